"""The protein language model in flax.linen, the same network as runtime/model.py.

Same blocks (RMSNorm or LayerNorm, rotary or learned positions, grouped-query attention,
SwiGLU or GELU MLP, untied or tied head), same parameter names and shapes as the torch
model: a linear layer holds `weight` of shape (out, in) and computes x @ weight.T, so a
torch state dict converts by renaming `layers.3.` to `layers_3/` (`from_torch_names`).

Every parameter and the activations between layers carry *logical* axis names ("embed",
"heads", "mlp", "vocab", "batch", "seq", ...); jaxrt/sharding.py maps them onto the plan's
mesh axes with one rule table per sharding strategy. The forward casts the fp32 parameters
to the compute dtype (bf16 under a bf16 plan) at their use; the loss runs in fp32.

Recompute (`remat`): "full" keeps only each block's input (jax.checkpoint with nothing
saveable); "selective" keeps the matmuls against weights and recomputes the attention core
(`dots_with_no_batch_dims_saveable`: the score and value matmuls have batch dimensions),
as Korthikanti et al. 2022 recompute it; "selective-op" keeps what the torch runtime's
per-op policy keeps (runtime/parallel/recompute.py): the q and v projections, the attention
output, the first MLP projection and, with SwiGLU, the down projection, each named with
`checkpoint_name` and saved by `save_only_these_names`; k, o, up and every elementwise op
are recomputed.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxrt.preflight import attention_choice
from jaxrt.sharding import constrain
from planner.schema.specs import ModelSpec
from planner.schema.vocab import PAD_ID

NORM_EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}  # torch's RMSNorm above / nn.LayerNorm defaults


@dataclasses.dataclass(frozen=True)
class Dims:
    """What the network needs of a ModelSpec, hashable (a linen attribute)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    activation: str
    norm: str
    position: str
    tied_embeddings: bool

    @classmethod
    def of(cls, spec: ModelSpec) -> "Dims":
        return cls(spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn_hidden,
                   spec.vocab_size, spec.seq_len, spec.activation, spec.norm, spec.position, spec.tied_embeddings)


def _normal(std: float):
    return nn.initializers.normal(stddev=std)


class Linear(nn.Module):
    """y = x @ weight.T, weight (out, in) in fp32, used in the compute dtype."""

    features: int
    axes: tuple[str, str]
    std: float
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        w = self.param("weight", nn.with_logical_partitioning(_normal(self.std), self.axes),
                       (self.features, x.shape[-1]), jnp.float32)
        return jnp.einsum("...i,oi->...o", x.astype(self.dtype), w.astype(self.dtype))


class Norm(nn.Module):
    kind: str
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        dim = x.shape[-1]
        w = self.param("weight", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)), (dim,), jnp.float32)
        xf = x.astype(jnp.float32)
        if self.kind == "rmsnorm":  # torch: (x.float() * rsqrt(mean(x^2) + eps)).type_as(x) * weight
            out = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + NORM_EPS["rmsnorm"])
            return out.astype(self.dtype) * w.astype(self.dtype)
        b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)), (dim,), jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        out = (xf - mean) * jax.lax.rsqrt(var + NORM_EPS["layernorm"]) * w + b
        return out.astype(self.dtype)


def rope_tables(head_dim: int, seq_len: int, theta: float = 10000.0):
    """cos and sin of shape (seq_len, head_dim / 2), as runtime/model.rope_tables."""
    inv = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = jnp.outer(jnp.arange(seq_len, dtype=jnp.float32), inv)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate the pairs (x[..., 2i], x[..., 2i + 1]); x is (batch, seq, heads, head_dim)."""
    s = x.shape[1]
    c, n = cos[None, :s, None, :], sin[None, :s, None, :]
    xf = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
    a, b = xf[..., 0], xf[..., 1]
    return jnp.stack((a * c - b * n, a * n + b * c), axis=-1).reshape(x.shape).astype(x.dtype)


def attention_implementation(dtype) -> str:
    """The kernel `attention` asks for: EXAPLAN_JAX_ATTENTION (xla or cudnn) where set, else
    cuDNN's fused flash attention on GPUs in bf16 or fp16 and XLA's einsums elsewhere. jax's
    own default (implementation=None) is XLA's einsums everywhere, which hold every score
    matrix (batch x heads x seq^2) in memory."""
    choice = attention_choice()
    if choice:
        return choice
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if half and jax.default_backend() == "gpu" else "xla"


# Why cuDNN's attention did not run where `attention_implementation` picked it (one entry per
# refusal at trace time; empty where it ran or was never picked): `attention_in_use` reads it.
_CUDNN_REFUSED: list[str] = []


def attention_in_use(dtype) -> str:
    """The kernel `attention` ran with, once a step has been traced: `attention_implementation`,
    or "xla (cuDNN refused: ...)" where cuDNN's kernel was picked and refused the shapes."""
    impl = attention_implementation(dtype)
    if impl == "cudnn" and attention_choice() is None and _CUDNN_REFUSED:
        return f"xla (cuDNN refused: {_CUDNN_REFUSED[-1]})"
    return impl


def attention(q, k, v):
    """Causal attention; cuDNN's kernel where `attention_implementation` picks it and it
    takes these shapes (else XLA's: on ROCm, or a head dimension cuDNN does not run),
    unless EXAPLAN_JAX_ATTENTION asks for it explicitly."""
    impl = attention_implementation(q.dtype)
    if impl == "cudnn" and attention_choice() is None:  # picked here, not asked for: fall back where it refuses
        try:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        except (RuntimeError, ValueError, NotImplementedError) as e:
            warnings.warn(f"cuDNN attention does not run here ({e}); XLA's einsums instead", stacklevel=2)
            _CUDNN_REFUSED.append((str(e).strip().splitlines() or [type(e).__name__])[0][:200])
            impl = "xla"
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)


class Attention(nn.Module):
    dims: Dims
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x, rope):
        d = self.dims
        b, s, _ = x.shape
        out_std = 0.02 / math.sqrt(2 * d.layers)
        q = checkpoint_name(Linear(d.heads * d.head_dim, ("heads", "embed"), 0.02, self.dtype, name="wq")(x), "op_q")
        k = Linear(d.kv_heads * d.head_dim, ("kv_heads", "embed"), 0.02, self.dtype, name="wk")(x)
        v = checkpoint_name(Linear(d.kv_heads * d.head_dim, ("kv_heads", "embed"), 0.02, self.dtype, name="wv")(x), "op_v")
        q = q.reshape(b, s, d.heads, d.head_dim)
        k = k.reshape(b, s, d.kv_heads, d.head_dim)
        v = v.reshape(b, s, d.kv_heads, d.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q = constrain(q, ("batch", "seq", "act_heads", None))
        k = constrain(k, ("batch", "seq", "act_kv_heads", None))
        v = constrain(v, ("batch", "seq", "act_kv_heads", None))
        # (batch, seq, heads, head_dim) in and out; grouped-query heads shared.
        out = checkpoint_name(attention(q, k, v), "op_attention")
        out = constrain(out.reshape(b, s, -1), ("batch", "seq", "act_heads"))
        return Linear(d.hidden, ("embed", "heads"), out_std, self.dtype, name="wo")(out)


class FeedForward(nn.Module):
    dims: Dims
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        d = self.dims
        out_std = 0.02 / math.sqrt(2 * d.layers)
        h = checkpoint_name(Linear(d.ffn_hidden, ("mlp", "embed"), 0.02, self.dtype, name="w1")(x), "op_gate")
        if d.activation == "swiglu":
            h = jax.nn.silu(h) * Linear(d.ffn_hidden, ("mlp", "embed"), 0.02, self.dtype, name="w3")(x)
        else:
            h = jax.nn.gelu(h, approximate=True)
        h = constrain(h, ("batch", "seq", "act_mlp"))
        out = Linear(d.hidden, ("embed", "mlp"), out_std, self.dtype, name="w2")(h)
        # the 7th matmul of a SwiGLU block, kept; a GELU block's down projection is its 6th
        return checkpoint_name(out, "op_down") if d.activation == "swiglu" else out


class Block(nn.Module):
    dims: Dims
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x, rope):
        # The residual stream is ("batch", "act_seq", "act_embed"): split over the sequence
        # between the matmuls under sequence parallelism (the rules map act_seq to tp).
        h = Norm(self.dims.norm, self.dtype, name="attention_norm")(x)
        x = x + Attention(self.dims, self.dtype, name="attention")(h, rope)
        x = constrain(x, ("batch", "act_seq", "act_embed"))
        h = Norm(self.dims.norm, self.dtype, name="ffn_norm")(x)
        x = x + FeedForward(self.dims, self.dtype, name="feed_forward")(h)
        return constrain(x, ("batch", "act_seq", "act_embed"))


REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "selective": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "selective-op": jax.checkpoint_policies.save_only_these_names("op_q", "op_v", "op_attention", "op_gate", "op_down"),
}


class ProteinLM(nn.Module):
    """tokens (batch, seq) int32 -> logits (batch, seq, vocab) in the compute dtype."""

    dims: Dims
    dtype: jnp.dtype = jnp.float32
    remat: str = "none"

    @nn.compact
    def __call__(self, tokens):
        d = self.dims
        emb = self.param("tok_embeddings", nn.with_logical_partitioning(_normal(0.02), ("vocab", "embed")),
                         (d.vocab_size, d.hidden), jnp.float32)
        h = jnp.take(emb, tokens, axis=0).astype(self.dtype)
        if d.position == "learned":
            pos = self.param("pos_embeddings", nn.with_logical_partitioning(_normal(0.02), ("pos", "embed")),
                             (d.seq_len, d.hidden), jnp.float32)
            h = h + pos[: tokens.shape[1]].astype(self.dtype)[None]
        h = constrain(h, ("batch", "act_seq", "act_embed"))
        # the job may train sequences longer than the model's context (torch: setup_rope covers both)
        rope = rope_tables(d.head_dim, max(d.seq_len, tokens.shape[1])) if d.position == "rope" else None
        block = Block
        if self.remat != "none":
            block = nn.remat(Block, policy=REMAT_POLICIES[self.remat], prevent_cse=True)
        for i in range(d.layers):
            h = block(d, self.dtype, name=f"layers_{i}")(h, rope)
        h = Norm(d.norm, self.dtype, name="norm")(h)
        h = constrain(h, ("batch", "seq", "act_embed"))
        if d.tied_embeddings:
            logits = jnp.einsum("bsi,vi->bsv", h, emb.astype(self.dtype))
        else:
            logits = Linear(d.vocab_size, ("vocab", "embed"), 0.02, self.dtype, name="output")(h)
        return constrain(logits, ("batch", "seq", "act_vocab"))


def token_losses(logits, targets):
    """Per-token next-token cross entropy in fp32 and the mask of non-<pad> targets."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask = (targets != PAD_ID).astype(jnp.float32)
    return nll * mask, mask


def blockwise_loss(logits, targets, blocks: int):
    """The mean over `blocks` equal row blocks of the batch (the data-parallel ranks' micro-
    batches) of each block's mean loss over its non-<pad> targets: what the torch runtime's
    ranks compute, each `loss_fn` on its micro-batch, then averaged over the ranks."""
    nll, mask = token_losses(logits, targets)
    nll = nll.reshape(blocks, -1).sum(axis=1)
    count = mask.reshape(blocks, -1).sum(axis=1)
    return jnp.mean(nll / count)


# ------------------------------------------------------------------------------ torch names


def torch_name_to_path(name: str) -> tuple[str, ...]:
    """`layers.3.attention.wq.weight` -> ("layers_3", "attention", "wq", "weight");
    `tok_embeddings.weight` -> ("tok_embeddings",)."""
    parts = name.split(".")
    if parts[0] in ("tok_embeddings", "pos_embeddings") and parts[1:] == ["weight"]:
        return (parts[0],)
    if parts[0] == "layers":
        parts = [f"layers_{parts[1]}", *parts[2:]]
    return tuple(parts)


def path_to_torch_name(path: tuple[str, ...]) -> str:
    """The inverse of torch_name_to_path."""
    if len(path) == 1 and path[0] in ("tok_embeddings", "pos_embeddings"):
        return f"{path[0]}.weight"
    head, *rest = path
    if head.startswith("layers_"):
        return ".".join(["layers", head.split("_", 1)[1], *rest])
    return ".".join(path)


def from_torch_state(state: dict, params_like) -> dict:
    """A torch ProteinLM state dict (name -> array-like, full tensors) as this model's param
    tree (numpy fp32), checked name by name and shape by shape against `params_like`."""
    import numpy as np

    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params_like)[0]:
        key = tuple(getattr(k, "key", str(k)) for k in path)
        name = path_to_torch_name(key)
        if name not in state:
            raise KeyError(f"the torch state has no {name!r}")
        value = np.asarray(state[name], dtype=np.float32)
        if value.shape != tuple(leaf.shape):
            raise ValueError(f"{name}: torch shape {value.shape}, this model {tuple(leaf.shape)}")
        flat[key] = value
    return _unflatten(flat)


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        for k in key[:-1]:
            node = node.setdefault(k, {})
        node[key[-1]] = value
    return out
