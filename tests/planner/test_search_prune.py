"""search(prune=True): the rows it leaves unscored could not have been finalists (their bounds
hold on every row), and it returns the same finalists, step times and errors as the full search."""

from __future__ import annotations

import numpy as np
import pytest

from machine_models import load_machine
from machine_models.frameworks import load_framework
from planner.cost.bounds import row_bounds
from planner.cost.step import evaluate_space
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.errors import PlanError
from planner.search import search as search_module
from planner.search.search import _finalists, search
from planner.search.space import enumerate_space

FIELDS = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "mbs", "gas", "vpp", "schedule", "sharding", "recompute", "sp")


def _job(model_name, machine_name, nodes, workload="pretrain", framework="exaplan"):
    model, mach = get_model(model_name), load_machine(machine_name)
    return model, mach, make_job(model, mach, nodes * mach.devices_per_node, None, None, None, 1e12, workload,
                                 "in-step", load_framework(framework))


CASES = [("protein-3.5b", "aurora", 512, "pretrain", "exaplan"),  # oneCCL, large: most rows pruned
         ("protein-3.5b", "frontier", 64, "pretrain", "exaplan"),
         ("protein-3.5b", "alps", 16, "dpo", "exaplan"),  # the reference's forward in the step
         ("protein-small", "dgx-h100", 2, "pretrain", "megatron"),
         ("protein-tiny", "local", 1, "pretrain", "exaplan")]  # fewer rows than the first batch


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}-{c[2]}-{c[3]}-{c[4]}")
def test_the_pruned_search_returns_the_full_searchs_finalists(case, monkeypatch):
    name, machine, nodes, workload, framework = case
    model, mach, job = _job(name, machine, nodes, workload, framework)
    monkeypatch.setattr(search_module, "PRUNE_FIRST_ROWS", 1 << 12)  # several batches on every case
    full = search(model, mach, job, nodes, top_k=3)
    pruned = search(model, mach, job, nodes, top_k=3, prune=True)
    for f in FIELDS:
        assert np.array_equal(getattr(full.finalists, f), getattr(pruned.finalists, f)), f
    assert np.array_equal(full.finalist_step_time_s, pruned.finalist_step_time_s)
    assert np.array_equal(full.evaluation.step_time_s, pruned.evaluation.step_time_s)
    assert pruned.fitting is None and full.fitting > 0
    assert pruned.total_layouts == full.total_layouts and pruned.layouts_scored <= full.layouts_scored


def test_a_large_space_is_mostly_left_unscored():
    model, mach, job = _job("protein-3.5b", "aurora", 512)
    full, pruned = search(model, mach, job, 512), search(model, mach, job, 512, prune=True)
    assert pruned.layouts_scored < 0.5 * full.layouts_scored, (pruned.layouts_scored, full.layouts_scored)


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: f"{c[1]}-{c[2]}-{c[3]}-{c[4]}")
def test_the_bounds_hold_on_every_row(case):
    """row_bounds: no row's step time (float64, every algorithm choice) is below its step
    bound, no row's memory below its memory bound."""
    name, machine, nodes, workload, framework = case
    model, mach, job = _job(name, machine, nodes, workload, framework)
    space = enumerate_space(model, job, nodes * mach.devices_per_node)
    step_bound, memory_bound = row_bounds(model, mach, job, space)
    ev = evaluate_space(model, mach, job, space)
    assert (ev.step_time_s >= step_bound * (1 - 1e-12)).all()
    assert (ev.memory.total >= memory_bound * (1 - 1e-12)).all()
    assert (step_bound > 0).all() and np.median(step_bound / ev.step_time_s) > 0.2  # not a vacuous bound


def test_a_model_that_fits_nowhere_gets_the_same_error_pruned():
    model, mach, job = _job("protein-70b", "dgx-h100", 1)
    errors = []
    for prune in (False, True):
        with pytest.raises(PlanError) as err:
            search(model, mach, job, 1, prune=prune)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "fits nowhere" in errors[0]


def test_finalists_break_ties_at_the_edge_by_row():
    key = np.array([5.0, 1.0, 3.0, 3.0, 9.0, 3.0, 2.0], dtype=np.float32)
    assert list(_finalists(key, 3)) == [1, 2, 6]  # 1.0, 2.0 and the first 3.0
    assert list(_finalists(key, 5)) == [1, 2, 3, 5, 6]
    assert list(_finalists(key, 7)) == list(range(7))
    shuffled = np.concatenate([key, np.full(100, 7.0, np.float32)])  # other rows do not move the choice
    assert list(_finalists(shuffled, 3)) == [1, 2, 6]
