"""Intervals from the leave-one-out errors (machine_models/uncertainty.py): the larger of the
device kind's and the framework's p80, and the stated default wherever a half of the
prediction rests on figures nothing was fitted to."""

from __future__ import annotations

import pytest
import yaml

from machine_models import load_framework, load_machine
from machine_models.uncertainty import UNFITTED_STEP_TIME, uncertainty_of

H100 = "NVIDIA H100 SXM5"


def _write(tmp_path, frameworks):
    path = tmp_path / "uncertainty.yaml"
    path.write_text(yaml.safe_dump({"device_kinds": {H100: {"rows": 13, "median": 0.04, "p80": 0.09, "max": 0.2}},
                                    "frameworks": frameworks}))
    return path


def test_the_larger_p80_of_device_kind_and_framework(tmp_path):
    path = _write(tmp_path, {"megatron": {"rows": 17, "median": 0.02, "p80": 0.05, "max": 0.19},
                             "exaplan": {"rows": 14, "median": 0.06, "p80": 0.12, "max": 0.16}})
    machine = load_machine("dgx-h100")
    meg = uncertainty_of(machine, load_framework("megatron"), path=path)
    ex = uncertainty_of(machine, load_framework("exaplan"), path=path)
    assert (meg.step_time, meg.fitted) == (0.09, True)
    assert (ex.step_time, ex.fitted) == (0.12, True)


def test_a_framework_with_held_figures_gets_the_unfitted_default(tmp_path):
    """Its rows could not fit overlap or per-step cost (fit_published.IDENTIFIABLE): their
    small leave-one-out errors say nothing of predictions that lean on those guesses."""
    path = _write(tmp_path, {"deepspeed": {"rows": 8, "median": 0.04, "p80": 0.05, "max": 0.11,
                                           "held": ["overlap_dp", "step_overhead_s"]}})
    u = uncertainty_of(load_machine("dgx-h100"), load_framework("deepspeed"), path=path)
    assert u.step_time == UNFITTED_STEP_TIME and not u.fitted
    assert "overlap_dp, step_overhead_s not fitted" in u.basis
    lo, hi = u.rate_interval(100.0)
    assert lo == pytest.approx(100 / 1.3) and hi == pytest.approx(100 / 0.7)


def test_shipped_deepspeed_profile_is_fitted():
    """Since the Max 1550 rows (2 s steps) are fitted, DeepSpeed's overlap and per-step cost
    are seen by its rows and fitted: the seed paper's predictions carry leave-one-out
    intervals, no held figures."""
    u = uncertainty_of(load_machine("aurora"), load_framework("deepspeed"))
    assert u.fitted and 0.0 < u.step_time < UNFITTED_STEP_TIME
    assert "not fitted" not in u.basis
