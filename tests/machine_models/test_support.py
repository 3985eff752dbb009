"""Intervals that widen with distance from the fitted rows (machine_models/support.py, the
`support` and `widen` sections of uncertainty.yaml, calibration/support_fit.py)."""

from __future__ import annotations

import pytest
import yaml

from machine_models import load_framework, load_machine
from machine_models.support import Point, distance, needed_widening, point_distance, support_of
from machine_models.uncertainty import MAX_WIDENED, uncertainty_of

H100 = "NVIDIA H100 SXM5"
ROWS = [Point(8, 2048, 7e9, "fsdp", False), Point(64, 4096, 7e10, "fsdp", False), Point(16, 2048, 1.3e10, "hsdp", False)]


def test_support_and_distance():
    s = support_of(ROWS)
    assert s == {"world": [8, 64], "seq_len": [2048, 4096], "params": [7e9, 7e10], "shardings": ["fsdp", "hsdp"],
                 "pipeline": [False], "rows": 3}
    assert distance(Point(32, 4096, 2e10, "hsdp", False), s) == (0.0, [])
    d, why = distance(Point(256, 16384, 7e10, "zero1", True), s)
    assert d == pytest.approx(2 + 2 + 1 + 1)  # world 4x and seq 4x past the range: log2 4 each; sharding; pipeline
    assert why[0] == "world 256 GPUs above the fitted 64" and "sharding zero1 (fitted: fsdp, hsdp)" in why
    assert distance(Point(2, 2048, 3.5e9, "fsdp", False), s)[0] == pytest.approx(2 + 1)  # below: log2 4, log2 2


def test_a_device_kind_without_the_frameworks_rows_falls_back_to_its_rows_elsewhere():
    supports = {H100: {"exaplan": support_of(ROWS)}, "A100": {"megatron": support_of([Point(512, 2048, 1e12, "zero1", True)])}}
    assert point_distance(ROWS[0], supports, H100, "exaplan") == (0.0, [])
    d, why = point_distance(ROWS[0], supports, "A100", "exaplan")
    assert d == 1.0 and why == ["no fitted exaplan rows on A100"]
    assert point_distance(ROWS[0], supports, H100, "deepspeed") is None


def test_needed_widening():
    assert needed_widening(0.05, 0.10, 2.0) == 0.0          # inside the base already
    assert needed_widening(0.30, 0.10, 2.0) == pytest.approx(1.0)  # 0.1 x (1 + 1.0 x 2) = 0.3


def _file(tmp_path, factor):
    path = tmp_path / "uncertainty.yaml"
    path.write_text(yaml.safe_dump({
        "device_kinds": {H100: {"rows": 13, "median": 0.04, "p80": 0.09, "max": 0.2}},
        "frameworks": {"exaplan": {"rows": 14, "median": 0.03, "p80": 0.05, "max": 0.1}},
        "widen": {"factor": factor, "rows": 5, "of": 14},
        "support": {H100: {"exaplan": support_of(ROWS)}}}))
    return path


def test_uncertainty_widens_outside_the_support_and_says_why(tmp_path):
    path = _file(tmp_path, 0.5)
    h100, fw = load_machine("dgx-h100"), load_framework("exaplan")
    inside = uncertainty_of(h100, fw, path=path, point=Point(16, 2048, 7e9, "fsdp", False))
    assert inside.step_time == 0.09 and "widened" not in inside.basis
    out = uncertainty_of(h100, fw, path=path, point=Point(16, 8192, 7e9, "fsdp", False))  # seq 2x past: d = 1
    assert out.step_time == pytest.approx(0.09 * 1.5)
    assert "widened x1.50 at distance 1.00 from the fitted rows (seq_len 8,192 tokens above the fitted 4,096)" in out.basis
    far = uncertainty_of(h100, fw, path=path, point=Point(65536, 131072, 1e12, "zero1", True))
    assert far.step_time == MAX_WIDENED
    assert uncertainty_of(h100, fw, path=path).step_time == 0.09  # no point: the base
    (tmp_path / "zero").mkdir()
    zero = uncertainty_of(h100, fw, path=_file(tmp_path / "zero", 0.0), point=Point(16, 8192, 7e9, "fsdp", False))
    assert zero.step_time == 0.09 and zero.basis.endswith(
        "at distance 1.00 from the fitted rows (seq_len 8,192 tokens above the fitted 4,096), not widened (fitted widening 0)")
    cpu = uncertainty_of(load_machine("local"), fw, path=path, point=Point(1, 99999, 1e3, "zero1", True))
    assert not cpu.fitted and "widened" not in cpu.basis  # a stated default is not widened


def test_the_widening_is_fitted_on_the_rows_outside_the_others_support(tmp_path):
    """support_fit on the shipped published runs: each row left out lies inside or outside the
    support of the others; the factor is the conformal bound of what the outside ones needed."""
    from calibration import fit_published as cal
    from calibration.published import published_runs
    from calibration.support_fit import fit_widening, supports_of
    from machine_models.uncertainty import conformal_bound

    runs = published_runs()
    machines = cal.machines_of(runs)
    loo = {r.id: 0.01 * (i % 7) for i, r in enumerate(runs)}
    widen, needs = fit_widening(runs, machines, loo)
    assert 0 < widen["rows"] == len(needs) < len(runs) and widen["of"] == len(runs)
    assert widen["factor"] == round(conformal_bound([n["needed"] for n in needs]), 4)
    for n in needs:
        assert n["distance"] > 0 and n["needed"] == round(needed_widening(abs(loo[n["id"]]), n["base"], n["distance"]), 4)
    supports = supports_of(runs, machines)
    assert sum(s["rows"] for fw in supports.values() for s in fw.values()) == len(runs)
