"""Section M (calibration/published_own.py): exaplan's own runs on a lent H200, held out. The
records must say what the evidence files (docs/gpu/) measured and what the plan ran, and the
prediction must fall inside the uncertainty the planner states for a device kind without
published rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from calibration.published import held_out_runs, published_runs
from calibration.published_own import TOKENS_PER_STEP, own_gpu_runs
from calibration.validate_published import predict
from machine_models.loader import load_machine

ROOT = Path(__file__).resolve().parents[2]


def test_the_records_are_the_measured_runs():
    runs = {r.id.rsplit("-", 1)[-1]: r for r in own_gpu_runs()}
    assert set(runs) == {"compile", "eager"}
    plan = yaml.safe_load((ROOT / "plans" / "gpu" / "protein-3.5b_1xh200.yaml").read_text())
    assert plan["job"]["global_batch"] * plan["job"]["seq_len"] == TOKENS_PER_STEP
    for mode, run in runs.items():
        evidence = json.loads((ROOT / "docs" / "gpu" / f"2026-11-26-h200-{mode}.json").read_text())
        key = "protein-3.5b_1xh200" + ("+compile" if mode == "compile" else "")
        median = evidence["plans"][key]["best"]["exaplan"]["median_s"]
        assert run.figure == pytest.approx(TOKENS_PER_STEP / median, rel=1e-3)
        assert run.layout.micro_batch == plan["micro_batch_size"] and run.layout.dp == 1
        assert run.model.hidden == plan["model"]["hidden"] and run.model.layers == plan["model"]["layers"]


def test_held_out_and_predicted_within_the_stated_uncertainty():
    assert not {r.id for r in own_gpu_runs()} & {r.id for r in published_runs()}
    assert {r.id for r in own_gpu_runs()} <= {r.id for r in held_out_runs()}
    plan = yaml.safe_load((ROOT / "plans" / "gpu" / "protein-3.5b_1xh200.yaml").read_text())
    band = plan["prediction"]["uncertainty"]["step_time"]  # +/-30%: an unfitted device kind
    assert not plan["prediction"]["uncertainty"]["fitted"]
    for run in own_gpu_runs():
        predicted, _ = predict(run, load_machine(run.machine))
        assert predicted == pytest.approx(plan["prediction"]["tokens_per_s"], rel=1e-6)  # the same prediction
        assert abs(predicted / run.figure - 1) < band, run.id
