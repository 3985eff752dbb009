"""What the plots and the HTML report share, without matplotlib: the curves of a sweep (one per
model x machine x varied values), the knee of each, the varied fields, and the Pareto front of
time to train against node-hours.

A point is anything with WhatifPoint's attributes (planner.whatif); only attributes are read.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from planner.whatif import WhatifPoint, WhatifResult

Group = tuple  # (model, machine, ((field, value label), ...))


def finite(v: Any) -> bool:
    """A number that can be drawn: not None, not nan, not inf."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def group_of(p: WhatifPoint) -> Group:
    return (p.model, p.machine, tuple(sorted((str(k), str(v)) for k, v in (p.varied or {}).items())))


def varied_label(varied: Iterable[tuple[str, str]] | dict | str) -> str:
    """'field=value, field=value' from a dict or pairs; a string, or an item that is not a pair, as is."""
    if isinstance(varied, str):
        return varied
    items = varied.items() if isinstance(varied, dict) else varied
    return ", ".join(f"{i[0]}={i[1]}" if isinstance(i, (tuple, list)) and len(i) == 2 else str(i) for i in items)


def group_label(g: Group, with_model: bool = True) -> str:
    model, machine, varied = g
    head = f"{model} on {machine}" if with_model else str(machine)
    return f"{head} [{varied_label(varied)}]" if varied else head


def groups(points: Sequence[WhatifPoint]) -> dict[Group, list[WhatifPoint]]:
    """Points by curve, in order of first appearance, each curve sorted by node count."""
    out: dict[Group, list] = {}
    for p in points:
        out.setdefault(group_of(p), []).append(p)
    return {g: sorted(ps, key=lambda p: p.nodes) for g, ps in out.items()}


def models(points: Sequence[WhatifPoint]) -> list[str]:
    return list(dict.fromkeys(p.model for p in points))


def machines(points: Sequence[WhatifPoint]) -> list[str]:
    return list(dict.fromkeys(p.machine for p in points))


def varied_fields(points: Sequence[WhatifPoint]) -> dict[str, list[str]]:
    """Each varied field and its value labels, in sweep order."""
    out: dict[str, list[str]] = {}
    for p in points:
        for k, v in (p.varied or {}).items():
            vals = out.setdefault(str(k), [])
            if str(v) not in vals:
                vals.append(str(v))
    return out


def _normalise(key: Any) -> Group | str:
    """A knee key as the engine writes it, as a Group: (model, machine, varied) with varied a
    dict, pairs, a frozenset of pairs or a 'k=v, k=v' label; a plain string stays a string."""
    if isinstance(key, tuple) and len(key) == 2:
        key = (key[0], key[1], ())
    if not (isinstance(key, tuple) and len(key) == 3):
        return str(key)
    model, machine, varied = key
    if isinstance(varied, dict):
        pairs = varied.items()
    elif isinstance(varied, str):
        pairs = [tuple(s.strip().split("=", 1)) for s in varied.split(",") if "=" in s]
    else:
        pairs = varied or ()
    return (model, machine, tuple(sorted((str(k), str(v)) for k, v in pairs)))


def knees(result: WhatifResult) -> dict[Group, int]:
    """result.knees keyed by Group; string keys are matched against the curves' labels."""
    out: dict[Group, int] = {}
    labels = {}
    for g in groups(result.points):
        labels[group_label(g)] = g
        labels[group_label(g, with_model=False)] = g
        labels["/".join([g[0], g[1]] + [varied_label(g[2])] * bool(g[2]))] = g
    for key, nodes in (result.knees or {}).items():
        if nodes is None:
            continue
        g = _normalise(key)
        g = labels.get(g) if isinstance(g, str) else g
        if g is not None:
            out[g] = int(nodes)
    return out


def pareto_front(points: Sequence[WhatifPoint]) -> list[WhatifPoint]:
    """The points no other point beats on both time to train (days) and node-hours, fewest
    node-hours first. Only points that fit and have both figures count; of equal points the
    first is kept."""
    cands = [p for p in points if p.fits and finite(p.days) and finite(p.node_hours)]
    cands.sort(key=lambda p: (p.node_hours, p.days))
    front, best_days = [], math.inf
    for p in cands:
        if p.days < best_days:
            front.append(p)
            best_days = p.days
    return front
