"""The plan's communicator table counts what exaplan's runtime issues (exaplan check measured it
at full size: docs/results/check-sweep.json): a pipeline stage sends its sequence shard under
sequence parallelism and an fp32 residual stream under autocast on fp32 weights; without
sequence parallelism every column-parallel input's gradient is all-reduced on its own; full
recompute repeats the forward's collectives but the last; DPO's reference adds a forward."""

from __future__ import annotations

import pytest

from machine_models import load_machine
from planner.cost.layout import Layouts
from planner.cost.step import evaluate
from planner.emit import build_plan
from planner.inputs import make_job
from planner.presets import get_model

MODEL, MACHINE = get_model("protein-3.5b"), load_machine("dgx-h100")


def table(workload="pretrain", **lay) -> dict[str, float]:
    one = Layouts.one(**lay)
    world = int(one.dp[0] * one.tp[0] * one.pp[0] * one.cp[0])
    job = make_job(MODEL, MACHINE, world, int(one.dp[0] * one.mbs[0] * one.gas[0]), None, "bf16", None, workload=workload)
    plan = build_plan(MODEL, MACHINE, job, world // 8, one, evaluate(MODEL, MACHINE, job, one), 0, command="test")
    return {k.value: c.bytes_per_step for k, c in plan.collectives.communicators.items()}


BASE = dict(dp=8, mbs=2, gas=8, sharding="fsdp")


def test_a_stage_sends_its_sequence_shard_under_sequence_parallelism():
    sp = table(pp=2, tp=2, **BASE)["pp"]
    assert table(pp=2, tp=2, sp=False, **BASE)["pp"] == pytest.approx(2 * sp)
    assert table(pp=2, **BASE)["pp"] == pytest.approx(2 * sp)  # tp 1: the whole activation


def test_an_fp32_residual_stream_doubles_what_a_stage_sends():
    assert table(pp=4, dp=8, mbs=2, gas=8, sharding="zero1")["pp"] == pytest.approx(2 * table(pp=4, **BASE)["pp"])


def test_tensor_parallel_calls_per_block():
    sp, no_sp = table(tp=2, **BASE)["tp"], table(tp=2, sp=False, **BASE)["tp"]
    assert no_sp / sp == pytest.approx(7 / 8)  # 2 all-reduces forward, 5 backward (wq wk wv w1 w3) vs 4 + 4
    assert table(tp=2, recompute="full", **BASE)["tp"] / sp == pytest.approx(11 / 8)  # the forward again, less its last
    assert table(tp=2, recompute="selective-op", **BASE)["tp"] / sp == pytest.approx(10 / 8)  # k's and up's inputs
    assert table(tp=2, dp=8, mbs=2, gas=8, sharding="zero1")["tp"] / sp == pytest.approx(1.5)  # fp32 gathers


def test_dpo_adds_the_reference_forward():
    pre = table(tp=2, dp=8, mbs=4, gas=8, sharding="fsdp")["tp"]
    dpo = table("dpo", tp=2, dp=8, mbs=2, gas=8, sharding="fsdp")["tp"]  # the same sequences a micro-batch
    assert dpo / pre == pytest.approx(12 / 8)
