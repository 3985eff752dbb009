"""Predict the published runs (calibration.published) and compare with what their authors measured.

    rows = validate_published()                           # shipped machine models
    rows = validate_published(leave_one_out_errors=True)  # and the leave-one-out error (~2 CPU-minutes)
    rows = validate_published(refit=True)                 # fit, write device_kinds.yaml, predict
    render_published(rows, console)   # table + median/max |error| overall, per device kind, per framework
    published_json(rows)              # the same as a dict, for --json (both: calibration/validate_tables.py)

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

from dataclasses import asdict
from pathlib import Path

from machine_models import DEVICE_KINDS_FILE
from calibration import fit_files, fit_published as cal
from planner.cost.step import evaluate
from calibration.published import PROFILE_OF, PublishedRun, held_out_runs, published_runs
from calibration.record_check import check_record
from calibration.strata import strata_of
from calibration.support_fit import fit_widening, run_point, supports_of, write_support
from planner.cost.flops import total_params
from calibration.validate_rows import (  # noqa: F401 - the rows' API, re-exported for cli/ and the tests
    LONG_SEQ, LOO_TARGETS, PINNED_SHIFT, PINNED_SHIFT_S, SUMMARISED_SECTIONS, ValidationRow, foundry_groups, groups,
    interval_coverage, loo_summary, loo_targets, moved_figures, summary,
)
from calibration.validate_tables import pinned_lines, published_json, render_published  # noqa: F401 - re-exported
from machine_models.uncertainty import uncertainty_of
from planner.schema.specs import MachineModel


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


def _row(run: PublishedRun, machine: MachineModel) -> ValidationRow:
    predicted, ev = predict(run, machine)
    u = uncertainty_of(machine, run.job().framework, point=run_point(run))
    lo, hi = u.time_interval(predicted) if run.kind == "iteration_time_s" else u.rate_interval(predicted)
    return ValidationRow(
        id=run.id, section=run.section, model=run.model.name, machine=run.machine, device=machine.device_name,
        framework=run.framework, gpus=run.gpus, kind=run.kind, unit=run.unit,
        layout=run.layout.describe() + (f" {run.torch_blocks}" if run.torch_blocks else ""),
        published=run.figure, predicted=predicted, error=predicted / run.figure - 1.0, step_time_s=float(ev.step_time_s[0]),
        seq_len=run.model.seq_len, global_batch=run.layout.global_batch,
        strata=strata_of(machine.device_name, run.framework, run.layout.sharding.value, run.layout.pp, run.gpus,
                         run.model.seq_len, total_params(run.model)),
        breakdown_s={k: float(getattr(ev, k)[0]) for k in ("compute_s", "bubble_s", "tp_s", "dp_s", "pp_s", "optimizer_s")},
        fits_memory=bool(ev.memory.fits[0]), assumed=list(run.assumed),
        interval=(lo, hi), inside_interval=bool(lo <= run.figure <= hi),
        record=asdict(check_record(run, machine, ev, predicted)),
    )


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


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
            widen, _ = fit_widening(runs, machines, {r.id: r.loo_error for r in rows})
            write_support(supports_of(runs, machines), widen)
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
    header += [f"  {name}: " + line(part) for name, part in {**groups(rows, "framework"), **groups(rows, "device")}.items()]
    notes = {"": header}
    for device, part in groups(rows, "device").items():
        notes[device] = [line(part) + "."] + [f"{text}." for text in (bounds or {}).get(device, [])]
    return notes
