"""`exaplan plan --framework F` never proposes what F cannot run: the search's best layouts for
each export target, on machines of every vendor, for pretraining and DPO, all export (the
exporter refuses what the framework cannot express, so a refusal here is a layout the profile
let through)."""

from __future__ import annotations

import pytest

from export.base import Derived
from export.registry import TARGETS, export_plan
from machine_models import load_framework, load_machine
from planner.emit import build_plan
from planner.inputs import load_model, make_job
from planner.schema.errors import PlanError
from planner.search.search import search

# (model, machine, nodes, global batch, seq len, workload): NVIDIA, AMD and Intel nodes of 8, 8
# and 12 ranks (Aurora's 12 tiles cut a tp of 8 at the node boundary), a GQA model, DPO.
SCENARIOS = [
    ("protein-7b", "dgx-h100", 16, 512, None, "pretrain"),
    ("protein-70b", "frontier", 64, 512, None, "pretrain"),
    ("protein-3.5b", "aurora", 64, 1536, None, "pretrain"),
    ("protein-3.5b", "alps", 32, 256, 1024, "dpo"),
    ("protein-small", "dgx-a100-80gb", 2, 64, 256, "pretrain"),
]
TOP = 8


def _plans(target: str, scenario: int):
    name, machine_name, nodes, batch, seq, workload = SCENARIOS[scenario]
    profile = load_framework(TARGETS[target][1])
    model, machine = load_model(name), profile.applied_to(load_machine(machine_name))
    world = nodes * machine.devices_per_node
    try:
        job = make_job(model, machine, world, batch, seq, "bf16", None, workload, "in-step", profile)
    except PlanError as err:  # a workload or a machine the framework does not train on: refused up front
        libraries = [lib.value for lib in profile.collective_libraries or []]
        assert (err.field == "workload" and workload not in profile.workloads) or (
            err.field == "machine.collective_library" and machine.collective_library.value not in libraries), err
        return []
    result = search(model, machine, job, nodes, top_k=TOP)
    lay, ev = result.layouts, result.evaluation
    return [build_plan(model, machine, job, nodes, lay, ev, i, command="tests/export") for i in range(len(lay))]


@pytest.mark.parametrize("scenario", range(len(SCENARIOS)))
@pytest.mark.parametrize("target", list(TARGETS))
def test_the_search_proposes_only_what_the_target_runs(target, scenario):
    for plan in _plans(target, scenario):
        exported = export_plan(plan, target)  # PlanError here: the profile let through what the target refuses
        assert exported.derived == Derived.of(plan)


def test_a_workload_the_framework_does_not_train_is_refused_up_front():
    """torchtitan trains pretraining only: `plan --framework torchtitan --workload dpo` stops at
    the job, naming the field, before any search."""
    profile = load_framework("torchtitan")
    model, machine = load_model("protein-3.5b"), load_machine("dgx-h100")
    with pytest.raises(PlanError) as err:
        make_job(model, machine, 64, 256, None, "bf16", None, "dpo", "in-step", profile)
    assert err.value.field == "workload" and "torchtitan trains pretrain, not dpo" in str(err.value)
    maxtext = load_framework("maxtext")
    with pytest.raises(PlanError) as err:
        make_job(model, machine, 64, 256, None, "bf16", None, "dpo", "precomputed", maxtext)
    assert err.value.field == "reference"
