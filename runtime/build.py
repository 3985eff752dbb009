"""One rank of a plan, set up: it joins the job (step 1 of runtime/trainer.py's `train`) and
builds its part of the model (steps 3-6: on the meta device, split into pipeline stages,
tensor and context parallelism, recompute, compile, data parallelism, then materialised and
initialised). torch is imported inside the functions, when a rank starts.
"""

from __future__ import annotations

import sys

from planner.schema.errors import PlanError


def join(args):
    """Step 1: (the plan, this rank's device, its global rank, whether this process started
    the process group and so ends it)."""
    import torch
    import torch.distributed as dist

    from planner.schema.plan import load_plan
    from runtime import launch

    plan = load_plan(args.plan)
    renv = launch.detect()
    if renv is None:
        raise PlanError("not started by a launcher: use `exaplan run PLAN` (it starts torchrun), srun, mpiexec or torchrun")
    owns_group = not dist.is_initialized()  # tests start the process group themselves
    device = launch.init_distributed(plan, renv)
    rank = dist.get_rank()
    if device.type == "cpu" and plan.job.precision.value != "fp32" and rank == 0:
        print(f"warning: a {plan.job.precision.value} plan on a CPU: bf16/fp16 matmuls run about 200x slower here; "
              "plan with --precision fp32 for CPU runs", file=sys.stderr)
    if device.type == "cuda" and not plan.compile and rank == 0:  # protein-3.5b on one H100: 664 ms compiled, 914 eager
        print("note: " + ("--compile on a plan predicted for eager blocks: expect a faster step than predicted (`exaplan plan "
              "--compile` predicts compiled ones)" if args.compile else "eager blocks on a GPU, as predicted; --compile fuses "
              "their norms, rotary embeddings and activations (20-30% faster on protein-3.5b)"), file=sys.stderr)
    torch.manual_seed(args.seed + rank)
    return plan, device, rank, owns_group


def parallel_parts(plan, mesh, compile_blocks: bool = False):
    """Steps 3-5 of a plan, on the meta device: (this rank's model parts, their data-parallel
    handles). `exaplan run` materialises them (build_model); `exaplan check` keeps them on
    meta at the plan's full size (runtime/check.py)."""
    import torch

    from runtime.model import ProteinLM
    from runtime.parallel import apply_cp, apply_data_parallel, apply_recompute, apply_tp

    # 3. The model on the meta device: no rank ever holds all of it.
    with torch.device("meta"):
        model = ProteinLM(plan.model)

    # 4. Pipeline split: the chunks this pp rank runs (the whole model when pp = 1).
    if plan.mesh.pp > 1:
        from runtime.parallel.pipeline import split_model

        parts = split_model(model, plan, mesh["pp"].get_local_rank())
    else:
        parts = [model]

    # 5. On every part, in this order: tensor (+ sequence) parallelism, context parallelism,
    #    activation recompute, compile, then data parallelism (FSDP2 / HSDP / DDP / ZeRO).
    handles = []
    for part in parts:
        apply_tp(part, mesh["tp"], plan.sequence_parallel)
        apply_cp(part, mesh["cp"])
        apply_recompute(part, plan.recompute)
        if plan.compile or compile_blocks:
            for key, block in part.layers.items():
                part.layers[key] = torch.compile(block)
        handles.append(apply_data_parallel(part, mesh, plan))
    return parts, handles


def build_model(plan, mesh, device, seed: int, compile_blocks: bool = False):
    """Steps 3-6 of a plan: (this rank's model parts, their data-parallel handles)."""
    from runtime.model import init_weights

    spec = plan.model
    parts, handles = parallel_parts(plan, mesh, compile_blocks)

    # 6. Materialise and initialise: the same seed gives the same weights in any layout.
    for part in parts:
        part.to_empty(device=device)
        init_weights(part, spec, seed)
        part.setup_rope(device, plan.job.seq_len)
    return parts, handles
