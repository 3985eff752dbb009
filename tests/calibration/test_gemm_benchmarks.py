"""Published GEMM microbenchmarks in the fit of the published runs (calibration/gemm_benchmarks.py):
one weighted log error per benchmarked device kind, in the fit's residuals, and the shipped
figures honour it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration import gemm_benchmarks as gb
from calibration.fit_published import StepTimes, _Problem, machines_of
from calibration.published import published_runs
from machine_models import load_machine

MAX1550 = "Intel Max 1550 tile"


def test_residual_is_the_curves_log_error_at_the_benchmarks_size():
    figures = {"peak_fraction": 0.6, "half_dim": 800.0}
    bench = gb.GEMM_BENCHMARKS[MAX1550]
    res = gb.residuals({MAX1550: figures, "NVIDIA H100 SXM5": figures}, {MAX1550: {"bf16": 367.0}})
    expected = math.log(0.6 * 8192 / (8192 + 800.0) * 367.0 / bench.tflops)
    assert res == [pytest.approx(gb.WEIGHT * expected)]  # one entry: H100 has no benchmark listed
    assert bench.size == 8192 and bench.precision == "bf16"


def test_the_fit_counts_the_benchmark_as_one_more_row():
    """On the Aurora rows (section K) the fit's residuals are: one log error per row, one prior
    term per figure, and the Max 1550 benchmark last."""
    runs = [r for r in published_runs() if r.id.startswith("K-")]
    p = _Problem.of(runs, StepTimes(machines_of(runs)))
    x = p.x0()
    res = p.residuals(x)
    assert len(res) == len(runs) + len(p.params) + 1
    fit = p.unpack(x)
    expected = gb.curve_tflops(fit.device[MAX1550], 367.0, 8192) / gb.GEMM_BENCHMARKS[MAX1550].tflops
    assert res[-1] == pytest.approx(gb.WEIGHT * np.log(expected))


def test_shipped_max1550_curve_agrees_with_the_benchmark():
    """The refit honours the benchmark: the shipped Max 1550 curve at 8192 within 5% of ALCF's
    measured rate (without it the fit had drifted to 157 TFLOP/s, 24% under)."""
    m = load_machine("aurora")
    e = m.matmul_efficiency
    rate = gb.curve_tflops({"peak_fraction": e.peak_fraction, "half_dim": e.half_dim}, m.peak_flops("bf16") / 1e12, 8192)
    assert rate == pytest.approx(gb.GEMM_BENCHMARKS[MAX1550].tflops, rel=0.05)


def test_report_gives_the_shipped_curve_against_the_measurement():
    (entry,) = gb.report()
    assert entry["device"] == MAX1550 and entry["measured_tflops"] == 207.0
    assert entry["error"] == pytest.approx(entry["curve_tflops"] / 207.0 - 1)
    assert "gemm.cpp" in entry["source"]
