"""What the hand-written torch baselines (benchmarks/torch_*.py) share: their options, the
process group, protein-small on the meta device, the synthetic batch, the timed loop and the
result file.

The workload is the demo's: protein-small, a global batch of 4 sequences of 128 tokens, fp32,
AdamW (lr 3e-4 constant, betas (0.9, 0.95), weight decay 0.1), gradients clipped to norm 1.0,
one fixed random token batch reused every step (what `exaplan run --io-mode synthetic` does).

The step time is what exaplan's trainer measures as its step time (runtime/trainer.py,
`_train_step`): from before the forward to after optimizer.step() and zero_grad(), with a
cuda synchronize on GPUs. Start-up to the first step: from the script's first line to the end
of the first step (`startup_to_first_step_s`); the absolute end of the first step
(`first_step_end_time`, time.time()) is written too, so that the driver
(benchmarks/runtime_vs_torch.py) can measure both sides the same way, from its launch of the
command.

Exaplan imports: only the model (runtime.model) and the preset catalogue (planner.presets).
torch is imported lazily, so that `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

MODEL = "protein-small"
GLOBAL_BATCH = 4
SEQ_LEN = 128
MAX_NORM = 1.0
ADAMW = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(description.strip().split("\n\n")[0].split()),
                                 epilog="Start with `torchrun --nproc-per-node 2 SCRIPT ...` (2 ranks, gloo on CPU).")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    ap.add_argument("--out", help="JSON file for the result (rank 0 writes it; default: print a line only)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the synthetic batch (default 0)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    return args


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def setup():
    """The process group (nccl on a GPU, else gloo), this rank's device and its share of the
    cores. Returns (device, rank, world size)."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(max(1, cores() // local_world))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return device, dist.get_rank(), dist.get_world_size()


def model_spec():
    """protein-small's ModelSpec, from the planner's preset catalogue."""
    from planner.presets import get_model

    return get_model(MODEL)


def meta_model(spec):
    """The whole ProteinLM on the meta device (no memory yet)."""
    import torch

    from runtime.model import ProteinLM

    with torch.device("meta"):
        return ProteinLM(spec)


def materialise(model, spec, device, seed: int) -> None:
    """Allocate on `device`, initialise from (seed, name) (DTensor shards too), rotary tables."""
    from runtime.model import init_weights

    model.to_empty(device=device)
    init_weights(model, spec, seed)
    model.setup_rope(device)


def synthetic_batch(spec, rows: int, seed: int, device, seq_len: int = SEQ_LEN):
    """(inputs, targets) of `rows` random sequences of `seq_len` tokens (no padding token 0)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, spec.vocab_size, (rows, seq_len + 1), generator=g)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def adamw(params):
    import torch

    return torch.optim.AdamW(params, **ADAMW)


def ddp(model, device, bucket_cap_mb: float = 25):
    """torch's DistributedDataParallel around `model`: the plan's 25 MB bucket, gradients as
    bucket views (what the DDP and ZeRO-1 baselines wrap)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=True)


def plain_step(forward, inputs, targets, params, opt):
    """The step every baseline without a pipeline times: forward, loss, backward, torch's
    clip_grad_norm_ (global over DTensors too), optimizer step, zero_grad. Returns a
    callable for `run_steps`."""
    import torch

    from runtime.model import loss_fn

    def step():
        loss = loss_fn(forward(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def run_steps(step: Callable[[], object], steps: int, device) -> tuple[list[float], float, list]:
    """Call `step` (forward, backward, clip, optimizer step, zero_grad) `steps` times.
    Returns (step times in s, time.time() at the end of the first step, what each step returned)."""
    import torch

    times, outs, first_end = [], [], 0.0
    for i in range(steps):
        t0 = time.perf_counter()
        outs.append(step())
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if i == 0:
            first_end = time.time()
    return times, first_end, outs


def report(args, layout: str, t_start: float, times: list[float], first_end: float, losses: list) -> None:
    """Rank 0: the result line on stdout and, with --out, the JSON file. Every rank then leaves
    the process group."""
    import statistics

    import torch.distributed as dist

    if dist.get_rank() == 0:
        loss = [float(x) for x in losses if x is not None]
        result = {
            "layout": layout,
            "world_size": dist.get_world_size(),
            "step_times_s": times,
            "startup_to_first_step_s": first_end - t_start,
            "first_step_end_time": first_end,
            "script_start_time": t_start,
            "losses": loss,
        }
        trend = f"; loss {loss[0]:.4f} -> {loss[-1]:.4f}" if loss else ""
        print(f"{layout}: {len(times)} steps, median {statistics.median(times) * 1e3:.1f} ms, min "
              f"{min(times) * 1e3:.1f} ms; start-up to first step {first_end - t_start:.2f} s{trend}", flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(args.out).with_name(Path(args.out).name + ".tmp")
            tmp.write_text(json.dumps(result, indent=1) + "\n")
            os.replace(tmp, args.out)
    dist.barrier()
    dist.destroy_process_group()
