"""The questions asked of a sweep's points: scaling efficiency and its knee, the deadline
(fewest nodes, cheapest point, or the best achievable), the fastest machine, and warnings
(a global batch past the critical-batch estimate; fewer tokens/s at more nodes under weak scaling)."""

from __future__ import annotations

import math
from dataclasses import replace

from planner.whatif import batch as batch_rule
from planner.whatif.types import WhatifPoint


def groups(points: list[WhatifPoint]) -> dict[tuple, list[WhatifPoint]]:
    """Points by (model, machine, varied), each list by node count."""
    out: dict[tuple, list[WhatifPoint]] = {}
    for p in points:
        out.setdefault(p.group, []).append(p)
    return {k: sorted(v, key=lambda p: p.nodes) for k, v in out.items()}


def with_efficiency(points: list[WhatifPoint]) -> list[WhatifPoint]:
    """Each fitting point's per-device tokens/s over that of the smallest fitting node count
    of its group (1 there; nan where nothing fits)."""
    base = {}
    for key, ps in groups(points).items():
        first = next((p for p in ps if p.fits), None)
        if first is not None:
            base[key] = first.tokens_per_s / first.ranks
    return [replace(p, scaling_efficiency=(p.tokens_per_s / p.ranks) / base[p.group]) if p.fits else p
            for p in points]


def _label(p: WhatifPoint) -> str:
    varied = ", ".join(f"{k}={v}" for k, v in p.varied.items())
    return f"{p.model} on {p.machine}" + (f" ({varied})" if varied else "")


def knees(points: list[WhatifPoint], threshold: float) -> list[dict]:
    """Per group: the first node count whose scaling efficiency is below `threshold`."""
    out = []
    for ps in groups(points).values():
        fit = [p for p in ps if p.fits]
        knee = next((p for p in fit if p.scaling_efficiency < threshold), None)
        above = [p for p in fit if knee is None or p.nodes < knee.nodes]
        if knee is not None:
            # One decimal when whole percent would round up to the threshold (79.6% -> "80%").
            pct = f"{knee.scaling_efficiency:.0%}" if round(knee.scaling_efficiency, 2) < threshold \
                else f"{knee.scaling_efficiency:.1%}"
            sentence = (f"{_label(ps[0])}: efficiency falls to {pct} at {knee.nodes:,} nodes "
                        f"(below {threshold:.0%})" + (f"; {above[-1].nodes:,} nodes is the last above" if above else ""))
        elif fit:
            sentence = f"{_label(ps[0])}: efficiency stays at or above {threshold:.0%} up to {fit[-1].nodes:,} nodes"
        else:
            sentence = f"{_label(ps[0])}: nothing fits"
        out.append(dict(model=ps[0].model, machine=ps[0].machine, varied=dict(ps[0].varied), threshold=threshold,
                        knee_nodes=knee.nodes if knee else None,
                        efficiency_at_knee=knee.scaling_efficiency if knee else math.nan,
                        last_efficient_nodes=above[-1].nodes if above else None, sentence=sentence))
    return out


def _cost(p: WhatifPoint, minimise: str) -> float:
    if minimise == "energy" and p.energy_kwh is not None:
        return p.energy_kwh
    return p.node_hours


def deadline(points: list[WhatifPoint], days: float, minimise: str) -> list[dict]:
    """Per group: the fewest nodes that train within `days`, and the cheapest point that does
    (node-hours, or energy with minimise='energy' where the machine has a power: section);
    where none does, the best achievable (fewest days) and a sentence saying so. When the
    fewest is the smallest node count tried (`fewer_not_tried`), the sentence says that fewer
    nodes were not tried and may meet it too."""
    out = []
    for ps in groups(points).values():
        fit = [p for p in ps if p.fits]
        meet = [p for p in fit if p.days <= days]
        fewest = min(meet, key=lambda p: p.nodes) if meet else None
        cheapest = min(meet, key=lambda p: (_cost(p, minimise), p.nodes)) if meet else None
        best = min(fit, key=lambda p: (p.days, p.nodes)) if fit else None
        by = "energy" if minimise == "energy" and cheapest is not None and cheapest.energy_kwh is not None else "node-hours"
        # The fewest nodes tried that meet it is the smallest count swept: fewer may meet it too.
        untried = fewest is not None and fewest.nodes == ps[0].nodes and fewest.nodes > 1
        if fewest is not None:
            cost = f"{cheapest.energy_kwh:,.0f} kWh" if by == "energy" else f"{cheapest.node_hours:,.0f} node-hours"
            sentence = (f"{_label(ps[0])}: {fewest.nodes:,} nodes meet {days:g} days ({fewest.days:.2f} days, "
                        f"{fewest.days_lo:.2f}-{fewest.days_hi:.2f}); cheapest by {by}: {cheapest.nodes:,} nodes "
                        f"({cost}, {cheapest.days:.2f} days)")
            if untried:
                sentence += (f"; fewer nodes were not tried ({fewest.nodes:,} is the smallest count swept) and may "
                             f"meet it too: sweep below it, e.g. --nodes {max(1, fewest.nodes // 8)}:{fewest.nodes}")
        elif best is not None:
            sentence = (f"{_label(ps[0])}: no node count tried meets {days:g} days; the best achievable is "
                        f"{best.days:.2f} days ({best.days_lo:.2f}-{best.days_hi:.2f}) at {best.nodes:,} nodes")
        else:
            sentence = f"{_label(ps[0])}: nothing fits at any node count tried, so no deadline can be met"
        out.append(dict(model=ps[0].model, machine=ps[0].machine, varied=dict(ps[0].varied), deadline_days=days,
                        met=fewest is not None, minimise=by, fewest=fewest, cheapest=cheapest, best=best,
                        smallest_tried=ps[0].nodes, fewer_not_tried=untried, sentence=sentence))
    return out


def fastest(points: list[WhatifPoint]) -> list[dict]:
    """Per model (and varied values): machines ranked by days to train at each node count they
    share, and by the node-hours of their cheapest point (equal budget)."""
    by_model: dict[tuple, list[WhatifPoint]] = {}
    for p in points:
        if p.fits:
            by_model.setdefault((p.model, tuple(sorted(p.varied.items()))), []).append(p)
    out = []
    for (model, varied), ps in by_model.items():
        by_nodes = {}
        for n in sorted({p.nodes for p in ps}):
            ranked = sorted((p for p in ps if p.nodes == n), key=lambda p: p.days)
            by_nodes[n] = [dict(machine=p.machine, days=p.days, tokens_per_s=p.tokens_per_s) for p in ranked]
        cheapest = {}
        for p in ps:
            if p.machine not in cheapest or p.node_hours < cheapest[p.machine].node_hours:
                cheapest[p.machine] = p
        by_cost = [dict(machine=p.machine, nodes=p.nodes, node_hours=p.node_hours, days=p.days, energy_kwh=p.energy_kwh)
                   for p in sorted(cheapest.values(), key=lambda p: p.node_hours)]
        quickest = min(ps, key=lambda p: p.days)
        sentence = (f"{model}: fastest {quickest.machine} ({quickest.days:.2f} days at {quickest.nodes:,} nodes); "
                    f"cheapest {by_cost[0]['machine']} ({by_cost[0]['node_hours']:,.0f} node-hours at "
                    f"{by_cost[0]['nodes']:,} nodes)")
        out.append(dict(model=model, varied=dict(varied), by_nodes=by_nodes, by_node_hours=by_cost,
                        sentence=sentence))
    return out


def batch_warnings(points: list[WhatifPoint], cases, tokens: float, seq_len: int | None) -> list[str]:
    """One warning per model (per machine where the batch differs by machine) whose global
    batch exceeds the critical-batch estimate (planner/whatif/batch.py)."""
    limit = {}
    for c in cases:
        limit[(c.model_name, c.machine_name, tuple(sorted(c.varied.items())))] = batch_rule.critical_batch_tokens(
            c.model, seq_len or c.model.seq_len, tokens)
    over: dict[tuple, list[tuple[WhatifPoint, float]]] = {}
    for p in points:
        b = limit[p.group]
        if p.global_batch_tokens > b:
            model_fields = tuple((k, v) for k, v in sorted(p.varied.items()) if k.startswith("model."))
            over.setdefault((p.model, model_fields), []).append((p, b))
    out = []
    for (model, fields), items in over.items():
        name = model + (f" ({', '.join(f'{k}={v}' for k, v in fields)})" if fields else "")
        sizes = {p.global_batch_tokens for p, _ in items}
        p, b = max(items, key=lambda x: x[0].global_batch_tokens)
        where = "" if len(sizes) == 1 else f" (largest: {p.nodes:,} x {p.machine}; from {min(sizes):.3g} tokens)"
        out.append(f"{name}: global batch up to {p.global_batch_seqs:,} sequences ({p.global_batch_tokens:.3g} tokens)"
                   f"{where} exceeds the critical-batch estimate {b:.3g} tokens for {tokens:.3g} training tokens by "
                   f"{p.global_batch_tokens / b:.1f}x ({batch_rule.SOURCE}); past it the same compute reaches a "
                   f"higher loss")
    return out


def slowdown_warnings(points: list[WhatifPoint]) -> list[str]:
    """Weak scaling (the same sequences per rank at every node count of a curve): one warning per
    fitting point that gives fewer tokens/s than a smaller node count of its curve, and why. Odd
    counts do it: 7 Aurora nodes (84 ranks) train protein-3.5b slower than 6 (72 ranks), since a
    factor 7 divides neither its 16 layers nor its 32 heads and the legal layouts are slower."""
    out = []
    for ps in groups(points).values():
        fit = [p for p in ps if p.fits]
        for i, p in enumerate(fit):
            best = max(fit[:i], key=lambda q: q.tokens_per_s, default=None)
            if best is None or p.tokens_per_s >= best.tokens_per_s:
                continue
            if p.global_batch_seqs * best.ranks != best.global_batch_seqs * p.ranks:
                continue  # the batch per rank differs (one global batch): the knee tells
            per_rank = p.global_batch_seqs / p.ranks
            if p.ranks % best.ranks:
                why = (f"{p.ranks:,} ranks are not a multiple of {best.ranks:,}, so {best.nodes:,} nodes' layout "
                       f"cannot just add data-parallel replicas, and the layouts of {p.ranks:,} ranks are slower "
                       f"(best: {p.layout}); node counts that multiply the smaller one avoid it")
            else:
                why = (f"the step time grows faster than the ranks ({p.step_time_s:.3g} s against "
                       f"{best.step_time_s:.3g} s)")
            out.append(f"{_label(p)}: {p.nodes:,} nodes give fewer tokens/s than {best.nodes:,} nodes "
                       f"({p.tokens_per_s:,.0f} against {best.tokens_per_s:,.0f}) at the same {per_rank:g} "
                       f"sequence{'' if per_rank == 1 else 's'} per rank: {why}")
    return out


def other_warnings(points: list[WhatifPoint], minimise: str) -> list[str]:
    out = []
    no_power = sorted({p.machine for p in points if p.fits and p.energy_kwh is None})
    if no_power:
        out.append(f"no power: section in the machine file of {', '.join(no_power)}: no energy"
                   + ("; cheapest by node-hours there" if minimise == "energy" else ""))
    unfitted = sorted({p.machine for p in points if not p.fitted})
    if unfitted:
        out.append(f"unfitted predictions (+/- the stated default) for {', '.join(unfitted)}")
    return out
