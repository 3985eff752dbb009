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
from planner.cost.bounds import row_bounds
from planner.cost.step import Evaluation, Scores, evaluate, evaluate_space
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
    fitting: int | None  # legal layouts that fit in memory (None: not counted, search(prune=True))
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
           pins: Pins | None = None, prune: bool = False) -> SearchResult:
    """The best `top_k` layouts of `job` on `nodes` nodes of `machine`; with `pins`, among the
    layouts that keep every pinned value (PlanError for pins that conflict or leave none).
    `prune`: score only the rows that can reach the finalists (_promising_rows: the same
    layouts, found sooner; the fitting count is then left out)."""
    if nodes > machine.nodes:
        raise PlanError(f"{nodes} nodes asked for, {machine.name} has {machine.nodes}", field="nodes")
    world = nodes * machine.devices_per_node
    pins = pins or Pins()
    pins.check(model, job, world)
    pins.check_framework(job.framework)
    start = time.perf_counter()
    space = enumerate_space(model, job, world, vpp=pins.vpp)
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
    rows, scores = _promising_rows(model, machine, job, space) if prune else \
        (None, evaluate_space(model, machine, job, space, detail=False))
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
    cand = _finalists(key, min(FINALISTS, fitting))
    lay = space.layouts(cand if rows is None else rows[cand])
    ev = evaluate(model, machine, job, lay)  # library-consistent algorithms
    # Rank by step time, then memory; the layout fields break exact ties deterministically.
    tie = tuple(getattr(lay, f) for f in ("sp", "recompute", "sharding", "schedule", "vpp", "gas", "mbs", "tp", "cp", "dp_shard", "dp_replicate", "pp"))
    ranked = np.lexsort(tie + (np.round(ev.memory.total), ev.step_time_s))
    order = ranked[:top_k]
    seconds = time.perf_counter() - start
    best = evaluate(model, machine, job, lay.take(order))
    return SearchResult(model, machine, job, nodes, lay.take(order), best, len(space), scores.layouts_scored,
                        None if prune else fitting, seconds, pins, lay.take(ranked), ev.step_time_s[ranked])


def _finalists(key: np.ndarray, n: int) -> np.ndarray:
    """The n rows of least key, ascending by row; of rows tied with the n-th, the first ones (not
    whichever the partition left there: so the same rows whatever else the array holds)."""
    if n >= len(key):
        return np.arange(len(key))
    edge = key[np.argpartition(key, n - 1)[n - 1]]
    below = np.flatnonzero(key < edge)
    return np.sort(np.concatenate([below, np.flatnonzero(key == edge)[:n - len(below)]]))


PRUNE_FIRST_ROWS = 1 << 15  # rows of least bound scored first; each next batch twice the last
BOUND_MARGIN = 1e-4  # the bounds are float64, the scores float32: a row is left out only well beyond them


def _promising_rows(model: ModelSpec, machine: MachineModel, job: TrainingJob, space) -> tuple[np.ndarray, Scores]:
    """The rows (ascending indices into `space`) and Scores of every row that can be among the
    FINALISTS fitting rows of least step time. Rows are scored in order of their step time's
    lower bound (row_bounds), in batches, until FINALISTS rows fit; then every row whose bound
    lies at or below the FINALISTS-th fitting step is scored, and no other can enter. A row whose
    memory bound exceeds the device is not scored unless too few fit (then every row is, as
    without pruning, so that the least memory is known)."""
    step_bound, memory_bound = row_bounds(model, machine, job, space)
    hopeless = memory_bound * (1.0 - BOUND_MARGIN) > machine.device_memory_gib * GIB
    bound = np.where(hopeless, np.inf, step_bound * (1.0 - BOUND_MARGIN))
    scored = np.zeros(len(space), dtype=bool)
    edge, batch, parts = np.inf, PRUNE_FIRST_ROWS, []
    while not scored.all():
        if np.isfinite(edge):
            take = ~scored & (bound <= edge)
        elif batch >= np.count_nonzero(~scored):
            take = ~scored  # the rest, the hopeless ones too
        else:
            cut = np.partition(np.where(scored, np.inf, bound), batch - 1)[batch - 1]
            take = ~scored & (bound <= cut)
            batch *= 2
        if not take.any():
            break
        rows = np.flatnonzero(take)
        scored |= take
        parts.append((rows, evaluate_space(model, machine, job, space.subset(rows), detail=False)))
        fit = np.concatenate([sc.step_time_s[sc.fits] for _, sc in parts])
        if len(fit) >= FINALISTS:
            edge = float(np.partition(fit, FINALISTS - 1)[FINALISTS - 1])
    rows = np.concatenate([r for r, _ in parts])
    by_row = np.argsort(rows)
    joined = [np.concatenate([getattr(sc, f) for _, sc in parts])[by_row] for f in ("step_time_s", "memory_bytes", "fits")]
    return rows[by_row], Scores(*joined, sum(sc.layouts_scored for _, sc in parts))
