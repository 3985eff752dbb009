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


def test_a_profile_takes_its_base_fields(tmp_path):
    """`base: NAME` gives a profile the other's fields, its own replacing them; an unknown base or
    a cycle is refused naming the profile's field."""
    from machine_models.frameworks import FRAMEWORKS_FILE
    from planner.schema.errors import PlanError

    zero, ds = load_framework("deepspeed-zero"), load_framework("deepspeed")
    assert (zero.overlap_dp, zero.step_overhead_s, zero.shardings) == (ds.overlap_dp, ds.step_overhead_s, ds.shardings)
    assert ds.tensor_parallel and ds.pipeline_parallel and not zero.tensor_parallel and not zero.pipeline_parallel
    assert zero.dpo_shardings is None and ds.dpo_shardings is not None
    bad = tmp_path / "frameworks.yaml"
    bad.write_text(FRAMEWORKS_FILE.read_text() + "\nloop-a: {base: loop-b}\nloop-b: {base: loop-a}\norphan: {base: nope}\n")
    for name, why in (("loop-a", "a cycle"), ("orphan", "not a profile")):
        with pytest.raises(PlanError) as err:
            load_framework(name, path=bad)
        assert why in str(err.value) and ".base:" in str(err.value)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_the_new_constraints_agree_row_for_row(name):
    """On a 12-rank-a-node machine (Aurora: degrees the node boundary cuts), DPO, a tied model:
    the vectorised filter and the one-layout check agree on every row."""
    model, machine = load_model("protein-small"), load_machine("aurora")
    model = model.model_copy(update={"tied_embeddings": True})
    profile = load_framework(name)
    world = 4 * machine.devices_per_node
    job = make_job(model, machine, world, 96, 256, None, None, "pretrain", "in-step", load_framework("exaplan"))
    sp = enumerate_space(model, job, world)
    kw = dict(ranks_per_node=machine.devices_per_node, device_name=machine.device_name, tied_embeddings=True, workload="dpo")
    allowed = sp.allowed_by(profile, model.layers, **kw)
    rows = np.random.default_rng(0).choice(len(sp), size=min(400, len(sp)), replace=False)
    lay = sp.layouts(rows)
    for j, i in enumerate(rows):
        assert bool(allowed[i]) == (not framework_problems(profile, lay, j, layers=model.layers, **kw)), (name, lay.row(j))


def test_maxtext_splits_at_the_node_and_torchtitan_unties_under_pp():
    maxtext, titan = load_framework("maxtext"), load_framework("torchtitan")
    common = dict(layers=24, vpp=1, cp=1, sharding="fsdp", recompute="full", schedule="gpipe", sp=True, precision="bf16")
    # 12 ranks a node: tp 8 leaves no in-node factor; tp 4 x dp_shard 3 splits cleanly
    assert any(p.startswith("mesh.tp:") for p in layout_refusals(
        maxtext, pp=1, tp=8, dp_replicate=1, dp_shard=6, ranks_per_node=12, **common))
    assert layout_refusals(maxtext, pp=1, tp=4, dp_replicate=1, dp_shard=12, ranks_per_node=12, **common) == []
    assert any(p.startswith("grad_accumulation_steps:") for p in layout_refusals(
        maxtext, pp=4, tp=1, dp_replicate=1, dp_shard=3, gas=6, ranks_per_node=12, **common))
    assert any(p.startswith("recompute:") for p in layout_refusals(
        maxtext, pp=1, tp=1, dp_replicate=1, dp_shard=12, device_name="AMD MI250X GCD",
        **{**common, "recompute": "selective-op"}))
    assert any(p.startswith("model.tied_embeddings:") for p in layout_refusals(
        titan, pp=2, tp=1, dp_replicate=1, dp_shard=4, tied_embeddings=True, **{**common, "schedule": "1f1b"}))
