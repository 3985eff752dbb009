"""Stopping cleanly before the walltime ends: the scheduler's signal, a checkpoint, exit 85.

A batch scheduler sends a signal some time before a job's walltime ends (Slurm:
`#SBATCH --signal=USR1@120`, or SIGTERM at the end; PBS: SIGTERM, then SIGKILL after a grace
period). Every rank of `exaplan run` handles SIGUSR1 and SIGTERM the same way:

1. the handler only records the signal (`StopSignal.requested`): nothing is interrupted, so a
   second signal during a save cannot corrupt it (and a save is atomic anyway: written to
   `step-N.tmp/`, renamed when complete, runtime/checkpoint/io.py);
2. after the current optimizer step, the ranks agree: the flag rides in the all-reduce (MAX)
   the trainer already makes for the peak memory, so one rank's signal stops all of them at
   the same step and no rank saves alone, at no extra collective;
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


class Forwarder:
    """In the `exaplan run` parent: SIGUSR1 / SIGTERM go on to the ranks torchrun started
    (its children), once; `received` names the first signal."""

    def __init__(self):
        self.proc = None
        self.received: str | None = None
        self._old: dict = {}

    def __enter__(self) -> "Forwarder":
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        name = signal.Signals(signum).name
        first = self.received is None
        self.received = self.received or name
        if self.proc is None or self.proc.poll() is not None:
            return
        ranks = child_pids(self.proc.pid)
        if first:
            print(f"exaplan run: {name}: forwarding to the ranks ({len(ranks)} processes)", file=sys.stderr, flush=True)
        for pid in ranks:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
