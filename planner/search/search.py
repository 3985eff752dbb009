"""Search every legal layout: enumerate, score (vectorised), prune by memory, rank.

Ranking: predicted step time, then peak memory. The fast scores give each communicator its
cheapest algorithm; the finalists are then re-scored with one allreduce and one
reduce-scatter/all-gather algorithm for the whole job (how libraries take the setting) and
re-ranked, so what is printed and emitted is what the library can actually be told to do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from planner.cost.layout import Layouts
from planner.cost.step import Evaluation, evaluate, evaluate_space
from planner.schema.errors import PlanError
from planner.search.axes import cp_options, tp_options
from planner.search.pins import Pins
from planner.search.space import enumerate_space
from planner.schema.specs import MachineModel, ModelSpec, TrainingJob, divisors

FINALISTS = 64
GIB = 2.0**30


@dataclass
class SearchResult:
    model: ModelSpec
    machine: MachineModel
    job: TrainingJob
    nodes: int
    layouts: Layouts  # the top layouts, best first
    evaluation: Evaluation  # their detailed predictions, same order
    total_layouts: int  # legal layouts enumerated
    layouts_scored: int  # layouts x algorithm choices scored
    fitting: int  # legal layouts that fit in memory
    seconds: float  # enumerate + score + rank
    pins: Pins = field(default_factory=Pins)  # the values kept fixed (every layout has them)
    finalists: Layouts | None = None  # every re-scored finalist, best first (layouts is its head)
    finalist_step_time_s: np.ndarray | None = None  # their library-consistent step times

    @property
    def world(self) -> int:
        return self.nodes * self.machine.devices_per_node


def feasible_global_batches(model: ModelSpec, job: TrainingJob, world: int, around: int, count: int = 4) -> list[int]:
    """Global batches near `around` that some layout of `world` ranks can keep."""
    dps = sorted({world // (t * c * p) for t in tp_options(model, world) for c in cp_options(job, world // t)
                  for p in divisors(world // (t * c)) if p <= model.layers})
    cands = {k * d for d in dps for k in (max(around // d, 1), around // d + 1)}
    return sorted(cands, key=lambda b: (abs(b - around), b))[:count]


def search(model: ModelSpec, machine: MachineModel, job: TrainingJob, nodes: int, top_k: int = 5,
           pins: Pins | None = None) -> SearchResult:
    """The best `top_k` layouts of `job` on `nodes` nodes of `machine`; with `pins`, among the
    layouts that keep every pinned value (PlanError for pins that conflict or leave none)."""
    if nodes > machine.nodes:
        raise PlanError(f"{nodes} nodes asked for, {machine.name} has {machine.nodes}", field="nodes")
    world = nodes * machine.devices_per_node
    pins = pins or Pins()
    pins.check(model, job, world)
    pins.check_framework(job.framework)
    start = time.perf_counter()
    space = enumerate_space(model, job, world)
    if len(space) == 0:
        near = feasible_global_batches(model, job, world, job.global_batch)
        raise PlanError(
            f"no layout of {world} ranks keeps global batch {job.global_batch} (micro-batch x accumulation x "
            f"data-parallel degree must equal it; it is never changed silently). Global batches that work here: "
            f"{', '.join(map(str, near))}",
            field="global_batch",
        )
    allowed = space.allowed_by(job.framework, model.layers, ranks_per_node=machine.devices_per_node,
                               device_name=machine.device_name, tied_embeddings=model.tied_embeddings,
                               workload=job.workload.value)
    if not allowed.all():  # the shardings and the sequence, pipeline and context parallelism the framework runs
        if not allowed.any():
            raise PlanError(f"{job.framework.name} runs none of the {len(space):,} legal layouts (it runs "
                            f"{job.framework.offers()})", field="framework")
        space = space.subset(allowed)
    if pins:
        pinned = pins.restrict(space)
        if len(pinned) == 0:
            raise pins.no_layout(space, model, job, world)
        space = pinned
    scores = evaluate_space(model, machine, job, space, detail=False)
    fitting = int(scores.fits.sum())
    if fitting == 0:
        least = float(scores.memory_bytes.min())
        with_pins = f" with {pins.label()}" if pins else ""
        raise PlanError(
            f"{model.name} fits nowhere on {nodes} x {machine.name}{with_pins}: the leanest of {len(space):,} layouts needs "
            f"{least / GIB:.1f} GiB per device, a device has {machine.device_memory_gib:.1f} GiB "
            f"(try more nodes, a shorter sequence or a smaller model)",
            field="memory",
        )
    key = np.where(scores.fits, scores.step_time_s, np.inf)
    n = min(FINALISTS, fitting)
    cand = np.argpartition(key, n - 1)[:n] if n < len(key) else np.arange(len(key))
    lay = space.layouts(cand)
    ev = evaluate(model, machine, job, lay)  # library-consistent algorithms
    # Rank by step time, then memory; the layout fields break exact ties deterministically.
    tie = tuple(getattr(lay, f) for f in ("sp", "recompute", "sharding", "schedule", "vpp", "gas", "mbs", "tp", "cp", "dp_shard", "dp_replicate", "pp"))
    ranked = np.lexsort(tie + (np.round(ev.memory.total), ev.step_time_s))
    order = ranked[:top_k]
    seconds = time.perf_counter() - start
    best = evaluate(model, machine, job, lay.take(order))
    return SearchResult(model, machine, job, nodes, lay.take(order), best, len(space), scores.layouts_scored, fitting, seconds,
                        pins, lay.take(ranked), ev.step_time_s[ranked])
