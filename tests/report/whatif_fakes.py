"""Fake what-if results (imported by the tests as whatif_fakes) with WhatifPoint's and WhatifResult's attributes (planner.whatif), so the
report is tested without the sweep engine: a few points per machine, nan and None energy, an
unfitted device kind, a point that does not fit, and a hostile machine name."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

NAN = math.nan
HOSTILE = '<script>alert("x")</script>$a$&'


@dataclass(frozen=True)
class FakePoint:
    model: str
    machine: str
    nodes: int
    varied: dict
    fits: bool
    reason: str
    layout: str
    step_time_s: float
    step_time_lo_s: float
    step_time_hi_s: float
    tokens_per_s: float
    tokens_per_s_lo: float
    tokens_per_s_hi: float
    tflops_per_device: float
    mfu: float
    days: float
    days_lo: float
    days_hi: float
    node_hours: float
    node_hours_lo: float
    node_hours_hi: float
    energy_kwh: float | None
    energy_kwh_lo: float | None
    energy_kwh_hi: float | None
    scaling_efficiency: float
    global_batch_seqs: int
    global_batch_tokens: int
    fitted: bool
    uncertainty_basis: str


@dataclass
class FakeResult:
    points: list
    inputs: dict
    command: str
    deadline: dict = field(default_factory=dict)
    fastest: list = field(default_factory=list)
    knees: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    device_status: dict = field(default_factory=dict)


def point(model="protein-3.5b", machine="frontier", nodes=16, varied=None, *, speed=1.0, eff=1.0, fits=True,
          energy=True, fitted=True, tokens=1e12) -> FakePoint:
    """A point whose tokens/s grows with nodes at efficiency `eff`; days and node-hours follow."""
    if not fits:
        return FakePoint(model, machine, nodes, dict(varied or {}), False, "fits nowhere: 80 GiB > 64 GiB", "",
                         *[NAN] * 14, None, None, None, NAN, 65536, 65536 * 2048, fitted, "n/a")
    tps = 1e5 * speed * nodes * eff
    step = 65536 * 2048 / tps
    days = tokens / tps / 86400
    nh = days * 24 * nodes
    kwh = nh * 3.0 if energy else None
    return FakePoint(model, machine, nodes, dict(varied or {}), True, "", f"tp2 pp1 dp{nodes * 4} zero1",
                     step, step * 0.9, step * 1.2, tps, tps / 1.2, tps / 0.9, 150.0 * speed * eff, 0.4 * eff,
                     days, days * 0.9, days * 1.2, nh, nh * 0.9, nh * 1.2, kwh,
                     None if kwh is None else kwh * 0.9, None if kwh is None else kwh * 1.2,
                     eff, 65536, 65536 * 2048, fitted, "leave-one-out" if fitted else "unfitted first guess")


def sweep(machines=("frontier", "aurora"), node_counts=(16, 32, 64, 128), varied=None, model="protein-3.5b",
          **kw) -> list[FakePoint]:
    """Points over machines x node counts x (optional) varied dicts; efficiency falls with nodes."""
    out = []
    for i, m in enumerate(machines):
        for v in varied or [None]:
            for n in node_counts:
                eff = max(0.3, 1.0 - 0.08 * math.log2(n / node_counts[0]))
                out.append(point(model, m, n, v, speed=1.0 + 0.3 * i, eff=eff, **kw))
    return out


def fake_result() -> FakeResult:
    pts = sweep(machines=("frontier", HOSTILE))
    pts.append(point(machine="aurora", nodes=16, energy=False, fitted=False))
    pts.append(point(machine="aurora", nodes=32, fits=False, fitted=False))
    first = pts[0]
    return FakeResult(
        points=pts,
        inputs={"model": ["protein-3.5b"], "machine": ["frontier", HOSTILE, "aurora"], "tokens": 1e12,
                "nodes": [16, 32, 64, 128], "global_batch": 65536},
        command="exaplan whatif --model protein-3.5b --machine frontier,aurora --nodes 16:128 --tokens 1e12 "
                "--report r.html",
        deadline={("protein-3.5b", "frontier", ()): {"fewest_nodes": 64, "cheapest": first,
                                                     "sentence": "64 nodes meet 7 days"},
                  ("protein-3.5b", "aurora", ()): {"best": None, "sentence": "nothing meets 7 days; best 30 days"}},
        fastest=[{"rank": 1, "machine": HOSTILE, "nodes": 64, "days": 3.2}, {"rank": 2, "machine": "frontier"}],
        knees={("protein-3.5b", "frontier", ()): 64},
        warnings=[f"global batch 65,536 sequences exceeds the critical batch for {HOSTILE}"],
        device_status={"MI250X": "fitted (8 rows)", "Max 1550": "unfitted first guess", "<b>x</b>": "unfitted",
                       "GH200": "copied from H100"},
    )
