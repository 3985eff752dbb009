"""Context parallelism: the sequence of every micro-batch split over the "cp" mesh axis, with
all-gathered keys and values (the scheme of Llama 3's training, Dubey et al. 2024, sec. 3.3.2).

Works with any attention kernel and any backend (gloo on the CPU, NCCL on GPUs): torch's
experimental `context_parallel` (ring attention) needs the CUDA flash / efficient kernels and is
not used.

Sequence split, load-balanced. The sequence of a micro-batch is cut into 2 x cp equal chunks;
cp rank r keeps chunks r and 2cp-1-r, in that order, as its local sequence of seq / cp tokens
(`shard_sequence`, `load_balanced_positions`). Under a causal mask chunk j attends to j+1
chunks, so every rank does the same attention work: (r+1) + (2cp-r) = 2cp+1 chunk pairs. The
legality rule "2 x cp divides the sequence length" (planner/schema/plan.py) is exactly this cut.

Attention (`ContextParallel.attention`, called by runtime.model.Attention when `apply_cp` has
set its `cp` attribute). Each rank computes q, k and v of its own tokens with rotary
embeddings at their GLOBAL positions, all-gathers k and v (one collective for both) over the cp
group, puts the gathered chunks back into global sequence order and runs
scaled_dot_product_attention of its local queries against all seq keys with an explicit
boolean mask (query's global position >= key's global position). The all-gather is an
autograd Function: all-gather forward, reduce-scatter (sum) of the k / v gradients backward,
so each rank receives the gradient of its own k and v from every rank's queries. Data
parallelism already reduces gradients over dp_cp (runtime/mesh.py: replicate / ZeRO average
over "dp_cp", FSDP shards over "dp_shard_cp"), and every cp rank holds the same number of
tokens, so the average of the cp ranks' per-token-mean losses is the micro-batch's mean loss
and the averaged gradient its gradient (with padding, a mean of per-rank means, as over dp).

Grouped-query attention: k / v travel with kv_heads heads (the gather moves kv_heads, not
heads). On the CPU the kernel repeats them itself (enable_gqa). On other devices the gathered
k / v are repeated to the query heads before the kernel: the CUDA kernel that takes an
arbitrary mask (memory-efficient) does not accept fewer kv heads, and SDPA would fall back to
the math kernel (seq/cp x seq scores per head in memory). The price: the repeated copies,
heads / kv_heads times the gathered K/V, are what the kernel keeps for backward. Tensor
parallelism splits heads over "tp", a different mesh axis: each tp rank gathers its own heads
over its cp group.

Communication, and the cost model. planner/cost/step.py charges context parallelism as ring
passes of K and V: per layer and micro-batch, (cp-1) point-to-point steps of this rank's
K and V (2 x b x seq/cp x kv_heads/tp x head_dim elements), 3 passes (forward; backward K/V
again and their gradients) plus 1 under full recompute. Each collective here moves the bytes
of one such pass: the forward all-gather receives (cp-1)/cp of the layer's K and V, the
backward reduce-scatter of their gradients sends as much. That is 2 passes (3 under full
recompute, whose re-run forward gathers again; selective recompute keeps the gathered k / v
as the kernel's saved input and does not), so the cost model's 3 (+1) is an upper bound for
this implementation. Other differences: one collective per layer and direction instead of
cp-1 steps overlapped with blocks of attention, and the whole sequence's K and V held at once
and kept for backward (2 x b x seq x kv_heads/tp x head_dim per layer, x heads/kv_heads on
GPUs: see above) where a ring keeps only the local ones. The plan's `communicators.cp` entry
(planner/emit.py) still says op send_recv, ring, bytes_per_step 0.

Pipeline parallelism: stages pass hidden states of seq / cp tokens (build_schedule's
microbatch_shape is (mbs, seq / cp)); the cp ranks of one stage run the same schedule, so their
collectives line up.

Limits: a global sequence longer than the rotary table (spec.seq_len) fails, as without cp.
torch.compile of a block works (checked on the CPU: same losses).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["apply_cp", "shard_sequence", "load_balanced_positions", "ContextParallel", "all_gather_kv",
           "local_causal_attention"]


def load_balanced_positions(seq_len: int, cp_rank: int, cp_size: int, device=None) -> torch.Tensor:
    """Global positions (int64, length seq_len / cp_size) of the tokens cp rank `cp_rank` holds:
    chunk cp_rank, then chunk 2 cp_size - 1 - cp_rank, of the sequence cut into 2 cp_size."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp rank {cp_rank} outside a cp group of {cp_size}")
    if seq_len % (2 * cp_size):
        raise ValueError(f"2 x cp ({2 * cp_size}) must divide the sequence length ({seq_len})")
    c = seq_len // (2 * cp_size)
    first, second = cp_rank * c, (2 * cp_size - 1 - cp_rank) * c
    return torch.cat((torch.arange(first, first + c, device=device), torch.arange(second, second + c, device=device)))


def shard_sequence(batch: torch.Tensor, cp_rank: int, cp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This cp rank's load-balanced slices (inputs, targets) of a micro-batch
    batch [mbs, seq + 1]: inputs = batch[:, :-1] and targets = batch[:, 1:] at the positions
    load_balanced_positions(seq, cp_rank, cp_size), each [mbs, seq / cp_size]. cp_size 1: the
    whole of both."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    if cp_size == 1:
        return inputs, targets
    pos = load_balanced_positions(inputs.shape[1], cp_rank, cp_size, device=batch.device)
    return inputs.index_select(1, pos), targets.index_select(1, pos)


class _GatherKV(torch.autograd.Function):
    """All-gather along a new leading dim of size cp (forward); reduce-scatter, sum, of the
    gradient (backward): rank r gets the sum over ranks of the gradient of its slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = x.new_empty((size * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x, group=group)
        return out.view(size, *x.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = grad.new_empty(grad.shape[1:])
        dist.reduce_scatter_single(out, grad.flatten(0, 1), group=ctx.group)
        return out, None, None


def all_gather_kv(x: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """Differentiable all-gather: x [...] -> [size, ...] (rank order); backward reduce-scatters."""
    return _GatherKV.apply(x, group, size)


def _global_order(size: int, device=None) -> torch.Tensor:
    """Index into the gathered (rank, half) chunks, flattened as 2 rank + half, giving global
    chunk order: chunk j < size is rank j's first half, chunk j >= size rank 2size-1-j's second."""
    return torch.tensor([2 * j if j < size else 2 * (2 * size - 1 - j) + 1 for j in range(2 * size)], device=device)


def local_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                           repeat_kv: bool) -> torch.Tensor:
    """Attention of local queries q [b, hq, s_local, d] at global positions q_pos [s_local]
    against the whole sequence's keys / values k, v [b, hkv, seq, d] in global order, causal.
    repeat_kv: repeat kv heads to the query heads before the kernel (else enable_gqa)."""
    seq = k.shape[2]
    mask = q_pos[:, None] >= torch.arange(seq, device=q.device)[None, :]
    gqa = q.shape[1] != k.shape[1]
    if gqa and repeat_kv:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        gqa = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class ContextParallel:
    """What a module needs to run under context parallelism: the cp group, this rank's place
    in it, and the attention with gathered K/V. Shared by every Attention of a model part."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int):
        self.group, self.rank, self.size = group, rank, size
        self._positions: dict[tuple[int, str], torch.Tensor] = {}
        self._order: dict[str, torch.Tensor] = {}

    def positions(self, local_len: int, device) -> torch.Tensor:
        """Global positions of this rank's `local_len` tokens (cached per length and device)."""
        key = (local_len, str(device))
        if key not in self._positions:
            self._positions[key] = load_balanced_positions(local_len * self.size, self.rank, self.size, device=device)
        return self._positions[key]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """q [b, s, hq, d], k and v [b, s, hkv, d] of this rank's s = seq / cp tokens, before
        rotary embeddings; returns the attention output [b, s, hq, d]."""
        from runtime.model import apply_rope

        s = k.shape[1]
        pos = self.positions(s, q.device)
        if rope is not None:  # rotary embeddings at the tokens' global positions
            cos, sin = rope[0][pos], rope[1][pos]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gathered = all_gather_kv(torch.stack((k, v)), self.group, self.size)  # [cp, 2, b, s, hkv, d]
        # Local sequence = [first chunk | second chunk]: back into global chunk order.
        chunks = gathered.unflatten(3, (2, s // 2)).permute(1, 2, 0, 3, 4, 5, 6)  # [2, b, cp, 2, c, hkv, d]
        order = self._order.get(str(q.device))
        if order is None:
            order = self._order[str(q.device)] = _global_order(self.size, q.device)
        chunks = chunks.flatten(2, 3).index_select(2, order)
        kv = chunks.flatten(2, 3)  # [2, b, seq, hkv, d], global order
        out = local_causal_attention(q.transpose(1, 2), kv[0].transpose(1, 2), kv[1].transpose(1, 2), pos,
                                     repeat_kv=q.device.type != "cpu")
        return out.transpose(1, 2)


def apply_cp(model: nn.Module, cp_mesh: DeviceMesh) -> None:
    """Context parallelism over `cp_mesh` (the 1-D "cp" axis) for `model` (a ProteinLM or a
    pipeline chunk of one), in place: sets `cp` on the model (learned positions) and on every
    Attention module. A no-op when the axis has one rank. Call after apply_tp, before
    recompute, compile and data parallelism; inputs must then be shard_sequence slices."""
    size = cp_mesh.size()
    if size == 1:
        return
    from runtime.model import Attention

    ctx = ContextParallel(cp_mesh.get_group(), cp_mesh.get_local_rank(), size)
    model.cp = ctx
    for m in model.modules():
        if isinstance(m, Attention):
            m.cp = ctx
