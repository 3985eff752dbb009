"""The rows of `exaplan validate --published` and what is computed over them: the row
(ValidationRow), median and max |error|, leave-one-out summaries and targets, the figures a
leave-one-out fold moves, interval coverage, and the section-L groups (by the source's table
and sequence band). The prediction: calibration/validate_published.py; the tables and the
JSON: calibration/validate_tables.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from calibration.record_check import out_of_reach


@dataclass
class ValidationRow:
    """One published figure against the cost model's prediction. error = predicted /
    published - 1 (signed); loo_* are the leave-one-out prediction and its error."""

    id: str
    section: str
    model: str
    machine: str
    device: str
    framework: str
    gpus: int
    layout: str
    kind: str
    unit: str
    published: float
    predicted: float
    error: float
    step_time_s: float
    seq_len: int = 0       # tokens per sequence (a job, for calibration/ranking.py, is one source, model, seq_len, machine, GPU count)
    global_batch: int = 0  # sequences per step
    strata: dict[str, str] = field(default_factory=dict)  # calibration/strata.py: device, framework, sharding, ...
    breakdown_s: dict[str, float] = field(default_factory=dict)
    fits_memory: bool = True
    assumed: list[str] = field(default_factory=list)
    loo_predicted: float | None = None
    loo_error: float | None = None
    # The prediction's interval in the run's unit, as `plan` and `estimate` would show it
    # (machine_models/uncertainty.py: its device kind's and framework's leave-one-out p80),
    # and whether the published figure lies in it.
    interval: tuple[float, float] | None = None
    inside_interval: bool | None = None
    # Fitted figures this row's leave-one-out fold moved by PINNED_SHIFT or more: name ->
    # (with it, without it). A row that pins a figure is predicted from whatever the others
    # make of it when left out, which is where large leave-one-out errors come from.
    loo_moved: dict[str, tuple[float, float]] = field(default_factory=dict)
    # The compute time the record leaves and the rate it implies (calibration/record_check.py).
    record: dict | None = None


# A fitted figure is "pinned" by a row when leaving the row out moves it by this fraction (the
# fixed cost per step: by PINNED_SHIFT_S seconds).
PINNED_SHIFT = 0.2


PINNED_SHIFT_S = 0.02


def moved_figures(full: dict[str, float], fold: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The figures of `fold` that differ from `full` by PINNED_SHIFT or more: name -> (full, fold)."""
    out = {}
    for name, value in fold.items():
        was = full[name]
        shift = abs(value - was) >= PINNED_SHIFT_S if name == "step_overhead_s" else abs(value - was) >= PINNED_SHIFT * abs(was)
        if shift:
            out[name] = (was, value)
    return out


def summary(rows: list[ValidationRow]) -> tuple[float, float]:
    """(median |error|, max |error|) over the rows, as fractions."""
    errs = np.abs([r.error for r in rows])
    return float(np.median(errs)), float(np.max(errs))


def loo_summary(rows: list[ValidationRow]) -> tuple[float, float] | None:
    """(median, max) |leave-one-out error|, or None when the rows have none."""
    errs = [abs(r.loo_error) for r in rows if r.loo_error is not None]
    return (float(np.median(errs)), float(np.max(errs))) if errs else None


# The targets of the published-run fit: leave-one-out median and max |error|, rows.
LOO_TARGETS = {"median": 0.03, "max": 0.10, "rows": 25}


def loo_targets(rows: list[ValidationRow]) -> dict | None:
    """Each target with its value and whether it is met, and the rows past the maximum
    (largest first); None without leave-one-out errors."""
    loo = loo_summary(rows)
    if loo is None:
        return None
    n = sum(r.loo_error is not None for r in rows)
    over = sorted((r for r in rows if r.loo_error is not None and abs(r.loo_error) > LOO_TARGETS["max"]),
                  key=lambda r: -abs(r.loo_error))
    return {"median": {"target": LOO_TARGETS["median"], "value": loo[0], "met": loo[0] <= LOO_TARGETS["median"]},
            "max": {"target": LOO_TARGETS["max"], "value": loo[1], "met": loo[1] <= LOO_TARGETS["max"],
                    "rows_over": {r.id: r.loo_error for r in over},
                    "unreachable_records": [r.id for r in over if out_of_reach(r.record)]},
            "rows": {"target": LOO_TARGETS["rows"], "value": n, "met": n >= LOO_TARGETS["rows"]}}


def interval_coverage(rows: list[ValidationRow]) -> float | None:
    """The fraction of rows whose published figure lies inside the prediction's interval (None
    where no row has one). On held-out rows this checks the intervals themselves: they are the
    QUANTILE of leave-one-out errors, so about that fraction should fall inside."""
    marks = [r.inside_interval for r in rows if r.inside_interval is not None]
    return float(np.mean(marks)) if marks else None


def groups(rows: list[ValidationRow], attr: str) -> dict[str, list[ValidationRow]]:
    out: dict[str, list[ValidationRow]] = {}
    for r in rows:
        out.setdefault(getattr(r, attr), []).append(r)
    return out


# Held-out sections too long to list row by row: summarised (render_published), whole in --json.
SUMMARISED_SECTIONS = ("L",)


# Sequence bands of the section-L summary: short (what the fitted rows cover) and long.
LONG_SEQ = 8192


def foundry_groups(rows: list[ValidationRow]) -> dict[str, dict[str, list[ValidationRow]]]:
    """Section-L rows by the source's table, then by sequence band ('all', '< 8k', '>= 8k')."""
    from calibration.published_foundry import TABLES, foundry_runs, foundry_table

    runs = {r.id: r for r in foundry_runs()}
    out: dict[str, dict[str, list[ValidationRow]]] = {}
    for table in TABLES:
        part = [r for r in rows if foundry_table(runs[r.id]) == table]
        if part:
            seq = {r.id: runs[r.id].model.seq_len for r in part}
            out[table] = {"all": part, f"< {LONG_SEQ // 1024}k": [r for r in part if seq[r.id] < LONG_SEQ],
                          f">= {LONG_SEQ // 1024}k": [r for r in part if seq[r.id] >= LONG_SEQ]}
    return out
