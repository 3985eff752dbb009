"""The planner's memory for one rank of a plan (what `exaplan check` compares torch's
accounting with): the plan's layout predicted again, then that pipeline rank's share."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.cost.layout import RC_FULL, Layouts
from planner.cost.memory import (activation_parts, autocast_copy_bytes, copies_never_held, in_flight_on_rank,
                                 model_state_bytes, pipeline_grad_bytes, rank_parameters, reserve_bytes, stage_params)
from planner.schema.plan import Plan


def rank_memory(plan: Plan, pp_rank: int) -> dict[str, float]:
    """The planner's memory for a rank of pipeline rank `pp_rank`, in bytes by category
    (parameters with a DPO reference, gradients, optimizer, activations, buffers, reserve):
    the plan's layout predicted again (planner/cost/step.py evaluate, the busiest rank), then,
    with a pipeline, this rank's own share: model states and gathered blocks in proportion to
    the parameters it holds (rank_parameters), its blocks' activations times the micro-batches
    it holds in flight (in_flight_on_rank) with, under autocast on fp32 weights, their 16-bit
    weight copies, the last stage's loss and final norm on the last rank only, the unsharded
    gradients of a deferred sync (freeing one micro-batch where several are in flight), and the
    reserve on that churn."""
    from planner.cost.step import evaluate
    from planner.schema.figures import framework_machine

    model, job = plan.model, plan.job
    lay = Layouts.from_plan(plan)
    mem = evaluate(model, plan.machine, job, lay, ddp_buckets_mb=(plan.sharding.ddp_bucket_mb,)).memory
    out = {"parameters": float(mem.parameters[0]), "gradients": float(mem.gradients[0]),
           "optimizer": float(mem.optimizer[0]), "activations": float(mem.activations[0]),
           "buffers": float(mem.buffers[0]), "reference": float(np.asarray(mem.reference).reshape(-1)[0])}
    machine = framework_machine(plan.machine, job.framework)
    if plan.mesh.pp > 1:
        sharded = plan.sharding.kind.value in ("fsdp", "fsdp-grad-op", "hsdp")
        group = plan.mesh.dp_shard * plan.mesh.cp if sharded else 1
        heaviest = float(stage_params(model, lay)[0]) / plan.mesh.tp / group
        ratio = rank_parameters(plan, pp_rank) / heaviest
        for key in ("parameters", "gradients", "optimizer", "reference", "buffers"):
            out[key] *= ratio
        unit = replace(lay, mbs=lay.mbs * job.sequences_per_sample)  # dpo: 2 mbs sequences (step.unit_costs)
        per_mb, working, last = (float(x[0]) for x in activation_parts(model, machine, job, unit))
        stages = [s for s in plan.pipeline.stages if s.pp_rank == pp_rank]
        blocks = sum(s.last_layer - s.first_layer for s in stages)
        per_mb *= blocks / np.ceil(model.layers / plan.mesh.pp)
        held = in_flight_on_rank(plan.mesh.pp, plan.grad_accumulation_steps, plan.pipeline.virtual_stages,
                                 int(lay.schedule[0]), pp_rank)
        copies = float(autocast_copy_bytes(model, job, lay)[0]) * ratio if plan.grad_accumulation_steps > 1 else 0.0
        autocast_stage = plan.sharding.kind.value in ("zero1", "zero2") or (
            plan.sharding.kind.value == "none" and plan.mesh.dp_replicate * plan.mesh.cp == 1)
        if copies_never_held(job, lay.recompute)[0] or lay.recompute[0] == RC_FULL or not autocast_stage:
            copies = 0.0
        out["activations"] = (per_mb * held + (last if pp_rank == plan.mesh.pp - 1 else working)
                              + copies * max(held - 1.0, 0.0))
        if plan.grad_accumulation_steps > 1:  # the deferred sync's unsharded gradients on this rank
            G = float(pipeline_grad_bytes(model, job, lay)[0]) * ratio
            base = float(model_state_bytes(model, job, lay)[1][0]) * ratio
            out["gradients"] = base + (G if held <= 1.0 else max(G - per_mb, 0.0))
    out["parameters"] += out.pop("reference")
    out["reserve"] = float(reserve_bytes(machine, out["activations"] + out["buffers"]))
    return {k: float(v) for k, v in out.items()}
