"""Run a function on N gloo ranks on the CPU, for tests: `run_on_ranks(fn, n, *args)`.

Each rank is a fresh spawned process (torch.multiprocessing, start method "spawn") that joins
a gloo process group through a file store in a temporary folder (no port to pick, so no race
for a free port), sets torch.set_num_threads(1) (the test machine has 2 cores and runs up to
4 ranks), calls `fn(rank, world_size, *args)` and sends its return value back. The caller
gets the list of return values in rank order, or an exception carrying the failing rank's
traceback. A run that takes longer than `timeout_s` is killed and raises TimeoutError instead
of hanging (keep `timeout_s` below the test's pytest-timeout).

`fn` must be a module-level function (spawn pickles it by name) and should return plain
Python values (floats, lists, dicts): tensors would travel through shared memory.
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

__all__ = ["run_on_ranks"]


def _entry(rank: int, world_size: int, store_path: str, fn: Callable, args: tuple, results, timeout_s: float) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    reported = False
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            # Report before tearing the group down: the teardown makes the other ranks fail
            # too, and the first report to arrive should be the cause, not a consequence.
            out = fn(rank, world_size, *args)
            results.put((rank, True, out))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
        reported = True
        dist.destroy_process_group()
    except BaseException:  # init (or, unreported, teardown) failed
        if not reported:
            results.put((rank, False, traceback.format_exc()))


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 100.0) -> list[Any]:
    """fn(rank, world_size, *args) on `world_size` gloo ranks; their return values by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="exaplan-dist-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(r, world_size, store, fn, args, results, timeout_s), daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        outs: dict[int, Any] = {}
        errors: dict[int, str] = {}  # in order of arrival: the first is the likely cause
        deadline = time.monotonic() + timeout_s

        def take(item) -> None:
            rank, ok, payload = item
            if ok:
                outs[rank] = payload
            else:
                errors.setdefault(rank, payload)

        try:
            while len(outs) + len(errors) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{world_size} ranks did not finish in {timeout_s:.0f} s "
                                       f"(finished: {sorted(outs)}, failed: {sorted(errors)})")
                try:
                    take(results.get(timeout=min(left, 1.0)))
                except queue.Empty:
                    for r, p in enumerate(procs):  # died without reporting (killed, segfault)
                        if p.exitcode not in (None, 0) and r not in outs and r not in errors:
                            time.sleep(0.5)  # a report may still be in flight
                            while not results.empty():
                                take(results.get())
                            errors.setdefault(r, f"rank {r} exited with code {p.exitcode} without reporting")
                if errors:  # the others may be blocked in a collective: collect briefly, then stop
                    end = time.monotonic() + 2.0
                    while len(outs) + len(errors) < world_size and time.monotonic() < end:
                        try:
                            take(results.get(timeout=0.2))
                        except queue.Empty:
                            pass
                    break
        finally:
            done = not errors and len(outs) == world_size
            for p in procs:
                p.join(timeout=5.0 if done else 0.5)
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=2.0)
                if p.is_alive():
                    p.kill()
                    p.join()
    if errors:
        # A rank that died without a word (exit code set, no report) is the likeliest cause.
        silent = {r: f"rank {r} exited with code {p.exitcode} without reporting" for r, p in enumerate(procs)
                  if r not in outs and r not in errors and p.exitcode not in (None, 0, -15, -9)}
        errors = {**silent, **errors}
        first = next(iter(errors))
        others = [r for r in errors if r != first]
        also = f" (then ranks {others} failed too)" if others else ""
        raise RuntimeError(f"rank {first} of {world_size} failed first{also}:\n{errors[first]}")
    return [outs[r] for r in range(world_size)]
