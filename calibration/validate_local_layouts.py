"""The layouts `exaplan validate --local` runs on this machine, and their plans.

`default_layouts`: DDP with two bucket sizes, FSDP, FSDP grad-op, ZeRO-1, tensor parallel with
and without sequence parallelism, 1F1B and GPipe pipelines, recompute, two micro-batch sizes
with accumulation, HSDP from 4 ranks; each a `LocalLayout`, written into a plan as `exaplan
estimate ... -o plan.yaml` would (`write_layout_plan`) and re-predicted on a machine
(`predict`). Default job: 2 sequences per rank, sequence 64, fp32 (the CPU's fast precision).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from planner.schema.errors import PlanError

GIB = float(1 << 30)
DEFAULT_SEQ_LEN = 64
SEQUENCES_PER_RANK = 2


@dataclass(frozen=True)
class LocalLayout:
    """One layout to run on this machine: a name, the degrees `Layouts.one` takes, the job
    (fp32: the CPU's fast precision) and optionally a DDP bucket size to force (otherwise the
    planner picks one)."""

    name: str
    dp: int
    mbs: int
    global_batch: int
    seq_len: int
    tp: int = 1
    pp: int = 1
    sharding: str = "none"
    shard_group: int | None = None
    recompute: str = "none"
    schedule: str | None = None
    sp: bool | None = None
    ddp_bucket_mb: float | None = None

    def layouts(self):
        from planner.cost.layout import Layouts

        return Layouts.one(dp=self.dp, mbs=self.mbs, gas=max(self.global_batch // (self.dp * self.mbs), 1), tp=self.tp,
                           pp=self.pp, sharding=self.sharding, shard_group=self.shard_group, recompute=self.recompute,
                           schedule=self.schedule, sp=self.sp)

    def estimate_args(self) -> list[str]:
        """The same layout as options of `exaplan estimate` (after --model/--machine/--nodes)."""
        args = ["--dp", self.dp, "--mbs", self.mbs]
        for flag, value, default in (("--tp", self.tp, 1), ("--pp", self.pp, 1), ("--shard", self.sharding, "none"),
                                     ("--shard-group", self.shard_group, None), ("--recompute", self.recompute, "none"),
                                     ("--schedule", self.schedule, None)):
            if value != default:
                args += [flag, value]
        if self.sp is not None:
            args.append("--sp" if self.sp else "--no-sp")
        args += ["--global-batch", self.global_batch, "--seq-len", self.seq_len, "--precision", "fp32"]
        return [str(a) for a in args]

    def describe(self) -> str:
        """The estimate options, and the forced bucket if any (the report's `estimate_args`)."""
        bucket = f" (ddp bucket {self.ddp_bucket_mb:g} MB)" if self.ddp_bucket_mb else ""
        return " ".join(self.estimate_args()) + bucket


def default_layouts(ranks: int = 2, *, global_batch: int | None = None, seq_len: int = DEFAULT_SEQ_LEN) -> list[LocalLayout]:
    """At least 10 different layouts on `ranks` local ranks (a power of two, >= 2)."""
    if ranks < 2 or ranks & (ranks - 1):
        raise PlanError(f"local validation needs a power of two of at least 2 ranks, got {ranks}", field="ranks")
    gb = global_batch or SEQUENCES_PER_RANK * ranks
    half = ranks // 2
    mbs = gb // ranks  # one micro-batch per step on pure data parallelism

    def L(name, **kw):
        return LocalLayout(name, global_batch=gb, seq_len=seq_len, **kw)

    out = [
        L("ddp-b25", dp=ranks, mbs=mbs, ddp_bucket_mb=25.0),
        L("ddp-b400", dp=ranks, mbs=mbs, ddp_bucket_mb=400.0),
        L("ddp-mbs1-gas", dp=ranks, mbs=1),
        L("ddp-recompute", dp=ranks, mbs=mbs, recompute="full"),
        L("fsdp", dp=ranks, mbs=mbs, sharding="fsdp"),
        L("fsdp-recompute", dp=ranks, mbs=mbs, sharding="fsdp", recompute="full"),
        L("fsdp-grad-op", dp=ranks, mbs=mbs, sharding="fsdp-grad-op"),
        L("zero1", dp=ranks, mbs=mbs, sharding="zero1"),
        L("tp2", tp=2, dp=half, mbs=gb // half, sp=False),
        L("tp2-sp", tp=2, dp=half, mbs=gb // half, sp=True),
        L("pp2-1f1b", pp=2, dp=half, mbs=1, schedule="1f1b"),
        L("pp2-gpipe", pp=2, dp=half, mbs=1, schedule="gpipe"),
    ]
    if ranks >= 4:
        out.append(L("hsdp", dp=ranks, mbs=mbs, sharding="hsdp", shard_group=2))
    return out


def resolve_machine(machine, ranks: int):
    from machine_models import load_machine
    from planner.schema.specs import MachineModel

    if isinstance(machine, MachineModel):
        return machine
    return load_machine(machine, ranks=ranks) if str(machine) == "local" else load_machine(machine)


def write_layout_plan(model: str, machine, ranks: int, layout: LocalLayout, path: Path, nodes: int = 1,
                      machine_label: str | None = None, backend: str = "torch"):
    """Write the plan of one layout, as `exaplan estimate --model MODEL --machine LABEL
    --nodes NODES ARGS -o PATH` would (the same functions; the machine may be a MachineModel,
    named in the plan's command by `machine_label` (default: its preset name, or "local"),
    layout.ddp_bucket_mb forces the DDP bucket; backend jax: the jax framework profile and
    `backend: jax` in the plan). Returns the plan."""
    from machine_models.frameworks import load_framework
    from planner.cost.step import evaluate
    from planner.emit import build_plan
    from planner.inputs import load_model, make_job
    from planner.schema.plan import write_plan
    from planner.search.space import layout_problems

    mach = resolve_machine(machine, ranks)
    name = machine_label or (machine if isinstance(machine, str) else "local")
    spec = load_model(model)
    world = mach.devices_per_node * nodes
    framework = load_framework("jax") if backend == "jax" else None
    job = make_job(spec, mach, world, layout.global_batch, layout.seq_len, "fp32", None, framework=framework)
    lay = layout.layouts()
    problems = layout_problems(spec, job, world, lay)
    if problems:
        raise PlanError(f"layout {layout.name}: " + "; ".join(problems))
    buckets = (float(layout.ddp_bucket_mb),) if layout.ddp_bucket_mb else None
    ev = evaluate(spec, mach, job, lay, ddp_buckets_mb=buckets)
    argv = ["estimate", "--model", model, "--machine", name, "--nodes", str(nodes), *layout.estimate_args()]
    if backend == "jax":
        argv += ["--framework", "jax"]
    plan = build_plan(spec, mach, job, nodes, lay, ev, 0, command=shlex.join(["exaplan", *argv, "-o", str(path)]),
                      backend=None if backend == "torch" else backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plan(plan, path)
    return plan


def predict(plan, machine=None) -> dict[str, float]:
    """Re-predict a plan's layout (same model, job, DDP bucket) on `machine` (default: the
    plan's own): step time, its parts and memory (GiB)."""
    from planner.cost.layout import Layouts
    from planner.cost.step import evaluate

    mach = machine or plan.machine
    # DDP runs with the plan's bucket; the other kinds let the model choose, as the planner did.
    ddp = plan.sharding.kind.value == "none"
    buckets = (plan.sharding.ddp_bucket_mb,) if ddp else None
    ev = evaluate(plan.model, mach, plan.job, Layouts.from_plan(plan), ddp_buckets_mb=buckets)
    return dict(step_time_s=float(ev.step_time_s[0]), compute_s=float(ev.compute_s[0]), dp_s=float(ev.dp_s[0]),
                tp_s=float(ev.tp_s[0]), pp_s=float(ev.pp_s[0]), bubble_s=float(ev.bubble_s[0]),
                optimizer_s=float(ev.optimizer_s[0]), memory_gib=float(ev.memory.total[0] / GIB))
