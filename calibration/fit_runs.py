"""Refit a machine's efficiency figures from measured runs (`exaplan calibrate --from-runs`).

Every run `exaplan run` makes leaves its plan.yaml and summary.json; `refit_from_runs` fits
the local machine's figures (matmul curve, dp overlap, per-step and per-operator framework
cost) by bounded least squares on log(predicted / measured) step time, and `holdout_report`
shows the error on runs left out of the fit, before and after.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from planner.schema.figures import BOUNDS, figures_of, with_figures
from calibration.json_input import check_json_nesting, loads
from calibration.validate_local_layouts import predict, resolve_machine
from planner.schema.errors import PlanError, check_name_or_path
from planner.schema.files import read_text

# Figures `refit_from_runs` fits unless told otherwise (planner/schema/figures.py lists every one it can).
FIT_FIGURES_DEFAULT = ("peak_fraction", "half_dim", "step_overhead_s", "op_overhead_us", "dtensor_op_overhead_us",
                       "optimizer_bytes_per_param", "allreduce_efficiency", "rs_ag_efficiency")


@dataclass
class MeasuredRun:
    name: str
    plan: Any
    measured_step_time_s: float
    measured_memory_gib: float | None
    # Medians over the steps after warm-up of the phases `exaplan run` logs (None in older
    # runs): forward + backward (with the data-parallel traffic FSDP/DDP run inside it) and
    # clipping + optimizer (with ZeRO's reduce-scatter and all-gather).
    measured_forward_backward_s: float | None = None
    measured_optimizer_s: float | None = None


WARMUP_STEPS = 2


def step_errors(runs: list[MeasuredRun], machine) -> dict[str, float]:
    """Each run's step-time error on `machine`: measured / predicted - 1, by run name."""
    return {r.name: r.measured_step_time_s / predict(r.plan, machine)["step_time_s"] - 1.0 for r in runs}


def layout_of(run: MeasuredRun) -> str:
    """The layout a run ran: its name less a repeat's suffix ('fsdp/repeat-1' -> 'fsdp')."""
    return run.name.split("/")[0]


def _phases(metrics: Path) -> tuple[float | None, float | None]:
    if not _exists(metrics):
        return None, None
    text = read_text(metrics, "the metrics")  # a device, a FIFO, a binary or huge file: refused naming it
    check_json_nesting(text, str(metrics))  # the line it names is the file's
    try:
        rows = [loads(line, str(metrics)) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise PlanError(f"cannot read a record per line: {str(e)[:80]}", field=str(metrics)) from None
    rows = [r for r in rows if isinstance(r, dict) and r.get("kind") == "train"
            and all(_finite(r.get(k)) for k in ("forward_backward_s", "clip_s", "optimizer_s"))]
    rows = rows[WARMUP_STEPS:] if len(rows) > WARMUP_STEPS else rows
    if not rows:
        return None, None
    fb = float(np.median([r["forward_backward_s"] for r in rows]))
    opt = float(np.median([r["clip_s"] + r["optimizer_s"] for r in rows]))
    return fb, opt


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _summary(path: Path) -> dict:
    """A run's summary.json: a mapping with a finite positive measured_step_time_s (and a
    finite peak_memory_gib or none); PlanError naming the file otherwise."""
    text = read_text(path, "the run summary")  # a device, a FIFO, a binary or huge file: refused naming it
    try:
        summ = loads(text, str(path))
    except json.JSONDecodeError as e:
        raise PlanError(f"not a run summary (JSON): {str(e)[:80]}", field=str(path)) from None
    if not isinstance(summ, dict) or not _finite(summ.get("measured_step_time_s")) or summ["measured_step_time_s"] <= 0:
        raise PlanError("needs measured_step_time_s, a finite positive number of seconds", field=str(path))
    if summ.get("peak_memory_gib") is not None and not _finite(summ["peak_memory_gib"]):
        raise PlanError("peak_memory_gib must be a finite number or absent", field=str(path))
    return summ


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL
        return False


def load_runs(run_dirs: Iterable[Path]) -> list[MeasuredRun]:
    """Runs with a summary.json and the plan.yaml they ran (written by run_local_validation)."""
    from planner.schema.plan import load_plan

    runs = []
    for d in map(Path, run_dirs):
        s, p = d / "summary.json", d / "plan.yaml"
        if not _exists(s) or not _exists(p):
            raise PlanError(f"{d}: needs summary.json and plan.yaml (a run directory of `exaplan validate --local`)", field="runs")
        summ = _summary(s)
        fb, opt = _phases(d / "metrics.jsonl")
        # validate --local keeps repeated runs of a layout in LAYOUT/repeat-N: name them so
        name = f"{d.parent.name}/{d.name}" if d.name.startswith(("repeat-", "memory")) else d.name
        runs.append(MeasuredRun(name, load_plan(p), float(summ["measured_step_time_s"]), summ.get("peak_memory_gib"),
                                fb, opt))
    if not runs:
        raise PlanError("no run directories given", field="runs")
    return runs


def _log_residuals(runs: list[MeasuredRun], machine) -> np.ndarray:
    """log(predicted / measured): the step time, or where the run logged its phases, the
    forward + backward and the clipping + optimizer parts separately (which tells a slow
    optimizer from slow compute, where the step time alone cannot)."""
    out = []
    for r in runs:
        p = predict(r.plan, machine)
        if r.measured_forward_backward_s and r.measured_optimizer_s:
            zero = r.plan.sharding.kind.value in ("zero1", "zero2")
            opt = p["optimizer_s"] + (p["dp_s"] if zero else 0.0)  # ZeRO communicates in the step
            out += [math.log((p["step_time_s"] - opt) / r.measured_forward_backward_s),
                    math.log(opt / r.measured_optimizer_s)]
        else:
            out.append(math.log(p["step_time_s"] / r.measured_step_time_s))
    return np.array(out)


def refit_from_runs(run_dirs, machine="local", figures: Sequence[str] = FIT_FIGURES_DEFAULT, ranks: int | None = None,
                    runs: list[MeasuredRun] | None = None):
    """The machine with `figures` refitted to the measured step times of the runs: least
    squares on log(predicted / measured) (scipy.optimize.least_squares, bounded; a weak pull
    towards the starting values keeps figures the runs do not constrain where they were).
    `machine`: a MachineModel, a name, or None for the machine stored in the first run's plan.
    Returns a MachineModel with calibrated=True and a description saying what was fitted."""
    from scipy.optimize import least_squares

    runs = runs if runs is not None else load_runs(run_dirs)
    if machine is None:
        base = runs[0].plan.machine
    else:
        base = resolve_machine(machine, ranks or runs[0].plan.machine.devices_per_node)
    figures = list(figures)
    x0 = np.array(list(figures_of(base, figures).values()), float)
    lo = np.array([BOUNDS[f][0] for f in figures])
    hi = np.array([BOUNDS[f][1] for f in figures])
    scale = np.maximum(hi - lo, 1e-9)
    x0 = np.clip(x0, lo, hi)
    prior = 0.02  # weight of the pull towards x0, per unit of each figure's range

    def resid(x):
        r = _log_residuals(runs, with_figures(base, dict(zip(figures, x))))
        return np.concatenate([r, prior * (x - x0) / scale])

    res = least_squares(resid, x0, bounds=(lo, hi), x_scale=scale, diff_step=1e-3)
    fitted = dict(zip(figures, map(float, res.x)))
    out = with_figures(base, fitted)
    out.calibrated = True
    names = ", ".join(f"{k}={v:.4g}" for k, v in fitted.items())
    out.description = (base.description + f" Refitted from {len(runs)} measured runs ({', '.join(r.name for r in runs)}): "
                       f"{names}.").strip()
    return out


def holdout_report(run_dirs, machine="local", figures: Sequence[str] = FIT_FIGURES_DEFAULT, test_every: int = 2,
                   offset: int = 1, runs: list[MeasuredRun] | None = None) -> dict[str, Any]:
    """Refit on some runs and measure the step-time error on the others, before and after.
    Layouts sorted by name; every `test_every`-th from `offset` is held out, with all its runs
    (repeats of a held-out layout never train the fit). Returns the fitted figures and per-run
    errors (measured / predicted - 1) on both sets. `runs`: already loaded from run_dirs."""
    runs = sorted(load_runs(run_dirs) if runs is None else runs, key=lambda r: r.name)
    layouts = sorted({layout_of(r) for r in runs})
    held = {name for i, name in enumerate(layouts) if i % test_every == offset % test_every}
    test = [r for r in runs if layout_of(r) in held]
    train = [r for r in runs if r not in test]
    if not train or not test:
        raise PlanError("needs at least 2 runs to hold some out", field="runs")
    base = runs[0].plan.machine if machine is None else resolve_machine(machine, runs[0].plan.machine.devices_per_node)
    fitted = refit_from_runs(None, base, figures, runs=train)

    def med(d):
        return float(np.median(np.abs(list(d.values()))))

    out = dict(train=[r.name for r in train], test=[r.name for r in test],
               figures_before=figures_of(base, figures), figures_after=figures_of(fitted, figures),
               train_before=step_errors(train, base), train_after=step_errors(train, fitted),
               test_before=step_errors(test, base), test_after=step_errors(test, fitted))
    for k in ("train_before", "train_after", "test_before", "test_after"):
        out[f"median_abs_{k}"] = med(out[k])
    out["machine"] = fitted
    return out


# Layouts a machine's own step-time band needs (fewer: its device kind's band stays).
BAND_MIN_LAYOUTS = 4


def leave_one_layout_out(runs: list[MeasuredRun], base, figures: Sequence[str] = FIT_FIGURES_DEFAULT) -> dict[str, float]:
    """Each run's step-time error (measured / predicted - 1) under a fit to the runs of every
    other layout (repeats of a layout are left out with it): out-of-sample errors of the
    refitted machine, one fit per layout."""
    errors = {}
    for layout in sorted({layout_of(r) for r in runs}):
        test = [r for r in runs if layout_of(r) == layout]
        fitted = refit_from_runs(None, base, figures, runs=[r for r in runs if r not in test])
        errors.update(step_errors(test, fitted))
    return errors


def step_time_band(runs: list[MeasuredRun], base):
    """The machine's own step-time band (planner/schema/band.py) from its runs' leave-one-layout-out
    errors, or None with fewer than BAND_MIN_LAYOUTS layouts."""
    from machine_models.uncertainty import conformal_bound
    from planner.schema.band import StepTimeBand

    layouts = sorted({layout_of(r) for r in runs})
    if len(layouts) < BAND_MIN_LAYOUTS:
        return None
    errors = leave_one_layout_out(runs, base)
    worst = max(errors, key=lambda k: abs(errors[k]))
    bound = min(max(conformal_bound(list(errors.values())), 1e-3), 1.0)  # an interval's half-width is at most 1
    return StepTimeBand(half_width=bound, runs=len(layouts),
                        basis=f"{', '.join(layouts)}; largest error {worst} {100 * errors[worst]:+.1f}%")


def refit_to_file(run_dirs: Sequence[Path], base, out: Path, command: str,
                  force: bool = True) -> tuple[Any, dict[str, Any] | None]:
    """`exaplan calibrate --from-runs`: refit `base` on every run folder and write the machine
    to `out` atomically (a header names the command and the runs). With 4 runs or more, also
    the step-time error on held-out layouts before and after (`holdout_report`), and with 4
    layouts or more the machine's own step-time band (`step_time_band`, written into the file).
    Returns the fitted machine and that summary (None with fewer runs)."""
    import yaml

    from planner.schema.files import write_new

    dirs = [Path(check_name_or_path(str(d), "--from-runs")) for d in run_dirs]
    for d in dirs:
        if not _exists(d / "summary.json") or not _exists(d / "plan.yaml"):
            raise PlanError(f"{d}: not a finished `exaplan run` folder (needs summary.json and plan.yaml)",
                            field="--from-runs")
    runs = load_runs(dirs)
    report = holdout_report(dirs, base, runs=runs) if len(dirs) >= 4 else None
    machine = refit_from_runs(None, base, runs=runs)
    machine.step_time_band = step_time_band(runs, base)
    names = [f"{d.parent.name}/{d.name}" if d.name.startswith("repeat-") else d.name for d in dirs]
    header = f"# Refitted by: {command}\n# from {len(dirs)} runs: {', '.join(names)}\n"
    body = machine.model_dump(mode="json")
    if machine.step_time_band is not None:  # (excluded from model_dump: plans do not carry it)
        body["step_time_band"] = machine.step_time_band.model_dump(mode="json")
    write_new(out, header + yaml.safe_dump(body, sort_keys=False), "the fitted machine file", force)
    keys = ("median_abs_test_before", "median_abs_test_after", "median_abs_train_before", "median_abs_train_after",
            "figures_before", "figures_after", "train", "test")
    return machine, None if report is None else {k: report[k] for k in keys}
