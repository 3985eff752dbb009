"""How far a prediction lies from the rows the figures were fitted to, and how much wider that
makes its interval (machine_models/uncertainty.py).

A prediction's point is its world size, sequence length, model size, data-parallel sharding and
whether it pipelines. The support of a device kind and framework profile is what their fitted
published rows cover: the range of each figure and the sharding and pipeline kinds seen
(uncertainty.yaml `support:`, written by the refit). The distance of a point from a support is

    d = sum over world, sequence, parameters of log2(how far outside the range: 0 inside)
        + 1 for a sharding no fitted row used, + 1 for pipelining (or not) where no row did

with the support of the framework's rows on every device kind standing in (+ 1) where the
device kind has no fitted rows with that framework. The interval's half-width grows as

    half = base x (1 + widen x d)

where base is the p80 of the device kind and framework, and `widen` is fitted on the
leave-one-out errors: each fitted row, left out, lies at some distance from the support of the
others of its kind and framework; `widen` is the 80% conformal bound of what each such row
needed, (|error| / base - 1) / d (0 where the base already covered it). Checked on the held-out
rows (never fitted): `exaplan validate --published` tables their coverage by stratum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NUMERIC = ("world", "seq_len", "params")


@dataclass(frozen=True)
class Point:
    """Where a prediction lies: GPUs (ranks), tokens per sequence, parameters, sharding, pipelining."""

    world: int
    seq_len: int
    params: float
    sharding: str
    pipeline: bool


def support_of(points: list[Point]) -> dict:
    """What the points cover, as uncertainty.yaml stores it."""
    out: dict = {name: [min(getattr(p, name) for p in points), max(getattr(p, name) for p in points)] for name in NUMERIC}
    out["shardings"] = sorted({p.sharding for p in points})
    out["pipeline"] = sorted({p.pipeline for p in points})
    out["rows"] = len(points)
    return out


def distance(point: Point, support: dict) -> tuple[float, list[str]]:
    """(d, what lies outside, in words) of `point` from `support` (support_of's dict)."""
    d, outside = 0.0, []
    units = {"world": "GPUs", "seq_len": "tokens", "params": "parameters"}
    for name in NUMERIC:
        lo, hi = support[name]
        x = getattr(point, name)
        if x < lo or x > hi:
            d += math.log2(lo / x if x < lo else x / hi)
            bound = f"{'below' if x < lo else 'above'} the fitted {lo if x < lo else hi:,.4g}"
            unit = "GPU" if name == "world" and x == 1 else units[name]
            outside.append(f"{name} {x:,.4g} {unit} {bound}")
    if point.sharding not in support["shardings"]:
        d += 1.0
        outside.append(f"sharding {point.sharding} (fitted: {', '.join(support['shardings'])})")
    if point.pipeline not in support["pipeline"]:
        d += 1.0
        outside.append("a pipeline" if point.pipeline else "no pipeline")
    return d, outside


def point_distance(point: Point, supports: dict, device: str, framework: str) -> tuple[float, list[str]] | None:
    """The distance of `point` from the rows of `device` with `framework` (uncertainty.yaml's
    `support` section: device -> framework -> support), or from the framework's rows on every
    kind plus one where the device kind has none with it; None where the framework has none."""
    own = (supports.get(device) or {}).get(framework)
    if own:
        return distance(point, own)
    pooled = [s[framework] for s in supports.values() if framework in s]
    if not pooled:
        return None
    union = {name: [min(s[name][0] for s in pooled), max(s[name][1] for s in pooled)] for name in NUMERIC}
    union["shardings"] = sorted({x for s in pooled for x in s["shardings"]})
    union["pipeline"] = sorted({x for s in pooled for x in s["pipeline"]})
    d, outside = distance(point, union)
    return d + 1.0, [f"no fitted {framework} rows on {device}"] + outside


def needed_widening(abs_error: float, base: float, d: float) -> float:
    """What a row at distance d > 0 needed of `widen` for its |error| to fall inside base x (1 + widen x d)."""
    return max(0.0, (abs_error / base - 1.0) / d)


__all__ = ["NUMERIC", "Point", "distance", "needed_widening", "point_distance", "support_of"]
