"""Pinned axes: the part of a layout a person keeps; the search chooses the rest.

`Pins` holds the values given (None: searched). Each pin is one comparison against one column
of a factored Space (`COLUMNS`: of its units, its meshes or its rows), so restricting the space
is a mask, the same code for every pin:

* `check` refuses pins that conflict with each other or with the model, the job and the world
  (one PlanError naming the field);
* `restrict` keeps the rows of a Space that satisfy every pin (and only the units and meshes
  they use);
* `no_layout` says, when nothing is left, which pins and why.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from planner.cost.layout import RECOMPUTES, SCHEDULES, SHARDINGS, Space
from planner.schema.errors import PlanError
from planner.schema.plan import Recompute, Schedule, Sharding
from planner.schema.specs import FrameworkProfile, ModelSpec, TrainingJob, divisors
from planner.search.axes import cp_options, tp_options

# Where each pin is compared in a Space: (part, column of that part's layouts or of the rows).
COLUMNS = {
    "tp": ("units", "tp"), "pp": ("units", "pp"), "dp": ("units", "dp"), "cp": ("units", "cp"),
    "mbs": ("units", "mbs"), "vpp": ("units", "vpp"), "recompute": ("units", "recompute"), "sp": ("units", "sp"),
    "shard": ("meshes", "sharding"), "shard_group": ("meshes", "dp_shard"), "schedule": ("rows", "schedule"),
}
# The rule each pin can break once the degrees are legal (`no_layout` names them).
_DEGREES = "tp x cp x pp x dp equals the world and dp divides the global batch"
_PIPELINE = "a pipeline of pp stages needs at least pp micro-batches per step (gas = global batch / (dp x mbs))"
_INTERLEAVED = "interleaved-1f1b needs gas a multiple of pp and pp x vpp <= layers"
_SHARDED = "sharding needs more than one data-parallel or cp rank, hsdp a shard group G >= 2 with dp / G >= 2"
RULES = {
    "tp": _DEGREES, "cp": _DEGREES, "dp": _DEGREES, "pp": _PIPELINE, "mbs": "mbs x gas x dp equals the global batch",
    "vpp": _INTERLEAVED, "schedule": _INTERLEAVED, "recompute": _PIPELINE, "shard": _SHARDED, "shard_group": _SHARDED,
    "sp": "sequence parallelism needs tp > 1 dividing seq / cp",
}
_ENUMS = {"shard": (Sharding, SHARDINGS), "schedule": (Schedule, SCHEDULES), "recompute": (Recompute, RECOMPUTES)}


@dataclass(frozen=True)
class Pins:
    """Layout values given by a person; None leaves an axis to the search. `dp` counts all
    data-parallel ranks (replicas x shards); `shard_group` is hsdp's dp_shard."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    mbs: int | None = None
    shard: Sharding | None = None
    shard_group: int | None = None
    vpp: int | None = None
    schedule: Schedule | None = None
    recompute: Recompute | None = None
    sp: bool | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name in _ENUMS:
                kind = _ENUMS[f.name][0]
                try:
                    object.__setattr__(self, f.name, kind(v))
                except ValueError:
                    raise PlanError(f"{v!r} is not one of {', '.join(k.value for k in kind)}", field=f.name) from None
            elif f.name == "sp":
                object.__setattr__(self, f.name, bool(v))
            elif isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise PlanError(f"must be a positive integer, got {v!r}", field=f.name)

    def given(self) -> dict[str, object]:
        """The pinned fields and their values, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __bool__(self) -> bool:
        return bool(self.given())

    def as_json(self) -> dict[str, object]:
        return {k: (v.value if k in _ENUMS else v) for k, v in self.given().items()}

    def label(self) -> str:
        """'tp=8, pp=16, shard=zero1'."""
        return ", ".join(self._pair(k) for k in self.given())

    def codes(self) -> dict[str, int]:
        """Each pin as the integer its column holds."""
        return {k: (_ENUMS[k][1].index(v) if k in _ENUMS else int(v)) for k, v in self.given().items()}

    # --- checks ---------------------------------------------------------------------------------

    def check(self, model: ModelSpec, job: TrainingJob, world: int) -> None:
        """Raise one PlanError, naming its field, for the first pin that conflicts with another
        or with the model, job or world; return quietly when there is none."""
        problems = self.problems(model, job, world)
        if problems:
            raise PlanError(problems[0][1], field=problems[0][0])

    def check_framework(self, framework: FrameworkProfile) -> None:
        """Raise one PlanError, naming its field, for a pin that needs pipeline or context
        parallelism the framework does not offer."""
        name = framework.name
        if not framework.pipeline_parallel:
            for pin, needs in (("pp", (self.pp or 1) > 1), ("vpp", (self.vpp or 1) > 1),
                               ("schedule", self.schedule is not None)):
                if needs:
                    raise PlanError(f"{name} has no pipeline parallelism ({self._pair(pin)} needs it; pp must be 1)",
                                    field=pin)
        if self.recompute is not None and Recompute(self.recompute) not in framework.recompute_levels:
            raise PlanError(f"{name} offers {', '.join(r.value for r in framework.recompute_levels)}, not "
                            f"{Recompute(self.recompute).value}", field="recompute")
        if not framework.context_parallel and self.cp is not None and self.cp > 1:
            raise PlanError(f"{name} has no context parallelism (cp must be 1, got {self.cp})", field="cp")

    def problems(self, model: ModelSpec, job: TrainingJob, world: int) -> list[tuple[str, str]]:
        """(field, message) for every conflict `check` refuses, most basic first."""
        return self._degree_problems(model, job, world) + self._batch_problems(job) + self._pipeline_problems(model) \
            + self._sharding_problems(world) + self._sp_problems(job)

    def _degree_problems(self, model: ModelSpec, job: TrainingJob, world: int) -> list[tuple[str, str]]:
        out = []
        if self.tp is not None:
            out += [("tp", f"{self.tp} does not divide model.{n} ({getattr(model, n)})")
                    for n in ("heads", "kv_heads", "ffn_hidden") if getattr(model, n) % self.tp]
        if self.cp is not None and self.cp > 1 and job.seq_len % (2 * self.cp):
            out.append(("cp", f"2 x cp = {2 * self.cp} does not divide the sequence length {job.seq_len}"))
        if self.pp is not None and self.pp > model.layers:
            out.append(("pp", f"{self.pp} stages for {model.layers} layers"))
        names, product = [], 1
        for name in ("tp", "cp", "pp", "dp"):
            if getattr(self, name) is None:
                continue
            names.append(name)
            product *= getattr(self, name)
            if world % product:
                values = " x ".join(str(getattr(self, n)) for n in names)
                what = f"{' x '.join(names)} = {values} = {product}" if len(names) > 1 else str(product)
                out.append((name, f"{what} does not divide the world ({world} ranks)"))
                return out
        if len(names) == 4 and product != world:
            out.append(("dp", f"tp x cp x pp x dp = {self.tp} x {self.cp} x {self.pp} x {self.dp} = {product}, but the "
                              f"world is {world} ranks"))
        return out

    def _batch_problems(self, job: TrainingJob) -> list[tuple[str, str]]:
        out, gb = [], job.global_batch
        if self.dp is not None and gb % self.dp:
            out.append(("dp", f"{self.dp} data-parallel ranks do not divide global batch {gb}"))
        elif self.mbs is not None and gb % (self.mbs * (self.dp or 1)):
            by = f" x data-parallel {self.dp}" if self.dp is not None else ""
            out.append(("mbs", f"micro-batch {self.mbs}{by} does not divide global batch {gb}"))
        return out

    def _pipeline_problems(self, model: ModelSpec) -> list[tuple[str, str]]:
        out, v, sched = [], self.vpp, self.schedule
        if sched is not None and self.pp == 1:
            out.append(("schedule", f"a pipeline schedule ({sched.value}) needs pp > 1"))
        if v is not None and v > 1 and self.pp == 1:
            out.append(("vpp", f"{v} virtual stages need pp > 1"))
        if v is not None and v > 1 and sched not in (None, Schedule.interleaved_1f1b):
            out.append(("vpp", f"{v} virtual stages need the interleaved-1f1b schedule, not {sched.value}"))
        if v == 1 and sched == Schedule.interleaved_1f1b:
            out.append(("schedule", "interleaved-1f1b needs vpp >= 2"))
        if v is not None and self.pp is not None and self.pp * v > model.layers:
            out.append(("vpp", f"pp x vpp = {self.pp} x {v} = {self.pp * v} chunks for {model.layers} layers "
                               f"(every chunk needs a layer)"))
        return out

    def _sharding_problems(self, world: int) -> list[tuple[str, str]]:
        out, g, dp = [], self.shard_group, self.dp
        cp = self.cp
        if cp is None and None not in (self.tp, self.pp, dp):
            cp = world // (self.tp * self.pp * dp)
        if g is not None and self.shard != Sharding.hsdp:
            out.append(("shard_group", "only hsdp takes a shard group (pin --shard hsdp with it)"))
        elif g is not None and (g < 2 or (dp is not None and (dp % g or dp // g < 2))):
            of = f" that divides dp ({dp}) into at least 2 replicas" if dp is not None else ""
            out.append(("shard_group", f"hsdp needs a shard group of at least 2{of}; got {g}"))
        if self.shard == Sharding.hsdp and dp is not None and not any(x >= 2 and dp // x >= 2 for x in divisors(dp)):
            out.append(("shard", f"hsdp needs dp >= 4 to have both shards and replicas; dp is {dp}"))
        if self.shard not in (None, Sharding.none) and dp == 1 and cp == 1:
            out.append(("shard", f"{self.shard.value} needs more than one data-parallel (or cp) rank; dp = cp = 1"))
        return out

    def _sp_problems(self, job: TrainingJob) -> list[tuple[str, str]]:
        if not self.sp or self.tp is None:
            return []
        if self.tp == 1:
            return [("sp", "sequence parallelism needs tp > 1")]
        tokens = job.seq_len // (self.cp or 1)
        if tokens % self.tp:
            return [("sp", f"sequence parallelism splits seq / cp = {tokens} tokens over tp = {self.tp}; tp must "
                           f"divide it")]
        return []

    # --- the space ------------------------------------------------------------------------------

    def masks(self, space: Space) -> dict[str, np.ndarray]:
        """Per pin, which rows of the space satisfy it."""
        out = {}
        for name, code in self.codes().items():
            part, column = COLUMNS[name]
            if part == "rows":
                out[name] = getattr(space, column) == code
                continue
            ok = getattr(getattr(space, part), column) == code
            out[name] = ok[space.unit if part == "units" else space.mesh]
        return out

    def restrict(self, space: Space) -> Space:
        """The rows of `space` that satisfy every pin (all of it when nothing is pinned), with
        only the units and meshes those rows use."""
        if not self:
            return space
        return space.subset(np.logical_and.reduce(list(self.masks(space).values())))

    def no_layout(self, space: Space, model: ModelSpec, job: TrainingJob, world: int) -> PlanError:
        """The error for pins that leave none of the (non-empty, unpinned) `space`: which pins,
        the rules they break, and which single pin, dropped, would leave layouts."""
        masks = self.masks(space)
        freed = [name for name in masks
                 if len(masks) == 1 or np.logical_and.reduce([m for k, m in masks.items() if k != name]).any()]
        why = self._degree_reason(model, job, world) or list(dict.fromkeys(RULES[name] for name in (freed or masks)))
        hint = f"; without {' or '.join(self._pair(n) for n in freed)} there are layouts" if freed else ""
        return PlanError(f"no layout of {world} ranks with {self.label()} keeps global batch {job.global_batch}: "
                         f"{'; '.join(why)}{hint}")

    def _pair(self, name: str) -> str:
        return f"{name}={str(self.as_json()[name]).lower()}"

    def _degree_reason(self, model: ModelSpec, job: TrainingJob, world: int) -> list[str]:
        """Why the pinned degrees alone keep no layout (empty when they could): no data-parallel
        degree divides the batch, or every one that does leaves fewer micro-batches than stages."""
        gb, mbs = job.global_batch, self.mbs or 1
        degrees = self._degrees(model, job, world)
        keep = sorted({(p, d) for _, _, p, d in degrees if gb % d == 0})
        if degrees and not keep:
            dps = ", ".join(str(d) for d in sorted({d for *_, d in degrees}))
            return [f"world / (tp x cp x pp) makes the data-parallel degree {dps}, and none divides the global batch"]
        if keep and all(p > 1 and gb // (d * mbs) < p for p, d in keep):
            most = ", ".join(f"pp={p} with dp={d}: at most {gb // (d * mbs)}" for p, d in keep)
            return [f"the degrees that keep it leave fewer micro-batches per step than pipeline stages ({most}), and a "
                    f"pipeline needs at least pp"]
        return []

    def _degrees(self, model: ModelSpec, job: TrainingJob, world: int) -> list[tuple[int, int, int, int]]:
        """The (tp, cp, pp, dp) the pinned degrees allow, before the batch."""
        out = []
        pinned = (self.tp, self.cp, self.pp, self.dp)
        for t in tp_options(model, world):
            for c in cp_options(job, world // t):
                for p in divisors(world // (t * c)):
                    x = (t, c, p, world // (t * c * p))
                    if p <= model.layers and all(v is None or v == y for v, y in zip(pinned, x)):
                        out.append(x)
        return out
