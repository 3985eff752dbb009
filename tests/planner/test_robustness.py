"""The robustness draws (planner/search/robustness.py) run as one evaluation of finalists x
draws rows; each draw must rank the finalists exactly as evaluating that draw's machine alone
does."""

from __future__ import annotations

import numpy as np
import pytest

from machine_models import load_machine
from machine_models.frameworks import load_framework
from planner.cost.layout import Space
from planner.cost.step import evaluate_space
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.figures import BOUNDS, figures_of, framework_machine, with_figures
from planner.search.robustness import DRAWN_FIGURES, P80_OF_ABS_NORMAL, ranking_robustness
from planner.search.search import search


def _one_draw_at_a_time(model, machine, job, finalists, step_time_s, half_width, draws, seed=0):
    """The definition: per draw, a machine with that draw's figures, its finalists ranked."""
    rng = np.random.default_rng(seed)
    machine = framework_machine(machine, job.framework)
    job = job.model_copy(update={"framework": job.framework.model_copy(
        update={"overlap_dp": None, "step_overhead_s": None, "cpu_figures": {}})})
    space = Space.of(finalists)
    offset = step_time_s - evaluate_space(model, machine, job, space, detail=False, memory=False).step_time_s
    base, sigma = figures_of(machine, DRAWN_FIGURES), half_width / P80_OF_ABS_NORMAL
    wins = np.zeros(len(finalists), dtype=int)
    for _ in range(draws):
        drawn = {k: min(max(v * float(np.exp(sigma * rng.standard_normal())), BOUNDS[k][0]), BOUNDS[k][1])
                 for k, v in base.items()}
        step = evaluate_space(model, with_figures(machine, drawn), job, space, detail=False, memory=False).step_time_s
        wins[int(np.argmin(step + offset))] += 1
    return {int(i): int(n) for i, n in enumerate(wins) if n}


@pytest.mark.parametrize("model_name, machine_name, nodes, framework, workload", [
    ("protein-3.5b", "frontier", 64, "exaplan", "pretrain"),
    ("protein-7b", "dgx-h100", 32, "megatron", "pretrain"),
    ("protein-3.5b", "lumi", 16, "deepspeed", "dpo"),
    ("protein-3.5b", "frontier", 64, "deepspeed", "pretrain"),
    ("protein-small", "local", 1, "torchtitan", "pretrain"),
])
def test_draws_at_once_win_as_draws_one_at_a_time(model_name, machine_name, nodes, framework, workload):
    model, machine = get_model(model_name), load_machine(machine_name)
    job = make_job(model, machine, nodes * machine.devices_per_node, None, None, None, None, workload=workload,
                   framework=load_framework(framework))
    res = search(model, machine, job, nodes)
    half_width = 0.15  # wide enough that several finalists win some draws
    got = ranking_robustness(model, machine, job, res.finalists, res.finalist_step_time_s, half_width, draws=60)
    want = _one_draw_at_a_time(model, machine, job, res.finalists, res.finalist_step_time_s, half_width, 60)
    assert got.winners == want and got.draws == 60 and got.stays_first == want.get(0, 0) / 60


def test_some_case_has_several_winners():
    """The comparison above is not vacuous: under wide draws the first choice loses some."""
    model, machine = get_model("protein-3.5b"), load_machine("frontier")
    job = make_job(model, machine, 64 * 8, None, None, None, None, framework=load_framework("deepspeed"))
    res = search(model, machine, job, 64)
    got = ranking_robustness(model, machine, job, res.finalists, res.finalist_step_time_s, 0.15, draws=60)
    assert len(got.winners) > 1 and got.stays_first < 1.0
