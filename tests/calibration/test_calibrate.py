"""exaplan calibrate: the fits (alpha-beta, matmul curve), the calibration file, bad data, and
measure() end to end (without collectives, with three sizes, and the whole quick run)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from machine_models import detect_local_machine, load_machine
from calibration.fit_measurements import (
    KINDS,
    fit,
    fit_alpha_beta,
    fit_matmul_curve,
    measurements_path,
    ring_coefficients,
    write_calibration,
)
from planner.schema.errors import PlanError

SIZES = [4 * 4**k for k in range(14)]  # 4 B ... 256 MiB, as the full run


def _synthetic_times(kind, n, alpha, beta, noise, rng):
    a, b = ring_coefficients(n, kind)
    t = a * alpha + b * np.asarray(SIZES, dtype=float) / beta
    return t * np.exp(rng.normal(0.0, noise, size=t.shape))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_fit_alpha_beta_recovers_synthetic(kind, n):
    """5% log-normal noise on every size: alpha and beta back within 10%."""
    rng = np.random.default_rng(n * 7 + KINDS.index(kind))
    alpha, beta = 150e-6, 1.2e9
    times = _synthetic_times(kind, n, alpha, beta, 0.05, rng)
    a, b = fit_alpha_beta(SIZES, times, n, kind)
    assert a == pytest.approx(alpha, rel=0.10)
    assert b == pytest.approx(beta, rel=0.10)


def test_fit_alpha_beta_shrugs_off_an_outlier():
    """One size 15x too slow (gloo's odd 4 ms hiccup) moves the fit by less than 20%."""
    rng = np.random.default_rng(0)
    times = _synthetic_times("allreduce", 2, 100e-6, 1.0e9, 0.03, rng)
    times[3] *= 15
    a, b = fit_alpha_beta(SIZES, times, 2, "allreduce")
    assert a == pytest.approx(100e-6, rel=0.2)
    assert b == pytest.approx(1.0e9, rel=0.2)


def test_fit_matmul_curve_recovers_synthetic():
    rng = np.random.default_rng(1)
    peak, f, h = 100e12, 0.7, 300.0
    d = np.array([64, 128, 256, 512, 1024, 2048, 4096, 8192], dtype=float)
    y = peak * f * d / (d + h) * np.exp(rng.normal(0, 0.02, d.shape))
    m = fit_matmul_curve(d, y, peak_flops=peak)
    assert m.peak_fraction == pytest.approx(f, rel=0.05)
    assert m.half_dim == pytest.approx(h, rel=0.10)
    # Without a nominal peak: f is the one given, and P * f is still the asymptote.
    m2 = fit_matmul_curve(d, y, peak_fraction=0.8)
    assert m2.peak_fraction == 0.8
    assert m2.peak_flops * 0.8 == pytest.approx(peak * f, rel=0.05)


def _fake_measurements(ranks=2):
    rng = np.random.default_rng(3)
    d = [128, 256, 512, 1024, 2048]
    meas = {
        "version": 1, "when": "2026-01-01T00:00:00+00:00", "host": "test", "device_type": "cpu",
        "device_name": "Test CPU", "torch": "x", "backend": "gloo", "ranks": ranks, "nodes": 1,
        "threads_per_rank": 1, "quick": True,
        "matmul": [{"precision": "fp32", "m": x, "n": x, "k": x, "d": x, "tflops": 0.15 * x / (x + 100)} for x in d]
        + [{"precision": "bf16", "m": 256, "n": 256, "k": 256, "d": 256, "tflops": 0.001}],
        "memory": {"gbyte_s_per_device": 8.0},
        "optimizer": {"params": 10_000_000, "seconds": 0.08},  # 8 ns a parameter at 8 GB/s: 64 B
        "collectives": {},
    }
    for kind in KINDS:
        n = 2 if kind == "p2p" else ranks
        beta = 0.3e9 if kind in ("reduce_scatter", "all_gather") else 0.9e9  # gloo's slower rs/ag
        meas["collectives"][kind] = {"n": n, "bytes": SIZES,
                                     "times_s": _synthetic_times(kind, n, 200e-6, beta, 0.03, rng).tolist()}
    return meas


def test_fit_sets_the_machine_figures():
    meas = _fake_measurements()
    m = fit(meas, detect_local_machine(2))
    assert m.calibrated
    assert m.intra_node_latency_us == pytest.approx(200, rel=0.1)
    assert m.intra_node_bandwidth_gbyte_s == pytest.approx(0.9, rel=0.1)
    assert m.memory_bandwidth_gbyte_s == 8.0
    assert m.matmul_efficiency.half_dim == pytest.approx(100, rel=0.05)
    eff = m.matmul_efficiency
    # The model reproduces the measured GEMMs, and bf16's single point, with the shared curve.
    for row in meas["matmul"]:
        model = m.peak_tflops[row["precision"]] * eff.peak_fraction * row["d"] / (row["d"] + eff.half_dim)
        assert model == pytest.approx(row["tflops"], rel=0.03)
    assert set(meas["fit"]["collectives"]) == set(KINDS)
    # Reduce-scatter and all-gather at a third of allreduce's bandwidth, times what the base
    # (the detected CPU) says allreduce reaches in training; AdamW's bytes.
    ar = detect_local_machine(2).collective_efficiency.allreduce
    assert m.collective_efficiency.allreduce == ar
    assert m.collective_efficiency.reduce_scatter == pytest.approx(ar / 3, rel=0.1)
    assert m.collective_efficiency.all_gather == pytest.approx(ar / 3, rel=0.1)
    assert m.optimizer_bytes_per_param == pytest.approx(64.0)
    assert "exaplan calibrate --ranks 2 --quick" in m.description


def test_calibration_file_round_trips(tmp_path):
    meas = _fake_measurements()
    m = fit(meas, detect_local_machine(2))
    path = tmp_path / "mine.yaml"
    write_calibration(m, meas, path)
    assert load_machine(path) == m
    assert load_machine(str(path)) == m
    text = path.read_text()
    assert text.startswith("# Machine model written by `exaplan calibrate --ranks 2 --quick`")
    saved = json.loads(measurements_path(path).read_text())
    assert saved["collectives"]["allreduce"]["times_s"] == meas["collectives"]["allreduce"]["times_s"]
    assert "fit" in saved
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize(
    "spoil, series",
    [
        (lambda m: m["collectives"]["allreduce"]["times_s"].__setitem__(2, math.nan), "collectives.allreduce.times_s"),
        (lambda m: m["collectives"]["all_gather"]["times_s"].__setitem__(0, -1e-3), "collectives.all_gather.times_s"),
        (lambda m: m["collectives"]["p2p"]["times_s"].__setitem__(0, 0.0), "collectives.p2p.times_s"),
        (lambda m: m["collectives"]["reduce_scatter"].__setitem__("times_s", []), "collectives.reduce_scatter.times_s"),
        (lambda m: m["collectives"]["allreduce"]["bytes"].pop(), "collectives.allreduce.times_s"),
        (lambda m: m["matmul"][1].__setitem__("tflops", math.nan), "matmul.fp32.tflops"),
        (lambda m: m.__setitem__("matmul", []), "matmul"),
        (lambda m: m["memory"].__setitem__("gbyte_s_per_device", -3.0), "memory.gbyte_s_per_device"),
        (lambda m: m["optimizer"].__setitem__("seconds", math.nan), "optimizer.seconds"),
        (lambda m: m["optimizer"].__setitem__("params", 0), "optimizer.params"),
    ],
)
def test_bad_measurements_raise_and_write_nothing(tmp_path, spoil, series):
    good = _fake_measurements()
    machine = fit(good, detect_local_machine(2))
    bad = _fake_measurements()
    spoil(bad)
    with pytest.raises(PlanError, match=series.replace(".", r"\.")):
        fit(bad, detect_local_machine(2))
    path = tmp_path / "bad.yaml"
    with pytest.raises(PlanError, match=series.replace(".", r"\.")):
        write_calibration(machine, bad, path)
    assert list(tmp_path.iterdir()) == []


def test_fit_alpha_beta_rejects_bad_input():
    with pytest.raises(PlanError, match="empty"):
        fit_alpha_beta([], [], 2, "allreduce")
    with pytest.raises(PlanError, match="mismatched"):
        fit_alpha_beta([4, 8, 16], [1e-3, 2e-3], 2, "allreduce")
    with pytest.raises(PlanError, match="not finite"):
        fit_alpha_beta([4, 8], [1e-3, float("nan")], 2, "allreduce")
    with pytest.raises(PlanError, match="unknown collective"):
        fit_alpha_beta([4, 8], [1e-3, 2e-3], 2, "broadcast")


def test_measure_tiny_matmul_and_memory_then_fit(tmp_path):
    """measure() without collectives: seconds, and the result fits and writes."""
    pytest.importorskip("torch")
    from calibration.measure import measure

    meas = measure(ranks=2, quick=True, progress=False, collectives=False)
    json.dumps(meas)
    assert meas["matmul"] and meas["memory"]["gbyte_s_per_device"] > 0
    assert "collectives" not in meas
    m = fit(meas, detect_local_machine(2))
    write_calibration(m, meas, tmp_path / "local.yaml")
    assert load_machine(tmp_path / "local.yaml") == m


def test_measure_collectives_few_sizes():
    """Two gloo ranks, three sizes: the collective path end to end in a few seconds."""
    pytest.importorskip("torch")
    from calibration.measure import measure

    meas = measure(ranks=2, quick=True, progress=False, matmul=False, memory=False, sizes=[4, 4096, 1 << 20],
                   timeout_s=120)
    assert set(meas["collectives"]) == set(KINDS)
    for kind, s in meas["collectives"].items():
        assert len(s["bytes"]) == len(s["times_s"]) == 3 and all(t > 0 for t in s["times_s"]), kind


def test_cli_calibrate_writes_a_machine_that_plans(tmp_path, capsys):
    """`exaplan calibrate --quick -o FILE` (the full quick measurement: about 10 s here, the
    brief: under a minute on 2 cores), then `exaplan plan --machine FILE` uses it."""
    pytest.importorskip("torch")
    from cli.main import main

    out = tmp_path / "here.yaml"
    assert main(["calibrate", "--quick", "-o", str(out), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["machine"]["calibrated"] is True and out.exists()
    meas = json.loads((tmp_path / "here.measurements.json").read_text())
    assert 0 < meas["duration_s"] < 60
    # The file holds the fit of the measurements it sits beside.
    assert load_machine(out) == fit(meas, detect_local_machine(2))
    assert main(["plan", "--model", "protein-tiny", "--machine", str(out), "--global-batch", "4", "--no-write", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["machine"]["calibrated"] is True and plan["job"]["precision"] == "fp32"
    assert main(["calibrate", "--ranks", "0", "-o", str(tmp_path / "bad.yaml")]) == 2
    assert not (tmp_path / "bad.yaml").exists()


def test_multi_node_fit_divides_the_nics_by_the_efficiency_the_model_applies():
    """From a two-node run the allreduce's bandwidth is the node's injection; the cost model
    multiplies the NICs by inter_node_efficiency where a machine sets one (else by
    network_efficiency), so the fit divides by that same figure and the model gives back the
    measured bandwidth; the intra-node fabric is left as the base has it."""
    meas = _fake_measurements()
    meas["nodes"] = 2
    base = detect_local_machine(2)
    for inter in (None, 0.5):
        b = base.model_copy(update={"inter_node_efficiency": inter, "nodes": 2})
        m = fit(copy.deepcopy(meas), b)
        eff = inter if inter is not None else b.network_efficiency
        injection = m.nic_gbit_s * m.nics_per_node / 8 * eff  # GB/s, as planner/cost/topology.py applies it
        assert injection == pytest.approx(0.9 * meas["ranks"], rel=0.1)
        assert m.intra_node_bandwidth_gbyte_s == b.intra_node_bandwidth_gbyte_s
