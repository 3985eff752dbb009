"""What the megatron-target tests share: whether Megatron's, the fork's and DeepSpeed's own
code is here (skip markers), the plans they use, and export-and-derive-back."""


import shlex

import pytest

from export import export_plan
from export import check_megatron
from export.base import Derived
from export.check import check_export
from planner.schema.errors import PlanError
from planner.schema.plan import Plan
from tests.export.export_plans import ROOT, committed_plans

CORE_MISSING = check_megatron.missing("megatron")
FORK_MISSING = check_megatron.missing("megatron-deepspeed")
needs_core = pytest.mark.skipif(CORE_MISSING is not None, reason=f"Megatron's own code is not here: {CORE_MISSING}")
needs_fork = pytest.mark.skipif(FORK_MISSING is not None,
                                reason=f"Megatron-DeepSpeed's own code is not here: {FORK_MISSING}")


def _deepspeed_missing() -> str | None:
    try:
        from export import check_deepspeed
    except ImportError:
        return "export/check_deepspeed.py"
    return check_deepspeed.missing()


DS_MISSING = _deepspeed_missing()
needs_deepspeed = pytest.mark.skipif(DS_MISSING is not None, reason=f"DeepSpeed's own code is not here: {DS_MISSING}")

COMMITTED = committed_plans()
TARGETS = ("megatron", "megatron-deepspeed")
PLAN_FIELDS = ("mesh.", "sharding.", "recompute", "pipeline.", "job.", "sequence_parallel", "machine.")
PLAN = ROOT / "plans/frameworks/protein-7b_dgx-h100_16n_megatron.yaml"
PIPELINED = ROOT / "plans/protein-70b_frontier_64n.yaml"  # pp 16 x 5 virtual stages, tp 2, rccl


def _names_a_field(err: PlanError) -> bool:
    return err.field is not None and (err.field != "plan" or any(f in str(err) for f in PLAN_FIELDS))


def _tokens(text: str) -> list[str]:
    return [t for line in text.splitlines() for t in shlex.split(line)]


def _value(tokens: list[str], name: str) -> str:
    return tokens[tokens.index(name) + 1]


def assert_exported(plan: Plan, target: str) -> Derived | None:
    """Export; where the target runs the plan, the framework's own code derives the plan's
    degrees and batch (None where the target refuses it, naming the field)."""
    try:
        exported = export_plan(plan, target)
    except PlanError as err:
        assert _names_a_field(err), str(err)
        return None
    assert exported.derived == Derived.of(plan)
    tokens = _tokens(exported.files["args.txt"])
    assert (int(_value(tokens, "--tensor-model-parallel-size")), int(_value(tokens, "--pipeline-model-parallel-size")),
            int(_value(tokens, "--micro-batch-size")), int(_value(tokens, "--global-batch-size"))) == (
        plan.mesh.tp, plan.mesh.pp, plan.micro_batch_size, plan.job.global_batch)
    if target == "megatron":
        derived = check_export(exported, plan)
    else:
        derived = check_megatron.check(exported, plan)
    assert derived == exported.derived == Derived.of(plan)
    return derived


@pytest.fixture(scope="module")
def pipelined() -> Plan:
    from planner.schema.plan import load_plan

    return load_plan(PIPELINED)


def as_zero1(plan: Plan) -> Plan:
    """The plan's layout with its data parallelism as zero1 (Megatron's distributed optimizer):
    its own is whatever the planner finds fastest."""
    from planner.schema.framework import Sharding

    dp = plan.mesh.dp_replicate * plan.mesh.dp_shard
    return plan.model_copy(update={
        "mesh": plan.mesh.model_copy(update={"dp_replicate": 1, "dp_shard": dp}),
        "sharding": plan.sharding.model_copy(update={"kind": Sharding.zero1, "shard_group_size": dp, "ddp_impl": None})})


def _with(exported, name: str, text: str):
    from dataclasses import replace

    return replace(exported, files={**exported.files, name: text})


# --- refusals --------------------------------------------------------------------------------------


def _fork_plan() -> Plan | None:
    for _, plan in COMMITTED:
        if plan.job.workload.value == "dpo" and plan.job.framework.name == "deepspeed":
            return plan
    return None
