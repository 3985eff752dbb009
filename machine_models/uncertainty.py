"""How far to trust a prediction: relative half-widths of the intervals every predicted time,
rate and memory figure carries, read from uncertainty.yaml (written by `exaplan validate
--published --refit --loo`: the leave-one-out errors of the published-run fit).

    u = uncertainty_of(machine, framework)
    u.step_time   # 0.09: the true step time lies within predicted x (1 +/- 0.09) for about
                  #       80% of the published rows of this device kind and framework
    u.memory      # 0.15
    u.basis       # the rows it comes from, or why a stated default is used

Step time: the 80% conformal bound (`conformal_bound`: an order statistic of the |leave-one-out
error|, which covers 80% of new errors where the empirical 80th percentile of a few rows
covers less) over the published rows of the
machine's device kind and, separately, of the job's framework; the larger of the two (a
prediction is as uncertain as its less-known half). The held-out errors of exaplan's own runs
on GPUs (section M: never fitted, out of sample like the leave-one-out ones) are pooled into
the exaplan profile and into their device kind where it has rows (`held_out_rows`): they may
widen its p80, never narrow it (single-GPU steps say nothing of communication). A device kind without fitted rows of its
own ("unfitted", or "copied from" another kind) gets UNFITTED_STEP_TIME instead, stated as
such; so does a framework whose rows could not fit its figures (`held` in uncertainty.yaml:
they stay first guesses). A machine calibrated by its own runs (`calibrate --from-runs` with 4
layouts or more, `calibrate --arrival`) carries its own band (`step_time_band`: the conformal
bound of its leave-one-layout-out errors), which stands in for its device kind's half. Memory: MEMORY, the 80th percentile of the net memory errors of the local validation
(docs/validate-local) and the spread of the published activation-memory checks
(tests/planner/test_memory_published.py), for every device kind.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from machine_models.loader import device_kind_status
from machine_models.support import Point, point_distance
from planner.schema.plan import PredictionUncertainty
from planner.schema.specs import FrameworkProfile, MachineModel

UNCERTAINTY_FILE = Path(__file__).resolve().parent / "uncertainty.yaml"
QUANTILE = 0.8


def conformal_bound(abs_errors, quantile: float = QUANTILE) -> float:
    """The bound a new prediction's |error| stays within with probability `quantile`, from n
    out-of-sample |errors| (leave-one-out or held out): the ceil((n + 1) x quantile)-th
    smallest, the largest where that exceeds n. This is the split-conformal / jackknife
    quantile (Vovk et al. 2005; Barber et al., "Predictive inference with the jackknife+",
    Ann. Statist. 2021): for exchangeable errors it covers at least `quantile` of new ones,
    where the empirical 80th percentile of a small sample covers less (13 rows: 0.8 x 14 =
    11.2 -> the 12th of 13, not the 10.6th). Before the seventeenth session the bands were
    np.quantile(errors, 0.8): held-out published rates fell inside 193 of 265 times (73%);
    now 212 (80%), `exaplan validate --published`."""
    import math

    import numpy as np

    a = np.sort(np.abs(np.asarray(abs_errors, dtype=float)))
    if a.size == 0:
        raise ValueError("no errors to bound")
    k = math.ceil((a.size + 1) * quantile)
    return float(a[min(k, a.size) - 1])
# Stated defaults: a device kind nothing was fitted to (first-guess efficiency figures), and
# memory (no published peak-memory rows to take leave-one-out errors from).
UNFITTED_STEP_TIME = 0.30
MAX_WIDENED = 0.5  # widened by distance, a half-width stops here: a prediction off by half is no prediction
CPU_DEVICE = "CPU rank"  # machine_models/loader.py detect_local_machine's device name starts so
MEMORY = 0.15


# The uncertainty of a prediction is the plan schema's PredictionUncertainty (step_time and
# memory half-widths, basis, fitted; its time/rate/memory intervals): one class for the
# planner's tables and the plan file.
Uncertainty = PredictionUncertainty


def _read(path: Path) -> dict:
    """uncertainty.yaml's contents ({} where it cannot be read), parsed once per version of it."""
    try:
        return _parse(str(path), Path(path).stat().st_mtime_ns)
    except OSError:
        return {}


@functools.lru_cache(maxsize=8)
def _parse(path: str, mtime_ns: int) -> dict:
    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _rows(stats: dict) -> str:
    """'13 rows', or '21 rows, 8 held out' where held-out errors are pooled in."""
    extra = int(stats.get("held_out_rows", 0))
    return f"{stats['rows']} rows" + (f", {extra} held out" if extra else "")


def uncertainty_of(machine: MachineModel, framework: FrameworkProfile | None = None,
                   path: Path = UNCERTAINTY_FILE, point: Point | None = None) -> Uncertainty:
    """The uncertainty of predictions for `machine` run with `framework` (default exaplan); with
    `point` (machine_models/support.py: the job's world, sequence, model size, sharding,
    pipelining), widened by how far that lies from the fitted rows of the device kind and
    framework (`widened`)."""
    framework = framework or FrameworkProfile()
    u = _base_uncertainty(machine, framework, _read(path))
    return u if point is None else at_point(u, machine, framework, point, path)


def at_point(u: Uncertainty, machine: MachineModel, framework: FrameworkProfile, point: Point,
             path: Path = UNCERTAINTY_FILE) -> Uncertainty:
    """`u` (uncertainty_of(machine, framework) without a point) at `point`: what
    uncertainty_of(..., point=point) gives, without reading the file again."""
    if not u.fitted or machine.step_time_band is not None:
        return u  # a stated default is wide already; a machine's own band comes from its own runs
    return widened(u, point, _read(path), machine.device_name, framework.name)


def widened(u: Uncertainty, point: Point, data: dict, device: str, framework: str) -> Uncertainty:
    """`u` widened to base x (1 + widen x d) at distance d from the fitted rows (support.py),
    at most MAX_WIDENED; unchanged inside them or where uncertainty.yaml has no support."""
    factor = (data.get("widen") or {}).get("factor")
    found = point_distance(point, data.get("support") or {}, device, framework) if factor is not None else None
    if not found or found[0] <= 0:
        return u
    d, outside = found
    half = min(u.step_time * (1 + factor * d), MAX_WIDENED)
    where = f"at distance {d:.2f} from the fitted rows ({'; '.join(outside)})"
    if factor == 0:  # said, not widened: the fitted rows left out at a distance stayed inside their band
        return u.model_copy(update={"basis": f"{u.basis}; {where}, not widened (fitted widening 0)"})
    return u.model_copy(update={"step_time": round(half, 4), "basis": f"{u.basis}; widened x{half / u.step_time:.2f} {where}"})


def _base_uncertainty(machine: MachineModel, framework: FrameworkProfile, data: dict) -> Uncertainty:
    """The p80 of the device kind and of the framework (the larger), or a stated default."""
    fw = (data.get("frameworks") or {}).get(framework.name)
    band = machine.step_time_band
    if band is not None:  # the machine's own runs replace its device kind's rows
        parts = [(band.half_width, f"{machine.name}'s own calibration (leave-one-layout-out over {band.runs} layouts"
                                   + (f": {band.basis})" if band.basis else ")"))]
    else:
        status = device_kind_status().get(machine.device_name, "unknown device kind")
        device = (data.get("device_kinds") or {}).get(machine.device_name)
        if machine.device_name.startswith(CPU_DEVICE):  # a CPU is measured by calibrate, never by published rows
            state = ("calibrated by microbenchmarks, no training runs measured" if machine.calibrated else
                     "uncalibrated: the project's first-guess CPU figures until `exaplan calibrate` measures this machine")
            return Uncertainty(step_time=UNFITTED_STEP_TIME, memory=MEMORY, fitted=False, basis=(
                f"{machine.device_name}: {state}; stated +/-{UNFITTED_STEP_TIME:.0%}, which the band of `exaplan "
                "calibrate --arrival` (layouts trained and predicted) replaces"))
        if status != "fitted" or not device:
            return Uncertainty(step_time=UNFITTED_STEP_TIME, memory=MEMORY, fitted=False, basis=f"{machine.device_name}: "
                               f"{status}; stated default +/-{UNFITTED_STEP_TIME:.0%} for device kinds without published rows")
        parts = [(float(device["p80"]), f"{machine.device_name} ({_rows(device)})")]
    if fw and fw.get("held"):
        # The framework's rows could not fit these figures (they stay first guesses): its
        # leave-one-out errors say nothing of predictions that lean on them.
        parts.append((UNFITTED_STEP_TIME, f"{framework.name}: {', '.join(fw['held'])} not fitted "
                                          f"(its {fw['rows']} rows cannot see them), stated default"))
        fw = None
    elif fw:
        parts.append((float(fw["p80"]), f"{framework.name} ({_rows(fw)})"))
    else:
        parts.append((UNFITTED_STEP_TIME, f"{framework.name}: no published rows, stated default"))
    value, _ = max(parts)
    basis = "leave-one-out |error| 80% conformal bound of " + " and ".join(name for _, name in parts)
    return Uncertainty(step_time=value, memory=MEMORY, basis=basis, fitted=fw is not None)
