"""The seed paper (MProt-DPO, SC24) on its own machines, as a check the model was never fitted
to: with the paper's layout (Megatron-DeepSpeed, data parallel + ZeRO-1, micro-batch 8,
sequence 512, SEED_ACCUMULATION micro-batches per step: planner/seed_runs.py), the predicted
model TFLOP/s per rank lies within the prediction's interval of the published sustained
rate (Table 3).

Since the Max 1550 rows (section K) are fitted, DeepSpeed's overlap and per-step cost are
fitted too and its intervals are leave-one-out ones (about +/-5-11%) instead of the unfitted
+/-30%. Aurora (fitted on 2-node runs of another shape) and Alps (GH200 borrows the H100 fit:
+/-30%) hold; Frontier (+28%) and PDX (+19%) fall outside: the model is too fast for the
paper's runs there. Those two are strict expected failures, so a change that brings them into
their intervals shows up (README, "The seed paper on its own machines")."""

from __future__ import annotations

import pytest

from planner.demo import paper_prediction
from planner.seed_runs import SEED_RUNS

PUBLISHED = [r for r in SEED_RUNS if r.published_tflops_per_rank is not None]
# Outside their leave-one-out intervals (see the module docstring): the model too fast.
TOO_FAST = {"frontier", "pdx"}
CASES = [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason="model too fast for the paper's runs here"))
         if r.machine in TOO_FAST else r for r in PUBLISHED]


@pytest.mark.parametrize("run", CASES, ids=[r.machine for r in PUBLISHED])
def test_published_rate_within_the_interval(run):
    ev, u = paper_prediction(run)
    rate = float(ev.model_tflops_per_device[0])
    lo, hi = u.rate_interval(rate)
    assert ev.memory.fits[0]
    assert lo <= run.published_tflops_per_rank <= hi, (
        f"{run.machine}: predicted {rate:.1f} TFLOP/s per rank ({lo:.1f}-{hi:.1f}, +/-{u.step_time:.0%} in step time: "
        f"{u.basis}), published {run.published_tflops_per_rank:g}")


def test_the_table_has_the_four_machines():
    assert {r.machine for r in PUBLISHED} == {"aurora", "alps", "frontier", "pdx"}


@pytest.mark.parametrize("run", [r for r in PUBLISHED if r.machine in TOO_FAST], ids=sorted(TOO_FAST))
def test_where_it_misses_the_model_is_too_fast_by_at_most_a_third(run):
    """The known misses stay bounded: too fast, by less than a third."""
    ev, _ = paper_prediction(run)
    rate = float(ev.model_tflops_per_device[0])
    assert run.published_tflops_per_rank < rate < 1.33 * run.published_tflops_per_rank
