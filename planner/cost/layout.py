"""Layouts as a struct of arrays: one element per candidate layout.

The codes of the enum-valued fields are the positions in these tuples, so arrays stay
integer and the search vectorises.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Recompute, Schedule, Sharding
from planner.schema.framework import is_nvidia, layout_refusals
from planner.schema.specs import FrameworkProfile, divisors

SHARDINGS = tuple(Sharding)
RECOMPUTES = tuple(Recompute)
SCHEDULES = (None,) + tuple(Schedule)  # code 0: no pipeline

SH_NONE, SH_ZERO1, SH_ZERO2, SH_FSDP, SH_GRAD_OP, SH_HSDP = range(len(SHARDINGS))
RC_NONE, RC_SELECTIVE, RC_FULL, RC_OP = range(len(RECOMPUTES))
SC_NONE, SC_GPIPE, SC_1F1B, SC_INTERLEAVED = range(len(SCHEDULES))


@dataclass
class Layouts:
    """Candidate layouts; every field is an int array of the same length."""

    pp: np.ndarray
    dp_replicate: np.ndarray
    dp_shard: np.ndarray
    cp: np.ndarray
    tp: np.ndarray
    mbs: np.ndarray  # micro-batch size (sequences)
    gas: np.ndarray  # gradient-accumulation steps (micro-batches per step)
    vpp: np.ndarray  # virtual stages per pipeline rank
    schedule: np.ndarray  # code into SCHEDULES
    sharding: np.ndarray  # code into SHARDINGS
    recompute: np.ndarray  # code into RECOMPUTES
    sp: np.ndarray  # sequence parallel (0/1)

    def __post_init__(self) -> None:
        n = None
        for f in fields(self):
            arr = np.atleast_1d(np.asarray(getattr(self, f.name), dtype=np.int64))
            setattr(self, f.name, arr)
            n = len(arr) if n is None else n
            if len(arr) != n:
                raise ValueError(f"layout field {f.name} has {len(arr)} elements, expected {n}")

    def __len__(self) -> int:
        return len(self.pp)

    @property
    def dp(self) -> np.ndarray:
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> np.ndarray:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def sharded(self) -> np.ndarray:
        """True where parameters/optimizer state are sharded over (dp_shard x cp) ranks."""
        return self.sharding != SH_NONE

    @property
    def shard_group(self) -> np.ndarray:
        """Ranks that share one copy of the sharded state: dp_shard x cp (1 for DDP)."""
        return np.where(self.sharded, self.dp_shard * self.cp, 1)

    @property
    def grad_group(self) -> np.ndarray:
        """Ranks whose gradients are reduced together: every data-parallel and cp rank."""
        return self.dp * self.cp

    def take(self, index) -> "Layouts":
        """A subset (fancy index or mask)."""
        return Layouts(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def row(self, i: int) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)[i]) for f in fields(self)}

    @staticmethod
    def one(*, dp: int, mbs: int, gas: int = 1, tp: int = 1, pp: int = 1, cp: int = 1,
            sharding: Sharding | str = Sharding.none, shard_group: int | None = None,
            recompute: Recompute | str = Recompute.none, schedule: Schedule | str | None = None, vpp: int = 1,
            sp: bool | None = None) -> "Layouts":
        """One layout from its degrees, the way a person states it: `dp` data-parallel ranks
        split into replicas x shards by the sharding (none: all replicas; hsdp: groups of
        `shard_group` shards; the others: all shards); with pp > 1 the schedule defaults to
        1F1B (interleaved with vpp > 1); sequence parallelism defaults on when tp > 1.
        Raises PlanError for a combination no plan can hold. Whether the layout suits a
        model and world is `planner.search.space.layout_problems`."""
        kind = Sharding(sharding)
        if kind == Sharding.hsdp:
            if shard_group is None or shard_group < 2 or dp % shard_group or dp // shard_group < 2:
                raise PlanError(f"hsdp needs a shard group of at least 2 that divides dp ({dp}) into at least 2 "
                                f"replicas; got {shard_group}", field="shard_group")
            dp_replicate, dp_shard = dp // shard_group, shard_group
        elif shard_group is not None:
            raise PlanError("only hsdp takes a shard group", field="shard_group")
        else:
            dp_replicate, dp_shard = (dp, 1) if kind == Sharding.none else (1, dp)
        if pp == 1:
            if schedule is not None or vpp != 1:
                raise PlanError("a schedule or virtual stages need pp > 1", field="schedule")
            sched = None
        else:
            sched = Schedule(schedule) if schedule else (Schedule.interleaved_1f1b if vpp > 1 else Schedule.one_f_one_b)
        return Layouts(
            pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, mbs=mbs, gas=gas, vpp=vpp,
            schedule=SCHEDULES.index(sched), sharding=SHARDINGS.index(kind), recompute=RECOMPUTES.index(Recompute(recompute)),
            sp=int(tp > 1 if sp is None else sp),
        )

    @staticmethod
    def from_plan(plan: Plan) -> "Layouts":
        """The one-row Layouts of a plan file (what the planner predicts it from)."""
        m = plan.mesh
        return Layouts(
            pp=m.pp, dp_replicate=m.dp_replicate, dp_shard=m.dp_shard, cp=m.cp, tp=m.tp, mbs=plan.micro_batch_size,
            gas=plan.grad_accumulation_steps, vpp=plan.pipeline.virtual_stages,
            schedule=SCHEDULES.index(plan.pipeline.schedule), sharding=SHARDINGS.index(plan.sharding.kind),
            recompute=RECOMPUTES.index(plan.recompute), sp=int(plan.sequence_parallel),
        )

    @staticmethod
    def concat(parts: list["Layouts"]) -> "Layouts":
        return Layouts(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Layouts)})


@dataclass
class Space:
    """Layouts in factored form, so that work is done once per distinct part.

    `units` hold what one micro-batch's work depends on (pp, cp, tp, mbs, vpp, recompute,
    sp; dp_replicate sized so that the world is right); `meshes` what the model states and
    data-parallel traffic depend on (pp, dp_replicate, dp_shard, cp, tp, sharding). Row i of
    the space is units[unit[i]] and meshes[mesh[i]] with gas[i] micro-batches under
    schedule[i].
    """

    units: Layouts
    meshes: Layouts
    unit: np.ndarray
    mesh: np.ndarray
    gas: np.ndarray
    schedule: np.ndarray

    def __len__(self) -> int:
        return len(self.unit)

    @staticmethod
    def of(lay: Layouts) -> "Space":
        """The trivial factorisation of explicit layouts (one unit and one mesh per row)."""
        idx = np.arange(len(lay))
        return Space(lay, lay, idx, idx, lay.gas, lay.schedule)

    def rows(self, start: int, stop: int) -> "Space":
        """Rows start..stop (a slice), on the same units and meshes."""
        return Space(self.units, self.meshes, self.unit[start:stop], self.mesh[start:stop], self.gas[start:stop],
                     self.schedule[start:stop])

    def subset(self, rows) -> "Space":
        """The given rows (indices or a mask), with only the units and meshes they use."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows)
        units, unit = np.unique(self.unit[rows], return_inverse=True)
        meshes, mesh = np.unique(self.mesh[rows], return_inverse=True)
        return Space(self.units.take(units), self.meshes.take(meshes), unit.reshape(-1), mesh.reshape(-1),
                     self.gas[rows], self.schedule[rows])

    def allowed_by(self, framework: FrameworkProfile, layers: int | None = None, *, ranks_per_node: int | None = None,
                   device_name: str | None = None, tied_embeddings: bool = False,
                   workload: str | None = None) -> np.ndarray:
        """Per row: whether the framework runs it (planner.schema.framework.layout_refusals,
        vectorised: its shardings, recompute levels and schedules; sequence, pipeline and
        context parallelism only where it offers them; with `layers`, even stages where it
        needs them; with `ranks_per_node`, `device_name` and `workload`, its node split, its
        device-bound recompute levels and its DPO shardings)."""
        shardings = [s for s in framework.shardings if workload != "dpo" or framework.dpo_shardings is None
                     or s in framework.dpo_shardings]
        ok_mesh = np.isin(self.meshes.sharding, [SHARDINGS.index(s) for s in shardings])
        m = self.meshes
        if framework.replicate_alone:
            ok_mesh &= ~((m.sharding == SH_NONE) & (((m.dp_replicate * m.dp_shard > 1) & ((m.pp > 1) | (m.tp > 1))) | (m.cp > 1)))
        if framework.node_split_axes is not None and ranks_per_node is not None:
            left = np.full(len(m), ranks_per_node, dtype=np.int64)
            for axis in framework.node_split_axes:
                degree = getattr(m, axis).astype(np.int64)
                inside = left % degree == 0
                ok_mesh &= inside | (degree % left == 0)
                left = np.where(inside, left // degree, 1)
        u = self.units
        recompute = [r for r in framework.recompute_levels if not (
            device_name is not None and r in framework.nvidia_only_recompute and not is_nvidia(device_name))]
        ok_unit = (((u.sp == 0) | framework.sequence_parallel) & ((u.pp == 1) | framework.pipeline_parallel)
                   & ((u.cp == 1) | framework.context_parallel)
                   & ((u.tp == 1) | framework.tensor_parallel)
                   & np.isin(u.recompute, [RECOMPUTES.index(r) for r in recompute]))
        if workload == "dpo" and not framework.dpo_pipeline_parallel:
            ok_unit &= u.pp == 1
        if framework.tp_needs_sp:
            ok_unit &= (u.tp == 1) | (u.sp == 1)
        if tied_embeddings and not framework.pipeline_tied_embeddings:
            ok_unit &= u.pp == 1
        if framework.even_stages and layers is not None:
            ok_unit &= (u.pp == 1) | (layers % (u.pp * u.vpp) == 0)
        ok = ok_mesh[self.mesh] & ok_unit[self.unit]
        pp = self.units.pp[self.unit]
        pipelined = pp > 1
        ok &= ~pipelined | np.isin(self.schedule, [SCHEDULES.index(s) for s in framework.schedules])
        if framework.pipeline_shardings is not None:
            ok &= ~pipelined | np.isin(self.meshes.sharding[self.mesh], [SHARDINGS.index(s) for s in framework.pipeline_shardings])
        if framework.microbatches_multiple_of_stages:
            ok &= ~pipelined | (self.gas % pp == 0)
        return ok

    def layouts(self, rows=None) -> Layouts:
        """Full layouts of the given rows (all rows if None)."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows)
        u, m = self.units.take(self.unit[rows]), self.meshes.take(self.mesh[rows])
        return Layouts(
            pp=u.pp, dp_replicate=m.dp_replicate, dp_shard=m.dp_shard, cp=u.cp, tp=u.tp, mbs=u.mbs,
            gas=self.gas[rows], vpp=u.vpp, schedule=self.schedule[rows], sharding=m.sharding,
            recompute=u.recompute, sp=u.sp,
        )


def default_shard_group(dp: int, ranks_per_node: int) -> int:
    """HSDP's default shard group: the data-parallel ranks of one node (the largest divisor of
    dp that fits in `ranks_per_node` and leaves at least 2 replicas), else the smallest legal
    group."""
    legal = [g for g in divisors(dp) if g >= 2 and dp // g >= 2]
    if not legal:
        raise PlanError(f"hsdp needs dp >= 4 to have both shards and replicas; dp is {dp}", field="dp")
    inside = [g for g in legal if g <= ranks_per_node]
    return max(inside) if inside else min(legal)


def framework_problems(framework: FrameworkProfile, lay: Layouts, i: int = 0, layers: int | None = None, *,
                       ranks_per_node: int | None = None, device_name: str | None = None,
                       tied_embeddings: bool = False, workload: str | None = None) -> list[str]:
    """Why row i is not a layout the framework runs (empty when it is), each naming the plan's
    field: planner.schema.framework.layout_refusals of the row."""
    r = lay.row(i)
    return layout_refusals(
        framework, layers=layers, pp=r["pp"], vpp=r["vpp"], cp=r["cp"], tp=r["tp"], dp_replicate=r["dp_replicate"],
        dp_shard=r["dp_shard"], sharding=SHARDINGS[r["sharding"]], recompute=RECOMPUTES[r["recompute"]],
        schedule=SCHEDULES[r["schedule"]], sp=bool(r["sp"]), precision=None, gas=r["gas"],
        ranks_per_node=ranks_per_node, device_name=device_name, tied_embeddings=tied_embeddings, workload=workload)
