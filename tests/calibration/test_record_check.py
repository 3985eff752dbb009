"""The record check of `exaplan validate --published` (calibration/record_check.py): the compute
time a published row's record leaves, and whether the fitted model can reach it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calibration.published import held_out_runs, published_runs
from calibration.record_check import check_record, published_step_time, record_lines
from calibration.validate_published import loo_targets, predict, shipped_machine, validate_published
from machine_models import load_machine


def _run(run_id: str):
    return next(r for r in published_runs() + held_out_runs() if r.id == run_id)


@pytest.mark.parametrize("run_id", ["A-gpt-16b", "B-gpt-175b-selective", "C-mpt-7b", "B-gpt-22b-full"])
def test_the_published_step_inverts_the_figure(run_id):
    """Every figure kind (TFLOP/s, MFU, tokens/s, s/step) maps back to the step time it stands for."""
    run = _run(run_id)
    machine = shipped_machine(run, load_machine(run.machine))
    predicted, ev = predict(run, machine)
    step = float(ev.step_time_s[0])
    for other in (0.5 * step, 1.7 * step):
        figure = float(run.figure_from_step_time(other, machine))
        assert published_step_time(run.kind, figure, predicted, step) == pytest.approx(other, rel=1e-9)


def test_a_row_at_its_own_prediction_is_in_reach_and_a_much_faster_one_is_not():
    run = _run("A-gpt-16b")
    machine = shipped_machine(run, load_machine(run.machine))
    predicted, ev = predict(run, machine)
    own = check_record(run.model_copy(update={"figure": predicted}), machine, ev, predicted)
    assert own.implied_fraction == pytest.approx(own.modelled_fraction) and not own.unreachable
    assert own.line_rate_fraction is None  # computed for unreachable rows only
    fast = check_record(run.model_copy(update={"figure": 1.6 * predicted}), machine, ev, predicted)
    assert fast.unreachable and fast.implied_fraction > fast.ceiling
    # at line rate the communication shrinks, so less of the step is taken from the compute
    assert fast.line_rate_fraction is not None and fast.line_rate_fraction < fast.implied_fraction
    # a figure so fast that the modelled communication alone takes longer leaves no time at all
    none_left = check_record(run.model_copy(update={"figure": 50 * predicted}), machine, ev, predicted)
    assert none_left.implied_fraction is None and none_left.unreachable


def test_of_the_fitted_rows_only_the_32b_megatron_row_is_out_of_reach():
    """A-gpt-32b (the leave-one-out maximum, docs/validation/limits.md) needs its whole step's compute
    above H100's fitted GEMM asymptote under its record; every other fitted row is in reach."""
    rows = validate_published()
    out = [r.id for r in rows if r.record["unreachable"]]
    assert out == ["A-gpt-32b"], out
    lines = record_lines(rows)
    assert len(lines) == 2 and lines[1].lstrip().startswith("A-gpt-32b:") and "layout.micro_batch" in lines[1]
    # its precision is unstated: in fp16, whose gradients Megatron reduces in fp16, it is in reach
    record = next(r.record for r in rows if r.id == "A-gpt-32b")
    assert record["other_precision"] == "fp16" and record["other_precision_fraction"] < record["ceiling"]
    assert "in fp16" in lines[1]
    assert record_lines([r for r in rows if r.id != "A-gpt-32b"]) == []


def test_the_targets_name_the_rows_past_the_maximum_whose_record_is_out_of_reach():
    rows = [r for r in validate_published() if r.id in ("A-gpt-32b", "A-gpt-7.1b", "A-gpt-16b")]
    loo = {"A-gpt-32b": -0.20, "A-gpt-7.1b": 0.12, "A-gpt-16b": 0.01}
    max_target = loo_targets([replace(r, loo_error=loo[r.id]) for r in rows])["max"]
    assert list(max_target["rows_over"]) == ["A-gpt-32b", "A-gpt-7.1b"]
    assert max_target["unreachable_records"] == ["A-gpt-32b"]  # 7.1b is past the maximum but in reach
