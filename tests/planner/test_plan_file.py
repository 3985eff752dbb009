"""The plan file: every emitted plan is legal, survives YAML and JSON round trips, refuses
tampering, and is written atomically. Property tests over random small models, machines,
node counts and global batches (a few dozen examples each; no deadline: the first example
pays for importing OR-Tools)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from machine_models import detect_local_machine, load_machine
from planner.emit import build_plan
from planner.schema.errors import PlanError
from planner.schema.plan import SCHEMA_VERSION, Plan, content_hash, dumps_plan, load_plan, plan_problems, write_plan
from planner.presets import get_model
from planner.cost.step import evaluate
from planner.search.search import search
from planner.search.space import enumerate_space
from planner.schema.specs import ModelSpec, TrainingJob

MACHINES = {name: load_machine(name) for name in ("dgx-h100", "frontier", "aurora", "alps")}
MACHINES["local"] = detect_local_machine(2)
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def models(draw) -> ModelSpec:
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0]))
    head_dim = draw(st.sampled_from([8, 16, 32]))
    return ModelSpec(
        name="prop", layers=draw(st.integers(1, 8)), hidden=heads * head_dim, heads=heads, kv_heads=kv_heads,
        ffn_hidden=draw(st.sampled_from([24, 64, 96, 256])), seq_len=draw(st.sampled_from([16, 30, 64, 128])),
        activation=draw(st.sampled_from(["gelu", "swiglu"])), norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["rope", "learned"])), tied_embeddings=draw(st.booleans()),
    )


@st.composite
def planned(draw) -> list[Plan]:
    """Search a random small job and emit a plan for each of its top layouts."""
    model = draw(models())
    machine_name = draw(st.sampled_from(sorted(MACHINES)))
    machine = MACHINES[machine_name]
    nodes = 1 if machine_name == "local" else draw(st.integers(1, 3))
    world = nodes * machine.devices_per_node
    gb = draw(st.one_of(st.integers(1, 4).map(lambda k: k * world), st.integers(1, 96)))
    precision = "fp32" if machine_name == "local" else draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    job = TrainingJob(global_batch=gb, seq_len=model.seq_len, precision=precision, token_budget=1e8)
    try:
        res = search(model, machine, job, nodes, top_k=3)
    except PlanError as e:
        # Only an arbitrary batch may have no layout; small models always fit.
        assert e.field == "global_batch", str(e)
        assume(False)
    plans = [build_plan(model, machine, job, nodes, res.layouts, res.evaluation, i, command="exaplan plan (test)")
             for i in range(len(res.layouts))]
    # Plus any legal layout (pipelines, interleaving, hsdp, cp...), as `estimate -o` emits them.
    space = enumerate_space(model, job, world)
    row = draw(st.integers(0, len(space) - 1), label="row")
    lay = space.layouts([row])
    plans.append(build_plan(model, machine, job, nodes, lay, evaluate(model, machine, job, lay), 0, command="exaplan estimate (test)"))
    return plans


def leaves(node, path=()):
    """(path, value) of every scalar in a nested dict/list."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))
    else:
        yield path, node


def tampered(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 1.0
    if isinstance(value, str):
        return value + "x"
    return 1  # None


def set_path(data, path, value):
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


# --- properties ---------------------------------------------------------------------------------


@PROPERTY
@given(planned())
def test_emitted_plans_are_legal(plans):
    for plan in plans:
        assert plan_problems(plan) == []
        again = Plan.model_validate(plan.model_dump(mode="json"))  # re-validation passes
        assert again == plan
        assert plan.provenance.content_hash == content_hash(plan)
        assert plan.world_size == plan.mesh.world_size
        assert plan.micro_batch_size * plan.grad_accumulation_steps * plan.mesh.dp == plan.job.global_batch
        if plan.mesh.pp > 1:
            st_ = plan.pipeline.stages
            assert [s.first_layer for s in st_[1:]] == [s.last_layer for s in st_[:-1]]
            assert all(s.last_layer > s.first_layer for s in st_)
        assert plan.prediction.step_time_s > 0
    assert all(p.prediction.fits for p in plans[:-1])  # the searched ones


@PROPERTY
@given(planned())
def test_plans_round_trip_through_yaml_and_json(plans):
    with tempfile.TemporaryDirectory() as d:
        for k, plan in enumerate(plans):
            for suffix in ("yaml", "json"):
                path = Path(d) / f"plan{k}.{suffix}"
                write_plan(plan, path)
                loaded = load_plan(path)
                assert loaded == plan
                assert loaded.provenance.content_hash == plan.provenance.content_hash
                assert dumps_plan(loaded, suffix) == path.read_text()
        assert sorted(os.listdir(d)) == sorted(f"plan{k}.{s}" for k in range(len(plans)) for s in ("yaml", "json"))
    # The JSON file is plain JSON; the YAML one names the regenerating command.
    text = dumps_plan(plans[0], "json")
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert "# Regenerate with: exaplan plan (test)" in dumps_plan(plans[0], "yaml")


@PROPERTY
@given(planned(), st.data())
def test_any_edit_is_refused(plans, data):
    plan = plans[0]
    body = yaml.safe_load(dumps_plan(plan, "yaml"))
    all_leaves = list(leaves(body))
    path, value = data.draw(st.sampled_from(all_leaves), label="leaf")
    set_path(body, path, tampered(value))
    fmt = data.draw(st.sampled_from(["yaml", "json"]), label="format")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / f"edited.{fmt}"
        f.write_text(json.dumps(body) if fmt == "json" else yaml.safe_dump(body, sort_keys=False))
        with pytest.raises(PlanError) as err:
            load_plan(f)
    try:
        Plan.model_validate(body)
        still_valid = True
    except Exception:
        still_valid = False
    if still_valid:
        # A consistent edit can only be caught by the hash.
        assert "content hash does not match" in str(err.value), (path, str(err.value))
    assert str(f) in str(err.value)


# --- fixed cases --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def a_plan() -> Plan:
    model, machine = get_model("protein-tiny"), MACHINES["dgx-h100"]
    job = TrainingJob(global_batch=16, seq_len=128)
    res = search(model, machine, job, 1, top_k=1)
    return build_plan(model, machine, job, 1, res.layouts, res.evaluation, 0, command="exaplan plan (fixture)")


def test_editing_the_prediction_is_caught_by_the_hash(a_plan, tmp_path):
    p = tmp_path / "p.yaml"
    write_plan(a_plan, p)
    text = p.read_text()
    old = f"step_time_s: {a_plan.prediction.step_time_s!r}"
    assert old in text
    p.write_text(text.replace(old, "step_time_s: 0.001"))
    with pytest.raises(PlanError, match="content hash does not match"):
        load_plan(p)
    # Comments are not content: editing the header is allowed.
    p.write_text(text.replace("# Regenerate with", "# Made again with"))
    assert load_plan(p) == a_plan


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("schema_version: 1\nmodel: [unclosed\n")
    with pytest.raises(PlanError, match="malformed YAML"):
        load_plan(p)


def test_missing_file(tmp_path):
    with pytest.raises(PlanError, match="cannot read plan file") as err:
        load_plan(tmp_path / "nope.yaml")
    assert err.value.field == str(tmp_path / "nope.yaml")


@pytest.mark.parametrize("version", [0, 3, "2", None])
def test_wrong_schema_version(a_plan, tmp_path, version):
    body = a_plan.model_dump(mode="json")
    if version is None:
        del body["schema_version"]
    else:
        body["schema_version"] = version
    p = tmp_path / "p.json"
    p.write_text(json.dumps(body))
    with pytest.raises(PlanError, match="schema_version"):
        load_plan(p)


def test_plan_of_an_older_schema_says_what_changed_and_how_to_regenerate(a_plan, tmp_path):
    """A schema-1 plan (old bandwidth names, rank_mapping) is refused with the regenerating
    command from its own provenance."""
    body = a_plan.model_dump(mode="json")
    body["schema_version"] = 1
    body["machine"]["nic_gbps"] = body["machine"].pop("nic_gbit_s")
    body["rank_mapping"] = {"axis_order": ["pp", "dp_replicate", "dp_shard", "cp", "tp"], "ranks": []}
    p = tmp_path / "old.yaml"
    p.write_text(yaml.safe_dump(body))
    with pytest.raises(PlanError) as err:
        load_plan(p)
    msg = str(err.value)
    assert "schema_version 1 was written by an older exaplan" in msg
    assert "nic_gbps -> nic_gbit_s" in msg and "rank_mapping" in msg
    assert msg.endswith(f"regenerate it: {a_plan.provenance.command}")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just a string\n", "42\n"])
def test_not_a_mapping(tmp_path, text):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(PlanError):
        load_plan(p)


def test_missing_and_unknown_fields_are_named(a_plan, tmp_path):
    body = a_plan.model_dump(mode="json")
    del body["mesh"]
    body["extra_knob"] = 3
    p = tmp_path / "p.json"
    p.write_text(json.dumps(body))
    with pytest.raises(PlanError) as err:
        load_plan(p)
    assert "mesh" in str(err.value) and "extra_knob" in str(err.value)


def test_inconsistent_plan_is_refused_before_the_hash(a_plan, tmp_path):
    body = a_plan.model_dump(mode="json")
    body["micro_batch_size"] += 1  # mbs x gas x dp no longer equals the global batch
    p = tmp_path / "p.json"
    p.write_text(json.dumps(body))
    with pytest.raises(PlanError, match="global_batch"):
        load_plan(p)


def test_write_plan_leaves_no_temporary_file(a_plan, tmp_path):
    write_plan(a_plan, tmp_path / "plan.yaml")
    with pytest.raises(PlanError, match="exists: give --force"):
        write_plan(a_plan, tmp_path / "plan.yaml")  # over an existing file: only when forced
    write_plan(a_plan, tmp_path / "plan.yaml", force=True)
    write_plan(a_plan, tmp_path / "plan.json")
    assert sorted(os.listdir(tmp_path)) == ["plan.json", "plan.yaml"]
    assert load_plan(tmp_path / "plan.json") == load_plan(tmp_path / "plan.yaml") == a_plan


def test_failed_write_keeps_the_old_file_and_no_temporary(a_plan, tmp_path, monkeypatch):
    target = tmp_path / "plan.yaml"
    target.write_text("old contents\n")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(PlanError, match="cannot write the plan") as err:
        write_plan(a_plan, target, force=True)
    assert err.value.field == str(target)
    assert os.listdir(tmp_path) == ["plan.yaml"]
    assert target.read_text() == "old contents\n"


def test_plan_coordinates_are_row_major_tp_fastest(a_plan):
    plan = a_plan.model_copy(deep=True)
    degrees = plan.mesh.degrees
    seen = {tuple(plan.coordinates(r).values()) for r in range(plan.world_size)}
    assert len(seen) == plan.world_size  # a bijection onto the mesh
    if plan.mesh.tp > 1:
        assert plan.coordinates(1)["tp"] == 1
    assert all(0 <= c < d for r in range(plan.world_size) for c, d in zip(plan.coordinates(r).values(), degrees))
    assert plan.placement(plan.ranks_per_node) == (1, 0) or plan.nodes == 1
