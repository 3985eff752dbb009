"""Start-up precautions of every rank (and of the `exaplan run` parent), from the seed
documents' lessons at scale:

- `raise_nofile_limit`: the soft limit on open files raised to the hard one (`ulimit -n`): a
  rank holds a socket per peer it talks to, and thousands of ranks reach the default 1024;
- `warn_somaxconn`: the rank hosting the rendezvous store (rank 0) accepts a connection from
  every rank at once; a listen backlog (`/proc/sys/net/core/somaxconn`) below that count makes
  connections wait for SYN retries (seconds each) or time out. Warned once, on rank 0;
- `tee_rank_log`: each rank's stdout and stderr also go to OUT/logs/rank-N.log (appended, so
  a requeued job's ranks continue their logs), through a `tee` process per stream that
  outlives a crashed rank and so keeps its last words. Under torchrun, srun or mpiexec alike.
"""

from __future__ import annotations

import functools

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOMAXCONN = Path("/proc/sys/net/core/somaxconn")


def raise_nofile_limit() -> tuple[int, int] | None:
    """Soft RLIMIT_NOFILE up to the hard limit; returns (old soft, new soft), None where the
    platform has no `resource` module."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


def somaxconn_warning(connecting: int, path: Path = SOMAXCONN) -> str | None:
    """The warning when the listen backlog is below the ranks that connect to the store."""
    try:
        backlog = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if backlog >= connecting:
        return None
    return (f"warning: {path} is {backlog}, below the {connecting} ranks that connect to the rendezvous store at "
            f"once: connections beyond the backlog wait for SYN retries or time out. Raise it on the store's host "
            f"(sysctl -w net.core.somaxconn={max(4096, connecting)}; the site's admins) or start fewer ranks per store")


def warn_somaxconn(rank: int, connecting: int) -> None:
    if rank == 0:
        msg = somaxconn_warning(connecting)
        if msg:
            print(msg, file=sys.stderr, flush=True)


def tee_rank_log(out: Path, rank: int) -> Path | None:
    """Duplicate this process's stdout and stderr (file descriptors 1 and 2, so that C
    libraries' output is caught too) into OUT/logs/rank-N.log. Returns the log's path, or None
    when `tee` is missing or EXAPLAN_RANK_LOGS=0."""
    if os.environ.get("EXAPLAN_RANK_LOGS", "1") == "0" or shutil.which("tee") is None:
        return None
    log = Path(out) / "logs" / f"rank-{rank}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for fd in (1, 2):
        # tee ignores the stop signals and SIGINT (it ends when the rank closes the pipe), so a
        # signal to the whole process tree does not break the rank's output.
        original = os.dup(fd)
        tee = subprocess.Popen(["tee", "-a", str(log)], stdin=subprocess.PIPE, stdout=original,
                               preexec_fn=_ignore_signals, close_fds=True)
        os.close(original)
        os.dup2(tee.stdin.fileno(), fd)
        tee.stdin.close()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass
    return log


def _ignore_signals() -> None:
    import signal

    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


@functools.cache
def destroy_group_at_exit() -> None:
    """Registers, once, an atexit handler that tears the default process group down while the
    interpreter is still whole, where a path out of the rank (an exception, an early return)
    skipped destroy_process_group: gloo's worker threads otherwise meet interpreter finalisation
    and the rank aborts at exit ("terminate called without an active exception", pytorch#190489)."""
    import atexit

    atexit.register(_destroy_group)


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - at exit, nothing is left to report it to
            pass


def exit_rank(code: int) -> None:
    """Ends a rank that has finished (its files closed, its process group torn down): the atexit
    handlers run, stdout and stderr are flushed, and the process exits without the interpreter's
    finalisation. A process group still referenced from Python (a device mesh, an FSDP module)
    otherwise has its gloo threads destroyed during finalisation, and a rank that trained to the
    end aborts at exit, now and then under load ("terminate called without an active exception",
    SIGABRT: torchrun then fails the whole run; pytorch#190489, pytorch/pytorch#179291)."""
    import atexit
    import logging

    atexit._run_exitfuncs()  # noqa: SLF001 - what normal exit would run first
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
