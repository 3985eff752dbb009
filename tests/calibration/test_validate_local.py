"""`exaplan validate --local` (calibration/validate_local.py): layouts, statistics, the refit, and
one small end-to-end run through the real `exaplan run` path."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from machine_models import detect_local_machine
from calibration import fit_runs as rl
from calibration import validate_local as vl
from calibration.validate_local_report import CSV_COLUMNS


def test_default_layouts_cover_the_kinds():
    lays = vl.default_layouts(2)
    assert len(lays) >= 10
    assert len({l.name for l in lays}) == len(lays)
    joined = [" ".join(l.estimate_args()) for l in lays]
    for needle in ("--shard fsdp ", "--shard fsdp-grad-op", "--shard zero1", "--tp 2", "--sp", "--no-sp",
                   "--schedule 1f1b", "--schedule gpipe", "--recompute full", "--mbs 1"):
        assert any(needle in j + " " for j in joined), needle
    assert sorted(l.ddp_bucket_mb for l in lays if l.ddp_bucket_mb) == [25.0, 400.0]
    assert not any("hsdp" in j for j in joined)
    assert any("--shard hsdp" in " ".join(l.estimate_args()) for l in vl.default_layouts(4))
    with pytest.raises(vl.PlanError):
        vl.default_layouts(3)


def test_estimate_options_of_a_layout_give_the_same_layout():
    """The `exaplan estimate` options a local layout names (in its plan's provenance and the
    report) describe the layout it runs."""
    from cli.estimate import layout_of
    from cli.main import build_parser

    machine = detect_local_machine(4)
    for lay in vl.default_layouts(4, seq_len=32):
        args = build_parser().parse_args(["estimate", "--model", "protein-tiny", "--machine", "local", "--nodes", "1",
                                          *lay.estimate_args()])
        assert layout_of(args, machine).row(0) == lay.layouts().row(0), lay.name


def test_every_default_layout_plans(tmp_path):
    machine = detect_local_machine(2)
    for lay in vl.default_layouts(2, seq_len=32):
        plan = vl.write_layout_plan("protein-tiny", machine, 2, lay, tmp_path / lay.name / "plan.yaml")
        assert plan.world_size == 2
        if lay.ddp_bucket_mb:
            assert plan.sharding.ddp_bucket_mb == lay.ddp_bucket_mb
        # Re-predicting from the plan gives the plan's own prediction.
        assert vl.predict(plan)["step_time_s"] == pytest.approx(plan.prediction.step_time_s, rel=1e-9)


def test_spearman_and_first_choice_on_synthetic_numbers():
    assert vl.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert vl.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert vl.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(vl.spearman([1, 2], [1, 2]))
    fc = vl.first_choice(["a", "b", "c"], [1.0, 2.0, 3.0], [1.2, 1.0, 2.0])
    assert fc["first_choice"] == "a" and fc["fastest"] == "b" and not fc["first_choice_is_fastest"]
    assert fc["first_choice_miss"] == pytest.approx(0.2)
    fc = vl.first_choice(["a", "b"], [1.0, 2.0], [1.0, 3.0])
    assert fc["first_choice_is_fastest"] and fc["first_choice_miss"] == 0.0


def test_summarise_targets():
    rows = [dict(name=n, status="ok", predicted_step_time_s=p, measured_step_time_s=m, step_time_error=m / p - 1,
                 memory_error=0.05, memory_error_raw=0.3) for n, p, m in
            [("a", 1.0, 1.05), ("b", 2.0, 1.9), ("c", 3.0, 3.3), ("d", 4.0, 4.0)]]
    rows.append(dict(name="x", status="run failed (1)"))
    s = vl.summarise(rows)
    assert s["median_abs_step_error"] == pytest.approx(0.05)
    assert s["max_abs_step_error"] == pytest.approx(0.1)
    assert s["spearman"] == pytest.approx(1.0)
    assert s["targets"]["median_abs_step_error"]["met"] and s["targets"]["spearman"]["met"]
    assert s["targets"]["median_abs_memory_error"]["met"]
    assert s["median_abs_memory_error_raw"] == pytest.approx(0.3)


def _synthetic_runs(tmp_path: Path, base, truth, names=None, phases=False) -> list[Path]:
    """Run directories whose measured step time is what the `truth` machine predicts (with
    `phases`, also metrics.jsonl records of forward+backward, clip and optimizer time)."""
    dirs = []
    for lay in vl.default_layouts(2, seq_len=32):
        if names and lay.name not in names:
            continue
        d = tmp_path / lay.name
        plan = vl.write_layout_plan("protein-tiny", base, 2, lay, d / "plan.yaml")
        true = vl.predict(plan, truth)
        (d / "summary.json").write_text(json.dumps(dict(measured_step_time_s=true["step_time_s"],
                                                        predicted_step_time_s=plan.prediction.step_time_s,
                                                        peak_memory_gib=1.0, predicted_memory_gib=1.0)))
        if phases:
            zero = plan.sharding.kind.value.startswith("zero")
            opt = true["optimizer_s"] + (true["dp_s"] if zero else 0.0)
            rec = dict(kind="train", step_time_s=true["step_time_s"], forward_backward_s=true["step_time_s"] - opt,
                       clip_s=0.0, optimizer_s=opt)
            (d / "metrics.jsonl").write_text("\n".join(json.dumps(dict(rec, step=i)) for i in range(5)) + "\n")
        dirs.append(d)
    return dirs


def test_refit_recovers_known_figures(tmp_path):
    # Without the CPU framework costs, so that the GEMM curve carries the step time (with them
    # the weak pull towards the starting values moves peak_fraction by a few percent).
    base = detect_local_machine(2).model_copy(update={"op_overhead_us": 0.0, "dtensor_op_overhead_us": 0.0})
    truth = rl.with_figures(base, dict(peak_fraction=0.4, step_overhead_s=0.05))
    dirs = _synthetic_runs(tmp_path, base, truth)
    fitted = rl.refit_from_runs(dirs, base, figures=("peak_fraction", "step_overhead_s"))
    assert fitted.calibrated
    assert fitted.matmul_efficiency.peak_fraction == pytest.approx(0.4, rel=0.05)
    assert fitted.step_overhead_s == pytest.approx(0.05, rel=0.1, abs=0.005)


def test_refit_with_phases_tells_the_optimizer_from_the_collectives(tmp_path):
    """The phases `exaplan run` logs (forward+backward vs clip+optimizer) separate figures
    that the step time alone trades against each other: the optimizer's bytes per parameter
    and the collectives' efficiency (ZeRO communicates in its step, FSDP and DDP in backward)."""
    base = detect_local_machine(2)
    truth = rl.with_figures(base, dict(optimizer_bytes_per_param=120.0, allreduce_efficiency=0.4, rs_ag_efficiency=0.2))
    dirs = _synthetic_runs(tmp_path, base, truth, phases=True)
    runs = rl.load_runs(dirs)
    assert all(r.measured_forward_backward_s and r.measured_optimizer_s for r in runs)
    figures = ("optimizer_bytes_per_param", "allreduce_efficiency", "rs_ag_efficiency")
    fitted = rl.refit_from_runs(dirs, base, figures=figures)
    assert fitted.optimizer_bytes_per_param == pytest.approx(120.0, rel=0.05)
    assert fitted.collective_efficiency.allreduce == pytest.approx(0.4, rel=0.05)
    assert fitted.collective_efficiency.reduce_scatter == pytest.approx(0.2, rel=0.05)
    assert fitted.collective_efficiency.all_gather == pytest.approx(0.2, rel=0.05)


def test_holdout_keeps_the_repeats_of_a_layout_together(tmp_path):
    base = detect_local_machine(2)
    truth = rl.with_figures(base, dict(peak_fraction=0.5))
    dirs = _synthetic_runs(tmp_path, base, truth, names=("ddp-b25", "fsdp", "zero1", "tp2"))
    repeats = []
    for d in dirs:  # a second run of each layout, as validate --local --repeats 2 leaves it
        r = d / "repeat-1"
        r.mkdir()
        for f in ("plan.yaml", "summary.json"):
            (r / f).write_text((d / f).read_text())
        repeats.append(r)
    rep = rl.holdout_report(dirs + repeats, base, figures=("peak_fraction",))
    assert "fsdp/repeat-1" in rep["train"] + rep["test"]
    for name in rep["test"]:
        assert not any(t.split("/")[0] == name.split("/")[0] for t in rep["train"])


def test_holdout_report_reduces_error(tmp_path):
    base = detect_local_machine(2)
    truth = rl.with_figures(base, dict(peak_fraction=0.5, step_overhead_s=0.03, overlap_dp=0.6))
    dirs = _synthetic_runs(tmp_path, base, truth)
    rep = rl.holdout_report(dirs, base)
    assert set(rep["train"]).isdisjoint(rep["test"]) and len(rep["test"]) >= 4
    assert rep["median_abs_test_after"] < rep["median_abs_test_before"] / 3
    assert rep["median_abs_test_after"] < 0.05


def test_run_local_validation_end_to_end(tmp_path):
    pytest.importorskip("torch")
    lays = [l for l in vl.default_layouts(2, seq_len=32) if l.name in ("ddp-b25", "fsdp")]
    rep = vl.run_local_validation("protein-tiny", 2, tmp_path, steps=3, layouts=lays, progress=False)
    assert [r["status"] for r in rep.rows] == ["ok", "ok"], rep.rows
    for name in ("validation.csv", "validation.json", "validation.png"):
        assert (tmp_path / name).stat().st_size > 0
    with open(tmp_path / "validation.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == CSV_COLUMNS and [r["name"] for r in rows] == ["ddp-b25", "fsdp"]
    data = json.loads((tmp_path / "validation.json").read_text())
    for key in ("median_abs_step_error", "max_abs_step_error", "first_choice", "targets", "rows", "baseline_rss_gib"):
        assert key in data
    for r in rep.rows:
        assert r["measured_step_time_s"] > 0 and r["predicted_step_time_s"] > 0
        assert r["measured_memory_gib"] > 0
        assert (Path(r["run_dir"]) / "plan.yaml").exists() and (Path(r["run_dir"]) / "summary.json").exists()
        assert not (Path(r["run_dir"]) / "checkpoints").exists()
    # The run directories feed the refit.
    runs = rl.load_runs([Path(r["run_dir"]) for r in rep.rows])
    assert len(runs) == 2
    # ... and `exaplan calibrate --from-runs` writes a refitted machine that plans.
    from cli.main import main as cli

    out = tmp_path / "refit.yaml"
    assert cli(["calibrate", "--from-runs", *[r["run_dir"] for r in rep.rows], "-o", str(out)]) == 0
    assert cli(["plan", "--model", "protein-tiny", "--machine", str(out), "--global-batch", "4", "--no-write"]) == 0
    assert cli(["calibrate", "--from-runs", str(tmp_path), "-o", str(tmp_path / "no.yaml")]) == 2
    assert not (tmp_path / "no.yaml").exists()


def test_from_runs_writes_the_machines_own_band_from_leave_one_layout_out(tmp_path):
    """With 4 layouts or more, refit_to_file refits without each layout, predicts its runs, and
    writes the 80% conformal bound of those errors into the machine file (step_time_band),
    which loads back and sets the intervals of plans on it; with fewer, no band."""
    from machine_models.uncertainty import conformal_bound, uncertainty_of
    from planner.schema.specs import MachineModel

    base = detect_local_machine(2)
    truth = rl.with_figures(base, dict(peak_fraction=0.5, step_overhead_s=0.03))
    dirs = _synthetic_runs(tmp_path / "r", base, truth, names=("ddp-b25", "fsdp", "zero1", "tp2", "ddp-recompute"))
    runs = rl.load_runs(dirs)
    errors = rl.leave_one_layout_out(runs, base)
    assert set(errors) == {r.name for r in runs} and all(abs(e) < 0.5 for e in errors.values())
    machine, _ = rl.refit_to_file(dirs, base, tmp_path / "m.yaml", "test")
    band = machine.step_time_band
    assert band is not None and band.runs == 5
    assert band.half_width == pytest.approx(min(max(conformal_bound(list(errors.values())), 1e-3), 1.0), rel=1e-6)
    loaded = MachineModel.model_validate(yaml.safe_load((tmp_path / "m.yaml").read_text()))
    assert loaded.step_time_band == band
    u = uncertainty_of(loaded)  # the band stands in for the device kind's half; the framework's half stays
    assert u.step_time >= band.half_width and "own calibration" in u.basis
    few, _ = rl.refit_to_file(dirs[:3], base, tmp_path / "few.yaml", "test")
    assert few.step_time_band is None and "step_time_band" not in (tmp_path / "few.yaml").read_text()
