"""The planner's memory for one pipeline rank (what `exaplan check` compares torch's with): the
micro-batches each rank holds, and the plan's own prediction at its busiest rank."""

from __future__ import annotations

import numpy as np
import pytest

from planner.cost.layout import SC_GPIPE, SC_INTERLEAVED, SC_1F1B
from planner.cost.memory import GIB, in_flight_on_rank, microbatches_in_flight, microbatches_in_flight_last
from planner.cost.rank import rank_memory
from planner.schema.plan import load_plan
from tests.export.export_plans import ROOT


@pytest.mark.parametrize("schedule", [SC_GPIPE, SC_1F1B, SC_INTERLEAVED])
@pytest.mark.parametrize("pp, gas, vpp", [(4, 16, 2), (8, 8, 2), (16, 128, 1), (4, 3, 1)])
def test_the_ends_of_the_pipeline_hold_what_the_search_counts(schedule, pp, gas, vpp):
    if schedule != SC_INTERLEAVED:
        vpp = 1
    first = in_flight_on_rank(pp, gas, vpp, schedule, 0)
    last = in_flight_on_rank(pp, gas, vpp, schedule, pp - 1)
    assert first == pytest.approx(float(microbatches_in_flight(pp, gas, vpp, schedule)))
    assert last == pytest.approx(float(microbatches_in_flight_last(pp, gas, vpp, schedule)))
    held = [in_flight_on_rank(pp, gas, vpp, schedule, k) for k in range(pp)]
    assert held == sorted(held, reverse=True)  # a later rank never holds more


@pytest.mark.parametrize("name", ["protein-3.5b_aurora_3200n.yaml", "protein-3.5b_alps_2060n.yaml",
                                  "protein-7b_dgx-h100_16n.yaml", "protein-3.5b_aurora_3200n_dpo.yaml"])
def test_the_busiest_rank_is_the_plans_prediction(name):
    plan = load_plan(ROOT / "plans" / name)
    ranks = [rank_memory(plan, k) for k in range(plan.mesh.pp)]
    busiest = max(ranks, key=lambda m: sum(v for k, v in m.items() if k != "reserve"))
    predicted = plan.prediction.memory
    assert sum(busiest.values()) / GIB == pytest.approx(plan.prediction.memory_gib_per_device, rel=0.02)
    assert busiest["optimizer"] / GIB == pytest.approx(predicted.optimizer_gib, rel=0.02)
    assert np.isfinite(list(busiest.values())).all()
