"""Data parallelism at the plan's sharding kind, and the handle the trainer drives it with.

    none          DDP semantics: parameters, gradients and optimizer state replicated over
                  mesh["dp_cp"], gradients allreduced (mean), in one of two ways
                  (plan.sharding.ddp_impl, chosen by planner.schema.plan.ddp_impl_for):
      ddp         torch.nn.parallel.DistributedDataParallel with the plan's bucket size,
                  gradient_as_bucket_view (no copy of the gradients into buckets) and
                  static_graph, wrapped when the optimizer is built (DDP needs the
                  materialised weights; it broadcasts nothing: every rank initialised the same
                  weights). The fastest path torch has (make bench-runtime: replicate's
                  wrapper costs ~15% of a step on 2 CPU ranks). bf16 computes under autocast.
                  Only with plain tensors (tp == pp == 1): DDP around a TP model fails on gloo
                  (mixed Tensor/DTensor in `_sync_module_states`) and torch's pipeline stages
                  drive FSDP2-style modules.
      replicate   torch's FSDP2-based `replicate` (torch.distributed._composable.
                  replicate_with_fsdp) on the meta-device model: consecutive blocks grouped,
                  in backward order, into units of at least `sharding.ddp_bucket_mb` MiB of
                  fp32 parameters; each unit is one allreduce (block granularity, so a bucket
                  may exceed the cap by up to one block; the root unit takes the embedding,
                  final norm and head). Plans without ddp_impl run this.
    fsdp          FSDP2 fully_shard on every block, then on the root, over mesh["dp_shard_cp"],
                  reshard_after_forward=True (ZeRO-3 / FULL_SHARD).
    fsdp-grad-op  the same with reshard_after_forward=False (gathered parameters kept from
                  forward to backward, SHARD_GRAD_OP).
    hsdp          FSDP2 on the 2-D mesh mesh["dp_replicate", "dp_shard_cp"]: sharded inside a
                  group, replicated across groups (reshard_after_forward from the plan).
    zero1, zero2  runtime/parallel/zero.py over mesh["dp_cp"]: the module is left alone; the
                  optimizer built by the handle shards the gradients and the optimizer state.

FSDP kinds use MixedPrecisionPolicy(param_dtype = the plan's precision, reduce_dtype = fp32);
so does `none` through replicate; `none` through DDP keeps fp32 weights and gradients and
computes under autocast; so do ZeRO and a dp size of 1 (fp32 weights; autocast_forward's hooks
around the module's forward, pipeline stages included); gradients are always accumulated and
reduced in fp32 by ZeRO.

Gradient accumulation (`handle.no_sync()` around the forward and backward of every micro-batch
but the last):
    none          no reduction until the last micro-batch (unsharded gradients accumulate,
                  like DDP's no_sync);
    fsdp, fsdp-grad-op
                  nothing skipped: each micro-batch's gradient is reduce-scattered and
                  accumulated into the sharded gradient (memory-optimal; this is what the cost
                  model charges: FSDP gradient traffic per micro-batch);
    hsdp          reduce-scatter inside the shard group every micro-batch, the allreduce across
                  replicas only after the last one (FSDP2's set_requires_all_reduce);
    zero1         nothing to do: the reduce-scatter always waits for the step;
    zero2         nothing skipped: every micro-batch's gradient is reduce-scattered and only this
                  rank's shard is kept.

Gradient clipping: `handle.clip_grad_norm(max_norm)` is the norm of the whole model's gradient:
each DTensor gradient's squared norm summed over the mesh dims it is split over (FSDP shards,
TP shards), ZeRO shards summed over dp, and the parts of a pipeline summed over mesh["pp"]. It
assumes one model part per pipeline rank; with several (interleaved schedules) call
`clip_grad_norm_(handles, max_norm)` once with all of this rank's handles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate

from planner.schema.plan import Plan, Sharding
from planner.schema.specs import Precision
from runtime.parallel.zero import MIB, ZeroOptimizer, _shard_key

__all__ = ["DataParallelHandle", "apply_data_parallel", "clip_grad_norm_"]

_DTYPES = {Precision.fp32: torch.float32, Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


def _blocks(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    return list(layers.values()) if layers is not None else []


def _replicate_units(blocks: list[nn.Module], bucket_mb: float) -> list[list[nn.Module]]:
    """Consecutive blocks grouped, from the last, until each group holds >= bucket_mb MiB
    (fp32); returned in model order."""
    cap = bucket_mb * MIB
    units: list[list[nn.Module]] = []
    current: list[nn.Module] = []
    size = 0.0
    for block in reversed(blocks):
        current.insert(0, block)
        size += sum(p.numel() for p in block.parameters()) * 4
        if size >= cap:
            units.insert(0, current)
            current, size = [], 0.0
    if current:
        units.insert(0, current)
    return units


def apply_data_parallel(model: nn.Module, mesh: DeviceMesh, plan: Plan) -> "DataParallelHandle":
    """Apply the plan's data parallelism to `model` (a ProteinLM or a pipeline chunk; its
    embedding or head may be None) in place, on the meta device or materialised; returns the
    handle the trainer uses for accumulation, the optimizer and clipping."""
    kind = Sharding(plan.sharding.kind)
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[Precision(plan.job.precision)], reduce_dtype=torch.float32)
    blocks = _blocks(model)
    precision = Precision(plan.job.precision)
    use_ddp = False
    if kind == Sharding.none:
        dp_mesh = mesh["dp_cp"]
        use_ddp = plan.sharding.ddp_impl == "ddp" and dp_mesh.size() > 1  # wrapped in build_optimizer
        if dp_mesh.size() > 1 and not use_ddp:
            from torch.distributed._composable.replicate_with_fsdp import replicate

            for unit in _replicate_units(blocks, plan.sharding.ddp_bucket_mb):
                replicate(unit if len(unit) > 1 else unit[0], mesh=dp_mesh, mp_policy=mp)
            replicate(model, mesh=dp_mesh, mp_policy=mp)
    elif kind in (Sharding.fsdp, Sharding.fsdp_grad_op, Sharding.hsdp):
        if kind == Sharding.hsdp:
            dp_mesh = mesh["dp_replicate", "dp_shard_cp"]
            reshard = plan.sharding.reshard_after_forward
        else:
            dp_mesh = mesh["dp_shard_cp"]
            reshard = kind == Sharding.fsdp
        for block in blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    else:
        dp_mesh = mesh["dp_cp"]
    handle = DataParallelHandle(model, mesh, dp_mesh, kind, plan.sharding.ddp_bucket_mb)
    if use_ddp:
        handle.ddp_pending = True
        handle.static_graph = plan.grad_accumulation_steps == 1
    # No mixed-precision policy was applied (DDP, a dp size of 1, ZeRO): the weights stay fp32
    # and a bf16 plan computes under autocast, entered by hooks around the module's forward
    # (through handle.forward, DDP or a pipeline schedule alike).
    no_policy = use_ddp or kind in (Sharding.zero1, Sharding.zero2) or (kind == Sharding.none and dp_mesh.size() == 1)
    if no_policy and precision == Precision.bf16:  # fp16 would need a loss scaler (DDP plans: replicate)
        autocast_forward(model, _DTYPES[precision])
    return handle


def autocast_forward(module: nn.Module, dtype: torch.dtype) -> None:
    """Run every forward of `module` under torch.autocast(dtype) on its parameters' device:
    forward hooks enter it and leave it (also when the forward raises), so whoever calls the
    module (the handle, DDP, a pipeline stage, validation) computes in `dtype`."""
    entered: list = []

    def enter(mod: nn.Module, args) -> None:  # noqa: ARG001 (forward pre-hook signature)
        param = next(mod.parameters(), None)
        ctx = torch.autocast(param.device.type if param is not None else "cpu", dtype=dtype)
        ctx.__enter__()
        entered.append(ctx)

    def leave(mod: nn.Module, args, out) -> None:  # noqa: ARG001 (forward hook signature)
        entered.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


class DataParallelHandle:
    """What the trainer needs from data parallelism, whatever the kind:

    forward(*inputs)                           the model's forward (through DDP where the
                                               handle wraps it)
    no_sync()                                  context for every micro-batch but the last
    build_optimizer(lr, betas, weight_decay)   AdamW (ZeroOptimizer under zero1/zero2);
                                               call after materialising the model
    clip_grad_norm(max_norm) -> float          clip by the global gradient norm; returns it
    grad_norm_squared() -> Tensor              this part's squared norm (no pp reduction)
    scale_grads_(factor)                       multiply the gradients (e.g. 1 / micro-batches)
    """

    def __init__(self, model: nn.Module, mesh: DeviceMesh, dp_mesh: DeviceMesh, kind: Sharding, bucket_mb: float):
        self.model = model
        self.mesh = mesh
        self.dp_mesh = dp_mesh
        self.kind = kind
        self.bucket_mb = bucket_mb
        self.optimizer: torch.optim.Optimizer | None = None
        self.ddp: nn.Module | None = None  # DistributedDataParallel around the model (ddp_impl ddp)
        self.ddp_pending = False  # DDP to be wrapped once the weights exist (build_optimizer)
        self._through_handle = False
        self.static_graph = False

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The model's forward: through DDP when it wraps the model (its reducer must see
        every forward). A bf16 plan whose weights no mixed-precision policy casts (DDP, a dp
        size of 1, ZeRO) computes under autocast (autocast_forward's hooks on the model)."""
        if self.ddp is None:
            return self.model(*inputs)
        self._through_handle = True
        try:
            return self.ddp(*inputs)
        finally:
            self._through_handle = False

    def _refuse_bypass(self, module, args) -> None:  # noqa: ARG002 (forward pre-hook signature)
        """A forward with gradients that bypasses DDP would skip the gradient all-reduce
        without a word: refuse it."""
        if torch.is_grad_enabled() and not self._through_handle:
            raise RuntimeError("this model part is wrapped in DistributedDataParallel: run its forward through "
                               "its data-parallel handle (handle.forward(inputs)), or under torch.no_grad()")

    def _wrap_ddp(self) -> None:
        """DistributedDataParallel around the materialised model: the plan's bucket size,
        gradients as views of the buckets (no copy), a static graph (the same parameters
        and autograd graph every step, recompute included) where there is no accumulation
        (torch 2.13's reducer asserts on a static graph whose first backward runs under
        no_sync), no broadcasts (the ranks initialised the same weights; the RoPE tables
        are constant buffers)."""
        from torch.nn.parallel import DistributedDataParallel

        self.ddp = DistributedDataParallel(
            self.model, process_group=self.dp_mesh.get_group(), bucket_cap_mb=self.bucket_mb,
            gradient_as_bucket_view=True, static_graph=self.static_graph, forward_sync_buffers=False, init_sync=False)
        self.ddp_pending = False
        self.model.register_forward_pre_hook(self._refuse_bypass)

    # ------------------------------------------------------------------ accumulation

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        m = self.model
        if self.ddp is not None:
            with self.ddp.no_sync():
                yield
        elif self.kind == Sharding.none and isinstance(m, FSDPModule):
            m.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                m.set_requires_gradient_sync(True)
        elif self.kind == Sharding.hsdp and isinstance(m, FSDPModule):
            m.set_requires_all_reduce(False)
            try:
                yield
            finally:
                m.set_requires_all_reduce(True)
        elif self.kind == Sharding.zero1 and isinstance(self.optimizer, ZeroOptimizer):
            self.optimizer.sync_enabled = False  # the reduce-scatters wait for the last micro-batch
            try:
                yield
            finally:
                self.optimizer.sync_enabled = True
        else:  # fsdp, fsdp-grad-op, zero2: reduce every micro-batch
            yield

    # --------------------------------------------------------------------- optimizer

    def build_optimizer(self, lr: float, betas: tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.0,
                        eps: float = 1e-8, foreach: bool = True) -> torch.optim.Optimizer:
        """AdamW over this part's parameters (for ZeRO: over this rank's shard of them).
        The model must be materialised (to_empty) first. foreach=False: the per-tensor update,
        the same arithmetic (exaplan check: torch's memory tracker misreads the foreach
        kernels' optimizer state under fake tensors)."""
        if any(p.is_meta for p in self.model.parameters()):
            raise RuntimeError("build_optimizer: materialise the model first (to_empty, init_weights)")
        if self.ddp_pending:
            self._wrap_ddp()
        if self.kind in (Sharding.zero1, Sharding.zero2):
            self.optimizer = ZeroOptimizer(self.model, self.dp_mesh, 1 if self.kind == Sharding.zero1 else 2,
                                           self.bucket_mb, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                           foreach=foreach)
            # A pipeline schedule runs the micro-batches' backwards without the handle's
            # no_sync: zero1 then reduces at the step.
            names = self.mesh.mesh_dim_names or ()
            self.optimizer.overlap_sync = "pp" not in names or self.mesh["pp"].size() == 1
        else:
            # torch's foreach kernels (one launch per tensor list, not per tensor) refuse lists
            # mixing DTensors and plain tensors, or DTensors of different meshes (TP without SP
            # leaves the norms plain): one parameter group per kind, the same hyperparameters.
            # On a GPU, with plain tensors only (no TP, no FSDP), torch's fused AdamW: one kernel
            # for the whole update instead of a foreach chain of them.
            params = [p for p in self.model.parameters() if p.requires_grad]
            groups = _param_groups(params)
            fused = foreach and bool(params) and all(p.device.type == "cuda" and not isinstance(p, DTensor) for p in params)
            self.optimizer = torch.optim.AdamW([{"params": g} for g in groups], lr=lr, betas=betas, eps=eps,
                                               weight_decay=weight_decay,
                                               **({"fused": True} if fused else {"foreach": foreach}))
        return self.optimizer

    # ----------------------------------------------------------------------- clipping

    def _zero(self) -> ZeroOptimizer | None:
        if self.kind in (Sharding.zero1, Sharding.zero2):
            if not isinstance(self.optimizer, ZeroOptimizer):
                raise RuntimeError(f"{self.kind.value}: build_optimizer() before the first backward")
            return self.optimizer
        return None

    def grad_norm_squared(self) -> torch.Tensor:
        """Squared 2-norm of this part's whole gradient, the same on every rank of its dp x tp
        group (not summed over pipeline stages)."""
        zero = self._zero()
        if zero is not None:
            return zero.grad_norm_squared()
        params = [p for p in self.model.parameters() if p.grad is not None]
        _grads_to_param_placements(params)
        return _grad_norm_squared([p.grad for p in params])

    @torch.no_grad()
    def scale_grads_(self, factor: torch.Tensor | float) -> None:
        zero = self._zero()
        if zero is not None:
            zero.scale_grads_(factor)
            return
        _scale_([p.grad for p in self.model.parameters() if p.grad is not None], factor)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip this part's gradient by the norm of the whole model's gradient (over every
        dp, tp and pp rank); returns that norm (before clipping)."""
        return float(clip_grad_norm_([self], max_norm))


def _param_groups(params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The parameters split into lists that one foreach kernel takes: plain tensors, and
    DTensors by mesh, in first-seen order (the same on every rank)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in params:
        key = (id(p.device_mesh), tuple(p.device_mesh.mesh_dim_names or ())) if isinstance(p, DTensor) else None
        groups.setdefault(key, []).append(p)
    return list(groups.values())


@torch.no_grad()
def _grads_to_param_placements(params: Sequence[torch.Tensor]) -> None:
    """TP can leave a DTensor gradient in another layout than its parameter: Partial(sum)
    for the norm weights under sequence parallelism (each rank summed over its slice of the
    sequence), Replicate for the row-wise embedding. Bring each to its parameter's layout
    (an allreduce for Partial, a local slice for Replicate -> Shard) so that norms and the
    optimizer see reduced gradients of the parameter's shape."""
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)


def _grad_norm_squared(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of gradients that may be plain tensors (replicated) or DTensors split
    over some mesh dims: the local tensors of each group (by the dims they are split over)
    normed with torch's foreach kernels, each group's sum all-reduced over exactly its split
    dims."""
    device = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    groups: dict[object, tuple[object, list[torch.Tensor]]] = {}
    for g in grads:
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            g = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])
        key = _shard_key(g)
        k = None if key is None else (id(key[0]), key[1])
        groups.setdefault(k, (key, []))[1].append(g.to_local() if isinstance(g, DTensor) else g)
    # The same order on every rank (stable for ties), the replicated group first.
    for k in sorted(groups, key=lambda k: (k is not None, str(k[1]) if k else "")):
        key, local = groups[k]
        sq = torch.nn.utils.get_total_norm(local, 2.0, foreach=True).float().square()
        if key is not None:
            mesh, dims = key
            for d in dims:
                dist.all_reduce(sq, group=mesh.get_group(d))
        total = total + sq
    return total


@torch.no_grad()
def _scale_(tensors: Sequence[torch.Tensor], factor: torch.Tensor | float) -> None:
    """Multiply tensors (DTensors through their local shards) in place: one foreach kernel
    per device and dtype."""
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        by_kind.setdefault((local.device, local.dtype), []).append(local)
    for (device, _), ts in by_kind.items():
        torch._foreach_mul_(ts, factor.to(device) if isinstance(factor, torch.Tensor) else factor)


def clip_grad_norm_(handles: Sequence[DataParallelHandle], max_norm: float) -> torch.Tensor:
    """Clip the gradients of all of this rank's model parts (one handle each) by the norm of
    the whole model's gradient: the parts' squared norms, summed over this rank's parts and
    over mesh["pp"]. Every rank calls it; returns the norm before clipping, a 0-d tensor on
    the device (as torch.nn.utils.clip_grad_norm_: reading it is the caller's choice, so
    clipping never waits for the device)."""
    if not handles:
        raise ValueError("clip_grad_norm_: no handles")
    parts = [h.grad_norm_squared() for h in handles]
    total_sq = torch.stack([t.to(parts[0].device) for t in parts]).sum()
    mesh = handles[0].mesh
    if "pp" in (mesh.mesh_dim_names or ()) and mesh["pp"].size() > 1:
        dist.all_reduce(total_sq, group=mesh["pp"].get_group())
    total = total_sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch.nn.utils.clip_grad_norm_'s rule
    for h in handles:
        h.scale_grads_(coef)
    return total
