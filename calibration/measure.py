"""Measure this machine for `exaplan calibrate`: matmul throughput, memory bandwidth, collectives.

    meas = measure(ranks=2, quick=True)        # raw, JSON-able measurements
    machine = fit_local.fit(meas, base)        # calibration/fit_measurements.py (numpy/scipy, no torch)
    fit_local.write_calibration(machine, meas, Path("machine_models/local.yaml"))

What is measured, on the device this process would train on (CUDA -> nccl, Intel XPU ->
xccl, CPU -> gloo; runtime.launch.device_and_backend):
  - matmul: FLOP/s of square and skinny GEMMs for each precision that matters (bf16 and fp32
    on a GPU; fp32 on a CPU, plus one small bf16 shape, since CPU bf16 is ~200x slower). On a
    CPU each rank of a run gets cores // ranks threads (what runtime.launch gives it), so the
    GEMMs run in ONE process with torch.set_num_threads(cores // ranks): the figure is one
    rank's ("device's"). The other ranks are idle meanwhile, so shared caches and memory
    bandwidth favour this figure slightly.
  - memory: a large tensor copy (bytes read + written per second). On a CPU the copy runs
    with every core and the node figure is divided between the ranks (they share it); on a
    GPU it is the device's own.
  - collectives: allreduce, reduce_scatter (reduce_scatter_tensor), all_gather
    (all_gather_into_tensor) and point-to-point (send/recv ping-pong, one way = half the round
    trip) over message sizes from 4 bytes to 64 MiB (quick) or 256 MiB (full). The message
    size M is the full buffer, as planner/cost/comm.py counts it: what each rank holds before
    an allreduce or a reduce-scatter and after an all-gather. Each time is the slowest rank's,
    the median over repeats after a warm-up. Started as `ranks` processes through
    torch.multiprocessing (spawn) meeting at a free TCP port on 127.0.0.1, with a rich
    progress bar in the parent; or, when this process was started by a launcher (torchrun,
    srun, mpiexec: RANK/WORLD_SIZE or the launcher's own variables), as one rank of that job.

How one node and a multi-node run make a model of a whole machine:
  - A single-node run (`exaplan calibrate` on one node, ranks = devices per node) gives the
    device figures: the matmul efficiency curve and peaks per precision, the memory
    bandwidth, and the intra-node fabric's alpha (latency) and beta (bandwidth per device per
    direction), fitted to the ring formulas of planner/cost/comm.py.
  - A run over 2+ nodes (under srun or mpiexec, one process per device; measure() reads the
    launcher's RANK/WORLD_SIZE and the ranks per node) times the same collectives across the
    nodes: their alpha is the inter-node latency, and their beta times the ranks per node is
    the injection bandwidth of one node (nics_per_node x nic_gbit_s), since all ranks of a node
    share its NICs in a ring that crosses nodes. One rank per node measures the NIC path alone.
  - What no benchmark of a few nodes can see comes from the site's description: the number
    of nodes, the topology (fat tree, dragonfly groups and their taper) and NICs per node.
    A calibrated file starts from the site's preset (or the detected local machine) and
    replaces only the figures measured.

The collectives are in calibration/measure_collectives.py. torch is imported there and here
only (and only by `exaplan calibrate`); the fit is torch-free.
"""

from __future__ import annotations

import datetime as _dt
import platform
import socket
import time
from typing import Any

from calibration.measure_collectives import KINDS, collectives_spawned, collectives_under_launcher, launched_job
from calibration.timing import ProgressBar, device_name, time_repeated
from machine_models.loader import cpu_cores
from runtime.launch import device_and_backend

__all__ = ["KINDS", "MEASUREMENTS_VERSION", "default_sizes", "measure"]

MEASUREMENTS_VERSION = 2  # 2: bandwidths renamed *_gbyte_s (were *_gbps)

# Matmul shapes (M, N, K): square ones for the curve, skinny ones as a transformer's per-rank
# GEMMs are (many tokens x a narrow slice of a wide weight, or few tokens x a wide weight).
SQUARE_QUICK = (128, 256, 512, 1024, 2048)
SQUARE_FULL = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
SKINNY_QUICK = ((4096, 256, 1024), (256, 2048, 2048))
SKINNY_FULL = ((4096, 256, 1024), (256, 2048, 2048), (8192, 512, 2048), (2048, 8192, 512), (64, 4096, 4096))
CPU_LOW_PRECISION_SHAPE = (256, 256, 256)  # ~30 MFLOP: a tenth of a second at CPU bf16 speed
MATMUL_MIN_SECONDS = {True: 0.05, False: 0.2}  # repeat each GEMM until this long (quick, full)

# Message sizes in bytes: powers of 16 from 4 B to 64 MiB (quick), powers of 4 to 256 MiB (full).
SIZES_QUICK = tuple(4 * 16**k for k in range(7))  # 4 B ... 64 MiB
SIZES_FULL = tuple(4 * 4**k for k in range(14))  # 4 B ... 256 MiB


def default_sizes(quick: bool) -> tuple[int, ...]:
    return SIZES_QUICK if quick else SIZES_FULL


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def measure(
    ranks: int = 2,
    quick: bool = False,
    progress: bool = True,
    *,
    sizes: list[int] | tuple[int, ...] | None = None,
    collectives: bool = True,
    matmul: bool = True,
    memory: bool = True,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Measure this machine; returns raw, JSON-able measurements (see the module docstring).

    `ranks`: ranks per node the run would use (cores are split between them on a CPU), and
    the processes the collectives run on. Under a launcher the job's world size is used.
    `quick`: fewer shapes, sizes and repeats (under a minute on a 2-core CPU).
    `sizes`: message sizes in bytes (default: 4 B to 64 MiB quick, 256 MiB full).
    `collectives`, `matmul`, `memory`: switch parts off (tests, or a compute-only run).
    """
    import torch

    launched = launched_job()
    if launched is not None:
        ranks = launched["local_world_size"] or 1
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    started = time.perf_counter()
    device_type, backend = device_and_backend()
    cores = cpu_cores()
    threads = max(1, cores // ranks)
    sizes = tuple(int(s) for s in (sizes if sizes is not None else default_sizes(quick)))
    meas: dict[str, Any] = {
        "version": MEASUREMENTS_VERSION,
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "device_type": device_type,
        "device_name": device_name(device_type),
        "backend": backend,
        "ranks": ranks,  # ranks per node
        "nodes": 1,
        "world_size": ranks,
        "cores": cores,
        "threads_per_rank": threads if device_type == "cpu" else None,
        "quick": bool(quick),
        "launcher": launched["launcher"] if launched else "spawn",
        "notes": [],
    }
    if launched is not None:
        meas["world_size"] = launched["world_size"]
        meas["nodes"] = max(1, launched["world_size"] // max(1, ranks))
    if device_type == "cpu":
        meas["notes"].append(
            f"matmul timed in one process with torch.set_num_threads({threads}) = {cores} cores // {ranks} ranks "
            "(each rank's share, as runtime.launch gives it); the other ranks were idle meanwhile; operands "
            "rotated through 64 MiB so that they come from memory, as in training"
        )

    is_rank0 = launched is None or launched["rank"] == 0
    with ProgressBar(progress and is_rank0) as bar:
        if matmul:
            meas["matmul"] = _measure_matmul(device_type, threads, quick, bar)
        if memory:
            meas["memory"] = _measure_memory(device_type, ranks, quick, bar)
            meas["optimizer"] = _measure_optimizer(device_type, threads, quick, bar)
        if collectives and (launched is not None or ranks > 1):
            if launched is not None:
                meas["collectives"] = collectives_under_launcher(launched, sizes, quick, bar)
            else:
                meas["collectives"] = collectives_spawned(ranks, threads, sizes, quick, bar, timeout_s)
        elif collectives:
            meas["notes"].append("one rank: no collectives measured")
    meas["duration_s"] = round(time.perf_counter() - started, 3)
    return meas


# --------------------------------------------------------------------------------------------
# Matmul and memory
# --------------------------------------------------------------------------------------------


def _matmul_plan(device_type: str, quick: bool) -> list[tuple[str, tuple[int, int, int]]]:
    square = SQUARE_QUICK if quick else SQUARE_FULL
    skinny = SKINNY_QUICK if quick else SKINNY_FULL
    shapes = [(d, d, d) for d in square] + list(skinny)
    if device_type == "cpu":
        return [("fp32", s) for s in shapes] + [("bf16", CPU_LOW_PRECISION_SHAPE)]
    return [(p, s) for p in ("bf16", "fp32") for s in shapes]


COLD_BYTES = 64 << 20  # CPU matmul operands rotated through: more than the caches hold


def _measure_matmul(device_type: str, threads: int, quick: bool, bar: ProgressBar) -> list[dict[str, Any]]:
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    plan = _matmul_plan(device_type, quick)
    task = bar.add("matmul", len(plan))
    old_threads = torch.get_num_threads()
    if device_type == "cpu":
        torch.set_num_threads(threads)
    out = []
    try:
        for precision, (m, n, k) in plan:
            bar.describe(task, f"matmul {precision} {m}x{n}x{k}")
            # Cold operands, as in training (every GEMM of a step reads weights and
            # activations that the previous ones pushed out of cache): rotate through
            # enough operand pairs to overflow a CPU's caches (GPUs: one pair).
            pair_bytes = (m * k + k * n) * torch.tensor([], dtype=dtypes[precision]).element_size()
            copies = max(1, min(16, -(-COLD_BYTES // pair_bytes))) if device_type == "cpu" else 1
            a = [torch.randn(m, k, device=device_type, dtype=dtypes[precision]) for _ in range(copies)]
            b = [torch.randn(k, n, device=device_type, dtype=dtypes[precision]) for _ in range(copies)]
            c = torch.empty(m, n, device=device_type, dtype=dtypes[precision])
            turn = iter(range(1 << 62))

            def gemm():
                i = next(turn) % copies
                torch.matmul(a[i], b[i], out=c)

            min_s = MATMUL_MIN_SECONDS[quick] if not (device_type == "cpu" and precision != "fp32") else 0.0
            seconds = time_repeated(gemm, device_type, min_s)
            flops = 2.0 * m * n * k
            out.append({"precision": precision, "m": m, "n": n, "k": k, "d": round((m * n * k) ** (1 / 3), 3),
                        "seconds": seconds, "tflops": flops / seconds / 1e12})
            bar.advance(task)
    finally:
        torch.set_num_threads(old_threads)
    return out


def _measure_memory(device_type: str, ranks: int, quick: bool, bar: ProgressBar) -> dict[str, Any]:
    """Copy bandwidth: bytes read plus bytes written per second."""
    import torch

    task = bar.add("memory", 1)
    nbytes = (256 << 20) if (quick or device_type == "cpu") else (1 << 30)
    src = torch.ones(nbytes // 4, device=device_type, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = time_repeated(lambda: dst.copy_(src), device_type, 0.3 if quick else 1.0, max_calls=50)
    gbyte_s = 2 * nbytes / seconds / 1e9
    shared = device_type == "cpu"
    bar.advance(task)
    return {
        "bytes": nbytes,
        "seconds": seconds,
        "measured_gbyte_s": gbyte_s,
        "threads": torch.get_num_threads() if shared else None,
        "shared_by_ranks": ranks if shared else 1,
        "gbyte_s_per_device": gbyte_s / ranks if shared else gbyte_s,
    }


def _measure_optimizer(device_type: str, threads: int, quick: bool, bar: ProgressBar) -> dict[str, Any]:
    """One AdamW step as the runtime runs it (torch.optim.AdamW, single-tensor path) over
    tensors shaped like a transformer's (weight matrices and norm vectors), on a CPU with
    one rank's share of the cores."""
    import torch

    before = torch.get_num_threads()
    if device_type == "cpu":
        torch.set_num_threads(threads)
    try:
        return _time_adamw(device_type, quick, bar)
    finally:
        torch.set_num_threads(before)


def _time_adamw(device_type: str, quick: bool, bar: ProgressBar) -> dict[str, Any]:
    import torch

    task = bar.add("optimizer", 1)
    dim = 512 if quick else 1024
    shapes = [(dim, dim)] * 4 + [(3 * dim, dim)] * 3 + [(dim,)] * 2  # one block: attention, MLP, norms
    blocks = 4 if quick else 8
    params = [torch.nn.Parameter(torch.randn(s, device=device_type)) for _ in range(blocks) for s in shapes]
    for q in params:
        q.grad = torch.randn_like(q)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=False)
    seconds = time_repeated(opt.step, device_type, 0.5 if quick else 2.0, max_calls=50)
    bar.advance(task)
    return {"kind": "AdamW foreach=False", "params": int(sum(q.numel() for q in params)), "tensors": len(params),
            "seconds": seconds, "threads": torch.get_num_threads() if device_type == "cpu" else None}


