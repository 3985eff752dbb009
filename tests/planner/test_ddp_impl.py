"""Which replication the runtime uses under sharding kind none (issue 14): the plan names it
(`sharding.ddp_impl`), the planner picks it with `ddp_impl_for`, the cost model charges
DistributedDataParallel no bucket copies, and an impossible choice is refused."""

from __future__ import annotations

import pytest

from machine_models import load_machine
from planner.cost.layout import Layouts
from planner.cost.step import evaluate
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.errors import PlanError
from planner.emit import build_plan
from planner.schema.plan import Plan, Precision, Sharding, ddp_impl_for, dumps_plan, load_plan, seal
from planner.search.pins import Pins
from planner.search.search import search


@pytest.mark.parametrize("kind,tp,pp,precision,want", [
    (Sharding.none, 1, 1, Precision.fp32, "ddp"),
    (Sharding.none, 1, 1, Precision.bf16, "ddp"),
    (Sharding.none, 1, 1, Precision.fp16, "replicate"),  # autocast fp16 would need a loss scaler
    (Sharding.none, 2, 1, Precision.fp32, "replicate"),  # DTensor parameters
    (Sharding.none, 1, 2, Precision.fp32, "replicate"),  # pipeline stages drive FSDP2-style modules
    (Sharding.fsdp, 1, 1, Precision.fp32, None),
    (Sharding.zero1, 1, 1, Precision.fp32, None),
])
def test_ddp_impl_for(kind, tp, pp, precision, want):
    assert ddp_impl_for(kind, tp, pp, precision) == want


def _local_plan(**pins):
    model = get_model("protein-small")
    machine = load_machine("local", ranks=2)
    job = make_job(model, machine, 1, 4, 128, "fp32", None)
    result = search(model, machine, job, 1, top_k=1, pins=Pins(**pins))
    return build_plan(model, machine, job, 1, result.layouts, result.evaluation, 0, command="test")


def test_the_emitted_plan_names_ddp_and_round_trips(tmp_path):
    plan = _local_plan(dp=2, shard="none", tp=1, pp=1)
    assert plan.sharding.kind == Sharding.none and plan.sharding.ddp_impl == "ddp"
    path = tmp_path / "p.yaml"
    path.write_text(dumps_plan(plan))
    assert load_plan(path).sharding.ddp_impl == "ddp"


def test_an_impossible_ddp_impl_is_refused():
    plan = _local_plan(dp=1, tp=2, pp=1)
    body = plan.model_dump(mode="json")
    body["sharding"]["ddp_impl"] = "ddp"
    with pytest.raises(ValueError, match="ddp_impl ddp needs tp == 1"):
        Plan.model_validate(body)
    body = _local_plan(dp=2, shard="zero1", tp=1, pp=1).model_dump(mode="json")
    body["sharding"]["ddp_impl"] = "replicate"
    with pytest.raises(ValueError, match="applies to kind none only"):
        Plan.model_validate(body)


def test_a_plan_without_ddp_impl_keeps_its_hash(tmp_path):
    """Plans written before the field existed still load (their hash did not cover it) and
    run FSDP2's replicate, as they did."""
    plan = _local_plan(dp=2, shard="none", tp=1, pp=1)
    body = plan.model_dump(mode="json")
    body["sharding"]["ddp_impl"] = None
    old = Plan.model_validate(body)
    text = dumps_plan(seal(old)).replace(", ddp_impl: null", "")
    assert "ddp_impl" not in text
    path = tmp_path / "old.yaml"
    path.write_text(text)
    assert load_plan(path).sharding.ddp_impl is None


def test_ddp_is_charged_no_bucket_copies():
    """With the machine's buffer copies made expensive, a DDP layout (tp = pp = 1) costs the
    same, a replicated layout with tensor parallelism (FSDP2's replicate) more."""
    model = get_model("protein-small")
    machine = load_machine("local", ranks=4)
    job = make_job(model, machine, 1, 8, 128, "fp32", None)
    costly = machine.model_copy(update={"dp_buffer_copies": 20.0})
    ddp = Layouts.one(dp=4, mbs=2)
    tp_ddp = Layouts.one(dp=2, mbs=4, tp=2)
    assert evaluate(model, costly, job, ddp).step_time_s[0] == pytest.approx(
        evaluate(model, machine, job, ddp).step_time_s[0], rel=1e-12)
    assert evaluate(model, costly, job, tp_ddp).step_time_s[0] > evaluate(model, machine, job, tp_ddp).step_time_s[0]


def test_unknown_ddp_impl_is_a_plan_error(tmp_path):
    plan = _local_plan(dp=2, shard="none", tp=1, pp=1)
    path = tmp_path / "p.yaml"
    path.write_text(dumps_plan(plan).replace("ddp_impl: ddp", "ddp_impl: ddpp"))
    with pytest.raises(PlanError, match="ddp_impl"):
        load_plan(path)
