"""The run directory is owned: one `exaplan run` at a time writes into an --out folder.

`OUT/.exaplan-run.lock` holds the owner (host, pid, start time, command) and is held with an
exclusive `flock` for the whole run: the kernel releases it when the owner dies, however it
dies (kill -9 included), so a lock file whose flock is free is stale by construction. Then the
recorded owner is checked and said: a pid that is gone on this host, or another host's run
that no longer holds it, is taken over with a message; a second run while the owner is alive
is refused naming the owner (PlanError, exit 2). `--resume` takes the lock the same way.

On a workstation the `exaplan run` parent holds it and tells its ranks so
(EXAPLAN_RUN_LOCK_OWNER); under srun or mpiexec rank 0 takes it. flock on a shared file system
(NFS, Lustre with `flock` mounts) is cluster-wide; where it is local only, the recorded host
still lets a run started elsewhere be named.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from planner.schema.errors import PlanError

LOCK_FILE = ".exaplan-run.lock"
OWNER_ENV = "EXAPLAN_RUN_LOCK_OWNER"  # set by the parent that holds the lock, for its ranks


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe(owner: dict) -> str:
    started = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, started {when}"


class RunLock:
    """`with RunLock(out):` or acquire()/release(). `taken_over`: the stale owner replaced, or None."""

    def __init__(self, out: str | Path, argv: list[str] | None = None):
        self.out = Path(out)
        self.path = self.out / LOCK_FILE
        self.argv = list(argv or sys.argv)
        self.fd: int | None = None
        self.taken_over: dict | None = None

    def read_owner(self) -> dict:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self) -> "RunLock":
        """Take the lock (creating --out); PlanError naming the owner when a live run holds it."""
        import fcntl

        self.out.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = self.read_owner()
            raise PlanError(f"{self.out} is in use by another exaplan run ({describe(owner)}): wait for it to end, "
                            f"or choose another --out", field="--out") from None
        previous = self.read_owner()
        if previous.get("pid") and previous.get("pid") != os.getpid():
            self.taken_over = previous
            here = previous.get("host") == socket.gethostname()
            gone = "is gone" if here and not _pid_alive(int(previous["pid"])) else "no longer holds it"
            print(f"exaplan run: {self.out}: a stale lock of a run that ended without releasing it "
                  f"({describe(previous)}; that process {gone}): taking it over", file=sys.stderr, flush=True)
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "command": self.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        """Clear the owner and drop the flock (a run that ends normally leaves an empty lock file)."""
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        os.close(self.fd)  # closing the descriptor releases the flock
        self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
