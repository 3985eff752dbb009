"""Timing and progress for `exaplan calibrate`'s measurements (calibration/measure.py and
calibration/measure_collectives.py): device sync, per-call timing (device events on a GPU, the
wall clock on a CPU), the device's name and a progress bar. torch is imported inside the
functions only."""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any, Callable


def sync_device(device_type: str) -> None:
    import torch

    if device_type == "cuda":
        torch.cuda.synchronize()
    elif device_type == "xpu":
        torch.xpu.synchronize()


def device_name(device_type: str) -> str:
    import torch

    if device_type == "cuda":
        return torch.cuda.get_device_name(0)
    if device_type == "xpu":
        return torch.xpu.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def time_once(fn: Callable[[], Any], device_type: str) -> float:
    """Seconds of one call: device events on a GPU, the wall clock on a CPU."""
    import torch

    if device_type in ("cuda", "xpu"):
        mod = torch.cuda if device_type == "cuda" else torch.xpu
        start, end = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_repeated(fn: Callable[[], Any], device_type: str, min_seconds: float, max_calls: int = 1000) -> float:
    """Median seconds per call: one warm-up, then calls in batches until min_seconds pass."""
    fn()
    sync_device(device_type)
    first = time_once(fn, device_type)
    calls = max(1, min(max_calls, int(min_seconds / max(first, 1e-9))))
    per_batch = max(1, calls // 5)
    samples = [first]
    spent = first
    while spent < min_seconds and len(samples) < 50:
        t = time_once(lambda: [fn() for _ in range(per_batch)], device_type)
        samples.append(t / per_batch)
        spent += t
    return statistics.median(samples)


class ProgressBar:
    """A rich progress bar (or nothing when disabled), one task per part."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._p = None

    def __enter__(self) -> "ProgressBar":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), transient=False)
            self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)

    def add(self, name: str, total: int):
        return self._p.add_task(name, total=total) if self._p is not None else None

    def describe(self, task, text: str) -> None:
        if self._p is not None:
            self._p.update(task, description=text)

    def advance(self, task) -> None:
        if self._p is not None:
            self._p.advance(task)
