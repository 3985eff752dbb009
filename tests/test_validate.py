"""Published runs (planner.published) against the cost model (planner.validate).

The tolerance: after the fit, the median |error| over the published rows must stay below
MEDIAN_ERROR_LIMIT = 8%. Why 8%: the fit reaches about 5% (leave-one-out about 6%); the
published figures themselves spread by a few percent (llm-foundry's mpt-13b on 8 to 64 GPUs:
4767-4811 tokens/s per GPU; Megatron's table is rounded), and several rows rest on
unpublished fields (micro-batch, interleaving, global batch; `assumed` in each record) that
move a prediction by several percent. The first guesses, before any fit, give about 9.5%, so
8% also says that the fit did its job. A median, not a maximum: rows the cost model misses
for a structural reason (see the report of `exaplan validate --published`) must not be
hidden by tuning, and they show in the printed maximum instead.
"""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

import machine_models.loader as loader
from machine_models import DEVICE_KINDS_FILE, load_machine
from planner.published import UNITS, published_runs
from planner.validate import (
    BOUNDS,
    FIGURES,
    fit_device_kinds,
    leave_one_out,
    predict,
    published_json,
    render_published,
    summary,
    validate_published,
    with_figures,
    write_device_kinds,
)

MEDIAN_ERROR_LIMIT = 0.08


@pytest.fixture(scope="module")
def fitted():
    """One fit of every device kind (a few seconds), shared by the tests below."""
    return fit_device_kinds()


@pytest.fixture(scope="module")
def fitted_rows(fitted):
    runs = published_runs()
    rows = []
    for r in runs:
        m = load_machine(r.machine)
        rows.append((r, predict(r, with_figures(m, fitted[m.device_name]))[0]))
    return rows


def test_runs_are_well_formed():
    runs = published_runs()
    ids = [r.id for r in runs]
    assert len(ids) == len(set(ids)) == 25
    assert {r.section for r in runs} == {"A", "B", "C", "D"}
    for r in runs:
        assert r.kind in UNITS
        assert r.layout.tp * r.layout.pp * r.layout.dp == r.gpus
        for name in r.assumed:  # every assumed field names a real field of the record
            obj = r
            for part in name.split("."):
                obj = getattr(obj, part)


def test_every_published_run_is_predicted_and_fits_in_memory():
    rows = validate_published(leave_one_out_errors=False)
    assert len(rows) == len(published_runs())
    for row in rows:
        assert math.isfinite(row.predicted) and row.predicted > 0, row.id
        assert math.isfinite(row.error)
        # These runs ran: the memory model must not say they do not fit.
        assert row.fits_memory, f"{row.id}: predicted not to fit in device memory"


def test_unit_conversions_reproduce_the_papers_own_arithmetic():
    runs = {r.id: r for r in published_runs()}
    a100 = load_machine("dgx-a100-80gb")
    # Korthikanti et al. give both the selective-recompute iteration time and the MFU.
    for size, seconds in [("22b", 1.10), ("175b", 13.75), ("530b", 37.83), ("1t", 71.49)]:
        run = runs[f"B-gpt-{size}-selective"]
        assert run.figure_from_step_time(seconds, a100) == pytest.approx(run.figure, rel=0.01)
    # Megatron's TFLOP/s per GPU and its MFU column (41% for 408.8 on 989 TFLOP/s).
    h100 = load_machine("dgx-h100")
    run = runs["A-gpt-1.7b"]
    tokens = run.layout.global_batch * run.model.seq_len
    step = run.flops_per_token() * tokens / run.gpus / (run.figure * 1e12)
    assert run.figure_from_step_time(step, h100) == pytest.approx(run.figure)
    assert run.figure / 989.0 == pytest.approx(0.41, abs=0.005)


def test_fit_stays_within_bounds(fitted):
    assert set(fitted) == {"NVIDIA H100 SXM5", "NVIDIA A100 SXM4"}
    for figures in fitted.values():
        assert set(figures) == set(FIGURES)
        for name, value in figures.items():
            lo, hi = BOUNDS[name]
            assert lo - 1e-9 <= value <= hi + 1e-9, (name, value)


def test_median_error_after_fit_is_below_limit(fitted_rows):
    errors = sorted(abs(pred / run.figure - 1) for run, pred in fitted_rows)
    median = errors[len(errors) // 2]
    assert median < MEDIAN_ERROR_LIMIT, f"median |error| {median:.1%}"
    first = summary(validate_published(fitted=False, leave_one_out_errors=False))[0]
    assert median < first, "the fit must improve on the first guesses"


def test_shipped_machine_models_carry_a_fit():
    """device_kinds.yaml holds fitted figures for the current cost model; if this fails
    after a cost-model change, run `exaplan validate --published --refit`."""
    median, _ = summary(validate_published(fitted=True, leave_one_out_errors=False))
    assert median < MEDIAN_ERROR_LIMIT, f"median |error| {median:.1%} with the shipped figures"


def test_predictions_come_from_the_model_not_a_table():
    run = next(r for r in published_runs() if r.id == "D-llama2-7b")
    machine = load_machine(run.machine)
    base, _ = predict(run, machine)
    deeper = run.model_copy(update={"model": run.model.model_copy(update={"layers": run.model.layers * 2})})
    assert predict(deeper, machine)[0] < 0.6 * base  # twice the layers: about half the tokens/s
    wider = run.model_copy(update={"model": run.model.model_copy(update={"ffn_hidden": 2 * run.model.ffn_hidden})})
    assert predict(wider, machine)[0] < base
    faster = with_figures(machine, {"peak_fraction": 0.95})
    assert predict(run, faster)[0] > base


def test_leave_one_out_of_one_row():
    (value,) = leave_one_out(ids=["B-gpt-22b-full"], workers=1).values()
    assert math.isfinite(value) and value > 0
    assert abs(value / 1.42 - 1) < 0.25


def test_write_device_kinds_keeps_comments_and_is_read_back(tmp_path, monkeypatch, fitted):
    path = tmp_path / "device_kinds.yaml"
    original = DEVICE_KINDS_FILE.read_text()
    path.write_text(original)
    rows = validate_published(leave_one_out_errors=False)
    write_device_kinds(fitted, rows, path, date="2000-01-01")
    once = path.read_text()
    write_device_kinds(fitted, rows, path, date="2000-01-01")
    assert path.read_text() == once, "rewriting is idempotent"
    # Every comment line of the original that the refit does not own is still there.
    kept = [ln for ln in original.splitlines() if ln.lstrip().startswith("#") and "# fit:" not in ln]
    assert all(ln in once for ln in kept)
    assert "2000-01-01" in once
    monkeypatch.setattr(loader, "DEVICE_KINDS_FILE", path)
    for name in ("dgx-h100", "dgx-a100-80gb"):
        m = load_machine(name)
        figs = fitted[m.device_name]
        assert m.matmul_efficiency.peak_fraction == pytest.approx(figs["peak_fraction"], abs=1e-3)
        assert m.matmul_efficiency.half_dim == pytest.approx(figs["half_dim"], abs=0.1)
        assert m.attention_efficiency_factor == pytest.approx(figs["attention_efficiency_factor"], abs=1e-3)
        assert m.overlap.dp == pytest.approx(figs["overlap_dp"], abs=1e-3)
    gh200 = loader._device_kinds()["NVIDIA GH200"]
    assert gh200["matmul_efficiency"]["peak_fraction"] == pytest.approx(fitted["NVIDIA H100 SXM5"]["peak_fraction"], abs=1e-3)


def test_render_and_json():
    rows = validate_published(leave_one_out_errors=False)
    rows[0].loo_predicted, rows[0].loo_error = rows[0].predicted, 0.0  # as if computed
    out = io.StringIO()
    render_published(rows, Console(file=out, width=220, color_system=None))
    text = out.getvalue()
    assert "median |error|" in text and "leave-one-out" in text
    assert all(r.id in text for r in rows)
    data = json.loads(json.dumps(published_json(rows)))
    assert data["summary"]["rows"] == len(rows)
    assert data["summary"]["median_abs_error"] == pytest.approx(summary(rows)[0])
    assert data["rows"][0]["id"] == rows[0].id
