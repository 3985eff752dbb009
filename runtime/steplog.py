"""Per-step bookkeeping off the hot path (issue 14): what a step records is kept on the
device and reduced over the ranks only when it is written, and the stop signal is agreed
without waiting.

StepTimer   a step's time, without synchronising the device (CUDA events).
StepLog     each step's local figures (its loss, or a task's metric sums, the gradient norm
            as a device tensor, the step time and phases measured on this rank, this rank's
            peak memory) are kept, unread; `flush` reduces all the kept steps at once: one
            all-reduce (SUM) of their metric rows over the task's group and one (MAX) of
            their peak memories over the world, then writes their records in order. The
            trainer flushes on the steps it prints (--log-every), before a validation or a
            checkpoint and at the end, so that metrics.jsonl stays in step order; with
            --log-every 1 every step is reduced and written as it ends.
StopAgreement
            a SIGUSR1/SIGTERM flag must stop every rank after the same step. Each step's
            flag goes into an all-reduce (MAX) started without waiting (async_op) on a CPU
            group (the default group under gloo, else a gloo group of its own, so no device
            synchronises); its result is read after the next step, when it has long
            arrived. All ranks read the same result after the same step: a signal stops the
            run one step after the step it arrived in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class _Kept:
    step: int
    row: torch.Tensor  # the task's local metric sums of the step (device or CPU)
    grad_norm: torch.Tensor | float | None
    step_time_s: Any  # seconds, or (start, end) CUDA events
    phases: dict[str, float]
    peak: int
    lr: float
    end_time: float  # wall clock when the step ended (metrics.jsonl "time")


class StepLog:
    """The kept steps of this rank and how to write them (see the module docstring).

    reduce_rows(rows [k, n]) -> [(loss, stats or None)] * k   the task's reduction (collective)
    """

    def __init__(self, writer, device, tokens_per_step: float, reduce_rows: Callable[[torch.Tensor], list]):
        self.writer, self.device, self.tokens_per_step = writer, device, tokens_per_step
        self.reduce_rows = reduce_rows
        self.kept: list[_Kept] = []

    def keep(self, step: int, row: torch.Tensor, grad_norm, step_time_s, phases: dict[str, float],
             peak: int, lr: float) -> None:
        self.kept.append(_Kept(step, row.detach().reshape(-1), grad_norm, step_time_s, phases, peak, lr, time.time()))

    def flush(self) -> list[dict[str, Any]]:
        """Reduce and write the kept steps (every rank calls it at the same steps); returns
        [{step, loss, stats, step_time_s}] of what was written."""
        if not self.kept:
            return []
        kept, self.kept = self.kept, []
        rows = torch.stack([k.row.to(kept[0].row.device) for k in kept])
        reduced = self.reduce_rows(rows)
        peaks = torch.tensor([k.peak for k in kept], dtype=torch.float64, device=self.device)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        norms = [None if k.grad_norm is None else float(k.grad_norm) for k in kept]
        out = []
        for k, (loss, stats), peak, norm in zip(kept, reduced, peaks.tolist(), norms):
            step_time = _seconds(k.step_time_s)
            self.writer.log_step(k.step, loss, self.tokens_per_step, step_time, int(peak), k.lr, norm,
                                 phases=k.phases, time_s=k.end_time)
            if stats:
                self.writer.log_dpo_step(k.step, stats)
            out.append({"step": k.step, "loss": loss, "stats": stats, "step_time_s": step_time})
        return out


def _seconds(step_time) -> float:
    """A step time: seconds, or a pair of CUDA events (start, end) read now."""
    if isinstance(step_time, tuple):
        start, end = step_time
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return float(step_time)


class StopAgreement:
    """Whether every rank saw a stop signal after the same step, without a blocking
    collective per step (see the module docstring)."""

    def __init__(self, stop):
        self.stop = stop
        self._pending: tuple[Any, torch.Tensor] | None = None
        backend = dist.get_backend()
        # CPU tensors need a CPU backend: the default group when it is gloo, else a gloo
        # group of the same ranks (created by every rank here, at the same point).
        self.group = None if backend == "gloo" else dist.new_group(backend="gloo")

    def after_step(self) -> bool:
        """Call once per step on every rank: True when the ranks agreed to stop (the flags
        of the previous step, read now); starts the agreement on this step's flag."""
        stopping = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stopping = bool(flag.item())
        if not stopping:
            flag = torch.tensor([self.stop.flag if self.stop else 0], dtype=torch.int32)
            self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True), flag)
        else:
            self._pending = None
        return stopping

    def close(self) -> None:
        """Wait for the last agreement started (every rank calls it before leaving)."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None


class StepTimer:
    """A step's time without synchronising the device: CUDA events read when the step is
    written (StepLog.flush); on a CPU the host's clock."""

    def __init__(self, device):
        self.t0 = time.perf_counter()
        self.events = None
        if device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()

    def stop(self):
        if self.events is None:
            return time.perf_counter() - self.t0
        self.events[1].record()
        return self.events
