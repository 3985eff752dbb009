"""Predict the published runs (planner.published) and fit the device-kind figures to them.

    rows = validate_published()              # shipped machine models, with leave-one-out
    rows = validate_published(refit=True)    # fit, write machine_models/device_kinds.yaml, predict
    render_published(rows, console)          # table + median/max |error| (and leave-one-out)
    published_json(rows)                     # the same as a dict, for --json

The fit (`fit_device_kinds`) adjusts four physical figures per device kind, never one
constant per run: the matmul efficiency curve (peak_fraction, half_dim), the attention-core
efficiency relative to a GEMM, and the hidden fraction of data-parallel traffic. (What
belongs to a run's framework, not to the device, comes from the run's record: its attention
kernel and whether it hides tensor-parallel traffic; see PublishedRun.adapt_machine.) It
minimises the squared log error of the rows of that kind (scipy.optimize.least_squares)
within physical bounds, with a weak pull towards the first guesses so that a figure the rows
cannot determine stays where it was. Leave-one-out (fit on every row of the kind but one,
predict that one) shows how well the fit generalises: it is the honest error.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from machine_models import DEVICE_KINDS_FILE, load_machine
from planner.cost.step import evaluate
from planner.published import PublishedRun, published_runs
from planner.specs import MachineModel

# The figures the fit may move, their bounds, and the first guesses (device_kinds.yaml before
# any fit) that fitted=False predicts with and that the weak prior pulls towards.
FIGURES = ("peak_fraction", "half_dim", "attention_efficiency_factor", "overlap_dp")
BOUNDS = {
    "peak_fraction": (0.3, 0.95),
    "half_dim": (16.0, 4096.0),
    "attention_efficiency_factor": (0.2, 1.0),
    "overlap_dp": (0.2, 1.0),
}
FIRST_GUESSES = {
    "NVIDIA H100 SXM5": {"peak_fraction": 0.75, "half_dim": 300.0, "attention_efficiency_factor": 0.6, "overlap_dp": 0.9},
    "NVIDIA A100 SXM4": {"peak_fraction": 0.8, "half_dim": 200.0, "attention_efficiency_factor": 0.75, "overlap_dp": 0.9},
}
# Weight of the pull towards the first guess, per unit of (log) figure, against residuals in
# log error: 0.05 moves a figure freely when the rows say so (one row 5% off outweighs it).
PRIOR_WEIGHT = 0.05
# Coarse grid of starting points for the figures the fit can stall on (see fit_one_kind),
# and how many of its best points the fit starts from besides the prior.
GRID_STARTS = {"attention_efficiency_factor": (0.3, 0.6, 0.9), "overlap_dp": (0.3, 0.6, 0.9)}
GRID_KEEP = 2
# Device kinds that share fitted figures with a fitted kind (no published rows of their own).
SHARES_FIGURES_WITH = {"NVIDIA GH200": "NVIDIA H100 SXM5"}
FIT_COMMAND = "exaplan validate --published --refit"
FIT_MARK = "# fit:"  # starts the comment lines the refit writes (and replaces) in device_kinds.yaml


@dataclass
class ValidationRow:
    """One published figure against the cost model's prediction. error = predicted /
    published - 1 (signed); loo_* are the leave-one-out prediction and its error."""

    id: str
    section: str
    model: str
    machine: str
    device: str
    gpus: int
    layout: str
    kind: str
    unit: str
    published: float
    predicted: float
    error: float
    step_time_s: float
    breakdown_s: dict[str, float] = field(default_factory=dict)
    fits_memory: bool = True
    assumed: list[str] = field(default_factory=list)
    loo_predicted: float | None = None
    loo_error: float | None = None


# --------------------------------------------------------------------------------------------
# Figures <-> machines
# --------------------------------------------------------------------------------------------


def figures_of(machine: MachineModel) -> dict[str, float]:
    """The fitted figures a machine carries."""
    return {
        "peak_fraction": machine.matmul_efficiency.peak_fraction,
        "half_dim": machine.matmul_efficiency.half_dim,
        "attention_efficiency_factor": machine.attention_efficiency_factor,
        "overlap_dp": machine.overlap.dp,
    }


def with_figures(machine: MachineModel, figures: dict[str, float]) -> MachineModel:
    """A copy of `machine` carrying `figures` (any subset of FIGURES)."""
    f = {**figures_of(machine), **figures}
    return machine.model_copy(update={
        "matmul_efficiency": machine.matmul_efficiency.model_copy(update={"peak_fraction": f["peak_fraction"], "half_dim": f["half_dim"]}),
        "attention_efficiency_factor": f["attention_efficiency_factor"],
        "overlap": machine.overlap.model_copy(update={"dp": f["overlap_dp"]}),
    })


def _machines(runs: list[PublishedRun]) -> dict[str, MachineModel]:
    return {name: load_machine(name) for name in sorted({r.machine for r in runs})}


def predict(run: PublishedRun, machine: MachineModel):
    """(predicted figure in the run's unit, Evaluation) of one published run on `machine`."""
    m = run.adapt_machine(machine)
    # With overlap.tp = 1 the cost model multiplies 0 exposed calls by the infinite cost of
    # an algorithm the library does not offer (NaN, then never chosen): silence that.
    with np.errstate(invalid="ignore"):
        ev = evaluate(run.model, m, run.job(), run.layouts())
    return float(run.figure_from_step_time(ev.step_time_s[0], m)), ev


def _log_errors(runs: list[PublishedRun], machine: MachineModel) -> np.ndarray:
    return np.array([math.log(predict(r, machine)[0] / r.figure) for r in runs])


# --------------------------------------------------------------------------------------------
# The fit
# --------------------------------------------------------------------------------------------


def _to_x(figs: dict[str, float], names: list[str]) -> np.ndarray:
    # half_dim is fitted on a log scale (it spans two decades); the rest are fractions.
    return np.array([math.log(figs[n]) if n == "half_dim" else figs[n] for n in names])


def _from_x(x: np.ndarray, names: list[str]) -> dict[str, float]:
    return {n: float(math.exp(v) if n == "half_dim" else v) for n, v in zip(names, x)}


def fit_one_kind(runs: list[PublishedRun], machine: MachineModel) -> dict[str, float]:
    """Fit FIGURES for the device kind of `machine` to `runs` (all on that kind)."""
    from scipy.optimize import least_squares  # only the fit needs scipy

    device = machine.device_name
    prior = FIRST_GUESSES.get(device, figures_of(machine))
    names = list(FIGURES)
    lo = _to_x({n: BOUNDS[n][0] for n in names}, names)
    hi = _to_x({n: BOUNDS[n][1] for n in names}, names)
    x0 = np.clip(_to_x(prior, names), lo + 1e-9, hi - 1e-9)
    x_prior = _to_x(prior, names)

    def residuals(x):
        m = with_figures(machine, _from_x(x, names))
        return np.concatenate([_log_errors(runs, m), PRIOR_WEIGHT * (x - x_prior)])

    # The exposed-traffic terms are max(traffic - overlap x compute, floor), flat where
    # every row sits at its floor, and the figures trade off against each other: a single
    # start can stall. Start from the prior and from the best points of a coarse grid over
    # the attention and overlap figures, and keep the best fit.
    grid = []
    for values in itertools.product(*(GRID_STARTS[n] for n in names if n in GRID_STARTS)):
        x = x0.copy()
        for n, v in zip([n for n in names if n in GRID_STARTS], values):
            x[names.index(n)] = v
        grid.append((float(np.sum(residuals(x) ** 2)), x))
    grid.sort(key=lambda item: item[0])
    best = None
    for x_start in [x0] + [x for _, x in grid[:GRID_KEEP]]:
        res = least_squares(residuals, x_start, bounds=(lo, hi), diff_step=1e-3, xtol=1e-4, ftol=1e-6)
        if best is None or res.cost < best.cost:
            best = res
    return _from_x(best.x, names)


def fit_device_kinds(rows_subset: list[PublishedRun] | None = None) -> dict[str, dict[str, float]]:
    """Fitted figures per device kind (device_name -> figure -> value) from the given runs
    (default: every published run). Each kind is fitted on its own rows only."""
    runs = published_runs() if rows_subset is None else list(rows_subset)
    machines = _machines(runs)
    out: dict[str, dict[str, float]] = {}
    for device, kind_runs in _by_device(runs, machines).items():
        machine = machines[kind_runs[0].machine]
        out[device] = fit_one_kind(kind_runs, machine)
    return out


def _by_device(runs: list[PublishedRun], machines: dict[str, MachineModel]) -> dict[str, list[PublishedRun]]:
    groups: dict[str, list[PublishedRun]] = {}
    for r in runs:
        groups.setdefault(machines[r.machine].device_name, []).append(r)
    return groups


def leave_one_out(runs: list[PublishedRun] | None = None, ids: list[str] | None = None,
                  workers: int | None = None) -> dict[str, float]:
    """Run id -> its prediction from a fit on every other run of its device kind, for the
    runs named in `ids` (default: all). Each fold repeats the whole fit (prior and grid
    starts), so the held-out row cannot steer it. About 2 s per fold on one core; folds run
    in `workers` processes (default: one per CPU)."""
    runs = published_runs() if runs is None else list(runs)
    machines = _machines(runs)
    folds = []
    for kind_runs in _by_device(runs, machines).values():
        for i, held_out in enumerate(kind_runs):
            if ids is None or held_out.id in ids:
                folds.append((held_out, kind_runs[:i] + kind_runs[i + 1:], machines[held_out.machine]))
    workers = min(workers or os.cpu_count() or 1, len(folds))
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            predictions = list(pool.map(_fold, folds))
    else:
        predictions = [_fold(f) for f in folds]
    return {held_out.id: p for (held_out, _, _), p in zip(folds, predictions)}


def _fold(fold: tuple[PublishedRun, list[PublishedRun], MachineModel]) -> float:
    held_out, others, machine = fold
    return predict(held_out, with_figures(machine, fit_one_kind(others, machine)))[0]


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _row(run: PublishedRun, machine: MachineModel) -> ValidationRow:
    predicted, ev = predict(run, machine)
    return ValidationRow(
        id=run.id, section=run.section, model=run.model.name, machine=run.machine, device=machine.device_name,
        gpus=run.gpus, layout=run.layout.describe(), kind=run.kind, unit=run.unit, published=run.figure,
        predicted=predicted, error=predicted / run.figure - 1.0, step_time_s=float(ev.step_time_s[0]),
        breakdown_s={k: float(getattr(ev, k)[0]) for k in ("compute_s", "bubble_s", "tp_s", "dp_s", "pp_s", "optimizer_s")},
        fits_memory=bool(ev.memory.fits[0]), assumed=list(run.assumed),
    )


def validate_published(fitted: bool = True, *, refit: bool = False, leave_one_out_errors: bool = True) -> list[ValidationRow]:
    """Every published run, predicted and compared with its published figure.

    fitted=True: with the machine models as shipped, whose device kinds carry the fitted
    figures (machine_models/device_kinds.yaml). fitted=False: with the first guesses
    (FIRST_GUESSES), to show what the fit changed. refit=True: fit again, write the figures
    into device_kinds.yaml and predict with them (`exaplan validate --published --refit`).
    leave_one_out_errors: also fit without each row and predict it (one whole fit per row:
    about a minute on one core, divided among the CPUs).
    """
    if refit:
        return refit_device_kinds(write=True, leave_one_out_errors=leave_one_out_errors)[1]
    runs = published_runs()
    shipped = _machines(runs)
    machines = shipped if fitted else {n: with_figures(m, FIRST_GUESSES.get(m.device_name, {})) for n, m in shipped.items()}
    rows = [_row(r, machines[r.machine]) for r in runs]
    if leave_one_out_errors:
        _add_leave_one_out(rows, runs)
    return rows


def _add_leave_one_out(rows: list[ValidationRow], runs: list[PublishedRun]) -> None:
    loo = leave_one_out(runs)
    for row in rows:
        row.loo_predicted = loo[row.id]
        row.loo_error = loo[row.id] / row.published - 1.0


def summary(rows: list[ValidationRow]) -> tuple[float, float]:
    """(median |error|, max |error|) over the rows, as fractions."""
    errs = np.abs([r.error for r in rows])
    return float(np.median(errs)), float(np.max(errs))


def loo_summary(rows: list[ValidationRow]) -> tuple[float, float] | None:
    """(median, max) |leave-one-out error|, or None when the rows have none."""
    errs = [abs(r.loo_error) for r in rows if r.loo_error is not None]
    return (float(np.median(errs)), float(np.max(errs))) if errs else None


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _fmt(value: float, kind: str) -> str:
    if kind == "mfu":
        return f"{100 * value:.1f}%"
    if kind == "iteration_time_s":
        return f"{value:.2f}"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}"


def render_published(rows: list[ValidationRow], console) -> None:
    """Print the rows as a rich table, then median and max |error| (and leave-one-out)."""
    from rich.table import Table

    table = Table(title="Published runs: predicted vs published", show_lines=False)
    for col, just in [("row", "left"), ("model", "left"), ("GPUs", "right"), ("layout", "left"), ("published", "right"),
                      ("predicted", "right"), ("unit", "left"), ("error", "right"), ("leave-one-out", "right")]:
        table.add_column(col, justify=just)
    for r in rows:
        err = f"{100 * r.error:+.1f}%"
        style = "red" if abs(r.error) > 0.25 else ("yellow" if abs(r.error) > 0.10 else "")
        loo = "" if r.loo_error is None else f"{100 * r.loo_error:+.1f}%"
        mark = "*" if r.assumed else ""
        table.add_row(r.id + mark, r.model, str(r.gpus), r.layout, _fmt(r.published, r.kind), _fmt(r.predicted, r.kind),
                      r.unit, f"[{style}]{err}[/]" if style else err, loo)
    console.print(table)
    med, worst = summary(rows)
    console.print(f"median |error| {100 * med:.1f}%, max |error| {100 * worst:.1f}% over {len(rows)} rows")
    loo = loo_summary(rows)
    if loo:
        console.print(f"leave-one-out (fit without the row, then predict it): median |error| {100 * loo[0]:.1f}%, "
                      f"max {100 * loo[1]:.1f}%")
    for device, part in _per_device(rows).items():
        med, worst = summary(part)
        loo = loo_summary(part)
        loo_txt = f"; leave-one-out median {100 * loo[0]:.1f}%, max {100 * loo[1]:.1f}%" if loo else ""
        console.print(f"  {device}: median {100 * med:.1f}%, max {100 * worst:.1f}% over {len(part)} rows{loo_txt}")
    if any(r.assumed for r in rows):
        console.print("* a field of this row is not published; planner/published.py documents the choice made")


def published_json(rows: list[ValidationRow]) -> dict:
    """The rows and their summary (all rows, then per device kind) as a JSON-ready dict;
    errors are signed fractions (predicted / published - 1), summaries absolute."""
    return {
        "rows": [asdict(r) for r in rows],
        "summary": _summary_json(rows),
        "by_device": {device: _summary_json(part) for device, part in _per_device(rows).items()},
    }


def _summary_json(rows: list[ValidationRow]) -> dict:
    med, worst = summary(rows)
    loo = loo_summary(rows)
    return {
        "rows": len(rows),
        "median_abs_error": med,
        "max_abs_error": worst,
        "loo_median_abs_error": None if loo is None else loo[0],
        "loo_max_abs_error": None if loo is None else loo[1],
    }


def _per_device(rows: list[ValidationRow]) -> dict[str, list[ValidationRow]]:
    groups: dict[str, list[ValidationRow]] = {}
    for r in rows:
        groups.setdefault(r.device, []).append(r)
    return groups


# --------------------------------------------------------------------------------------------
# Writing the fit into machine_models/device_kinds.yaml
# --------------------------------------------------------------------------------------------


def refit_device_kinds(path: Path = DEVICE_KINDS_FILE, write: bool = True,
                       leave_one_out_errors: bool = True) -> tuple[dict[str, dict[str, float]], list[ValidationRow]]:
    """Fit every device kind to the published runs and predict them with the fitted figures
    (and leave-one-out); with write=True, write the figures into `path`, keeping its comments.
    Returns (figures per device kind, rows)."""
    runs = published_runs()
    machines = _machines(runs)
    fitted = fit_device_kinds(runs)
    rows = [_row(r, with_figures(machines[r.machine], fitted[machines[r.machine].device_name])) for r in runs]
    if leave_one_out_errors:
        _add_leave_one_out(rows, runs)
    if write:
        write_device_kinds(fitted, rows, path)
    return fitted, rows


def write_device_kinds(fitted: dict[str, dict[str, float]], rows: list[ValidationRow], path: Path = DEVICE_KINDS_FILE,
                       date: str | None = None) -> None:
    """Rewrite the fitted lines of each fitted device kind's block (and of the kinds that
    share its figures) in `path`, with a comment saying how and when; other lines stay."""
    date = date or _dt.date.today().isoformat()
    text = Path(path).read_text()
    for device, figs in fitted.items():
        kind_rows = [r for r in rows if r.device == device]
        med, worst = summary(kind_rows)
        loo = loo_summary(kind_rows)
        note = [f"`{FIT_COMMAND}`, {date}: median |error| {100 * med:.1f}% (max {100 * worst:.1f}%)",
                f"over {len(kind_rows)} published rows"
                + (f"; leave-one-out median {100 * loo[0]:.1f}% (max {100 * loo[1]:.1f}%)." if loo else ".")]
        text = _rewrite_block(text, device, figs, note)
        for sharer, source in SHARES_FIGURES_WITH.items():
            if source == device:
                text = _rewrite_block(text, sharer, figs, [f"copied from {device} (same GPU, no published rows of its own)."] + note)
    Path(path).write_text(text)


def _rewrite_block(text: str, device: str, figs: dict[str, float], note: list[str]) -> str:
    """Replace the fitted lines of one device kind's block and its "# fit:" comment lines."""
    lines = text.splitlines()
    try:
        start = lines.index(f"{device}:")
    except ValueError:
        return text  # the kind is not in the file: nothing to update
    end = start + 1
    while end < len(lines) and (not lines[end] or lines[end].startswith((" ", "#"))):
        end += 1
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1  # comments after the block belong to the next one
    block = [ln for ln in lines[start + 1:end] if not ln.strip().startswith(FIT_MARK)]
    values = {
        "matmul_efficiency": f"{{peak_fraction: {figs['peak_fraction']:.3f}, half_dim: {figs['half_dim']:.1f}}}",
        "attention_efficiency_factor": f"{figs['attention_efficiency_factor']:.3f}",
    }
    out = []
    for ln in block:
        key = ln.strip().split(":", 1)[0]
        if key in values and not ln.strip().startswith("#"):
            ln = f"  {key}: {values[key]}"
        elif key == "overlap" and not ln.strip().startswith("#"):
            ln = re.sub(r"dp: [0-9.]+", f"dp: {figs['overlap_dp']:.3f}", ln)
        out.append(ln)
    out[:0] = [f"  {FIT_MARK} {line}" for line in note]
    return "\n".join(lines[:start + 1] + out + lines[end:]) + ("\n" if text.endswith("\n") else "")
