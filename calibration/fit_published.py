"""Calibration of the machine models: fit their efficiency figures to published training runs.

    fit = fit_published()                      # every published run (calibration.published)
    fit.device["NVIDIA H100 SXM5"]             # {peak_fraction, half_dim, attention_efficiency_factor}
    fit.framework["fsdp"]                      # {overlap_dp, step_overhead_s}
    fit_files.write_fit(fit, notes)            # into device_kinds.yaml and frameworks.yaml
    leave_one_out()                            # run id -> its prediction from a fit without it

A few physical figures per device kind and a few per training framework, never a constant
per run, fitted jointly to every published row:
  - per device kind (the GPU and its kernel libraries): the matmul efficiency curve
    (peak_fraction, half_dim), the attention-core efficiency relative to a GEMM and the
    fraction of memory bandwidth elementwise kernels reach, this one shared by NVIDIA's two
    generations (SHARED_FIGURES: the same kernels; one figure fewer to fit);
  - per framework (Megatron-LM, or FSDP as llm-foundry and fms-fsdp use it): the hidden
    fraction of data-parallel traffic (overlap.dp: how the framework buckets, prefetches and
    orders its collectives) and a fixed cost per optimizer step (step_overhead_s: launches,
    gradient clipping, loss and metric syncs, the optimizer's per-tensor overheads).
What a framework sets rather than achieves comes from each run's record and is not fitted:
the attention kernel and Megatron's tensor-parallel overlap (in the run's job: PublishedRun.job).

The fit minimises the squared log error of all rows (scipy.optimize.least_squares) within
physical bounds, with a weak pull towards the first guesses so that a figure the rows cannot
determine stays where it was, and a published GEMM microbenchmark of a device kind, where one
is listed, as one more row (calibration/gemm_benchmarks.py). Device kinds and frameworks are
fitted together: Megatron and FSDP rows both exist on H100 and on A100, so each device figure
is pinned by both frameworks.

The shipped machine models (device_kinds.yaml) carry the device-kind figures and the FSDP
framework's figures, since exaplan's runtime is torch FSDP2/DDP (SHIPPED_FRAMEWORK); the
other frameworks' fitted figures go into their profiles in machine_models/frameworks.yaml
(calibration/fit_files.py writes both files and reads the figures back), so that `exaplan
validate --published` predicts every row with the figures of its own framework, and
`exaplan plan --framework megatron` plans with them.

scipy is imported only by the fit itself (fit_published); reading a fit needs nothing more
than the loader does.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration import gemm_benchmarks
from calibration.published import PublishedRun, published_runs
from machine_models.loader import load_machine
from planner.cost.step import evaluate
from planner.schema.figures import figures_of, with_figures
from planner.schema.specs import MachineModel

# The figures, their bounds and first guesses: calibration/fit_figures.py (re-exported).
from calibration.fit_figures import (  # noqa: F401
    DEVICE_FIGURES, FRAMEWORK_FIGURES, FIGURES, BOUNDS, ATTENTION_RATE_FLOOR, ATTENTION_SATURATED_DIM,
    FIRST_GUESSES, FRAMEWORK_FIRST_GUESSES, IDENTIFIABLE, SHIPPED_FRAMEWORK, PRIOR_WEIGHT, PRIOR_WEIGHTS,
    GRID_STARTS, GRID_KEEP, OVERLAP_SCAN, OVERHEAD_SCAN, SHARES_FIGURES_WITH, SHARED_FIGURES, FIT_COMMAND,
    FIT_MARK,
)


@dataclass
class Fit:
    """Fitted figures: per device kind (device_name -> DEVICE_FIGURES) and per framework
    (name -> FRAMEWORK_FIGURES); `cost` is half the sum of squared residuals (log errors and
    prior terms) at the optimum."""

    device: dict[str, dict[str, float]]
    framework: dict[str, dict[str, float]]
    cost: float = 0.0
    rows: list[str] = field(default_factory=list)  # ids of the runs fitted to
    held: list[tuple[str, str]] = field(default_factory=list)  # (framework, figure) held at the first guess

    def figures(self, device: str, framework: str) -> dict[str, float]:
        """All FIGURES for a run on `device` under `framework`."""
        return {**self.device[device], **self.framework[framework]}


def machines_of(runs: list[PublishedRun]) -> dict[str, MachineModel]:
    """The machine presets the runs name, as shipped (name -> MachineModel)."""
    return {name: load_machine(name) for name in sorted({r.machine for r in runs})}


def first_guess_machine(machine: MachineModel, framework: str) -> MachineModel:
    """`machine` with the first guesses of its device kind (where there are some) and of
    `framework`."""
    return with_figures(machine, {**FIRST_GUESSES.get(machine.device_name, {}), **FRAMEWORK_FIRST_GUESSES[framework]})


# --------------------------------------------------------------------------------------------
# Fast prediction for the fit
# --------------------------------------------------------------------------------------------


class StepTimes:
    """Memo of predicted step times. A run's step time depends on its device kind's figures
    and its framework's overlap.dp through the whole cost model (one `evaluate`, ~2 ms), and
    on step_overhead_s only additively (a constant added to every candidate's step, so it
    changes no choice of algorithm or bucket): the memo stores the step time without the
    overhead, keyed by the run and the four figures it depends on, so that a finite-
    difference step in one figure re-evaluates only the runs that figure touches."""

    def __init__(self, machines: dict[str, MachineModel]):
        self.machines = machines
        self.scales: dict[str, float] = {}  # run id -> figure x step time (0: the figure is the step time)
        self.memo: dict[tuple, float] = {}
        self.jobs: dict[str, Any] = {}  # run id -> its TrainingJob (the same at every figure)
        self.evaluations = 0

    def base_step_s(self, run: PublishedRun, figs: dict[str, float]) -> float:
        key = (run.id, *(figs[n] for n in DEVICE_FIGURES), figs["overlap_dp"])
        t = self.memo.get(key)
        if t is None:
            m = with_figures(self.machines[run.machine], {**figs, "step_overhead_s": 0.0})
            job = self.jobs.get(run.id)
            if job is None:
                job = self.jobs[run.id] = run.job()
            t = float(evaluate(run.model, m, job, run.layouts()).step_time_s[0])
            self.memo[key] = t
            self.evaluations += 1
        return t

    def figure(self, run: PublishedRun, figs: dict[str, float]) -> float:
        """The run's predicted figure, in its published unit."""
        step = self.base_step_s(run, figs) + figs["step_overhead_s"]
        scale = self.scales.get(run.id)
        if scale is None:
            # Every published unit is the step time itself or a constant over it (tokens,
            # FLOPs, MFU per second); the constant needs only the machine's peak FLOP rate.
            m = self.machines[run.machine]
            scale = self.scales[run.id] = 0.0 if run.kind == "iteration_time_s" else float(run.figure_from_step_time(1.0, m))
        return step if scale == 0.0 else scale / step


# --------------------------------------------------------------------------------------------
# The fit
# --------------------------------------------------------------------------------------------


def attention_floor(kind: str) -> float | None:
    """The least attention_efficiency_factor of a device kind with a published kernel rate
    (ATTENTION_RATE_FLOOR): that rate over the efficiency of a GEMM of the saturated tile's
    size on the kind's first-guess matmul curve; None for other kinds."""
    rate, guess = ATTENTION_RATE_FLOOR.get(kind), FIRST_GUESSES.get(kind)
    if rate is None or guess is None:
        return None
    d = ATTENTION_SATURATED_DIM
    return rate / (guess["peak_fraction"] * d / (d + guess["half_dim"]))


def lower_bound(group: str, name: str) -> float:
    """The fit's lower bound of figure `name` for a device kind or framework `group`."""
    floor = attention_floor(group) if name == "attention_efficiency_factor" else None
    return BOUNDS[name][0] if floor is None else max(BOUNDS[name][0], floor)


def at_bounds(fit: Fit, tol: float = 1e-3) -> dict[str, list[str]]:
    """Device kind -> "figure at its floor/ceiling (value)" for each fitted figure that sits
    on a bound of the fit: a figure there says what the rows asked for lies beyond what is
    physical (or published), not that the figure is known."""
    out: dict[str, list[str]] = {}
    for kind, figures in fit.device.items():
        for name, value in figures.items():
            lo, hi = lower_bound(kind, name), BOUNDS[name][1]
            side = "floor" if value <= lo * (1 + tol) else "ceiling" if value >= hi * (1 - tol) else None
            if side:
                out.setdefault(kind, []).append(f"{name} at its {side} ({value:.3g})")
    return out


def holder(kind: str, name: str, kinds) -> str:
    """The device kind whose parameter is figure `name` of `kind` in a fit of `kinds`: the
    first of its SHARED_FIGURES family among them, else `kind` itself."""
    family = SHARED_FIGURES.get(name, ())
    return next((k for k in family if k in kinds), kind) if kind in family else kind


def shared_notes(fit: Fit) -> dict[str, list[str]]:
    """Device kind -> "figure shared with KIND" for each SHARED_FIGURES figure it holds from
    another kind of the fit."""
    out: dict[str, list[str]] = {}
    for name, family in SHARED_FIGURES.items():
        for kind in family:
            held_by = holder(kind, name, fit.device)
            if kind in fit.device and held_by != kind:
                out.setdefault(kind, []).append(f"{name} shared with {held_by} (one figure: SHARED_FIGURES)")
    return out


def _to_x(name: str, value: float) -> float:
    # half_dim is fitted on a log scale (it spans two decades); the rest are linear.
    return math.log(value) if name == "half_dim" else value


def _from_x(name: str, x: float) -> float:
    return float(math.exp(x) if name == "half_dim" else x)


@dataclass
class _Problem:
    """The least-squares problem of `fit_published`. The parameter vector holds (group,
    figure) pairs, device kinds first, in fit coordinates (`_to_x`); the residuals are every
    run's log error, then the weak pull of each parameter towards its first guess."""

    runs: list[PublishedRun]
    times: StepTimes
    device_of: dict[str, str]  # run id -> device kind
    kinds: list[str]
    frameworks: list[str]
    params: list[tuple[str, str]]
    lo: np.ndarray
    hi: np.ndarray
    x_prior: np.ndarray
    published: np.ndarray
    pairs: list[tuple[str, str]]  # the (device kind, framework) pairs of the runs
    peaks: dict[str, dict[str, float]]  # device kind -> precision -> peak TFLOP/s (gemm_benchmarks)
    held: list[tuple[str, str]] = field(default_factory=list)  # framework figures its rows cannot see

    @classmethod
    def of(cls, runs: list[PublishedRun], times: StepTimes) -> "_Problem":
        device_of = {r.id: times.machines[r.machine].device_name for r in runs}
        kinds = sorted(set(device_of.values()))
        frameworks = sorted({r.framework for r in runs})
        params = [(k, n) for k in kinds for n in DEVICE_FIGURES if holder(k, n, kinds) == k]
        params += [(f, n) for f in frameworks for n in FRAMEWORK_FIGURES]
        prior = {}
        for k in kinds:
            machine = times.machines[next(r.machine for r in runs if device_of[r.id] == k)]
            guess = FIRST_GUESSES.get(k, figures_of(machine))
            prior.update({(k, n): guess[n] for n in DEVICE_FIGURES})
        for f in frameworks:
            prior.update({(f, n): FRAMEWORK_FIRST_GUESSES[f][n] for n in FRAMEWORK_FIGURES})
        p = cls(
            runs=runs, times=times, device_of=device_of, kinds=kinds, frameworks=frameworks, params=params,
            lo=np.array([_to_x(n, lower_bound(g, n)) for g, n in params]),
            hi=np.array([_to_x(n, BOUNDS[n][1]) for _, n in params]),
            x_prior=np.array([_to_x(n, prior[(g, n)]) for g, n in params]),
            published=np.array([r.figure for r in runs]),
            pairs=sorted({(device_of[r.id], r.framework) for r in runs}),
            peaks={device_of[r.id]: {p.value: v for p, v in times.machines[r.machine].peak_tflops.items()} for r in runs},
        )
        p.hold_unseen()
        return p

    def predicted(self, x) -> np.ndarray:
        """Every run's predicted figure at parameters `x`."""
        fit = self.unpack(x)
        figs = {pair: fit.figures(*pair) for pair in self.pairs}
        return np.array([self.times.figure(r, figs[self.device_of[r.id], r.framework]) for r in self.runs])

    def hold_unseen(self) -> None:
        """Pin each framework figure its rows cannot see (IDENTIFIABLE) to its first guess:
        bounds narrowed to the guess, recorded in `held`."""
        x0 = self.x0()
        for i, (g, n) in enumerate(self.params):
            if g not in self.frameworks:
                continue
            rows = np.array([r.framework == g for r in self.runs])
            ends = []
            for v in (self.lo[i], self.hi[i]):
                x = x0.copy()
                x[i] = v
                ends.append(np.log(self.predicted(x)[rows]))
            if float(np.max(np.abs(ends[1] - ends[0]))) < IDENTIFIABLE:
                self.held.append((g, n))
                self.lo[i], self.hi[i] = self.x_prior[i] - 1e-7, self.x_prior[i] + 1e-7

    def x0(self) -> np.ndarray:
        """The first guesses, just inside the bounds."""
        return np.clip(self.x_prior, self.lo + 1e-9, self.hi - 1e-9)

    def unpack(self, x) -> Fit:
        dev = {k: {} for k in self.kinds}
        fw = {f: {} for f in self.frameworks}
        for (g, n), v in zip(self.params, x):
            (dev if g in dev else fw)[g][n] = _from_x(n, v)
        for k in self.kinds:  # a shared figure, from the kind that holds it
            dev[k] = {n: dev[holder(k, n, self.kinds)][n] for n in DEVICE_FIGURES}
        return Fit(dev, fw)

    def residuals(self, x) -> np.ndarray:
        weights = np.array([PRIOR_WEIGHTS.get(n, PRIOR_WEIGHT) for _, n in self.params])
        bench = gemm_benchmarks.residuals(self.unpack(x).device, self.peaks)
        return np.concatenate([np.log(self.predicted(x) / self.published), weights * (x - self.x_prior), bench])

    def cost(self, x) -> float:
        return 0.5 * float(np.sum(self.residuals(x) ** 2))

    def solve(self, x_start) -> tuple[np.ndarray, float]:
        """The gradient fit from `x_start`: (x, cost)."""
        from scipy.optimize import least_squares  # only the fit needs scipy

        res = least_squares(self.residuals, x_start, bounds=(self.lo, self.hi), diff_step=1e-3, xtol=1e-4, ftol=1e-6)
        return res.x, float(res.cost)


def _fit_from_grid(p: _Problem) -> tuple[np.ndarray, float]:
    """The gradient fit from the best GRID_KEEP points of a coarse grid over the figures in
    GRID_STARTS, the others at their first guesses (the grid holds the first guesses or points
    near them). The grid costs few evaluations of the cost model: each run sees only its own
    kind's attention values, and the overhead needs none."""
    x0 = p.x0()
    gridded = [i for i, (g, n) in enumerate(p.params) if n in GRID_STARTS and (g, n) not in p.held]
    grid = []
    for values in itertools.product(*(GRID_STARTS[p.params[i][1]] for i in gridded)):
        x = x0.copy()
        x[gridded] = values
        x = np.clip(x, p.lo + 1e-9, p.hi - 1e-9)  # a kind's own floor may lie above a grid value
        grid.append((p.cost(x), tuple(x)))
    grid.sort(key=lambda item: item[0])
    best_x, best_cost = None, math.inf
    for _, x_start in grid[:GRID_KEEP]:
        x, c = p.solve(np.array(x_start))
        if c < best_cost:
            best_x, best_cost = x, c
    return best_x, best_cost


def _scan_overlap(p: _Problem, framework: str, x_from: np.ndarray) -> tuple[float, np.ndarray]:
    """(cost, x) of the best point of `x_from` with the framework's overlap.dp on OVERLAP_SCAN
    and its step overhead on OVERHEAD_SCAN (one evaluation per run of the framework and
    overlap value; none for the overhead, which is additive)."""
    i_ov, i_oh = p.params.index((framework, "overlap_dp")), p.params.index((framework, "step_overhead_s"))
    scan_ov = [x_from[i_ov]] if (framework, "overlap_dp") in p.held else OVERLAP_SCAN
    scan_oh = [x_from[i_oh]] if (framework, "step_overhead_s") in p.held else OVERHEAD_SCAN
    candidates = []
    for ov, oh in itertools.product(scan_ov, scan_oh):
        x = x_from.copy()
        x[i_ov], x[i_oh] = ov, oh
        candidates.append((p.cost(x), x))
    return min(candidates, key=lambda item: item[0])


def _refit_from_scans(p: _Problem, best_x: np.ndarray, best_cost: float) -> tuple[np.ndarray, float]:
    """The overlap figures have flat stretches (every row of the framework at its floor) that
    a gradient cannot leave: scan each framework's overlap.dp (`_scan_overlap`), and restart
    the gradient fit from a better point when the scan finds one (at most three times)."""
    for _ in range(3):
        x_scan, c_scan = best_x, best_cost
        for f in p.frameworks:
            c, x = _scan_overlap(p, f, x_scan)
            if c < c_scan:
                x_scan, c_scan = x, c
        if c_scan >= best_cost - 1e-6:
            break  # the gradient fit's point is (near) the best of the scan
        x, c = p.solve(x_scan)
        if c >= best_cost:
            break
        best_x, best_cost = x, c
    return best_x, best_cost


def fit_published(runs: list[PublishedRun] | None = None, *, times: StepTimes | None = None) -> Fit:
    """Fit DEVICE_FIGURES per device kind and FRAMEWORK_FIGURES per framework, jointly, to
    `runs` (default: every published run). `times`: a memo to reuse (it must hold the
    machines the runs name). A gradient fit from the best start of a coarse grid, then scans
    of each framework's overlap.dp that restart it from a better point where they find one."""
    runs = published_runs() if runs is None else list(runs)
    if times is None:
        times = StepTimes(machines_of(runs))
    problem = _Problem.of(runs, times)
    best_x, best_cost = _fit_from_grid(problem)
    best_x, best_cost = _refit_from_scans(problem, best_x, best_cost)
    fit = problem.unpack(best_x)
    fit.cost, fit.rows, fit.held = best_cost, [r.id for r in runs], list(problem.held)
    return fit


def machine_for(run: PublishedRun, machine: MachineModel, fit: Fit) -> MachineModel:
    """`machine` (the run's preset) carrying the fitted figures of its device kind and of the
    run's framework."""
    return with_figures(machine, fit.figures(machine.device_name, run.framework))


# --------------------------------------------------------------------------------------------
# Leave-one-out
# --------------------------------------------------------------------------------------------


def leave_one_out(runs: list[PublishedRun] | None = None, ids: list[str] | None = None,
                  workers: int | None = None, on_fold: Callable[[str], None] | None = None,
                  fold_figures: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """Run id -> its prediction by a whole fit on every other run (grid, gradient fit, scan), for
    the runs in `ids` (default: all); about 11 s per fold on one core at 46 rows. Folds run
    one task each in `workers` processes (default: one per CPU); `on_fold(run id)` as each ends.
    `fold_figures`, if given, receives run id -> the figures its fold predicted it with (its
    device kind's and its framework's)."""
    runs = published_runs() if runs is None else list(runs)
    held = [r.id for r in runs if ids is None or r.id in ids]
    workers = max(1, min(workers or os.cpu_count() or 1, len(held)))
    global _FOLD_RUNS, _FOLD_TIMES
    _FOLD_RUNS, _FOLD_TIMES = runs, StepTimes(machines_of(runs))  # inherited by the forked workers
    fork = workers > 1 and "fork" in multiprocessing.get_all_start_methods()
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) if fork else None
    out: dict[str, float] = {}
    try:
        if pool is None:
            done = ((rid, _folds([rid])) for rid in held)
        else:
            futures = {pool.submit(_folds, [rid]): rid for rid in held}
            done = ((futures[f], f.result()) for f in as_completed(futures))
        for rid, part in done:
            out.update({k: pred for k, (pred, _) in part.items()})
            if fold_figures is not None:
                fold_figures.update({k: figs for k, (_, figs) in part.items()})
            if on_fold is not None:
                on_fold(rid)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        _FOLD_RUNS, _FOLD_TIMES = None, None
    return {rid: out[rid] for rid in held}


_FOLD_RUNS: list[PublishedRun] | None = None  # set for the (forked) fold workers
_FOLD_TIMES: StepTimes | None = None


def _folds(held_ids: list[str]) -> dict[str, tuple[float, dict[str, float]]]:
    runs, times = _FOLD_RUNS, _FOLD_TIMES
    out = {}
    for rid in held_ids:
        held = next(r for r in runs if r.id == rid)
        fit = fit_published([r for r in runs if r.id != rid], times=times)
        device = times.machines[held.machine].device_name
        if device not in fit.device:
            raise ValueError(f"{rid}: no other run on {device} to fit to")
        # A framework with no other row is predicted with its first guesses.
        framework = fit.framework.get(held.framework, FRAMEWORK_FIRST_GUESSES[held.framework])
        figures = {**fit.device[device], **framework}
        out[rid] = (times.figure(held, figures), figures)
    return out
