"""The public ways to name one layout: `Layouts.one` (from degrees) and `Layouts.from_plan`,
and the DDP bucket sizes as an argument of `evaluate`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from machine_models import load_machine
from planner.cost.layout import SCHEDULES, SHARDINGS, Layouts, default_shard_group
from planner.cost.step import DDP_BUCKETS_MB, evaluate
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.errors import PlanError
from planner.schema.plan import Schedule, Sharding, load_plan

PLANS = sorted((Path(__file__).resolve().parents[2] / "plans").glob("*.yaml"))


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_from_plan_repredicts_the_plan(path):
    """A committed plan's layout, read back with its DDP bucket, predicts what the plan says."""
    plan = load_plan(path)
    ev = evaluate(plan.model, plan.machine, plan.job, Layouts.from_plan(plan),
                  ddp_buckets_mb=(plan.sharding.ddp_bucket_mb,))
    assert ev.step_time_s[0] == pytest.approx(plan.prediction.step_time_s, rel=1e-9)
    assert ev.memory.total[0] / 2**30 == pytest.approx(plan.prediction.memory_gib_per_device, rel=1e-9)
    assert float(ev.ddp_bucket_mb[0]) == plan.sharding.ddp_bucket_mb


def test_one_splits_dp_by_sharding_and_fills_defaults():
    ddp = Layouts.one(dp=8, mbs=2)
    assert (ddp.dp_replicate[0], ddp.dp_shard[0], SHARDINGS[ddp.sharding[0]]) == (8, 1, Sharding.none)
    fsdp = Layouts.one(dp=8, mbs=2, sharding="fsdp")
    assert (fsdp.dp_replicate[0], fsdp.dp_shard[0]) == (1, 8)
    hsdp = Layouts.one(dp=8, mbs=2, sharding=Sharding.hsdp, shard_group=4)
    assert (hsdp.dp_replicate[0], hsdp.dp_shard[0]) == (2, 4)
    pipe = Layouts.one(dp=2, mbs=1, gas=8, pp=4, tp=2)
    assert SCHEDULES[pipe.schedule[0]] == Schedule.one_f_one_b and pipe.sp[0] == 1
    inter = Layouts.one(dp=2, mbs=1, gas=8, pp=4, vpp=2, tp=2, sp=False)
    assert SCHEDULES[inter.schedule[0]] == Schedule.interleaved_1f1b and inter.sp[0] == 0
    assert SCHEDULES[Layouts.one(dp=2, mbs=1).schedule[0]] is None


@pytest.mark.parametrize("kwargs,field", [
    (dict(dp=8, mbs=1, sharding="hsdp"), "shard_group"),
    (dict(dp=8, mbs=1, sharding="hsdp", shard_group=3), "shard_group"),
    (dict(dp=4, mbs=1, sharding="hsdp", shard_group=4), "shard_group"),
    (dict(dp=8, mbs=1, sharding="fsdp", shard_group=4), "shard_group"),
    (dict(dp=8, mbs=1, schedule="gpipe"), "schedule"),
    (dict(dp=8, mbs=1, vpp=2), "schedule"),
])
def test_one_refuses_what_no_plan_can_hold(kwargs, field):
    with pytest.raises(PlanError) as err:
        Layouts.one(**kwargs)
    assert err.value.field == field


def test_default_shard_group_is_one_node_of_data_parallel_ranks():
    assert default_shard_group(64, 8) == 8
    assert default_shard_group(4, 8) == 2  # at least 2 replicas
    with pytest.raises(PlanError):
        default_shard_group(2, 8)


def test_evaluate_takes_the_ddp_bucket_sizes():
    model, machine = get_model("protein-3.5b"), load_machine("frontier")
    job = make_job(model, machine, 64, 512, None, None, None)
    lay = Layouts.one(dp=64, mbs=8)
    chosen = float(evaluate(model, machine, job, lay).ddp_bucket_mb[0])
    assert chosen in DDP_BUCKETS_MB
    times = {}
    for mb in DDP_BUCKETS_MB:
        ev = evaluate(model, machine, job, lay, ddp_buckets_mb=(mb,))
        assert float(ev.ddp_bucket_mb[0]) == mb
        times[mb] = float(ev.step_time_s[0])
    assert float(evaluate(model, machine, job, lay).step_time_s[0]) == pytest.approx(min(times.values()))
    assert min(times, key=times.get) == chosen
    assert len(set(np.round(list(times.values()), 9))) > 1  # the bucket size matters here
    with pytest.raises(ValueError):
        evaluate(model, machine, job, lay, ddp_buckets_mb=())
