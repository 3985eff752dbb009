"""Data parallelism at the plan's sharding kind, and the handle the trainer drives it with.

    none          DDP semantics: parameters, gradients and optimizer state replicated over
                  mesh["dp_cp"], gradients allreduced (mean). Implemented with torch's
                  FSDP2-based `replicate` (torch.distributed._composable.replicate_with_fsdp)
                  rather than nn.parallel.DistributedDataParallel, because the trainer applies
                  data parallelism to the meta-device model before `to_empty`, in place (DDP
                  broadcasts the weights at construction and holds references to parameters
                  that `to_empty` replaces), because plain DDP around a TP model fails on
                  CPU/gloo (mixed Tensor/DTensor in `_sync_module_states`), and because
                  torch's pipeline stages drive FSDP2-style modules but not composable DDP.
                  Buckets: consecutive blocks are grouped, in backward order, into replicate
                  units of at least `sharding.ddp_bucket_mb` MiB of fp32 parameters; each unit
                  is one allreduce (block granularity, so a bucket may exceed the cap by up to
                  one block; the root unit takes the embedding, final norm and head).
    fsdp          FSDP2 fully_shard on every block, then on the root, over mesh["dp_shard_cp"],
                  reshard_after_forward=True (ZeRO-3 / FULL_SHARD).
    fsdp-grad-op  the same with reshard_after_forward=False (gathered parameters kept from
                  forward to backward, SHARD_GRAD_OP).
    hsdp          FSDP2 on the 2-D mesh mesh["dp_replicate", "dp_shard_cp"]: sharded inside a
                  group, replicated across groups (reshard_after_forward from the plan).
    zero1, zero2  runtime/parallel/zero.py over mesh["dp_cp"]: the module is left alone; the
                  optimizer built by the handle shards the gradients and the optimizer state.

FSDP kinds use MixedPrecisionPolicy(param_dtype = the plan's precision, reduce_dtype = fp32);
so does `none` (through replicate). ZeRO and a dp size of 1 leave the compute precision to
the trainer (autocast); gradients are always accumulated and reduced in fp32 by ZeRO.

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
import math
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
    if kind == Sharding.none:
        dp_mesh = mesh["dp_cp"]
        if dp_mesh.size() > 1:
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
    return DataParallelHandle(model, mesh, dp_mesh, kind, plan.sharding.ddp_bucket_mb)


class DataParallelHandle:
    """What the trainer needs from data parallelism, whatever the kind:

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

    # ------------------------------------------------------------------ accumulation

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        m = self.model
        if self.kind == Sharding.none and isinstance(m, FSDPModule):
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
        else:  # fsdp, fsdp-grad-op, zero2: reduce every micro-batch; zero1: always deferred
            yield

    # --------------------------------------------------------------------- optimizer

    def build_optimizer(self, lr: float, betas: tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.0,
                        eps: float = 1e-8) -> torch.optim.Optimizer:
        """AdamW over this part's parameters (for ZeRO: over this rank's shard of them).
        The model must be materialised (to_empty) first."""
        if any(p.is_meta for p in self.model.parameters()):
            raise RuntimeError("build_optimizer: materialise the model first (to_empty, init_weights)")
        if self.kind in (Sharding.zero1, Sharding.zero2):
            self.optimizer = ZeroOptimizer(self.model, self.dp_mesh, 1 if self.kind == Sharding.zero1 else 2,
                                           self.bucket_mb, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        else:
            params = [p for p in self.model.parameters() if p.requires_grad]
            # foreach kernels refuse lists mixing DTensors and plain tensors (TP without SP
            # leaves the norms plain): the single-tensor path works for any mix.
            self.optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                               foreach=False)
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
    def scale_grads_(self, factor: float) -> None:
        zero = self._zero()
        if zero is not None:
            zero.scale_grads_(factor)
            return
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip this part's gradient by the norm of the whole model's gradient (over every
        dp, tp and pp rank); returns that norm (before clipping)."""
        return clip_grad_norm_([self], max_norm)


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
    over some mesh dims: each group's local sum is all-reduced over exactly its split dims."""
    device = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    by_key: dict[tuple, tuple[object, torch.Tensor]] = {}
    for g in grads:
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            g = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])
        key = _shard_key(g)
        local = g.to_local() if isinstance(g, DTensor) else g
        sq = local.detach().float().pow(2).sum()
        if key is None:
            total = total + sq
            continue
        k = (id(key[0]), key[1])
        prev = by_key.get(k)
        by_key[k] = (key, sq if prev is None else prev[1] + sq)
    for k in sorted(by_key, key=lambda k: str(k[1])):  # the same order on every rank (stable for ties)
        (mesh, dims), sq = by_key[k]
        for d in dims:
            dist.all_reduce(sq, group=mesh.get_group(d))
        total = total + sq
    return total


def clip_grad_norm_(handles: Sequence[DataParallelHandle], max_norm: float) -> float:
    """Clip the gradients of all of this rank's model parts (one handle each) by the norm of
    the whole model's gradient: the parts' squared norms, summed over this rank's parts and
    over mesh["pp"]. Every rank calls it; returns the norm before clipping."""
    if not handles:
        raise ValueError("clip_grad_norm_: no handles")
    parts = [h.grad_norm_squared() for h in handles]
    total_sq = torch.stack([t.to(parts[0].device) for t in parts]).sum()
    mesh = handles[0].mesh
    if "pp" in (mesh.mesh_dim_names or ()) and mesh["pp"].size() > 1:
        dist.all_reduce(total_sq, group=mesh["pp"].get_group())
    total = math.sqrt(float(total_sq))
    coef = max_norm / (total + 1e-6)  # torch.nn.utils.clip_grad_norm_'s rule
    if coef < 1.0:
        for h in handles:
            h.scale_grads_(coef)
    return total
