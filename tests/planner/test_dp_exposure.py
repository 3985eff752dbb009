"""The exposed data-parallel traffic's contention form (planner/cost/step.py): traffic that does
not fit under the compute it overlaps is exposed whole, and of what does, the fraction
1 - overlap.dp, exposed = max(T - overlap.dp x min(T, C), floor). Before 2026-11-27 the
window was discounted instead (max(T - overlap.dp x C, floor)), which at overlap 0.5 hides
half the window whatever the traffic: it would expose nothing of traffic under half its
window, where this form exposes half of it."""

from __future__ import annotations

import numpy as np
import pytest

from machine_models import load_machine
from planner.cost.layout import Layouts
from planner.cost.step import _interfered, evaluate
from planner.presets import get_model
from planner.schema.figures import with_figures
from planner.schema.specs import Precision, TrainingJob


def test_the_form():
    traffic, window = np.array([1.0, 3.0, 2.0]), np.array([3.0, 1.0, 2.0])
    assert _interfered(traffic, window, 0.4) == pytest.approx([0.6, 2.6, 1.2])
    assert _interfered(traffic, window, 0.0) == pytest.approx(traffic)  # nothing hidden
    assert _interfered(traffic, window, 1.0) == pytest.approx([0.0, 2.0, 0.0])  # what exceeds the window


def test_traffic_under_its_window_shows_in_proportion():
    """protein-3.5b under DDP on 4 DGX H100 nodes, one micro-batch of 8 a step: the gradient
    allreduce fits under the backward, so at overlap 0.5 half of it shows, at 1 only its last
    bucket, at 0 all of it."""
    model, machine = get_model("protein-3.5b"), load_machine("dgx-h100")
    job = TrainingJob(global_batch=256, seq_len=512, precision=Precision.bf16)
    lay = Layouts.one(dp=32, mbs=8)
    dp = {ov: float(evaluate(model, with_figures(machine, {"overlap_dp": ov}), job, lay).dp_s[0]) for ov in (0.0, 0.5, 1.0)}
    ev = evaluate(model, machine, job, lay)
    assert dp[0.0] < 2.0 / 3.0 * float(ev.compute_s[0])  # under the backward's window
    assert dp[1.0] < 0.1 * dp[0.0]  # its floor: the last bucket
    assert dp[0.5] == pytest.approx(0.5 * dp[0.0], rel=0.02)
