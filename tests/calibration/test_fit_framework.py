"""The jax profile's CPU figures: applied on CPU machines only, fitted from runs, saved into
frameworks.yaml without touching anything else."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from calibration.fit_framework import FIXED, fit_cpu_figures, save_cpu_figures
from calibration.validate_local_layouts import LocalLayout, predict, write_layout_plan
from machine_models import load_machine
from machine_models.frameworks import FRAMEWORKS_FILE, load_framework
from planner.schema.errors import PlanError
from planner.schema.figures import figures_of, framework_machine, with_figures

FIGS = {"op_overhead_us": 3.0, "peak_fraction": 0.9}


def test_cpu_figures_replace_a_cpu_machines_own_only():
    jax = load_framework("jax").model_copy(update={"cpu_figures": FIGS})
    cpu = load_machine("local", ranks=2)
    assert figures_of(framework_machine(cpu, jax), FIGS) == FIGS
    gpu = load_machine("dgx-h100")
    assert figures_of(framework_machine(gpu, jax), FIGS) == figures_of(gpu, FIGS)
    assert figures_of(framework_machine(cpu, load_framework("exaplan")), FIGS) == figures_of(cpu, FIGS)


def _layouts():
    gb, seq = 4, 64
    return [LocalLayout("ddp", dp=2, mbs=2, global_batch=gb, seq_len=seq),
            LocalLayout("ddp-gas", dp=2, mbs=1, global_batch=gb, seq_len=seq),
            LocalLayout("fsdp", dp=2, mbs=2, global_batch=gb, seq_len=seq, sharding="fsdp"),
            LocalLayout("zero1", dp=2, mbs=2, global_batch=gb, seq_len=seq, sharding="zero1"),
            LocalLayout("tp2", tp=2, dp=1, mbs=4, global_batch=gb, seq_len=seq, sp=False)]


def test_the_fit_recovers_the_figures_that_made_the_runs(tmp_path):
    """Runs whose 'measured' times are the predictions with known figures: the fit finds
    figures that predict them within 1%, left-out layouts within 3%."""
    truth = {"peak_fraction": 0.8, "op_overhead_us": 4.0, "step_overhead_s": 0.01}
    dirs = []
    for lay in _layouts():
        d = tmp_path / lay.name
        plan = write_layout_plan("protein-tiny", "local", 2, lay, d / "plan.yaml", backend="jax")
        true_machine = with_figures(plan.machine, {**truth, **FIXED})  # no DTensor dispatch in XLA
        plan.job.framework.cpu_figures = {}  # the truth is in the machine (the fit strips the profile's too)
        measured = predict(plan, true_machine)["step_time_s"]
        (d / "summary.json").write_text(json.dumps({"measured_step_time_s": measured}))
        dirs.append(d)
    result = fit_cpu_figures(dirs, figures=tuple(truth))
    assert result["before_stats"]["median_abs"] > 0.05  # the machine's own figures miss them
    assert result["fit_stats"]["max_abs"] < 0.01
    assert result["loo_stats"]["max_abs"] < 0.03


def test_save_rewrites_the_profiles_cpu_figures_line_only(tmp_path):
    path = tmp_path / "frameworks.yaml"
    shutil.copy(FRAMEWORKS_FILE, path)
    before = path.read_text()
    result = {"figures": FIGS, "loo": {"a": 0.1, "b": -0.2}, "loo_stats": {"median_abs": 0.15, "max_abs": 0.2}}
    save_cpu_figures("jax", result, "exaplan validate --local --backend jax --refit", path)
    assert load_framework("jax", path).cpu_figures == FIGS
    assert load_framework("exaplan", path) == load_framework("exaplan")
    after = path.read_text()
    changed = [line for line in after.splitlines() if line not in before.splitlines()]
    assert len(changed) == 2 and "cpu fit:" in changed[0] and changed[1].startswith("  cpu_figures: {")
    save_cpu_figures("jax", result, "again", path)  # the comment is replaced, not stacked
    assert path.read_text().count("cpu fit:") == 1


def test_unknown_cpu_figures_are_refused(tmp_path):
    path = tmp_path / "frameworks.yaml"
    text = re.sub(r"^  cpu_figures: .*$", "  cpu_figures: {peak_fractoin: 1.0}", FRAMEWORKS_FILE.read_text(), flags=re.M)
    path.write_text(text)
    with pytest.raises(PlanError, match="peak_fractoin"):
        load_framework("jax", path)


def test_refit_without_jax_is_refused(tmp_path):
    from cli.main import main

    assert main(["validate", "--local", "--refit", "--out", str(tmp_path / "v")]) == 2
    assert not (tmp_path / "v").exists()
