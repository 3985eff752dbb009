"""Published rows whose figure the fitted cost model cannot reach under their record.

A row's record (calibration/data/published/) fixes its layout, unstated fields included, and so
the communication, bubble and optimizer time the cost model charges it. Take that time from
the published step: what is left is the time the record leaves for the compute. Over it, the
step's hardware FLOPs run at some fraction of the device's peak. Where that fraction is above
the asymptote of the device kind's fitted GEMM curve (`matmul_efficiency.peak_fraction`, the
fastest the fitted model runs any work), the row is out of the model's reach: its whole step
(attention, norms and the loss included) would have to run faster than the fitted model's
largest GEMMs. Either the record is not what ran (an unstated micro-batch, gradient dtype or
schedule), or the modelled communication is wrong for it, or the fitted curve is too slow for
it alone; the report names the row's unstated fields.

    check = check_record(run, machine, evaluation, predicted)
    check.unreachable      # implied_fraction above ceiling (or no compute time left)
    record_lines(rows)     # one line per unreachable row, for `exaplan validate --published`

`line_rate_fraction` repeats the arithmetic with every link at its line rate (network and NIC
efficiency 1), the most the modelled communication could shrink; `other_precision_fraction`
with the other 16-bit precision where the record had to choose one (Megatron reduces bf16
training's gradients in fp32 and fp16 training's in fp16).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.step import evaluate

# Figure kinds whose value falls as the step grows (rates); the others grow with it (time).
RATE_KINDS = ("model_tflops_per_gpu", "mfu", "tokens_per_s_per_gpu")


@dataclass
class RecordCheck:
    published_step_s: float  # the step time the published figure stands for
    compute_left_s: float  # that step less the modelled communication, bubble and optimizer time
    implied_fraction: float | None  # the step's hardware FLOPs over compute_left_s, of peak (None: no time left)
    modelled_fraction: float  # the same over the modelled compute time
    ceiling: float  # the fitted GEMM curve's asymptote, as a fraction of peak (matmul peak_fraction)
    unreachable: bool = False  # implied_fraction above the ceiling, or no time left
    line_rate_fraction: float | None = None  # implied_fraction with every link at line rate (unreachable rows only)
    # The same with the record's other 16-bit precision, where its precision is unstated
    # (calibration/search_unstated.py precisions; unreachable rows only): (precision, fraction).
    other_precision: str | None = None
    other_precision_fraction: float | None = None


def published_step_time(kind: str, figure: float, predicted: float, step_time_s: float) -> float:
    """The step time a published figure stands for, from the model's step and its figure for it
    (every kind is proportional or inversely proportional to the step time)."""
    return step_time_s * (predicted / figure if kind in RATE_KINDS else figure / predicted)


def _fraction(run, machine, evaluation, published_step_s: float) -> tuple[float, float | None, float]:
    """(compute time left, implied fraction of peak (None: none left), modelled fraction of peak)."""
    step = float(evaluation.step_time_s[0])
    compute = float(evaluation.compute_s[0])
    flops = float(evaluation.hardware_tflops_per_device[0]) * 1e12 * step
    peak = machine.peak_flops(run.job().precision)
    left = published_step_s - (step - compute)
    implied = flops / (left * peak) if left > 0 else None
    return left, implied, flops / (compute * peak)


def check_record(run, machine, evaluation, predicted: float) -> RecordCheck:
    """The compute time a published row's record leaves and the rate it implies (module doc)."""
    published = published_step_time(run.kind, run.figure, predicted, float(evaluation.step_time_s[0]))
    left, implied, modelled = _fraction(run, machine, evaluation, published)
    ceiling = machine.matmul_efficiency.peak_fraction
    check = RecordCheck(published, left, implied, modelled, ceiling, unreachable=implied is None or implied > ceiling)
    if check.unreachable:
        fast = machine.model_copy(update={"network_efficiency": 1.0, "inter_node_efficiency": None})
        ev = evaluate(run.model, fast, run.job(), run.layouts())
        check.line_rate_fraction = _fraction(run, fast, ev, published)[1]
        _other_precision(check, run, machine, published)
    return check


def _other_precision(check: RecordCheck, run, machine, published: float) -> None:
    """The implied fraction under the run's other 16-bit precision, where the record had to
    choose one (a framework may reduce the two formats' gradients in different dtypes)."""
    from calibration.search_unstated import precisions

    others = precisions(run)[1:]
    if not others:
        return
    alt = run.model_copy(update={"precision": others[0]})
    ev = evaluate(alt.model, machine, alt.job(), alt.layouts())
    check.other_precision = others[0].value
    check.other_precision_fraction = _fraction(alt, machine, ev, published)[1]


def out_of_reach(record: dict | None) -> bool:
    """Whether a row's check (a RecordCheck as a dict, ValidationRow.record) found it out of reach."""
    return bool(record and record["unreachable"])


def _pct(x: float | None) -> str:
    return "no time left" if x is None else f"{100 * x:.0f}%"


def record_line(row_id: str, check: RecordCheck, assumed: list[str]) -> str:
    """One row's verdict, for the validate report."""
    line_rate = "" if check.line_rate_fraction is None else f" ({_pct(check.line_rate_fraction)} with every link at line rate"
    if check.other_precision is not None:
        line_rate += f"; {_pct(check.other_precision_fraction)} in {check.other_precision}"
    line_rate += ")" if line_rate else ""
    unstated = f"; its unstated fields: {', '.join(assumed)}" if assumed else ""
    return (f"  {row_id}: the published step ({check.published_step_s:.3g} s) leaves {check.compute_left_s:.3g} s for compute "
            f"after the modelled communication, bubble and optimizer: {_pct(check.implied_fraction)} of peak{line_rate}, "
            f"above the fitted GEMM curve's asymptote ({_pct(check.ceiling)}); the model's compute runs at "
            f"{_pct(check.modelled_fraction)}{unstated}")


def record_lines(rows) -> list[str]:
    """The rows (ValidationRow) whose record the model cannot reach, with a heading; [] if none."""
    bad = [r for r in rows if out_of_reach(r.record)]
    if not bad:
        return []
    head = ("records out of the fitted model's reach (the published figure needs the whole step's compute faster than "
            "the device kind's fitted GEMM asymptote: the record, the modelled communication or the curve is wrong for it):")
    return [head] + [record_line(r.id, RecordCheck(**r.record), r.assumed) for r in bad]
