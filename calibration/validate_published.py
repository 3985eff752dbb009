"""Predict the published runs (calibration.published) and compare with what their authors measured.

    rows = validate_published()                           # shipped machine models
    rows = validate_published(leave_one_out_errors=True)  # and the leave-one-out error (~2 CPU-minutes)
    rows = validate_published(refit=True)                 # fit, write device_kinds.yaml, predict
    render_published(rows, console)   # table + median/max |error| overall, per device kind, per framework
    published_json(rows)              # the same as a dict, for --json

Prediction runs the cost model (planner.cost.step.evaluate) on each run's model, machine and
layout, with the machine as the run's framework used it. The figures fitted to these runs
are calibration.fit_published's: per device kind (matmul curve, attention efficiency),
shipped in machine_models/device_kinds.yaml, and per framework (hidden data-parallel traffic,
fixed cost per step). The shipped machine models carry the FSDP framework's figures (the
framework of exaplan's runtime); Megatron rows are predicted with Megatron's fitted figures,
which the refit records in the header of device_kinds.yaml. Refitting and leave-one-out call
calibration.fit_published (which uses scipy); plain validation needs only numpy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from machine_models import DEVICE_KINDS_FILE
from calibration import fit_files, fit_published as cal, gemm_benchmarks
from planner.cost.step import evaluate
from calibration.published import PROFILE_OF, PublishedRun, held_out_runs, published_runs
from calibration.record_check import check_record, out_of_reach, record_lines
from machine_models.uncertainty import QUANTILE, uncertainty_of
from planner.schema.specs import MachineModel


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


# --------------------------------------------------------------------------------------------
# Prediction
# --------------------------------------------------------------------------------------------


def predict(run: PublishedRun, machine: MachineModel):
    """(predicted figure in the run's unit, Evaluation) of one published run on `machine`
    (the machine as its framework achieves it: see shipped_machine)."""
    ev = evaluate(run.model, machine, run.job(), run.layouts())
    return float(run.figure_from_step_time(ev.step_time_s[0], machine)), ev


def shipped_machine(run: PublishedRun, machine: MachineModel,
                    recorded: dict[str, dict[str, float]] | None = None) -> MachineModel:
    """The run's machine preset as shipped, with the fitted figures of the run's framework:
    those the preset carries for the shipped framework (FSDP), the ones the last refit
    recorded in device_kinds.yaml for any other (`recorded`: framework -> figures, default
    read from the file; first guesses where none is recorded)."""
    if run.framework == cal.SHIPPED_FRAMEWORK:
        return machine
    recorded = fit_files.framework_figures() if recorded is None else recorded
    return cal.with_figures(machine, recorded.get(run.framework, cal.FRAMEWORK_FIRST_GUESSES[run.framework]))


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _row(run: PublishedRun, machine: MachineModel) -> ValidationRow:
    predicted, ev = predict(run, machine)
    u = uncertainty_of(machine, run.job().framework)
    lo, hi = u.time_interval(predicted) if run.kind == "iteration_time_s" else u.rate_interval(predicted)
    return ValidationRow(
        id=run.id, section=run.section, model=run.model.name, machine=run.machine, device=machine.device_name,
        framework=run.framework, gpus=run.gpus, kind=run.kind, unit=run.unit,
        layout=run.layout.describe() + (f" {run.torch_blocks}" if run.torch_blocks else ""),
        published=run.figure, predicted=predicted, error=predicted / run.figure - 1.0, step_time_s=float(ev.step_time_s[0]),
        breakdown_s={k: float(getattr(ev, k)[0]) for k in ("compute_s", "bubble_s", "tp_s", "dp_s", "pp_s", "optimizer_s")},
        fits_memory=bool(ev.memory.fits[0]), assumed=list(run.assumed),
        interval=(lo, hi), inside_interval=bool(lo <= run.figure <= hi),
        record=asdict(check_record(run, machine, ev, predicted)),
    )


def validate_published(fitted: bool = True, *, refit: bool = False, leave_one_out_errors: bool = False,
                       on_fold=None) -> list[ValidationRow]:
    """Every published run, predicted and compared with its published figure.

    fitted=True: with the machine models as shipped (device_kinds.yaml) and each run's
    framework figures (shipped_machine). fitted=False: with the first guesses of
    calibration.fit_published, to show what the fit changed. refit=True: fit again, write
    the figures into device_kinds.yaml and predict with them (`exaplan validate --published
    --refit`; about a minute). leave_one_out_errors: also fit without each row and predict it
    (one whole fit per row: about 40 minutes on one core, divided among the CPUs; off by
    default, `--loo`), calling on_fold(run id) as each fold ends.
    """
    if refit:
        return refit_device_kinds(write=True, leave_one_out_errors=leave_one_out_errors, on_fold=on_fold)[1]
    runs = published_runs()
    shipped = cal.machines_of(runs)
    if fitted:
        recorded = fit_files.framework_figures()
        machines = [shipped_machine(r, shipped[r.machine], recorded) for r in runs]
    else:
        machines = [cal.first_guess_machine(shipped[r.machine], r.framework) for r in runs]
    rows = [_row(r, m) for r, m in zip(runs, machines)]
    if leave_one_out_errors:
        _add_leave_one_out(rows, runs, machines, on_fold)
    return rows


def validate_searched(rows: list[ValidationRow] | None = None) -> list:
    """The rows with chosen (unpublished) layout fields, searched over those fields
    (calibration/search_unstated.py), with the shipped figures: the fitted rows, then the
    held-out rows listed one by one (section L, summarised, is not searched)."""
    from calibration.search_unstated import search_unstated

    runs = published_runs() + [r for r in held_out_runs() if r.section not in SUMMARISED_SECTIONS]
    shipped = cal.machines_of(runs)
    recorded = fit_files.framework_figures()
    out = [search_unstated(r, shipped_machine(r, shipped[r.machine], recorded)) for r in runs]
    return [s for s in out if s is not None]


def own_runtime_errors() -> list[tuple[str, str, float]]:
    """(device kind, profile, signed error) of section M, exaplan's own runtime on lent GPUs
    (held out, never fitted), predicted with the shipped figures: out-of-sample errors of the
    very predictions `exaplan plan` makes for its runtime, which the refit pools into the
    exaplan profile's uncertainty (fit_files.write_uncertainty). Not the JAX backend's runs
    (one GPU, five runs): its profile keeps its stated default."""
    from calibration.published_own import own_gpu_runs

    return [(row.device, PROFILE_OF[row.framework], row.error)
            for row in _shipped_rows([r for r in own_gpu_runs() if not r.jax_backend])]


def validate_held_out() -> list[ValidationRow]:
    """The held-out published rows (never fitted), predicted with the shipped figures of their
    device kind and framework: how the model does where nothing was fitted to them."""
    return _shipped_rows(held_out_runs())


def _shipped_rows(runs: list[PublishedRun]) -> list[ValidationRow]:
    """`runs` predicted with the shipped figures of their device kind and framework."""
    shipped = cal.machines_of(runs)
    recorded = fit_files.framework_figures()
    return [_row(r, shipped_machine(r, shipped[r.machine], recorded)) for r in runs]


def _add_leave_one_out(rows: list[ValidationRow], runs: list[PublishedRun], machines: list[MachineModel],
                       on_fold=None) -> None:
    """Each row's leave-one-out prediction and error, and the figures its fold moved (against
    those of `machines`, the machines the rows were predicted on)."""
    folds: dict[str, dict[str, float]] = {}
    loo = cal.leave_one_out(runs, on_fold=on_fold, fold_figures=folds)
    for row, machine in zip(rows, machines):
        row.loo_predicted = loo[row.id]
        row.loo_error = loo[row.id] / row.published - 1.0
        row.loo_moved = moved_figures(cal.figures_of(machine, folds[row.id]), folds[row.id])


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


# The targets of the published-run fit (issue 10): leave-one-out median and max |error|, rows.
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


def _targets_line(rows: list[ValidationRow]) -> str | None:
    t = loo_targets(rows)
    if t is None:
        return None

    def mark(key: str) -> str:
        return "met" if t[key]["met"] else "NOT met"

    unreachable = t["max"]["unreachable_records"]
    over = ", ".join(f"{k} {100 * v:+.1f}%{' (record out of reach, below)' if k in unreachable else ''}"
                     for k, v in t["max"]["rows_over"].items())
    return (f"targets: leave-one-out median <= {100 * t['median']['target']:.0f}% ({100 * t['median']['value']:.1f}%: "
            f"{mark('median')}), max <= {100 * t['max']['target']:.0f}% ({100 * t['max']['value']:.1f}%: {mark('max')}"
            f"{': ' + over if over else ''}), at least {t['rows']['target']} rows ({t['rows']['value']}: {mark('rows')})")


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _fmt(value: float, kind: str) -> str:
    if kind == "mfu":
        return f"{100 * value:.1f}%"
    if kind == "iteration_time_s":
        return f"{value:.2f}"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}"


def render_published(rows: list[ValidationRow], console, held_out: list[ValidationRow] | None = None,
                     searched: list | None = None, list_all: bool = False) -> None:
    """Print the rows as a rich table, then median and max |error| (and leave-one-out),
    overall, per device kind and per framework; then the held-out rows, if given (section L
    summarised by table and sequence band unless `list_all`)."""
    console.print(_table("Published runs: predicted vs published", rows))
    console.print(_summary_line("all rows", rows))
    for name, part in {**_groups(rows, "device"), **_groups(rows, "framework")}.items():
        console.print("  " + _summary_line(name, part))
    for line in gemm_benchmarks.report_lines():
        console.print("  " + line)
    if all(r.loo_error is None for r in rows):
        console.print("leave-one-out (fit without each row, then predict it): `--loo`")
    else:
        console.print(_targets_line(rows))
    for line in pinned_lines(rows) + record_lines(rows + [r for r in held_out or [] if r.section not in SUMMARISED_SECTIONS]):
        console.print(line)
    if held_out:
        listed = [r for r in held_out if list_all or r.section not in SUMMARISED_SECTIONS]
        console.print(_table("Held out (never fitted): predicted vs published", listed))
        console.print(_summary_line("held-out rows", listed, coverage=True))
        foundry = [r for r in held_out if r.section == "L"]
        if foundry:
            console.print(_foundry_table(foundry))
            console.print(_summary_line("section L (every row: --json)", foundry, coverage=True))
    if searched:
        console.print(_searched_table(searched, {r.id: r for r in rows + (held_out or [])}))
    if any(r.assumed for r in rows + (held_out or [])):
        console.print("* a field of this row is not published; calibration/published.py documents the choice made")
    if any(out_of_reach(r.record) for r in rows + (held_out or [])):
        console.print("! the record is out of the fitted model's reach (above)")


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


def _foundry_table(rows: list[ValidationRow]):
    from rich.table import Table

    table = Table(title="Held out: llm-foundry's whole benchmark tables (section L), |error| by table and sequence")
    for col in ("table", "rows", "median", "max", "mean (signed)", "median, seq < 8k", "median, seq >= 8k",
                "inside interval"):
        table.add_column(col, justify="left" if col == "table" else "right")
    for name, bands in foundry_groups(rows).items():
        cells = [f"{100 * summary(part)[0]:.1f}%" if part else "-" for band, part in bands.items() if band != "all"]
        med, worst = summary(bands["all"])
        mean = float(np.mean([r.error for r in bands["all"]]))
        inside = interval_coverage(bands["all"])
        table.add_row(name, str(len(bands["all"])), f"{100 * med:.1f}%", f"{100 * worst:.1f}%", f"{100 * mean:+.1f}%",
                      *cells, "-" if inside is None else f"{100 * inside:.0f}%")
    return table


def _searched_table(searched: list, rows: dict[str, ValidationRow]):
    from rich.table import Table

    table = Table(title="Rows with unpublished layout fields: those fields searched, the rest pinned")
    for col in ("row", "searched", "as recorded", "error", "best layout found", "error"):
        table.add_column(col, justify="right" if col == "error" else "left", no_wrap=col == "error", overflow="fold")
    for s in searched:
        r = rows[s.id]
        err = "" if s.error is None else f"{100 * s.error:+.1f}%"
        table.add_row(s.id, ", ".join(s.free), r.layout, f"{100 * r.error:+.1f}%", s.layout or "(nothing fits)", err)
    return table


def _table(title: str, rows: list[ValidationRow]):
    """Names wrap (folded, never cut to "..."); figures stay on one line; leave-one-out only with --loo."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    with_loo = any(r.loo_error is not None for r in rows)
    for col in ["row", "model", "framework", "GPUs", "layout", "published", "predicted", "unit", "error", "leave-one-out"][:9 + with_loo]:
        figure = col in ("GPUs", "published", "predicted", "error", "leave-one-out")
        table.add_column(col, justify="right" if figure else "left", no_wrap=figure, overflow="fold")
    for r in rows:
        err = f"{100 * r.error:+.1f}%" + (" !" if out_of_reach(r.record) else "")
        style = "red" if abs(r.error) > 0.25 else ("yellow" if abs(r.error) > 0.10 else "")
        loo = [] if not with_loo else ["" if r.loo_error is None else f"{100 * r.loo_error:+.1f}%"]
        table.add_row(r.id + ("*" if r.assumed else ""), r.model, r.framework, str(r.gpus), r.layout,
                      _fmt(r.published, r.kind), _fmt(r.predicted, r.kind), r.unit,
                      f"[{style}]{err}[/]" if style else err, *loo)
    return table


def _summary_line(name: str, rows: list[ValidationRow], coverage: bool = False) -> str:
    med, worst = summary(rows)
    text = f"{name}: median |error| {100 * med:.1f}%, max {100 * worst:.1f}% over {len(rows)} rows"
    loo = loo_summary(rows)
    if loo:
        text += f"; leave-one-out median {100 * loo[0]:.1f}%, max {100 * loo[1]:.1f}%"
    inside = interval_coverage(rows)
    if coverage and inside is not None:
        text += (f"; {round(inside * len(rows))} of {len(rows)} ({100 * inside:.0f}%) inside the interval a plan "
                 f"would show (meant to hold {100 * QUANTILE:.0f}%)")
    return text


def pinned_lines(rows: list[ValidationRow]) -> list[str]:
    """The rows that pin a fitted figure (leaving them out moves it by PINNED_SHIFT or more),
    largest leave-one-out error first: where the leave-one-out errors come from."""
    pinned = sorted((r for r in rows if r.loo_moved), key=lambda r: -abs(r.loo_error or 0.0))
    if not pinned:
        return []
    out = [f"rows that pin a fitted figure (left out, it moves by {100 * PINNED_SHIFT:.0f}% or more):"]
    for r in pinned:
        moved = ", ".join(f"{name} {was:.3g} -> {now:.3g}" for name, (was, now) in r.loo_moved.items())
        out.append(f"  {r.id} (leave-one-out {100 * r.loo_error:+.1f}%): {r.device}/{r.framework} {moved}")
    return out


def interval_coverage(rows: list[ValidationRow]) -> float | None:
    """The fraction of rows whose published figure lies inside the prediction's interval (None
    where no row has one). On held-out rows this checks the intervals themselves: they are the
    QUANTILE of leave-one-out errors, so about that fraction should fall inside."""
    marks = [r.inside_interval for r in rows if r.inside_interval is not None]
    return float(np.mean(marks)) if marks else None


def published_json(rows: list[ValidationRow], held_out: list[ValidationRow] | None = None,
                   searched: list | None = None) -> dict:
    """The rows and their summary (all rows, then per device kind and per framework) as a
    JSON-ready dict, and the held-out rows with theirs; errors are signed fractions
    (predicted / published - 1), summaries absolute."""
    out = {
        "rows": [asdict(r) for r in rows],
        "summary": _summary_json(rows),
        "by_device": {device: _summary_json(part) for device, part in _groups(rows, "device").items()},
        "by_framework": {fw: _summary_json(part) for fw, part in _groups(rows, "framework").items()},
        "gemm_benchmarks": gemm_benchmarks.report(),
    }
    targets = loo_targets(rows)
    if targets is not None:
        out["targets"] = targets
    if held_out:
        out["held_out"] = {"rows": [asdict(r) for r in held_out], "summary": _summary_json(held_out)}
        foundry = [r for r in held_out if r.section == "L"]
        if foundry:
            out["held_out"]["section_l"] = {table: {band: _summary_json(part) for band, part in bands.items() if part}
                                            for table, bands in foundry_groups(foundry).items()}
    if searched:
        out["searched_unstated"] = [asdict(s) for s in searched]
    return out


def _summary_json(rows: list[ValidationRow]) -> dict:
    med, worst = summary(rows)
    loo = loo_summary(rows)
    return {
        "rows": len(rows),
        "median_abs_error": med,
        "max_abs_error": worst,
        "loo_median_abs_error": None if loo is None else loo[0],
        "loo_max_abs_error": None if loo is None else loo[1],
        "inside_interval": interval_coverage(rows),
    }


def _groups(rows: list[ValidationRow], attr: str) -> dict[str, list[ValidationRow]]:
    groups: dict[str, list[ValidationRow]] = {}
    for r in rows:
        groups.setdefault(getattr(r, attr), []).append(r)
    return groups


# --------------------------------------------------------------------------------------------
# Refit: calibration.fit_published, then the notes it writes into device_kinds.yaml
# --------------------------------------------------------------------------------------------


def refit_device_kinds(path: Path = DEVICE_KINDS_FILE, write: bool = True, leave_one_out_errors: bool = False,
                       on_fold=None) -> tuple[cal.Fit, list[ValidationRow]]:
    """Fit the device-kind and framework figures to the published runs
    (calibration.fit_published.fit_published) and predict the runs with them (and
    leave-one-out); with write=True, write the fit into `path`, keeping its comments.
    Returns (the fit, rows)."""
    runs = published_runs()
    machines = cal.machines_of(runs)
    fit = cal.fit_published(runs, times=cal.StepTimes(machines))
    fitted = [cal.machine_for(r, machines[r.machine], fit) for r in runs]
    rows = [_row(r, m) for r, m in zip(runs, fitted)]
    if leave_one_out_errors:
        _add_leave_one_out(rows, runs, fitted, on_fold)
    if write:
        bounds, shared = cal.at_bounds(fit), cal.shared_notes(fit)
        notes = fit_notes(rows, {k: bounds.get(k, []) + shared.get(k, []) for k in {*bounds, *shared}})
        fit_files.write_fit(fit, notes, path)
        if leave_one_out_errors:
            profile = {r.id: r.profile for r in runs}
            held = {PROFILE_OF[fw]: [n for g, n in fit.held if g == fw] for fw, _ in fit.held}
            fit_files.write_uncertainty([(r.device, profile[r.id], r.loo_error) for r in rows], held=held,
                                        held_out=own_runtime_errors())
    return fit, rows


def fit_notes(rows: list[ValidationRow], bounds: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """The summaries a refit writes as comments: "" (the header) -> all rows, per framework
    and per device kind; device kind -> its rows, and its figures that sit on a bound of the
    fit (`bounds`: calibration.fit_published.at_bounds)."""
    def line(rows_):
        med, worst = summary(rows_)
        loo = loo_summary(rows_)
        text = f"median |error| {100 * med:.1f}% (max {100 * worst:.1f}%) over {len(rows_)} published rows"
        return text + (f"; leave-one-out median {100 * loo[0]:.1f}% (max {100 * loo[1]:.1f}%)" if loo else "")

    header = ["  all rows: " + line(rows)]
    header += [f"  {name}: " + line(part) for name, part in {**_groups(rows, "framework"), **_groups(rows, "device")}.items()]
    notes = {"": header}
    for device, part in _groups(rows, "device").items():
        notes[device] = [line(part) + "."] + [f"{text}." for text in (bounds or {}).get(device, [])]
    return notes
