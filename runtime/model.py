"""The protein language model: a Llama-style decoder in one readable file.

RMSNorm (or LayerNorm), rotary (or learned) positions, grouped-query attention through
`scaled_dot_product_attention` (flash kernels on GPU), SwiGLU (or GELU) MLP, untied (or
tied) output head. Configured from the plan's ModelSpec; its parameter count and FLOPs equal
the planner's (tests/runtime/test_model.py holds both sides together).

Layout-independence: modules keep the same fully-qualified names under every technique
(blocks live in a ModuleDict keyed by their global index; a pipeline stage deletes the
blocks it does not run and sets the embedding/norm/head it does not own to None), and
`init_weights` draws every parameter from a generator seeded by (seed, name) on the full
tensor, then keeps this rank's shard: the same seed gives the same weights whatever the
layout.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from planner.schema.specs import ModelSpec
from planner.schema.vocab import PAD_ID


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def make_norm(spec: ModelSpec) -> nn.Module:
    return RMSNorm(spec.hidden) if spec.norm == "rmsnorm" else nn.LayerNorm(spec.hidden)


def rope_tables(head_dim: int, seq_len: int, theta: float = 10000.0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq_len, head_dim/2) for rotary position embeddings."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]); x is (batch, seq, heads, head_dim)."""
    s = x.shape[1]
    c, n = cos[:s].view(1, s, 1, -1), sin[:s].view(1, s, 1, -1)
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    out = torch.stack((a * c - b * n, a * n + b * c), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)
        # Context parallelism (runtime/parallel/context.py, set by apply_cp): None = off.
        self.cp = None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them.
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.cp is not None:
            # Context parallelism: x holds this rank's load-balanced slice of the sequence;
            # rotary embeddings at global positions, keys/values gathered over the cp group.
            return self.wo(self.cp.attention(q, k, v, rope).reshape(b, s, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.swiglu = spec.activation == "swiglu"
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)  # gate (SwiGLU) or up (GELU)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)  # down
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False) if self.swiglu else None  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = make_norm(spec)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class ProteinLM(nn.Module):
    """Decoder-only protein LM. forward(tokens) -> logits; a pipeline stage without the
    embedding takes hidden states, one without the head returns them."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden)
        self.pos_embeddings = nn.Embedding(spec.seq_len, spec.hidden) if spec.position == "learned" else None
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm = make_norm(spec)
        self.output = None if spec.tied_embeddings else nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None
        # Context parallelism (runtime/parallel/context.py, set by apply_cp): None = off.
        self.cp = None

    def setup_rope(self, device=None, seq_len: int | None = None) -> None:
        """Rotary tables (not parameters, not checkpointed): call after materialising. They
        cover the model's context and `seq_len`, the job's, where a plan trains longer ones."""
        if self.spec.position == "rope":
            length = max(self.spec.seq_len, seq_len or 0)
            self.rope_cos, self.rope_sin = rope_tables(self.spec.head_dim, length, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(x)
            if self.pos_embeddings is not None:
                if self.cp is None:
                    h = h + self.pos_embeddings(torch.arange(x.shape[1], device=x.device))
                else:  # context parallelism: x holds tokens at load-balanced global positions
                    h = h + self.pos_embeddings(self.cp.positions(x.shape[1], x.device))
        else:
            h = x
        rope = (self.rope_cos, self.rope_sin) if self.rope_cos is not None else None
        for block in self.layers.values():
            h = block(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        if self.spec.tied_embeddings and self.norm is not None and self.tok_embeddings is not None:
            return F.linear(h, self.tok_embeddings.weight)
        return h


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy in fp32, padding ignored."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1), ignore_index=PAD_ID)


def canonical_name(name: str) -> str:
    """A parameter's name with wrapper prefixes removed (DDP, checkpoint, compile)."""
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "module."):
        name = name.replace(junk, "")
    return name


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{canonical_name(name)}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def full_init(name: str, shape: tuple[int, ...], spec: ModelSpec, seed: int) -> torch.Tensor:
    """The full (unsharded) initial value of one parameter, on the CPU, fp32: norm scales 1,
    biases 0, every matrix N(0, 0.02), the residual-branch outputs (wo, w2) scaled down by
    1/sqrt(2 layers) (GPT-2's scheme)."""
    name = canonical_name(name)
    if name.endswith("norm.weight") or name == "norm.weight":
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    std = 0.02
    if name.endswith(("wo.weight", "w2.weight")):
        std = 0.02 / math.sqrt(2 * spec.layers)
    return torch.empty(shape).normal_(0.0, std, generator=_generator(seed, name))


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Initialise every parameter deterministically from (seed, name), whatever the layout:
    the full tensor is drawn, then this rank keeps its shard (DTensor) or the whole."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters():
        full = full_init(name, tuple(param.shape), spec, seed)
        if isinstance(param, DTensor):
            # Every rank drew the same full tensor: keep the local shard, no communication.
            local = distribute_tensor(full.to(param.device_mesh.device_type), param.device_mesh, param.placements,
                                      src_data_rank=None)
            param.copy_(local)
        else:
            param.copy_(full.to(param.device))
