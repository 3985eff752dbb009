"""What-if capacity: how does time-to-train fall with node count, and how many nodes meet a deadline?

For each node count the whole layout space is searched again (the best layout changes with
scale), so the curve is what the planner would actually run at each size.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.schema.errors import PlanError
from planner.report import layout_label
from planner.search.search import search
from planner.schema.specs import MachineModel, ModelSpec, TrainingJob


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


def sweep(model: ModelSpec, machine: MachineModel, make_job, node_counts: list[int]) -> list[CapacityRow]:
    """The best layout at each node count; `make_job(world)` gives the job for a world size
    (the caller decides whether the global batch is fixed or grows with the world)."""
    rows = []
    for nodes in node_counts:
        world = nodes * machine.devices_per_node
        job: TrainingJob = make_job(world)
        try:
            r = search(model, machine, job, nodes, top_k=1)
        except PlanError as e:
            rows.append(CapacityRow(nodes, world, job.global_batch, None, None, None, None, None, note=_short(e)))
            continue
        ev = r.evaluation
        rows.append(CapacityRow(nodes, world, job.global_batch, layout_label(r.layouts, 0), float(ev.step_time_s[0]),
                                float(ev.tokens_per_s[0]), float(ev.mfu[0]), float(ev.time_to_train_days[0])))
    return rows


def _short(err: PlanError) -> str:
    if err.field == "memory":
        return "fits nowhere"
    if err.field == "global_batch":
        return "global batch cannot be kept"
    return str(err)


def smallest_meeting(rows: list[CapacityRow], deadline_days: float) -> CapacityRow | None:
    ok = [r for r in rows if r.days is not None and r.days <= deadline_days]
    return min(ok, key=lambda r: r.nodes) if ok else None
