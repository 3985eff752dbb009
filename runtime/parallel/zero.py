"""ZeRO-1 and ZeRO-2 (Rajbhandari et al. 2020) as a Megatron-style distributed optimizer.

The model stays whole on every data-parallel rank (parameters plain tensors, or DTensors
when tensor parallelism split them first: then everything below is about the local TP
shard). At `ZeroOptimizer` construction the parameters are packed, in backward order (the
reverse of registration), into flat fp32 buckets of about `bucket_mb` MiB, each padded to a
multiple of the dp size G; rank r owns the r-th contiguous 1/G of every bucket.

Gradients. A post-accumulate-grad hook on every parameter adds its gradient (fp32) into its
slice of the bucket's flat buffer and frees `param.grad`, so gradients never live in
`.grad`: read them through the optimizer (`clip_grad_norm`, `scale_grads_`).

    zero1   the full fp32 bucket buffers persist and accumulate over the micro-batches; one
            reduce-scatter per bucket, started in the last micro-batch's backward as the
            bucket completes (or, in pipeline stages, in `finish_grad_sync`, called by
            clip_grad_norm and step), so the gradient memory is P x 4 bytes, the
            optimizer state P x 8 / G (planner/cost/memory.py).
    zero2   when a bucket's last gradient has arrived in a backward pass (every micro-batch),
            it is reduce-scattered at once, this rank's shard is added to a persistent
            P x 4 / G accumulator and the full bucket buffer is freed: the gradient memory is
            P x 4 / G plus the buckets in flight.

The reduction is a sum divided by G (the mean over data-parallel ranks, as DDP does), in fp32.
On gloo (CPU ranks) the reduce-scatter is an allreduce of the bucket of which each rank keeps
its shard, and the all-gather one broadcast per owner: gloo's own reduce-scatter and
all-gather take about twice as long (25 MiB on 2 ranks: allreduce 16 ms, reduce-scatter 32
ms, all-gather 17 ms, broadcast 8.5 ms).

Step. AdamW (torch.optim.AdamW underneath, foreach path: one kernel per operation over all
the shards; the same arithmetic as plain AdamW on the whole model) runs on each bucket's
local fp32 shard of master weights; the updated shards are all-gathered (all started, then
waited for) and copied back into the parameters. With fp32
parameters the shard is refreshed from the parameters before every step (the parameters are
the master weights; the shard is working memory of P x 4 / G bytes), so loading model weights
in place needs nothing more. With 16-bit parameters the fp32 master shard persists and is
part of the optimizer state.

Collectives start without waiting in the hooks, when a bucket's last gradient arrives (zero2:
every micro-batch, one bucket in flight; zero1: in the step's last micro-batch, every bucket
in flight, finished by `finish_grad_sync`); every rank of a data-parallel group holds the
same parameters in the same buckets, so the order matches.
With pipeline parallelism (each stage its own ZeroOptimizer) this works unchanged, but the
schedule's `scale_grads` cannot see gradients that are not in `.grad`: scale the loss, or call
`scale_grads_` yourself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from runtime.model import canonical_name

__all__ = ["ZeroOptimizer"]

MIB = 1 << 20


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_key(p: torch.Tensor):
    """(mesh, mesh dims the tensor is split over) of a DTensor, None for a plain tensor or
    one replicated everywhere: a squared norm must be summed over exactly those dims."""
    if not isinstance(p, DTensor):
        return None
    # Anything neither replicated nor partial splits the tensor: Shard, and FSDP2's
    # _StridedShard (FSDP over a TP-sharded dim), which is not a Shard in torch 2.13.
    dims = tuple(i for i, pl in enumerate(p.placements) if not (pl.is_replicate() or pl.is_partial()))
    return (p.device_mesh, dims) if dims else None


@dataclass
class _Bucket:
    params: list[nn.Parameter]
    names: list[str]
    offsets: list[int]  # start of each parameter's local elements in the flat bucket
    numel: int  # padded to a multiple of the dp size
    shard_numel: int
    lo: int  # this rank's range [lo, lo + shard_numel)
    key: object  # _shard_key shared by every parameter of the bucket
    master: nn.Parameter  # fp32 [shard_numel]: what AdamW updates
    grad_full: torch.Tensor | None = None  # fp32 [numel], while gradients accumulate
    grad_shard: torch.Tensor | None = None  # fp32 [shard_numel], reduced (mean over dp)
    ready: int = 0  # parameters whose gradient arrived in the current backward
    pending: bool = False  # grad_full holds gradients not yet reduced
    inflight: tuple | None = None  # (async work, output shard) of a reduce-scatter under way
    # Plain-tensor buckets of one dtype: the parameters are views of one flat buffer, which
    # the step all-gathers into directly; its version counter tells when someone (a
    # checkpoint load) wrote the parameters, so the fp32 master is refreshed only then.
    param_buffer: torch.Tensor | None = None
    seen_version: int = -1
    grad_views: bool = False  # zero1, fp32: param.grad are views of grad_full (no copy)

    def overlaps(self, lo: int, hi: int):
        """(position, param start, param end) of every parameter overlapping [lo, hi)."""
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            n = _local(p).numel()
            if off < hi and off + n > lo:
                yield i, off, off + n


class ZeroOptimizer(torch.optim.AdamW):
    """AdamW over this rank's shard of the model's parameters (ZeRO stage 1 or 2).

    An optimizer like any other to the trainer (step, zero_grad, param_groups for the
    learning-rate schedule, state_dict / load_state_dict in a per-rank form), plus
    `dcp_state_dict()` / `load_dcp_state_dict()` in a layout-independent form for
    runtime/checkpoint/, and the gradient access the handle needs: `finish_grad_sync`,
    `grad_norm_squared`, `scale_grads_`. Construct it after the model is materialised and
    initialised (it hooks the parameters `to_empty` created, and 16-bit models take their
    fp32 master shard from the initial weights)."""

    def __init__(self, model: nn.Module, dp_mesh: DeviceMesh, stage: int, bucket_mb: float = 25.0, *,
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, foreach: bool = True):
        if stage not in (1, 2):
            raise ValueError(f"ZeRO stage must be 1 or 2, not {stage}")
        self.stage = stage
        self.model = model
        self.dp_mesh = dp_mesh
        self.group = dp_mesh.get_group()
        self.dp_size = dp_mesh.size()
        self.dp_rank = dp_mesh.get_local_rank()
        self.buckets = self._make_buckets(model, max(1, int(bucket_mb * MIB / 4)))
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(b, i))
                       for b in self.buckets for i, p in enumerate(b.params)]
        # zero1: reduce a bucket as soon as its last gradient of the step's last micro-batch
        # has arrived (under the rest of the backward), as DDP does. The handle clears
        # `sync_enabled` around the other micro-batches; `overlap_sync` off (pipeline stages,
        # whose schedule cannot say which micro-batch is the last) reduces at the step.
        self.sync_enabled = True
        self.overlap_sync = True
        # gloo (CPU): an allreduce instead of its slow reduce-scatter, and the all-gather as
        # one broadcast per owner (ZeroRedundancyOptimizer's way): both about twice as fast.
        self.gloo = self.dp_size > 1 and dist.get_backend(self.group) == "gloo"
        self.owners = [dist.get_global_rank(self.group, r) for r in range(self.dp_size)] if self.gloo else []
        # Every master shard is a plain fp32 tensor: torch's foreach kernels take them all.
        super().__init__([b.master for b in self.buckets], lr=lr, betas=betas, eps=eps,
                         weight_decay=weight_decay, foreach=foreach)

    # ---------------------------------------------------------------------------- buckets

    def _make_buckets(self, model: nn.Module, cap_numel: int) -> list[_Bucket]:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if any(p.is_meta for _, p in named):
            raise RuntimeError("build the ZeRO optimizer after materialising the model (to_empty, init_weights)")
        groups: list[list[tuple[str, nn.Parameter]]] = []
        open_by_key: dict[object, list] = {}
        size_by_key: dict[object, int] = {}
        for name, p in reversed(named):  # backward order: the last layers' gradients come first
            key = _shard_key(p)
            k = id(key[0]) if key else None, key[1] if key else None
            if k not in open_by_key or size_by_key[k] >= cap_numel:
                open_by_key[k], size_by_key[k] = [], 0
                groups.append(open_by_key[k])
            open_by_key[k].append((name, p))
            size_by_key[k] += _local(p).numel()
        buckets = []
        for members in groups:
            offsets, n = [], 0
            for _, p in members:
                offsets.append(n)
                n += _local(p).numel()
            numel = math.ceil(n / self.dp_size) * self.dp_size
            shard = numel // self.dp_size
            device = _local(members[0][1]).device
            b = _Bucket(params=[p for _, p in members], names=[canonical_name(nm) for nm, _ in members],
                        offsets=offsets, numel=numel, shard_numel=shard, lo=self.dp_rank * shard,
                        key=_shard_key(members[0][1]),
                        master=nn.Parameter(torch.zeros(shard, dtype=torch.float32, device=device)))
            self._load_master(b)
            if all(not isinstance(p, DTensor) for p in b.params) and len({p.dtype for p in b.params}) == 1:
                self._flatten(b)
            buckets.append(b)
        return buckets

    @torch.no_grad()
    def _flatten(self, b: _Bucket) -> None:
        """Make the bucket's parameters views of one flat buffer (the step's all-gather then
        writes them in place), and under zero1 with fp32 parameters their gradients views of
        the persistent full gradient buffer (autograd accumulates into it in place, as DDP's
        gradient_as_bucket_view: no copy, no free)."""
        first = b.params[0]
        buf = torch.zeros(b.numel, dtype=first.dtype, device=first.device)
        for p, s in zip(b.params, b.offsets):
            view = buf[s:s + p.numel()].view_as(p)
            view.copy_(p.data)
            p.data = view
        b.param_buffer, b.seen_version = buf, buf._version
        if self.stage == 1 and first.dtype == torch.float32:
            b.grad_full = torch.zeros(b.numel, dtype=torch.float32, device=first.device)
            for p, s in zip(b.params, b.offsets):
                p.grad = b.grad_full[s:s + p.numel()].view_as(p)
            b.grad_views = True

    @torch.no_grad()
    def _load_master(self, b: _Bucket) -> None:
        """Copy this rank's shard of the parameters into the fp32 master shard."""
        lo, hi = b.lo, b.lo + b.shard_numel
        for i, s, e in b.overlaps(lo, hi):
            flat = _local(b.params[i]).reshape(-1)
            a, z = max(s, lo), min(e, hi)
            b.master.data[a - lo:z - lo].copy_(flat[a - s:z - s])

    def _make_hook(self, b: _Bucket, i: int):
        def hook(p: torch.Tensor) -> None:
            g = p.grad
            if isinstance(g, DTensor):
                # TP may hand back Partial (SP norm weights) or Replicate (row-wise
                # embedding) gradients: reduce / slice to the parameter's own layout.
                if tuple(g.placements) != tuple(p.placements):
                    g = g.redistribute(p.device_mesh, p.placements)
                g = g.to_local()
            if g.numel() != _local(p).numel():
                raise RuntimeError(f"ZeRO: gradient of {b.names[i]} has {g.numel()} local elements, "
                                   f"the parameter {_local(p).numel()}")
            if b.inflight is not None:  # its buffer is still being reduced: finish that first
                if b.grad_views:  # autograd has already added into the buffer in flight
                    raise RuntimeError("ZeRO-1: a backward after the step's last micro-batch: call the optimizer's "
                                       "step() and zero_grad() first (or accumulate under handle.no_sync())")
                self._finish_reduce(b)
            if not b.grad_views:  # (with views autograd already accumulated into grad_full)
                if b.grad_full is None:
                    b.grad_full = torch.zeros(b.numel, dtype=torch.float32, device=g.device)
                s = b.offsets[i]
                b.grad_full[s:s + g.numel()].add_(g.reshape(-1))
                p.grad = None
            b.pending = True
            b.ready += 1
            if b.ready == len(b.params):  # the bucket is complete for this micro-batch
                b.ready = 0
                if self.stage == 2 or (self.overlap_sync and self.sync_enabled):
                    self._start_reduce(b)
        return hook

    @torch.no_grad()
    def _start_reduce(self, b: _Bucket) -> None:
        """Start the bucket's reduce-scatter without waiting. zero2 keeps one bucket in
        flight (the previous one is finished first, so only its full buffer is alive)."""
        if self.stage == 2:
            self._finish_all()
        work, out = None, None
        if self.dp_size == 1:
            out = b.grad_full.clone()
        elif self.gloo:  # allreduce, keep this rank's shard (see the module docstring)
            work = dist.all_reduce(b.grad_full, group=self.group, async_op=True)
        else:
            out = torch.empty(b.shard_numel, dtype=torch.float32, device=b.grad_full.device)
            work = dist.reduce_scatter_single(out, b.grad_full, group=self.group, async_op=True)
        b.inflight, b.pending, b.ready = (work, out), False, 0

    @torch.no_grad()
    def _finish_reduce(self, b: _Bucket) -> None:
        work, out = b.inflight
        if work is not None:
            work.wait()
        if out is None:  # allreduced in place: this rank's shard of the sum
            out = b.grad_full[b.lo:b.lo + b.shard_numel]
        if b.grad_shard is None:
            b.grad_shard = out.div(self.dp_size)  # (a new tensor: `out` may be a view of grad_full)
        else:
            b.grad_shard.add_(out, alpha=1.0 / self.dp_size)
        if self.stage == 2:
            b.grad_full = None  # the full gradient is gone: only this rank's shard is kept
        else:
            b.grad_full.zero_()  # (zero_grad then finds it zero: one pass either way)
        b.inflight = None

    def _finish_all(self) -> None:
        for b in self.buckets:
            if b.inflight is not None:
                self._finish_reduce(b)

    # ------------------------------------------------------------------- gradient access

    def finish_grad_sync(self) -> None:
        """Reduce whatever has not been reduced (all of it under zero1 without overlap):
        start every pending bucket's reduce-scatter, then wait for all. Idempotent."""
        for b in self.buckets:
            if b.pending:
                self._start_reduce(b)
        self._finish_all()

    def grad_norm_squared(self) -> torch.Tensor:
        """Squared 2-norm of the whole gradient of this model part (all dp shards, all TP
        shards), identical on every rank of the part's dp x tp group."""
        self.finish_grad_sync()
        by_key: dict[object, tuple[object, torch.Tensor]] = {}
        for b in self.buckets:
            sq = b.grad_shard.pow(2).sum() if b.grad_shard is not None else torch.zeros((), device=b.master.device)
            k = (id(b.key[0]), b.key[1]) if b.key else None
            prev = by_key.get(k)
            by_key[k] = (b.key, sq if prev is None else prev[1] + sq)
        total = torch.zeros((), dtype=torch.float32, device=self.buckets[0].master.device if self.buckets else "cpu")
        if not by_key:
            return total
        keys = sorted(by_key, key=lambda k: (k is not None, str(k[1]) if k else ""))
        sq = torch.stack([by_key[k][1] for k in keys])
        if self.dp_size > 1:
            dist.all_reduce(sq, group=self.group)
        for k, v in zip(keys, sq):
            key = by_key[k][0]
            if key is not None:
                mesh, dims = key
                for d in dims:
                    dist.all_reduce(v, group=mesh.get_group(d))
            total = total + v
        return total

    @torch.no_grad()
    def scale_grads_(self, factor: float) -> None:
        for b in self.buckets:
            if b.grad_shard is not None:
                b.grad_shard.mul_(factor)
            if b.grad_full is not None and b.pending:  # (a reduced full buffer is zero)
                b.grad_full.mul_(factor)

    # ------------------------------------------------------------------------- optimizer

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise NotImplementedError("ZeroOptimizer.step takes no closure")
        self.finish_grad_sync()
        for b in self.buckets:
            fp32 = bool(b.params) and _local(b.params[0]).dtype == torch.float32
            if fp32 and (b.param_buffer is None or b.param_buffer._version != b.seen_version):
                self._load_master(b)  # fp32: the parameters are the master weights (written since)
            b.master.grad = b.grad_shard if b.grad_shard is not None else torch.zeros_like(b.master)
        gathers = []  # every bucket's all-gather started, then each waited for (and copied back)
        groups = self.param_groups
        try:
            for b in self.buckets:  # AdamW bucket by bucket: each all-gather runs under the next one's update
                self.param_groups = [{**groups[0], "params": [b.master]}]
                super().step()
                b.master.grad = None
                gathers += self._start_gather(b)
        finally:
            self.param_groups = groups
        self._finish_gathers(gathers)
        return None

    def _start_gather(self, b: _Bucket) -> list[tuple]:
        """Start the all-gather of the bucket's updated shards: [(bucket, buffer, work)]."""
        gathers = []
        flat = b.param_buffer
        full = flat if flat is not None else torch.empty(b.numel, dtype=torch.float32, device=b.master.device)
        shard = b.master.data if full.dtype == torch.float32 else b.master.data.to(full.dtype)
        if self.gloo:
            full[b.lo:b.lo + b.shard_numel].copy_(shard)
            n = b.shard_numel
            gathers += [(b, full, dist.broadcast(full[r * n:(r + 1) * n], src, group=self.group, async_op=True))
                        for r, src in enumerate(self.owners)]
        elif self.dp_size > 1:
            gathers.append((b, full, dist.all_gather_single(full, shard, group=self.group, async_op=True)))
        else:
            full.copy_(shard)
            gathers.append((b, full, None))
        return gathers

    def _finish_gathers(self, gathers: list[tuple]) -> None:
        """Wait for the all-gathers and bring each bucket's parameters up to date."""
        for i, (b, full, work) in enumerate(gathers):
            if work is not None:
                work.wait()
            if i + 1 < len(gathers) and gathers[i + 1][0] is b:
                continue  # the bucket's other broadcasts first
            if b.param_buffer is not None:
                b.seen_version = b.param_buffer._version
                continue
            local = [_local(p) for p in b.params]
            torch._foreach_copy_(local, [full[s:s + t.numel()].view_as(t) for t, s in zip(local, b.offsets)])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradient buffers (kept allocated whatever `set_to_none` says: the shard
        accumulator, and under zero1 the full buffers, are persistent by design). A full
        buffer already reduced is zero (_finish_reduce): only unreduced ones are zeroed."""
        self._finish_all()  # no reduce-scatter left reading a buffer
        for b in self.buckets:
            if b.grad_shard is not None:
                b.grad_shard.zero_()
            if b.grad_full is not None:
                if self.stage == 2:
                    b.grad_full = None
                elif b.pending:
                    b.grad_full.zero_()
            b.ready, b.pending = 0, False
            b.master.grad = None
            if not b.grad_views:  # (views of grad_full stay: it was zeroed above)
                for p in b.params:
                    p.grad = None

    # ------------------------------------------------------------------ checkpoint state

    def _gather_flat(self, b: _Bucket, shard: torch.Tensor) -> torch.Tensor:
        full = torch.empty(b.numel, dtype=torch.float32, device=shard.device)
        if self.dp_size > 1:
            dist.all_gather_single(full, shard.contiguous(), group=self.group)
        else:
            full.copy_(shard)
        return full

    def _per_param(self, b: _Bucket, full: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for p, s in zip(b.params, b.offsets):
            loc = _local(p)
            t = full[s:s + loc.numel()].view(loc.shape).clone()
            if isinstance(p, DTensor):
                t = DTensor.from_local(t, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                       stride=p.stride())
            out.append(t)
        return out

    def _state_names(self) -> tuple[str, ...]:
        mixed = any(_local(b.params[0]).dtype != torch.float32 for b in self.buckets if b.params)
        return ("exp_avg", "exp_avg_sq") + (("master",) if mixed else ())

    def dcp_state_dict(self) -> dict:
        """{"state": {canonical name: {"step", "exp_avg", "exp_avg_sq"[, "master"]}}}: every
        tensor shaped like its parameter (a DTensor with the parameter's placements under TP,
        a plain tensor replicated over dp otherwise), so DCP can reshard it to any dp size.
        Gathers the optimizer state over dp (a collective; transient memory of the full state)."""
        state: dict[str, dict[str, torch.Tensor]] = {}
        for b in self.buckets:
            st = self.state.get(b.master, {})
            step = st.get("step", torch.zeros((), dtype=torch.float32))
            per_name = {}
            for what in self._state_names():
                shard = b.master.data if what == "master" else st.get(what, torch.zeros_like(b.master))
                per_name[what] = self._per_param(b, self._gather_flat(b, shard))
            for i, name in enumerate(b.names):
                state[name] = {"step": step.detach().clone().float().reshape(())}
                for what, tensors in per_name.items():
                    state[name][what] = tensors[i]
        return {"state": state}

    @torch.no_grad()
    def load_dcp_state_dict(self, state_dict: dict) -> None:
        """Inverse of dcp_state_dict (on any dp size): keep this rank's shard."""
        state = state_dict["state"]
        for b in self.buckets:
            lo, hi = b.lo, b.lo + b.shard_numel
            st = self.state[b.master]
            first = state[b.names[0]]
            st["step"] = first["step"].detach().clone().float().reshape(())
            for what in self._state_names():
                shard = torch.zeros(b.shard_numel, dtype=torch.float32, device=b.master.device)
                for i, s, e in b.overlaps(lo, hi):
                    flat = _local(state[b.names[i]][what]).reshape(-1)
                    a, z = max(s, lo), min(e, hi)
                    shard[a - lo:z - lo].copy_(flat[a - s:z - s])
                if what == "master":
                    b.master.data.copy_(shard)
                else:
                    st[what] = shard
