"""One rank of a plan at its full size, on this machine: torch's fake process group plays rank R
of the plan's whole world (collectives return without traffic), the plan's real device mesh is
built, the model is parallelised on the meta device by the runtime's own code in its own order
(runtime/build.py parallel_parts, the steps `exaplan run` takes), and two training steps run
under fake tensors (nothing is allocated): the task's own forward and backward (the pipeline
schedule when pp > 1: runtime/pretrain.py), the gradient clip and the optimizer step. The
second step is measured: torch's MemTracker accounts every tensor by category at the step's
peak, and a dispatch mode records every collective the step issues.

What the rank then holds is compared with what the planner counts for it: its parameters
(local shards, DTensor.to_local) against planner/cost/memory.py rank_parameters, and its peak
memory by category against rank_memory (the runtime takes only the schema from the planner:
the CLI passes both in).

Torch's categories at the peak, as the planner's are named:
    parameters   the parameters the rank holds (its shards), at their element size
    buffers      parameters beyond those (FSDP's gathered 16-bit blocks)
    gradients    GRAD
    optimizer    OPT (AdamW's moments; ZeRO's fp32 master shards are parameters of it)
    activations  ACT and TEMP (what the step keeps for backward and its working tensors)

DPO plans step as `exaplan run` steps them (runtime/dpo.py DPOTask, on a micro-batch of
synthetic pairs): the reference model built in the plan's layout, its forward over each
micro-batch's pairs, then the policy's forward and backward; the reference's parameters count
as parameters.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import asdict, dataclass, field

from planner.schema.errors import PlanError
from planner.schema.plan import Plan

GIB = 2**30
# The runtime pads uneven shards (FSDP2 rounds each dim-0 shard up) and keeps some small
# tensors replicated; a rank's count may exceed the planner's by this much and still agree.
PARAMETER_TOLERANCE = 0.03
# The planner's tensor memory against torch's accounting (issue 50's target on committed plans).
MEMORY_TOLERANCE = 0.10
CATEGORIES = ("parameters", "buffers", "gradients", "optimizer", "activations")
# The plan's communicator a mesh dimension's collectives belong to.
COMMUNICATOR_OF = {"dp": "dp", "dp_cp": "dp", "dp_replicate": "dp", "dp_shard": "dp", "dp_shard_cp": "dp",
                   "tp": "tp", "pp": "pp", "cp": "cp"}


@dataclass
class Collective:
    op: str  # all_gather, reduce_scatter, all_reduce, send, recv, broadcast, ...
    mesh_dim: str  # the mesh dimension whose group it ran on (or "world", "other")
    group_size: int
    bytes: int  # per call: the gathered output, the scattered input, the reduced or sent tensor
    count: int

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count


@dataclass
class RankCheck:
    rank: int
    pp_rank: int
    parameters: int  # elements this rank holds (local shards)
    predicted_parameters: int  # the planner's count for the same rank
    parameter_error: float  # parameters / predicted - 1
    agrees: bool  # parameters and memory within their tolerances
    seconds: float
    stepped: bool = False
    torch_peak_memory_gib: float | None = None  # every tensor at the step's peak (no allocator)
    torch_memory_gib: dict[str, float] = field(default_factory=dict)  # by category, at that peak
    torch_tracker_gib: dict[str, float] = field(default_factory=dict)  # MemTracker's own categories
    predicted_memory_gib: float | None = None  # the planner's tensors for this rank (no reserve)
    predicted_total_gib: float | None = None  # with its reserve
    predicted_gib: dict[str, float] = field(default_factory=dict)  # by category
    memory_error: float | None = None  # predicted / torch - 1
    reserve_gib: float | None = None  # the planner's reserve on torch's churn
    device_memory_gib: float | None = None
    fits: bool | None = None  # torch's peak + reserve within the device's memory
    planner_fits: bool | None = None
    collectives: list[Collective] = field(default_factory=list)
    note: str | None = None  # why the rank was built but not stepped

    def as_json(self) -> dict:
        out = asdict(self)
        out["collectives"] = [{**asdict(c), "total_bytes": c.total_bytes} for c in self.collectives]
        return out

    @property
    def verdict(self) -> str:
        if not self.agrees:
            return "disagrees"
        if self.fits is False:
            return "does not fit" + (" (the planner says it fits)" if self.planner_fits else "")
        return "fits" if self.fits else "agrees"

    @property
    def passed(self) -> bool:
        """A rank passes when it agrees with the planner and torch's accounting fits (or torch
        and the planner agree that it does not)."""
        return self.agrees and (self.fits is not False or self.planner_fits is False)


def ranks_of(plan: Plan, spec: str) -> list[int]:
    """The ranks a --ranks value names: first, last, stages (the first rank of each pipeline
    stage), or integers; PlanError naming --ranks for anything else or a rank outside the world."""
    world = plan.world_size
    per_stage = world // plan.mesh.pp
    out: list[int] = []
    for item in (part.strip() for part in spec.split(",")):
        if item == "first":
            out.append(0)
        elif item == "last":
            out.append(world - 1)
        elif item == "stages":
            out.extend(stage * per_stage for stage in range(plan.mesh.pp))
        else:
            try:
                rank = int(item)
            except ValueError:
                raise PlanError(f"{item[:40]!r} is not a rank: give first, last, stages or rank numbers",
                                field="--ranks") from None
            if not 0 <= rank < world:
                raise PlanError(f"rank {rank:,} is outside the plan's world size of {world:,} ranks (0-{world - 1:,})",
                                field="--ranks")
            out.append(rank)
    return list(dict.fromkeys(out))


@contextlib.contextmanager
def fake_world(plan: Plan, rank: int):
    """Rank `rank` of the plan's whole world on torch's fake process group, and its mesh."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from runtime.mesh import build_mesh

    if dist.is_initialized():
        raise RuntimeError("a process group is running already: exaplan check starts its own fake one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.world_size)
    try:
        yield build_mesh(plan, "cpu")
    finally:
        dist.destroy_process_group()
        # DTensor caches its sharding propagation by mesh shape and names, not by group: a
        # second world of the same shape in this process would get the first one's (destroyed)
        # groups back from the cache.
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()


def check_rank(plan: Plan, rank: int, predicted_parameters, predicted_memory=None, step: bool = True) -> RankCheck:
    """Build rank `rank` of the plan under a fake process group of its full world size and,
    with `step`, run and measure a training step under fake tensors.
    `predicted_parameters(plan, pp_rank)`, `predicted_memory(plan, pp_rank)`: the planner's
    figures (planner/cost/memory.py rank_parameters, rank_memory)."""
    from runtime.build import parallel_parts

    start = time.perf_counter()
    with fake_world(plan, rank) as mesh:
        pp_rank = mesh["pp"].get_local_rank()
        parts, handles = parallel_parts(plan, mesh)
        held, held_bytes = _local_sizes(parts)
        note = _not_steppable(handles) if step else None
        measured = _step(plan, mesh, parts, handles, rank) if step and note is None else None
    predicted = predicted_parameters(plan, pp_rank)
    error = held / predicted - 1
    out = RankCheck(rank=rank, pp_rank=pp_rank, parameters=held, predicted_parameters=predicted,
                    parameter_error=error, agrees=-PARAMETER_TOLERANCE <= error <= PARAMETER_TOLERANCE, seconds=0.0,
                    note=note)
    if measured is not None:
        snapshot, collectives, reference_bytes = measured
        _memory_verdict(out, plan, snapshot, held_bytes + reference_bytes, predicted_memory(plan, pp_rank) if predicted_memory else None)
        out.collectives = collectives
    out.seconds = time.perf_counter() - start
    return out


def _not_steppable(handles) -> str | None:
    """Why this rank's step cannot run under fake tensors, or None."""
    if any(h.ddp_pending or h.ddp is not None for h in handles):
        return ("torch's DistributedDataParallel (sharding.ddp_impl: ddp) cannot step under fake tensors: its C++ "
                "reducer reads the gradients' storage; built and counted, not stepped")
    return None


def _step(plan: Plan, mesh, parts, handles, rank: int):
    """Two training steps of this rank under fake tensors, the second measured: (torch's
    memory by category at the peak, in bytes; the collectives it issued)."""
    import argparse

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runtime.loader import SyntheticLoader
    from runtime.parallel import clip_grad_norm_
    from runtime.pretrain import PretrainTask

    device = torch.device("cpu")
    with FakeTensorMode(allow_non_fake_inputs=True):
        for part in parts:  # materialised as fake tensors: shapes, dtypes and placements, no storage
            part.to_empty(device=device)
            part.setup_rope(device, plan.job.seq_len)
        optimizers = [h.build_optimizer(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=False) for h in handles]
        if plan.job.workload.value == "dpo":
            from runtime.dpo import DPOTask

            args = argparse.Namespace(io_mode="synthetic", seed=0, beta=None, label_smoothing=0.0, pairs=None,
                                      reference=None, init=None, precompute_reference=False, val_pairs=None)
            pairs = _synthetic_pairs(plan)
            task = DPOTask(args, plan, mesh, device, parts, handles, None, _fake_build, pair_sets=(pairs, pairs))
        else:
            loader = SyntheticLoader(plan.job.seq_len, plan.micro_batch_size, mesh["dp"].get_local_rank(),
                                     mesh["dp"].size(), seed=0, grad_accumulation=plan.grad_accumulation_steps)
            args = argparse.Namespace(io_mode="synthetic", seed=0)
            task = PretrainTask(args, plan, mesh, device, parts, handles, None, rank, loader=loader)
        if task.runner is not None:
            _static_warmup(task.runner.schedule)
        reference = list(getattr(task, "ref_parts", None) or [])

        def one_step():
            task.step()
            clip_grad_norm_(handles, 1.0)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)

        one_step()  # creates the optimizer's state
        tracker = _peak_tracker()
        tracker.track_external(*parts, *reference, *optimizers)
        recorder = CollectiveRecorder(mesh)
        with tracker, recorder, warnings.catch_warnings():
            # MemTracker warns of every None among a module's outputs (the pipeline's empty grads)
            warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass", UserWarning)
            one_step()
        snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()), {})
    return {str(k).split(".")[-1]: int(v) for k, v in snapshot.items()}, recorder.table(), _local_sizes(reference)[1]


def _local_sizes(parts) -> tuple[int, int]:
    """(elements, bytes) of the parameters these model parts hold on this rank (their local
    shards). No reference to a parameter outlives the call: to_empty swaps them in place."""
    from torch.distributed.tensor import DTensor

    numel = nbytes = 0
    for p in (p for part in parts for p in part.parameters()):
        t = p.to_local() if isinstance(p, DTensor) else p
        numel, nbytes = numel + t.numel(), nbytes + t.numel() * t.element_size()
    return numel, nbytes


def _fake_build(plan: Plan, mesh, device, seed: int):  # noqa: ARG001 (runtime/build.py build_model's signature)
    """build_model under fake tensors: the runtime's parallelisation, materialised without
    storage or initialisation (DPO's reference model)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from runtime.build import parallel_parts

    with unset_fake_temporarily():  # parallelised on meta as the policy was (FSDP's sharding asks real shapes)
        parts, handles = parallel_parts(plan, mesh)
    for part in parts:
        part.to_empty(device=device)
        part.setup_rope(device, plan.job.seq_len)
    return parts, handles


def _synthetic_pairs(plan: Plan):
    """A micro-batch's worth of (chosen, rejected) pairs of random residues, full length."""
    import numpy as np

    from runtime.dpo_pairs import PairSet
    from runtime.loader import synthetic_batch

    n = plan.micro_batch_size
    rows = synthetic_batch(0, 0, 2 * n, plan.job.seq_len).astype(np.uint8)
    return PairSet(np.stack([rows[:n], rows[n:]], axis=1), plan.job.seq_len, "synthetic")


def _peak_tracker():
    """torch's MemTracker keeping only the step's peak and its categories. Its per-module
    statistics are not kept: they refuse a module called twice in a step (a pipeline chunk
    runs once per micro-batch) and their snapshots cost most of its time. The categories stay
    torch's: parameters, buffers and optimizer state as registered, gradients by their hooks,
    activations (forward, and a recomputed block's replay) and temporaries (backward). Only the
    whole step's peak is updated after each op, not every module's (a scan of all modules per
    op: 80% of a check's time before)."""
    import weakref

    from torch.distributed._tools.mem_tracker import MemTracker, _ModMemStats

    class PeakTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs):  # noqa: ARG002 (the hook's signature)
            if module not in self.memory_tracking:  # first call: its parameters and their gradients' hooks
                stats = _ModMemStats(self._mod_tracker.get_known_fqn(module))
                trained = all(p.requires_grad for p in module.parameters())  # not DPO's frozen reference
                stats.parameter_mem, stats.buffer_mem = self._track_module_params_and_buffers(module, install_grad_hooks=trained)
                self.memory_tracking[module] = stats
            elif self._mod_tracker.is_bw and self._ac_mod is None:  # a recomputed block's forward in backward
                self._ac_mod = weakref.ref(module)
                self._in_ac = True

        def _post_fw_hook(self, module, inputs, outputs):  # noqa: ARG002
            if self._mod_tracker.is_bw and self._ac_mod is not None and self._ac_mod() is module:
                self._ac_mod = None
                self._in_ac = False

        def _pre_bw_hook(self, module, args):  # noqa: ARG002
            pass

        def _update_peak_stats(self, peak_state):  # noqa: ARG002 (after every op: the step's peak only)
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)

        def _post_bw_hook(self, module, args):  # noqa: ARG002
            pass

    return PeakTracker()


def _static_warmup(schedule) -> None:
    """The pipeline schedule's first step votes over the pp ranks on static or inferred stage
    shapes and reads the vote (`.item()`), which a fake tensor cannot answer. Every stage the
    runtime builds has static shapes (runtime/parallel/pipeline.py _stage), so every rank of a
    real run votes static: set that on this rank's stages and skip the vote (whose only other
    work, opening the neighbours' communicators, a fake group has no use for)."""
    from torch.distributed.pipelining._utils import InferenceMode

    def warmup(stages, has_backward, p2p_done):  # noqa: ARG001 (the schedule's signature)
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedule._warmup_p2p = warmup


def _memory_verdict(out: RankCheck, plan: Plan, snapshot: dict, held_bytes: int, predicted: dict | None) -> None:
    """Torch's figures by category beside the planner's, the error and the verdicts."""
    param = snapshot.get("PARAM", 0)
    torch_bytes = {
        "parameters": min(held_bytes, param),
        "buffers": max(param - held_bytes, 0) + snapshot.get("BUFFER", 0),
        "gradients": snapshot.get("GRAD", 0),
        "optimizer": snapshot.get("OPT", 0),
        "activations": snapshot.get("ACT", 0) + snapshot.get("TEMP", 0) + snapshot.get("OTH", 0),
    }
    peak = snapshot.get("Total", sum(torch_bytes.values()))
    out.stepped = True
    out.torch_peak_memory_gib = peak / GIB
    out.torch_memory_gib = {k: v / GIB for k, v in torch_bytes.items()}
    out.torch_tracker_gib = {k: v / GIB for k, v in snapshot.items() if k != "Total"}
    machine = plan.machine
    churn = torch_bytes["activations"] + torch_bytes["buffers"]
    reserve = churn * machine.fragmentation_fraction + machine.memory_reserve_gib * GIB
    out.reserve_gib = reserve / GIB
    out.device_memory_gib = machine.device_memory_gib
    out.fits = bool(peak + reserve <= machine.device_memory_gib * GIB)
    if predicted is None:
        return
    predicted = {k: float(v) for k, v in predicted.items()}
    tensors = sum(v for k, v in predicted.items() if k != "reserve")
    out.predicted_gib = {k: v / GIB for k, v in predicted.items()}
    out.predicted_memory_gib = tensors / GIB
    out.predicted_total_gib = (tensors + predicted.get("reserve", 0.0)) / GIB
    out.planner_fits = bool(tensors + predicted.get("reserve", 0.0) <= machine.device_memory_gib * GIB)
    out.memory_error = tensors / peak - 1 if peak else None
    if out.memory_error is not None and abs(out.memory_error) > MEMORY_TOLERANCE:
        out.agrees = False


class CollectiveRecorder:
    """A dispatch mode recording every collective a step issues: c10d's ops (FSDP, DDP, ZeRO,
    the pipeline's send and recv) and the functional ones (DTensor's redistributions under
    tensor and sequence parallelism), with the mesh dimension of their group."""

    OPS = {  # op name -> (our name, which argument holds the tensor(s) whose size is the message)
        "allreduce_": ("all_reduce", 0), "all_reduce": ("all_reduce", 0),
        "_allgather_base_": ("all_gather", 0), "allgather_": ("all_gather", 0),
        "all_gather_into_tensor": ("all_gather", "out"), "allgather_into_tensor_coalesced_": ("all_gather", 0),
        "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
        "reduce_scatter_tensor": ("reduce_scatter", 0), "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
        "send": ("send", 0), "recv_": ("recv", 0), "broadcast_": ("broadcast", 0), "broadcast": ("broadcast", 0),
        "all_to_all_single": ("all_to_all", 0), "alltoall_base_": ("all_to_all", 1),
    }

    def __init__(self, mesh):
        from torch.utils._python_dispatch import TorchDispatchMode

        self.groups: dict[str, str] = {}
        names = mesh.mesh_dim_names or ()
        for name in (*names, "dp", "dp_shard_cp", "dp_cp"):
            with contextlib.suppress(Exception):
                sub = mesh[name]
                if sub.size() > 1:
                    self.groups.setdefault(sub.get_group().group_name, name)
        self.counts: dict[tuple[str, str, int, int], int] = {}
        recorder = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                ns = func.namespace
                if ns in ("c10d", "_c10d_functional"):
                    recorder._record(func, args, out)
                return out

        self._mode = _Mode()

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)

    def _record(self, func, args, out) -> None:
        import torch
        import torch.distributed as dist

        name = func._opname
        if name not in self.OPS:
            return
        op, where = self.OPS[name]
        tensors = out if where == "out" else args[where]
        if isinstance(tensors, (tuple, list)) and tensors and isinstance(tensors[0], (tuple, list)):
            tensors = tensors[0]
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        size = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
        group_name, group_size = self._group(args)
        key = (op, self.groups.get(group_name, "world" if group_size == dist.get_world_size() else "other"), group_size, size)
        self.counts[key] = self.counts.get(key, 0) + 1

    @staticmethod
    def _group(args) -> tuple[str, int]:
        import torch
        import torch.distributed as dist

        for a in args:
            if isinstance(a, torch.ScriptObject):  # c10d's ops take the group as a script object
                a = dist.ProcessGroup.unbox(a)
            if isinstance(a, dist.ProcessGroup):
                return a.group_name, a.size()
            if isinstance(a, str):
                with contextlib.suppress(Exception):
                    from torch.distributed.distributed_c10d import _resolve_process_group

                    pg = _resolve_process_group(a)
                    return pg.group_name, pg.size()
        return "", 0

    def table(self) -> list[Collective]:
        rows = [Collective(op, dim, size, nbytes, n) for (op, dim, size, nbytes), n in self.counts.items()]
        return sorted(rows, key=lambda c: (c.mesh_dim, c.op, -c.total_bytes))


def communicator_bytes(plan, result) -> dict[str, tuple[int, float | None]]:
    """Per communicator: (the bytes the rank's measured step moved over it, the plan's table)."""
    table = {k.value: c.bytes_per_step for k, c in plan.collectives.communicators.items()}
    moved: dict[str, int] = {}
    for c in result.collectives:
        name = COMMUNICATOR_OF.get(c.mesh_dim, c.mesh_dim)
        moved[name] = moved.get(name, 0) + c.total_bytes
    return {k: (moved.get(k, 0), table.get(k)) for k in sorted(set(moved) | set(table))}


def torch_runtime_note(plan) -> str | None:
    """Why the planner's figures for this plan are not those of the step the check runs."""
    if plan.backend == "jax":
        return ("a JAX-backend plan: the check steps its layout in exaplan's torch runtime, against the planner's "
                "figures for that runtime (not XLA's)")
    if plan.job.framework.name != "exaplan":
        return (f"a plan for {plan.job.framework.name}: the check steps its layout in exaplan's torch runtime, "
                "against the planner's figures for that runtime")
    return None
