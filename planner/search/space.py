"""Every legal layout of a job on a machine, generated as arrays.

Legal means: pp x dp x cp x tp = world size; tp divides heads, kv_heads and ffn_hidden;
2 cp divides the sequence (load-balanced context parallelism cuts it into 2 cp chunks);
pp <= layers; sequence parallelism needs tp to divide seq / cp;
mbs x gas x dp = global batch (never changed); a pipeline has gas >= pp micro-batches
(interleaved 1F1B: a multiple of pp, and pp x v <= layers; v need not divide the layers,
planner.cost.pipeline charges the busiest rank of the best uneven split); sharding over dp_shard x cp
ranks; HSDP groups of every size G with 2 <= G and dp / G >= 2; sequence parallelism only
with tp > 1. The values of each axis on its own come from planner.search.axes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.cost.layout import RECOMPUTES, SH_HSDP, SH_NONE, SHARDINGS, Layouts, Space
from planner.schema.specs import ModelSpec, TrainingJob, divisors
from planner.search.axes import MAX_VIRTUAL_STAGES, cp_options, pipeline_options, sharding_options, tp_options

if TYPE_CHECKING:
    from planner.search.pins import Pins


def enumerate_space(model: ModelSpec, job: TrainingJob, world: int, pins: Pins | None = None,
                    vpp: int | None = None) -> Space:
    """All legal layouts for `world` ranks (possibly none), in factored form; with `pins`, those
    that keep every pinned value (planner.search.pins; the pins are not checked here). Virtual
    stages run to MAX_VIRTUAL_STAGES, or to `vpp` (or the pinned count) where that is more."""
    max_vpp = max(MAX_VIRTUAL_STAGES, vpp or 0, (pins.vpp or 0) if pins is not None else 0)
    space = _enumerate(model, job, world, max_vpp)
    return space if pins is None else pins.restrict(space)


def _enumerate(model: ModelSpec, job: TrainingJob, world: int, max_vpp: int = MAX_VIRTUAL_STAGES) -> Space:
    """Every legal layout, in factored form (see the module docstring). Rows come in blocks:
    a block is n consecutive units under one gas and schedule, each unit crossed with its
    skeleton's meshes (unit-major); the blocks are expanded into rows at once at the end."""
    # Units come in groups of one (pp, dp, cp, tp, mbs, vpp, gas) with every recompute level
    # and sequence-parallel choice (levels x sps units, recompute-major), expanded at the end.
    groups: list[tuple[int, ...]] = []  # pp, dp_replicate (= dp), cp, tp, mbs, vpp, gas, sps
    n_total = 0  # units so far
    meshes: list[tuple[int, ...]] = []  # pp, dp_replicate, dp_shard, cp, tp, sharding
    blocks: list[tuple[int, int, int, int, int, int]] = []  # first unit, units, gas, schedule, first mesh, meshes
    levels = [RECOMPUTES.index(r) for r in job.framework.recompute_levels]  # the levels the framework offers
    for tp in tp_options(model, world):
        for cp in cp_options(job, world // tp):
            # Sequence parallelism splits each rank's seq / cp tokens over tp.
            sps = (0, 1) if tp > 1 and (job.seq_len // cp) % tp == 0 else (0,)
            n_units = len(levels) * len(sps)
            for pp in divisors(world // (tp * cp)):
                dp = world // (tp * cp * pp)
                if pp > model.layers or job.global_batch % dp:
                    continue
                first_mesh = len(meshes)
                meshes += [(pp, rep, shard, cp, tp, code) for code, rep, shard in sharding_options(dp, cp)]
                n_meshes = len(meshes) - first_mesh
                for mbs in divisors(job.global_batch // dp):
                    gas = job.global_batch // (dp * mbs)
                    by_v: dict[int, int] = {}
                    for schedule, v in pipeline_options(model.layers, pp, gas, max_vpp):
                        if v not in by_v:
                            by_v[v] = n_total
                            n_total += n_units
                            groups.append((pp, dp, cp, tp, mbs, v, gas, len(sps)))
                        blocks.append((by_v[v], n_units, gas, schedule, first_mesh, n_meshes))
    u = _units(np.asarray(groups, dtype=np.int64).reshape(-1, 8), np.asarray(levels, dtype=np.int64))
    m = np.asarray(meshes, dtype=np.int64).reshape(-1, 6)
    unit, mesh, gas, schedule = _expand(np.asarray(blocks, dtype=np.int64).reshape(-1, 6))
    ones_u, ones_m = np.ones(len(u), np.int64), np.ones(len(m), np.int64)
    unit_lay = Layouts(
        pp=u[:, 0], dp_replicate=u[:, 1], dp_shard=ones_u, cp=u[:, 2], tp=u[:, 3], mbs=u[:, 4], gas=u[:, 8],
        vpp=u[:, 5], schedule=ones_u * 0, sharding=ones_u * 0, recompute=u[:, 6], sp=u[:, 7],
    )
    mesh_lay = Layouts(
        pp=m[:, 0], dp_replicate=m[:, 1], dp_shard=m[:, 2], cp=m[:, 3], tp=m[:, 4], mbs=ones_m, gas=ones_m,
        vpp=ones_m, schedule=ones_m * 0, sharding=m[:, 5], recompute=ones_m * 0, sp=ones_m * 0,
    )
    return Space(unit_lay, mesh_lay, unit=unit, mesh=mesh, gas=gas, schedule=schedule)


def _units(groups: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The units (pp, dp, cp, tp, mbs, vpp, recompute, sp, gas) of the groups (pp, dp, cp, tp,
    mbs, vpp, gas, number of sp choices): each group's levels x sps, recompute-major."""
    n_sps = groups[:, 7]
    per = len(levels) * n_sps
    g = np.repeat(np.arange(len(groups)), per)
    j = np.arange(len(g)) - np.repeat(np.cumsum(per) - per, per)
    sps = n_sps[g]
    return np.column_stack([groups[g, :6], levels[j // sps], j % sps, groups[g, 6]])


def _expand(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(unit, mesh, gas, schedule) of every row of the blocks (first unit, units, gas,
    schedule, first mesh, meshes): each block's units in turn, each crossed with its meshes."""
    first_unit, n_units, gas, schedule, first_mesh, n_meshes = blocks.T
    runs = np.repeat(np.arange(len(blocks)), n_units)  # one run per (block, unit)
    run_unit = first_unit[runs] + (np.arange(len(runs)) - np.repeat(np.cumsum(n_units) - n_units, n_units))
    per_run = n_meshes[runs]
    rows = np.repeat(np.arange(len(runs)), per_run)
    starts = np.cumsum(per_run) - per_run
    mesh = first_mesh[runs][rows] + (np.arange(len(rows)) - np.repeat(starts, per_run))
    block = runs[rows]
    return run_unit[rows], mesh, gas[block], schedule[block]


def layout_problems(model: ModelSpec, job: TrainingJob, world: int, lay: Layouts) -> list[str]:
    """Why the single layout `lay` is not legal (empty when it is); each names its field."""
    r = lay.row(0)
    pp, cp, tp, dp = r["pp"], r["cp"], r["tp"], r["dp_replicate"] * r["dp_shard"]
    out = []
    if pp * dp * cp * tp != world:
        out.append(f"degrees: pp x dp x cp x tp = {pp} x {dp} x {cp} x {tp} = {pp * dp * cp * tp}, but the world is {world} ranks")
    for name in ("heads", "kv_heads", "ffn_hidden"):
        if getattr(model, name) % tp:
            out.append(f"tp: {tp} does not divide model.{name} ({getattr(model, name)})")
    if cp > 1 and job.seq_len % (2 * cp):
        out.append(f"cp: 2 x cp = {2 * cp} does not divide the sequence length {job.seq_len}")
    if pp > model.layers:
        out.append(f"pp: {pp} stages for {model.layers} layers")
    if r["mbs"] * r["gas"] * dp != job.global_batch:
        out.append(f"mbs: micro-batch {r['mbs']} x data-parallel {dp} does not divide global batch {job.global_batch}")
    elif pp > 1 and (r["schedule"], r["vpp"]) not in pipeline_options(model.layers, pp, r["gas"], model.layers):
        out.append(f"schedule: {r['gas']} micro-batches cannot run this schedule on {pp} stages with {r['vpp']} virtual stages "
                   f"(needs at least pp micro-batches; interleaved needs a multiple of pp and pp x vpp <= layers)")
    if r["sp"] and tp == 1:
        out.append("sp: sequence parallelism needs tp > 1")
    if r["sp"] and (job.seq_len // max(cp, 1)) % tp:
        out.append(f"sp: sequence parallelism splits seq / cp = {job.seq_len // max(cp, 1)} tokens over tp = {tp}; tp must divide it")
    if r["sharding"] == SH_HSDP and (r["dp_shard"] < 2 or r["dp_replicate"] < 2):
        out.append(f"shard_group: hsdp needs a shard group of at least 2 that divides dp ({dp}) at most dp/2")
    if r["sharding"] == SH_NONE and r["dp_shard"] != 1:
        out.append("shard: none (DDP) replicates over dp_replicate; dp_shard must be 1")
    if r["sharding"] not in (SH_NONE, SH_HSDP) and r["dp_replicate"] != 1:
        out.append(f"shard: {SHARDINGS[r['sharding']].value} shards over every data-parallel rank; dp_replicate must be 1")
    if r["sharding"] != SH_NONE and dp * cp == 1:
        out.append("shard: sharding needs more than one data-parallel (or cp) rank")
    return out
