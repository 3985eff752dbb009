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
from planner.search.axes import cp_options, pipeline_options, sharding_options, tp_options

if TYPE_CHECKING:
    from planner.search.pins import Pins


def enumerate_space(model: ModelSpec, job: TrainingJob, world: int, pins: Pins | None = None) -> Space:
    """All legal layouts for `world` ranks (possibly none), in factored form; with `pins`, those
    that keep every pinned value (planner.search.pins; the pins are not checked here)."""
    space = _enumerate(model, job, world)
    return space if pins is None else pins.restrict(space)


def _enumerate(model: ModelSpec, job: TrainingJob, world: int) -> Space:
    """Every legal layout, in factored form (see the module docstring)."""
    units: list[tuple[int, ...]] = []  # pp, dp_replicate (= dp), cp, tp, mbs, vpp, recompute, sp, gas
    meshes: list[tuple[int, ...]] = []  # pp, dp_replicate, dp_shard, cp, tp, sharding
    rows: list[np.ndarray] = []  # unit, mesh, gas, schedule
    levels = [RECOMPUTES.index(r) for r in job.framework.recompute_levels]  # the levels the framework offers
    for tp in tp_options(model, world):
        for cp in cp_options(job, world // tp):
            # Sequence parallelism splits each rank's seq / cp tokens over tp.
            sps = (0, 1) if tp > 1 and (job.seq_len // cp) % tp == 0 else (0,)
            for pp in divisors(world // (tp * cp)):
                dp = world // (tp * cp * pp)
                if pp > model.layers or job.global_batch % dp:
                    continue
                first_mesh = len(meshes)
                meshes += [(pp, rep, shard, cp, tp, code) for code, rep, shard in sharding_options(dp, cp)]
                mesh_ids = np.arange(first_mesh, len(meshes))
                runs = []  # (unit, gas, schedule) for this skeleton
                for mbs in divisors(job.global_batch // dp):
                    gas = job.global_batch // (dp * mbs)
                    by_v: dict[int, int] = {}
                    for schedule, v in pipeline_options(model.layers, pp, gas):
                        if v not in by_v:
                            by_v[v] = len(units)
                            units += [(pp, dp, cp, tp, mbs, v, rc, sp, gas) for rc in levels for sp in sps]
                        n_units = len(levels) * len(sps)
                        runs += [(by_v[v] + j, gas, schedule) for j in range(n_units)]
                if runs:
                    r = np.asarray(runs, dtype=np.int64)
                    rows.append(np.column_stack([np.repeat(r, len(mesh_ids), axis=0), np.tile(mesh_ids, len(r))]))
    u = np.asarray(units, dtype=np.int64).reshape(-1, 9)
    m = np.asarray(meshes, dtype=np.int64).reshape(-1, 6)
    r = np.vstack(rows) if rows else np.zeros((0, 4), dtype=np.int64)
    ones_u, ones_m = np.ones(len(u), np.int64), np.ones(len(m), np.int64)
    unit_lay = Layouts(
        pp=u[:, 0], dp_replicate=u[:, 1], dp_shard=ones_u, cp=u[:, 2], tp=u[:, 3], mbs=u[:, 4], gas=u[:, 8],
        vpp=u[:, 5], schedule=ones_u * 0, sharding=ones_u * 0, recompute=u[:, 6], sp=u[:, 7],
    )
    mesh_lay = Layouts(
        pp=m[:, 0], dp_replicate=m[:, 1], dp_shard=m[:, 2], cp=m[:, 3], tp=m[:, 4], mbs=ones_m, gas=ones_m,
        vpp=ones_m, schedule=ones_m * 0, sharding=m[:, 5], recompute=ones_m * 0, sp=ones_m * 0,
    )
    return Space(unit_lay, mesh_lay, unit=r[:, 0], mesh=r[:, 3], gas=r[:, 1], schedule=r[:, 2])


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
    elif pp > 1 and (r["schedule"], r["vpp"]) not in pipeline_options(model.layers, pp, r["gas"]):
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
