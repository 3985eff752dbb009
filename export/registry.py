"""The export targets (`exaplan export --to`), the framework profile each keeps, and the one
entry point: `export_plan(plan, target)` refuses what the target's profile cannot run
(planner.schema.framework.layout_refusals), then calls the target's module."""

from __future__ import annotations

import importlib

from export.base import Export
from export.targets import TARGETS
from planner.schema.errors import PlanError
from planner.schema.framework import job_refusals, layout_refusals
from planner.schema.plan import Plan


def target_module(target: str):
    if target not in TARGETS:
        import difflib

        near = difflib.get_close_matches(target, list(TARGETS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise PlanError(f"unknown target {target!r}{hint}; known: {', '.join(TARGETS)}", field="to")
    return importlib.import_module(TARGETS[target][0])


def target_profile(target: str):
    """The framework profile whose constraints `target` keeps."""
    from machine_models import load_framework

    target_module(target)  # the unknown-target message first
    return load_framework(TARGETS[target][1])


def profile_refusals(plan: Plan, target: str) -> list[str]:
    """Why the target's framework cannot run the plan's layout, by its profile (empty: it can)."""
    profile = target_profile(target)
    stages = [(s.first_layer, s.last_layer) for s in plan.pipeline.stages]
    return layout_refusals(
        profile, layers=plan.model.layers, pp=plan.mesh.pp, vpp=plan.pipeline.virtual_stages, cp=plan.mesh.cp,
        tp=plan.mesh.tp, dp_replicate=plan.mesh.dp_replicate, dp_shard=plan.mesh.dp_shard, sharding=plan.sharding.kind,
        recompute=plan.recompute, schedule=plan.pipeline.schedule, sp=plan.sequence_parallel,
        precision=plan.job.precision, stages=stages, target=target, gas=plan.grad_accumulation_steps,
        ranks_per_node=plan.ranks_per_node, device_name=plan.machine.device_name,
        tied_embeddings=plan.model.tied_embeddings, workload=plan.job.workload.value) + job_refusals(
        profile, plan.job.workload.value, plan.job.reference.value, plan.machine.collective_library.value)


# What to do instead, by target, where its profile refuses a degree (the field's prefix).
HINTS = {"deepspeed": ("mesh.", "tensor, pipeline and context parallelism are the model code's: export to "
                                "megatron-deepspeed, whose Megatron model runs them")}


def export_plan(plan: Plan, target: str) -> Export:
    """The target's files for the plan; PlanError naming the field for what it cannot express."""
    module = target_module(target)
    problems = profile_refusals(plan, target)
    if problems:
        prefix, hint = HINTS.get(target, (None, ""))
        hint = f" ({hint})" if prefix and any(p.startswith(prefix) for p in problems) else ""
        raise PlanError(f"{target} cannot run this plan: " + "; ".join(problems) + hint, field="plan")
    out = module.export(plan, target)
    if plan.job.framework.name != TARGETS[target][1]:
        out.notes.append(f"the plan was predicted with the {plan.job.framework.name!r} profile; "
                         f"`exaplan plan --framework {TARGETS[target][1]}` predicts it as {target} runs it")
    return out
