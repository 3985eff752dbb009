"""The frameworks' constraints as data (FrameworkProfile: schedules, even_stages,
pipeline_shardings, replicate_alone): the search's vectorised filter (Space.allowed_by), the
one-layout check of `estimate` (framework_problems) and the exporters' (layout_refusals) agree
row for row, and the search keeps to them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_models import list_frameworks, load_framework, load_machine
from planner.cost.layout import RECOMPUTES, SCHEDULES, SHARDINGS, framework_problems
from planner.inputs import load_model, make_job
from planner.schema.framework import layout_refusals
from planner.search.search import search
from planner.search.space import enumerate_space

FRAMEWORKS = list_frameworks()


def _space(model_name="protein-3.5b", machine_name="dgx-h100", nodes=4, batch=256):
    model, machine = load_model(model_name), load_machine(machine_name)
    world = nodes * machine.devices_per_node
    job = make_job(model, machine, world, batch, None, "bf16", None, "pretrain", "in-step", load_framework("exaplan"))
    return model, enumerate_space(model, job, world)


@pytest.fixture(scope="module")
def space():
    return _space()


@pytest.mark.parametrize("name", FRAMEWORKS)
@settings(max_examples=60, deadline=None)
@given(pick=st.integers(0, 2**31 - 1))
def test_filter_and_checks_agree(space, name, pick):
    model, sp = space
    profile = load_framework(name)
    allowed = sp.allowed_by(profile, model.layers)
    i = pick % len(sp)
    lay = sp.layouts([i])
    r = lay.row(0)
    refusals = layout_refusals(
        profile, layers=model.layers, pp=r["pp"], vpp=r["vpp"], cp=r["cp"], tp=r["tp"], dp_replicate=r["dp_replicate"],
        dp_shard=r["dp_shard"], sharding=SHARDINGS[r["sharding"]], recompute=RECOMPUTES[r["recompute"]],
        schedule=SCHEDULES[r["schedule"]], sp=bool(r["sp"]), precision="bf16")
    assert bool(allowed[i]) == (not refusals) == (not framework_problems(profile, lay, layers=model.layers)), refusals


def test_profiles_state_what_each_framework_runs():
    megatron, deepspeed, titan = (load_framework(n) for n in ("megatron", "deepspeed", "torchtitan"))
    assert megatron.even_stages and "gpipe" not in {s.value for s in megatron.schedules}
    assert deepspeed.pipeline_shardings is not None and {s.value for s in deepspeed.pipeline_shardings} == {"none", "zero1"}
    assert titan.replicate_alone and "zero1" not in {s.value for s in titan.shardings}


@pytest.mark.parametrize("name", ["megatron", "deepspeed", "torchtitan", "maxtext"])
def test_search_proposes_only_what_the_framework_runs(name):
    model, machine = load_model("protein-7b"), load_machine("dgx-h100")
    profile = load_framework(name)
    world = 16 * machine.devices_per_node
    job = make_job(model, profile.applied_to(machine), world, 512, None, "bf16", None, "pretrain", "in-step", profile)
    result = search(model, profile.applied_to(machine), job, 16, top_k=20)
    lay = result.layouts
    assert len(lay) == 20
    for i in range(len(lay)):
        assert framework_problems(profile, lay, i, layers=model.layers) == []


def test_refusals_name_the_plan_field():
    megatron = load_framework("megatron")
    out = layout_refusals(megatron, layers=30, pp=4, vpp=1, cp=1, tp=1, dp_replicate=1, dp_shard=2, sharding="fsdp",
                          recompute="selective-op", schedule="gpipe", sp=False, precision="bf16")
    fields = {p.split(":")[0] for p in out}
    assert fields == {"sharding.kind", "recompute", "pipeline.schedule", "pipeline.stages"}
    titan = load_framework("torchtitan")
    out = layout_refusals(titan, layers=32, pp=1, vpp=1, cp=1, tp=2, dp_replicate=4, dp_shard=1, sharding="none",
                          recompute="none", schedule=None, sp=True, precision="fp16")
    assert [p.split(":")[0] for p in out] == ["job.precision", "sharding.kind"]
    ds = load_framework("deepspeed")
    out = layout_refusals(ds, layers=32, pp=2, vpp=1, cp=2, tp=1, dp_replicate=1, dp_shard=4, sharding="zero2",
                          recompute="none", schedule="1f1b", sp=False, precision="bf16")
    assert [p.split(":")[0] for p in out] == ["mesh.cp", "sharding.kind"]


def test_even_stage_frameworks_get_even_stages():
    """Megatron's plans split the layers evenly even where the head tips CP-SAT's balance (as
    it does exaplan's)."""
    from planner.emit import stage_assignment
    from planner.cost.layout import Layouts

    model, machine = load_model("protein-3.5b"), load_machine("dgx-h100")
    model = model.model_copy(update={"vocab_size": 128000})  # a head heavy enough to unbalance the stages
    for name, expect_even in (("megatron", True), ("exaplan", False)):
        profile = load_framework(name)
        job = make_job(model, machine, 32, 64, None, "bf16", None, "pretrain", "in-step", profile)
        lay = Layouts.one(dp=8, mbs=1, gas=8, tp=1, pp=4, cp=1, sharding="none", recompute="none",
                          schedule="1f1b", vpp=1, sp=False)
        sizes = [s.last_layer - s.first_layer for s in stage_assignment(model, machine, job, lay)]
        assert sum(sizes) == model.layers and len(sizes) == 4
        assert (len(set(sizes)) == 1) == expect_even, (name, sizes)
