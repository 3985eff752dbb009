"""Collective measurements for `exaplan calibrate` (calibration/measure.py): allreduce,
reduce_scatter, all_gather and point-to-point over a range of message sizes, on `ranks` spawned
processes or as one rank of a launched job (torchrun, srun, mpiexec). torch is imported inside the
functions only.
"""

from __future__ import annotations

import os
import queue as _queue
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable

from calibration.timing import sync_device
from runtime.launch import device_and_backend

if TYPE_CHECKING:
    from calibration.timing import ProgressBar

KINDS = ("allreduce", "reduce_scatter", "all_gather", "p2p")


def _repeats(nbytes: int, quick: bool) -> int:
    if quick:
        return 11 if nbytes <= 1 << 20 else 3  # small ones cost ~0.3 ms each: more, against gloo's odd 4 ms
    return 20 if nbytes <= 1 << 20 else (10 if nbytes <= 16 << 20 else 5)


# --------------------------------------------------------------------------------------------
# Collectives
# --------------------------------------------------------------------------------------------


def launched_job() -> dict[str, Any] | None:
    """This process's place in a multi-process launcher's job (torchrun, srun, mpiexec, ...),
    read by the runtime's own launcher detection; None when not launched or alone."""
    from runtime.launch import detect

    env = detect()
    if env is None or env.world_size <= 1:
        return None
    return {"launcher": env.launcher, "rank": env.rank, "world_size": env.world_size,
            "local_rank": env.local_rank, "local_world_size": env.local_world_size}


def _elements(kind: str, nbytes: int, n: int) -> int:
    """fp32 elements of the full buffer: at least one per rank, a multiple of n for rs/ag."""
    elems = max(1, round(nbytes / 4))
    if kind in ("reduce_scatter", "all_gather"):
        elems = max(n, -(-elems // n) * n)
    return elems


def _run_collectives(rank: int, world: int, device, device_type: str, sizes, quick: bool,
                     report: Callable[[str], None], peer: int = 1) -> dict[str, Any]:
    """Every rank runs this; returns {kind: {"n", "bytes", "times_s"}}: per repeat the slowest
    rank's time (each repeat starts after a barrier), then the median over repeats. The
    point-to-point ping-pong runs between rank 0 and `peer` (the first rank of the second
    node in a multi-node job, so that it crosses the network)."""
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor collectives: renamed, not removed

    def barrier():
        if device_type == "cpu":
            dist.barrier()
        else:
            dist.barrier(device_ids=[device.index]) if device.index is not None else dist.barrier()

    out: dict[str, Any] = {}
    for kind in KINDS:
        series = {"n": world if kind != "p2p" else 2, "bytes": [], "times_s": []}
        for nbytes in sizes:
            elems = _elements(kind, nbytes, world)
            full = torch.ones(elems, device=device, dtype=torch.float32)
            part = torch.empty(elems // world if kind in ("reduce_scatter", "all_gather") else 1,
                               device=device, dtype=torch.float32)
            if kind == "allreduce":
                op = lambda: dist.all_reduce(full)  # noqa: E731
            elif kind == "reduce_scatter":
                op = lambda: dist.reduce_scatter_tensor(part, full)  # noqa: E731
            elif kind == "all_gather":
                op = lambda: dist.all_gather_into_tensor(full, part.fill_(1.0))  # noqa: E731
            else:
                def op():
                    if rank == 0:
                        dist.send(full, peer)
                        dist.recv(full, peer)
                    elif rank == peer:
                        dist.recv(full, 0)
                        dist.send(full, 0)
            times = []
            for i in range(_repeats(nbytes, quick) + 1):  # the first is a warm-up
                barrier()
                sync_device(device_type)
                t0 = time.perf_counter()
                op()
                sync_device(device_type)
                t = time.perf_counter() - t0
                if i:
                    times.append(t / 2 if kind == "p2p" else t)
            # The slowest rank per repeat (p2p: ranks 0 and 1 only).
            tt = torch.tensor(times, dtype=torch.float64, device=device if device_type != "cpu" else "cpu")
            if kind == "p2p" and rank not in (0, peer):
                tt.zero_()
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            series["bytes"].append(elems * 4)
            series["times_s"].append(statistics.median(tt.cpu().tolist()))
            del full, part
            report(f"{kind} {_human(nbytes)}")
        out[kind] = series
    return out


def _rank_device(device_type: str, local_rank: int):
    import torch

    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if device_type == "xpu":
        torch.xpu.set_device(local_rank)
        return torch.device("xpu", local_rank)
    return torch.device("cpu")


def _spawned_rank(rank: int, world: int, port: int, threads: int, sizes, quick: bool, messages, timeout_s: float) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    try:
        device_type, backend = device_and_backend()
        if device_type == "cpu":
            torch.set_num_threads(threads)
        device = _rank_device(device_type, rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        report = (lambda text: messages.put(("step", text))) if rank == 0 else (lambda text: None)
        result = _run_collectives(rank, world, device, device_type, sizes, quick, report)
        if rank == 0:
            messages.put(("done", result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        import traceback

        messages.put(("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))


def collectives_spawned(ranks: int, threads: int, sizes, quick: bool, bar: "ProgressBar", timeout_s: float) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    from runtime.launch import free_port

    port = free_port()
    task = bar.add("collectives", len(KINDS) * len(sizes))
    procs = [ctx.Process(target=_spawned_rank, args=(r, ranks, port, threads, tuple(sizes), quick, messages, timeout_s),
                         daemon=True) for r in range(ranks)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    result = None
    try:
        while result is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"collective measurements took longer than {timeout_s:.0f} s")
            try:
                what, payload = messages.get(timeout=0.5)
            except _queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a measuring rank exited with code {dead[0].exitcode}")
                continue
            if what == "step":
                bar.describe(task, f"collectives: {payload}")
                bar.advance(task)
            elif what == "error":
                raise RuntimeError(f"collective measurement failed on {payload}")
            else:
                result = payload
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return result


def collectives_under_launcher(launched: dict, sizes, quick: bool, bar: "ProgressBar") -> dict:
    """One rank of a launched job (torchrun, srun, mpiexec): the job's own process group."""
    import torch.distributed as dist

    device_type, backend = device_and_backend()
    device = _rank_device(device_type, launched["local_rank"])
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    started_here = not dist.is_initialized()
    if started_here:
        from runtime.startup import destroy_group_at_exit

        dist.init_process_group(backend, rank=launched["rank"], world_size=launched["world_size"])
        destroy_group_at_exit()
    task = bar.add("collectives", len(KINDS) * len(sizes))

    def report(text: str) -> None:
        bar.describe(task, f"collectives: {text}")
        bar.advance(task)

    try:
        ranks_per_node = launched["local_world_size"] or 1
        peer = ranks_per_node if launched["world_size"] > ranks_per_node else 1  # across nodes when there are two
        return _run_collectives(launched["rank"], launched["world_size"], device, device_type, sizes, quick, report, peer)
    finally:
        if started_here:
            dist.destroy_process_group()


def _human(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.4g} {unit}"
        nbytes /= 1024
    return str(nbytes)
