"""The seed paper (MProt-DPO, SC24) on its own machines, as a check the model was never fitted
to: with the paper's layout (Megatron-DeepSpeed, data parallel + ZeRO-1, micro-batch 8,
sequence 512, SEED_ACCUMULATION micro-batches per step: planner/seed_runs.py), the predicted
model TFLOP/s per rank lies within the prediction's interval of the published sustained
rate (Table 3) on every machine the table gives."""

from __future__ import annotations

import pytest

from planner.demo import paper_prediction
from planner.seed_runs import SEED_RUNS

PUBLISHED = [r for r in SEED_RUNS if r.published_tflops_per_rank is not None]


@pytest.mark.parametrize("run", PUBLISHED, ids=[r.machine for r in PUBLISHED])
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
