"""`exaplan capacity`, kept as a thin alias of `exaplan whatif` (planner/whatif): one machine,
its old defaults (8 sequences per rank, weak scaling; powers of two up to the machine's size)
and its old row shape. The sweep itself is whatif's."""

from __future__ import annotations

from dataclasses import dataclass

from planner.schema.specs import MachineModel


@dataclass
class CapacityRow:
    nodes: int
    ranks: int
    global_batch: int
    layout: str | None  # None: nothing legal or nothing fits
    step_time_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    days: float | None
    note: str = ""


def default_node_counts(machine: MachineModel) -> list[int]:
    """Powers of two up to the machine's size, and the machine's size."""
    counts, n = [], 1
    while n < machine.nodes:
        counts.append(n)
        n *= 2
    return counts + [machine.nodes]


def rows_from_points(points, workload: str = "pretrain") -> list[CapacityRow]:
    """whatif points (planner.whatif.WhatifPoint) as capacity rows (global batch in samples:
    dpo counts pairs)."""
    per_sample = 2 if workload == "dpo" else 1
    return [CapacityRow(p.nodes, p.ranks, p.global_batch_seqs // per_sample, p.layout if p.fits else None,
                        p.step_time_s if p.fits else None, p.tokens_per_s if p.fits else None,
                        p.mfu if p.fits else None, p.days if p.fits else None, p.reason) for p in points]


def sweep(model, machine: MachineModel, make_job, node_counts: list[int]) -> list[CapacityRow]:
    """The best layout at each node count; `make_job(world)` gives the job for a world size.
    Through whatif's point evaluation (one code path)."""
    from machine_models.uncertainty import uncertainty_of
    from planner.whatif.engine import Case, evaluate_point

    case = Case(model.name, machine.name, {}, model, machine)
    points, workload = [], "pretrain"
    for n in node_counts:
        job = make_job(n * machine.devices_per_node)
        workload = job.workload.value
        points.append(evaluate_point(case, job, n, uncertainty_of(machine, job.framework)))
    return rows_from_points(points, workload)


def smallest_meeting(rows: list[CapacityRow], deadline_days: float) -> CapacityRow | None:
    ok = [r for r in rows if r.days is not None and r.days <= deadline_days]
    return min(ok, key=lambda r: r.nodes) if ok else None
