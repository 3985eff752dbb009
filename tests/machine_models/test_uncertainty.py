"""Intervals from the leave-one-out errors (machine_models/uncertainty.py): the larger of the
device kind's and the framework's p80, and the stated default wherever a half of the
prediction rests on figures nothing was fitted to."""

from __future__ import annotations

import numpy as np
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


def test_held_out_errors_are_pooled_into_their_profile_and_fitted_kind(tmp_path):
    """write_uncertainty pools held-out errors (section M: exaplan's runs on GPUs) with the
    leave-one-out ones: into their profile always, into their device kind only where it has
    leave-one-out rows (a copied kind keeps its stated default); the basis says how many."""

    from calibration.fit_files import write_uncertainty

    loo = [(H100, "exaplan", e) for e in (0.01, -0.02, 0.03, -0.04, 0.05)] + [(H100, "megatron", 0.02)]
    held_out = [(H100, "exaplan", -0.3), ("NVIDIA H200 SXM", "exaplan", 0.06)]
    path = tmp_path / "uncertainty.yaml"
    write_uncertainty(loo, path=path, held_out=held_out)
    data = yaml.safe_load(path.read_text())
    ex, dev = data["frameworks"]["exaplan"], data["device_kinds"][H100]
    assert (ex["rows"], ex["held_out_rows"]) == (7, 2)
    assert (dev["rows"], dev["held_out_rows"]) == (7, 1)
    assert "NVIDIA H200 SXM" not in data["device_kinds"]
    assert "held_out_rows" not in data["frameworks"]["megatron"]
    # the ceil(8 x 0.8) = 7th smallest of 7: the largest, 0.3 (np.quantile's 80th percentile: 0.058)
    assert ex["p80"] == pytest.approx(0.3)
    u = uncertainty_of(load_machine("dgx-h100"), load_framework("exaplan"), path=path)
    assert "exaplan (7 rows, 2 held out)" in u.basis and "(7 rows, 1 held out)" in u.basis
    # Held-out errors smaller than the leave-one-out ones never narrow the band
    write_uncertainty(loo, path=path, held_out=[(H100, "exaplan", 0.0)] * 10)
    data = yaml.safe_load(path.read_text())
    assert data["frameworks"]["exaplan"]["held_out_rows"] == 10
    assert data["frameworks"]["exaplan"]["p80"] == pytest.approx(0.05)  # the 5 leave-one-out rows' bound: their largest


def test_the_shipped_exaplan_band_counts_its_own_gpu_runs():
    """The shipped uncertainty pools section M's held-out errors into the exaplan profile, not
    the JAX backend's (five runs on one GPU: the jax profile keeps its stated default)."""
    from calibration.published_own import own_gpu_runs

    torch_runs = [r for r in own_gpu_runs() if not r.jax_backend]
    assert len(torch_runs) < len(own_gpu_runs())
    u = uncertainty_of(load_machine("dgx-h100"), load_framework("exaplan"))
    assert f"{len(torch_runs)} held out" in u.basis
    assert not uncertainty_of(load_machine("dgx-h100"), load_framework("jax")).fitted


def test_the_band_is_the_conformal_order_statistic():
    """conformal_bound: the ceil((n + 1) x 0.8)-th smallest |error|, which covers at least 80% of
    a new exchangeable error; np.quantile's 80th percentile of a few rows covers less."""
    from machine_models.uncertainty import conformal_bound

    errors = [-0.01, 0.02, 0.03, -0.04, 0.05, 0.06, 0.07, -0.08, 0.09, 0.10, 0.11, 0.12, -0.20]
    assert conformal_bound(errors) == pytest.approx(0.12)  # n = 13: the 12th smallest
    assert conformal_bound(errors[:9]) == pytest.approx(0.08)  # n = 9: the 8th
    assert conformal_bound(errors[:3]) == pytest.approx(0.03)  # n = 3: ceil(3.2) = 4 > 3, the largest
    assert conformal_bound(errors) > float(np.quantile(np.abs(errors), 0.8))
    # The promise, checked by simulation: over many draws of 13 errors and one more, the new
    # one lies within the bound at least 80% of the time (np.quantile's: about 75%).
    rng = np.random.default_rng(0)
    draws = rng.standard_t(3, size=(20000, 14))
    inside = np.mean([abs(d[-1]) <= conformal_bound(d[:-1]) for d in draws])
    naive = np.mean([abs(d[-1]) <= np.quantile(np.abs(d[:-1]), 0.8) for d in draws])
    assert 0.80 <= inside <= 0.88 and naive < 0.79


def test_a_machine_calibrated_by_its_own_runs_carries_its_own_band(tmp_path):
    """`calibrate --from-runs` writes the band its leave-one-layout-out errors give
    (planner/schema/band.py). It stands in for the device kind's half of the interval (the
    machine's figures come from its own runs, not the kind's rows) even where the kind has no
    rows at all; the framework's half stays. Plans do not carry the field, their intervals do."""
    from planner.schema.band import StepTimeBand

    path = _write(tmp_path, {"exaplan": {"rows": 14, "median": 0.03, "p80": 0.05, "max": 0.1},
                             "megatron": {"rows": 17, "median": 0.05, "p80": 0.12, "max": 0.19}})
    band = StepTimeBand(half_width=0.07, runs=5, basis="a, b")
    h100 = load_machine("dgx-h100")
    own = uncertainty_of(h100.model_copy(update={"step_time_band": band}), load_framework("exaplan"), path=path)
    assert (own.step_time, own.fitted) == (0.07, True) and "own calibration (leave-one-layout-out over 5 layouts: a, b)" in own.basis
    assert uncertainty_of(h100, load_framework("exaplan"), path=path).step_time == 0.09  # the kind's p80 without it
    meg = uncertainty_of(h100.model_copy(update={"step_time_band": band}), load_framework("megatron"), path=path)
    assert meg.step_time == 0.12 and "megatron (17 rows)" in meg.basis  # the larger half
    cpu = load_machine("local")
    assert uncertainty_of(cpu, path=path).step_time == UNFITTED_STEP_TIME
    wide = uncertainty_of(cpu.model_copy(update={"step_time_band": band.model_copy(update={"half_width": 0.4})}), path=path)
    assert (wide.step_time, wide.fitted) == (0.4, True)
    assert "step_time_band" not in h100.model_copy(update={"step_time_band": band}).model_dump()
    with pytest.raises(ValueError, match="half_width"):
        StepTimeBand(half_width=-0.1, runs=4)


def test_a_cpu_says_plainly_whether_it_was_calibrated(tmp_path):
    """A CPU has no published rows: its interval is the stated default, and the basis says
    that `exaplan calibrate` has not measured it yet, or measured kernels only."""
    from machine_models.loader import detect_local_machine

    path = _write(tmp_path, {"exaplan": {"rows": 14, "median": 0.03, "p80": 0.05, "max": 0.1}})
    cpu = detect_local_machine(2)
    fresh = uncertainty_of(cpu, path=path)
    assert (fresh.step_time, fresh.fitted) == (UNFITTED_STEP_TIME, False)
    assert "uncalibrated" in fresh.basis and "until `exaplan calibrate` measures this machine" in fresh.basis
    measured = uncertainty_of(cpu.model_copy(update={"calibrated": True}), path=path)
    assert "calibrated by microbenchmarks, no training runs measured" in measured.basis
    assert "uncalibrated" not in measured.basis and measured.step_time == UNFITTED_STEP_TIME
