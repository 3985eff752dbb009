"""Stopping cleanly before the walltime ends: the scheduler's signal, a checkpoint, exit 85.

A batch scheduler sends a signal some time before a job's walltime ends (Slurm:
`#SBATCH --signal=USR1@120`, or SIGTERM at the end; PBS: SIGTERM, then SIGKILL after a grace
period). Every rank of `exaplan run` handles SIGUSR1 and SIGTERM the same way:

1. the handler only records the signal (`StopSignal.requested`): nothing is interrupted, so a
   second signal during a save cannot corrupt it (and a save is atomic anyway: written to
   `step-N.tmp/`, renamed when complete, runtime/checkpoint/io.py);
2. after the current optimizer step, the ranks agree: each step's flag goes into an all-reduce
   (MAX) on a CPU group that nobody waits for until the next step ends
   (runtime/steplog.StopAgreement), so one rank's signal stops all of them after the same step
   (the one after the signal) and no rank saves alone, without a blocking collective per step;
3. all ranks save a complete checkpoint of that step, rank 0 writes a `stop` record in
   metrics.jsonl, `summary.json` (with `stopped`) and `OUT/stopped.json`, and every rank exits
   with EXIT_REQUEUE (85, runtime/options.py); the job script requeues and runs
   `exaplan run ... --resume`.

On a workstation the `exaplan run` process that started torchrun forwards the signals it gets
to the ranks (`Forwarder`) and turns their exit into 85; torchrun itself is started with
SIGUSR1 and SIGTERM ignored, so that a signal sent to the whole process tree (as Slurm does
without `B:`) reaches the ranks without killing the launcher that hosts their store.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
STOPPED_FILE = "stopped.json"
# Set by `exaplan run`'s own torchrun for its ranks: a rank stopped by a signal exits 0 there
# (the parent reports 85 from stopped.json), 85 under srun, mpiexec or a job's torchrun.
LOCAL_LAUNCHER_ENV = "EXAPLAN_LOCAL_LAUNCHER"


class StopSignal:
    """Records SIGUSR1 / SIGTERM in this rank; `requested` is the signal's name or None."""

    def __init__(self, rank: int | None = None):
        self.requested: str | None = None
        self.received_at: float | None = None
        self.count = 0
        self.rank = rank

    def install(self) -> "StopSignal":
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 (signal handler signature)
        self.count += 1
        if self.requested is None:
            self.requested = signal.Signals(signum).name
            self.received_at = time.time()
        if self.rank in (0, None):
            again = " again: already stopping, the checkpoint is being written" if self.count > 1 else \
                ": stopping after this step, saving a checkpoint and exiting with 85 (requeue)"
            os.write(2, f"exaplan run: {signal.Signals(signum).name}{again}\n".encode())

    @property
    def flag(self) -> int:
        return 1 if self.requested else 0


def write_stopped(out: Path, reason: str, last_step: int, checkpoint: Path, exit_code: int) -> dict:
    """OUT/stopped.json (rank 0): why the run stopped and where it continues."""
    record = {"reason": reason, "last_step": int(last_step), "resume_step": int(last_step) + 1,
              "checkpoint": str(checkpoint), "exit_code": int(exit_code), "time": time.time(), "pid": os.getpid()}
    tmp = out / f".{STOPPED_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out / STOPPED_FILE)
    return record


def ignore_stop_signals() -> None:
    """preexec_fn for the launcher: SIGUSR1 and SIGTERM ignored (inherited across exec; the
    ranks install their own handlers, torchrun keeps the dispositions it inherits)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc; torchrun's workers are its children)."""
    out = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry))
    return out


# Signals the `exaplan run` parent passes on: the stop signals as they are; SIGINT (Ctrl-C,
# `kill -INT`) and SIGHUP (the terminal closed) as SIGTERM, so that the ranks save too; the
# parent then exits 128 + the signal (130, 129). A second SIGINT kills the ranks at once.
PARENT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Forwarder:
    """In the `exaplan run` parent: SIGUSR1 / SIGTERM go on to the ranks torchrun started
    (its children), SIGINT / SIGHUP go on as SIGTERM; `received` names the first signal,
    `killed` says a second SIGINT ended the ranks with SIGKILL."""

    def __init__(self):
        self.proc = None
        self.received: str | None = None
        self.killed = False
        self._old: dict = {}

    def __enter__(self) -> "Forwarder":
        for sig in PARENT_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def exit_code(self, code: int, stopped: bool, requeue: int) -> int:
        """The parent's exit code: 85 when a stop signal made the ranks save (they exit 0 under
        this launcher: LOCAL_LAUNCHER_ENV); 128 + signal (130 SIGINT, 129 SIGHUP) when those
        stopped the run; else torchrun's."""
        if self.received in ("SIGINT", "SIGHUP"):
            return 128 + int(signal.Signals[self.received])
        if stopped:
            return requeue
        return code

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        name = signal.Signals(signum).name
        first = self.received is None
        self.received = self.received or name
        if self.proc is None or self.proc.poll() is not None:
            return
        ranks = child_pids(self.proc.pid)
        if not first and signum == signal.SIGINT:
            print("exaplan run: SIGINT again: killing the ranks", file=sys.stderr, flush=True)
            self.killed = True
            for pid in [*ranks, self.proc.pid]:
                _kill(pid, signal.SIGKILL)
            return
        passed = signum if signum in STOP_SIGNALS else signal.SIGTERM
        if first:
            how = "" if passed == signum else f" as {passed.name} (save and stop)"
            print(f"exaplan run: {name}: forwarding to the ranks ({len(ranks)} processes){how}", file=sys.stderr,
                  flush=True)
        for pid in ranks:
            _kill(pid, passed)


def _kill(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig=signal.SIGKILL) -> bool:
    """Linux: this process gets `sig` when its parent dies (prctl PR_SET_PDEATHSIG; kept across
    exec). For a preexec_fn. False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def launcher_preexec() -> None:
    """preexec_fn of the torchrun that `exaplan run` starts: the stop signals ignored (see
    above), and SIGKILL when the `exaplan run` parent dies (kill -9 included), so it cannot
    live on alone; its ranks then notice their parent is gone (ParentWatchdog)."""
    ignore_stop_signals()
    set_parent_death_signal(signal.SIGKILL)


ORPHAN_GRACE_ENV = "EXAPLAN_ORPHAN_GRACE_S"


class ParentWatchdog:
    """In each rank: a daemon thread that notices the rank's parent (torchrun, srun's step
    daemon, mpiexec's proxy) is gone, i.e. the rank was reparented. It then stops the run as
    SIGTERM does (the ranks agree, save a complete checkpoint, exit 85), and SIGKILLs the rank
    if that has not happened within the grace period (EXAPLAN_ORPHAN_GRACE_S, 120 s): a rank
    whose peers are gone too would wait in a collective forever. No rank outlives its launcher
    by more than that."""

    def __init__(self, poll_s: float = 0.5, grace_s: float | None = None):
        self.parent = os.getppid()
        self.poll_s = poll_s
        self.grace_s = float(os.environ.get(ORPHAN_GRACE_ENV, "120")) if grace_s is None else grace_s
        self.orphaned_at: float | None = None

    def start(self) -> "ParentWatchdog":
        import threading

        if self.parent > 1:
            threading.Thread(target=self._watch, name="exaplan-parent-watchdog", daemon=True).start()
        return self

    def _watch(self) -> None:
        while os.getppid() == self.parent:
            time.sleep(self.poll_s)
        self.orphaned_at = time.time()
        os.write(2, f"exaplan run: rank {os.getpid()}: the launcher (pid {self.parent}) is gone: saving a "
                    f"checkpoint and stopping (SIGKILL in {self.grace_s:g} s)\n".encode())
        _kill(os.getpid(), signal.SIGTERM)
        time.sleep(self.grace_s)
        _kill(os.getpid(), signal.SIGKILL)
