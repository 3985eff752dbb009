"""The support of the fitted published rows and the widening of intervals with distance from it
(machine_models/support.py), fitted on the leave-one-out errors; written into
machine_models/uncertainty.yaml by `exaplan validate --published --refit --loo`."""

from __future__ import annotations

from pathlib import Path

import yaml

from calibration.published import PROFILE_OF, PublishedRun
from machine_models.support import Point, needed_widening, point_distance, support_of
from machine_models.uncertainty import UNCERTAINTY_FILE, conformal_bound, uncertainty_of
from planner.cost.flops import total_params
from planner.schema.specs import MachineModel


def run_point(run: PublishedRun) -> Point:
    return Point(world=run.gpus, seq_len=run.model.seq_len, params=float(total_params(run.model)),
                 sharding=run.layout.sharding.value, pipeline=run.layout.pp > 1)


def supports_of(runs: list[PublishedRun], machines: dict[str, MachineModel]) -> dict[str, dict[str, dict]]:
    """Device kind -> framework profile -> what its fitted rows cover."""
    points: dict[str, dict[str, list[Point]]] = {}
    for r in runs:
        points.setdefault(machines[r.machine].device_name, {}).setdefault(PROFILE_OF[r.framework], []).append(run_point(r))
    return {d: {f: support_of(p) for f, p in sorted(fs.items())} for d, fs in sorted(points.items())}


def fit_widening(runs: list[PublishedRun], machines: dict[str, MachineModel], loo_errors: dict[str, float],
                 path: Path = UNCERTAINTY_FILE) -> tuple[dict, list[dict]]:
    """The widening factor (support.py) and the rows it comes from: each fitted row, left out,
    at its distance from the support of the others; the factor is the 80% conformal bound of
    what the rows at a distance needed. The base of each row is its device kind's and
    framework's p80 as `path` holds them (written from the same leave-one-out errors)."""
    needs: list[dict] = []
    for i, r in enumerate(runs):
        found = point_distance(run_point(r), supports_of(runs[:i] + runs[i + 1:], machines),
                               machines[r.machine].device_name, PROFILE_OF[r.framework])
        if not found or found[0] <= 0:
            continue
        base = uncertainty_of(machines[r.machine], r.job().framework, path=path).step_time
        needs.append({"id": r.id, "distance": found[0], "loo_error": round(loo_errors[r.id], 4),
                      "base": base, "needed": round(needed_widening(abs(loo_errors[r.id]), base, found[0]), 4)})
    factor = conformal_bound([n["needed"] for n in needs]) if needs else 0.0
    return {"factor": round(factor, 4), "rows": len(needs), "of": len(runs)}, needs


def write_support(supports: dict, widen: dict, path: Path = UNCERTAINTY_FILE) -> None:
    """Add (or replace) the support and widen sections of uncertainty.yaml, keeping its header."""
    text = Path(path).read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    body = {k: v for k, v in (yaml.safe_load(text) or {}).items() if k not in ("support", "widen")}
    body["widen"] = widen
    body["support"] = supports
    note = ("# support: what the fitted rows of each device kind and framework cover; widen: the factor of\n"
            "# base x (1 + widen x distance) for a prediction outside it (machine_models/support.py), fitted on\n"
            "# the leave-one-out errors of the rows that lay outside the others' support when left out.\n")
    Path(path).write_text(header + (note if note not in header else "") + yaml.safe_dump(body, sort_keys=False))


__all__ = ["fit_widening", "run_point", "supports_of", "write_support"]
