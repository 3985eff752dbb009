"""Plans to export, for the tests of every target: the committed plans, and plans of layouts
drawn by hypothesis from the legal layouts each framework runs (the search's own space,
planner.search.space, filtered by the framework's profile as the search filters it), built by
the planner's own emitter as `exaplan estimate -o` builds them."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from machine_models import load_framework, load_machine
from planner.cost.step import evaluate
from planner.emit import build_plan
from planner.inputs import load_model, make_job
from planner.schema.framework import job_refusals
from planner.schema.plan import Plan, load_plan
from planner.search.space import enumerate_space

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "plans").rglob("*.yaml"))

# (model, machine, nodes, global batch, seq len, precision, workload): jobs of the sizes
# the frameworks are run at, small and large worlds, GQA and not, pretrain and DPO.
SCENARIOS = [
    ("protein-7b", "dgx-h100", 16, 512, None, "bf16", "pretrain"),
    ("protein-70b", "frontier", 64, 512, None, "bf16", "pretrain"),
    ("protein-3.5b", "aurora", 64, 1536, None, "bf16", "pretrain"),
    ("protein-3.5b", "alps", 32, 256, 1024, "bf16", "dpo"),
    ("protein-small", "dgx-a100-80gb", 2, 64, 256, "fp16", "pretrain"),
    ("protein-tiny", "dgx-a100-40gb", 1, 16, 128, "fp32", "pretrain"),
]


@functools.lru_cache(maxsize=64)
def _space(framework: str, scenario: int):
    name, machine_name, nodes, batch, seq, precision, workload = SCENARIOS[scenario]
    model, machine = load_model(name), load_machine(machine_name)
    profile = load_framework(framework)
    machine = profile.applied_to(machine)
    world = nodes * machine.devices_per_node
    if precision not in {p.value for p in profile.precisions} or job_refusals(profile, workload, "in-step",
                                                                                        machine.collective_library.value):
        return None
    job = make_job(model, machine, world, batch, seq, precision, None, workload, "in-step", profile)
    space = enumerate_space(model, job, world)
    allowed = np.flatnonzero(space.allowed_by(profile, model.layers, ranks_per_node=machine.devices_per_node,
                                              device_name=machine.device_name, tied_embeddings=model.tied_embeddings,
                                              workload=workload))
    return (model, machine, job, nodes, space, allowed) if len(allowed) else None


def plan_of(framework: str, scenario: int, pick: int) -> Plan | None:
    """The plan of one layout `framework` runs in a scenario (None where it runs none)."""
    found = _space(framework, scenario)
    if found is None:
        return None
    model, machine, job, nodes, space, allowed = found
    lay = space.layouts(allowed[[pick % len(allowed)]])
    return build_plan(model, machine, job, nodes, lay, evaluate(model, machine, job, lay), 0, command="tests/export")


def generated_plans(framework: str):
    """A hypothesis strategy of plans of layouts that `framework` runs."""
    usable = [i for i in range(len(SCENARIOS)) if _space(framework, i) is not None]
    return st.builds(lambda s, k: plan_of(framework, s, k), st.sampled_from(usable), st.integers(0, 2**31 - 1))


def committed_plans() -> list[tuple[str, Plan]]:
    return [(str(p.relative_to(ROOT)), load_plan(p)) for p in COMMITTED]
