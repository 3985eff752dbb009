"""Parameter and FLOP counts of a dense decoder-only transformer.

Conventions (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters", appendix; Megatron-LM's FLOP formula): a multiply-add is 2 FLOPs; the attention
core counts the full s x s score matrix (no causal halving); backward costs twice forward;
"model FLOPs" count forward + backward once, "hardware FLOPs" add what recompute repeats
(Chowdhery et al. 2022, MFU vs HFU). Per token unless the name says otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.schema.specs import ModelSpec

if TYPE_CHECKING:  # numpy is imported where arrays are made, not by `exaplan list`
    import numpy as np


def attention_params(m: ModelSpec) -> int:
    """Q and output projections h x h each; K and V h x (kv_heads * head_dim) each (GQA)."""
    kv = m.kv_heads * m.head_dim
    return 2 * m.hidden * m.hidden + 2 * m.hidden * kv


def mlp_params(m: ModelSpec) -> int:
    """SwiGLU: gate, up (h x f) and down (f x h); GELU: up and down."""
    mats = 3 if m.activation == "swiglu" else 2
    return mats * m.hidden * m.ffn_hidden


def norm_params(m: ModelSpec) -> int:
    """Two norms per block: RMSNorm has a scale, LayerNorm a scale and a bias."""
    return 2 * m.hidden * (1 if m.norm == "rmsnorm" else 2)


def layer_params(m: ModelSpec) -> int:
    return attention_params(m) + mlp_params(m) + norm_params(m)


def embedding_params(m: ModelSpec) -> int:
    """Token embedding (+ learned positions)."""
    pos = m.seq_len * m.hidden if m.position == "learned" else 0
    return m.vocab_size * m.hidden + pos


def head_params(m: ModelSpec) -> int:
    """Final norm, plus the output projection unless tied to the embedding."""
    final_norm = m.hidden * (1 if m.norm == "rmsnorm" else 2)
    return final_norm + (0 if m.tied_embeddings else m.vocab_size * m.hidden)


def total_params(m: ModelSpec) -> int:
    return m.layers * layer_params(m) + embedding_params(m) + head_params(m)


# --- FLOPs per token, forward pass -------------------------------------------------------


def qkv_flops(m: ModelSpec) -> float:
    return 2.0 * m.hidden * (m.hidden + 2 * m.kv_heads * m.head_dim)


def attention_core_flops(m: ModelSpec, seq_len: int) -> float:
    """Scores Q K^T and context P V: 2 matmuls of 2 * s * d_head per head."""
    return 4.0 * seq_len * m.hidden


def out_proj_flops(m: ModelSpec) -> float:
    return 2.0 * m.hidden * m.hidden


def mlp_flops(m: ModelSpec) -> float:
    return 2.0 * mlp_params(m)


def down_proj_flops(m: ModelSpec) -> float:
    """The MLP's last GEMM, f -> h: a block's last, which an early-stopping recompute skips."""
    return 2.0 * m.hidden * m.ffn_hidden


def layer_forward_flops(m: ModelSpec, seq_len: int) -> float:
    return qkv_flops(m) + attention_core_flops(m, seq_len) + out_proj_flops(m) + mlp_flops(m)


def head_forward_flops(m: ModelSpec) -> float:
    """Logits: 2 * h * V (the embedding lookup costs no FLOPs)."""
    return 2.0 * m.hidden * m.vocab_size


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token, forward + backward (3x forward), no recompute."""
    return 3.0 * (m.layers * layer_forward_flops(m, seq_len) + head_forward_flops(m))


def reference_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """dpo: a frozen reference model's forward per token (1x forward)."""
    return m.layers * layer_forward_flops(m, seq_len) + head_forward_flops(m)


def six_n_flops_per_token(m: ModelSpec) -> float:
    """The 6 N convention (N = parameters less the embedding lookup's): what published
    figures usually quote, with no attention term and, for dpo, the policy alone."""
    return 6.0 * (total_params(m) - embedding_params(m))


def step_flops(m: ModelSpec, job) -> dict[str, float]:
    """Model FLOPs of one optimizer step, both ways: `executed` as the trainer runs them
    (policy forward + backward with attention, plus the reference's forward when it runs in
    the step) and `six_n` = 6 N x the tokens the policy trains on (both sequences of each
    dpo pair), so that published figures can be compared either way."""
    tokens = job.tokens_per_step
    ref = reference_flops_per_token(m, job.seq_len) if job.reference_in_step else 0.0
    return {
        "tokens": float(tokens),
        "executed": (model_flops_per_token(m, job.seq_len) + ref) * tokens,
        "policy": model_flops_per_token(m, job.seq_len) * tokens,
        "reference": ref * tokens,
        "six_n": six_n_flops_per_token(m) * tokens,
    }


def op_recomputed_gemms(m: ModelSpec, early_stop: bool = False) -> list[tuple[float, float]]:
    """(N, K) of the forward GEMMs (tokens x K) @ (K x N) that selective-op recompute repeats:
    torchtitan's per-op policy (runtime/parallel/recompute.py) keeps the output of every other
    matmul in the block's order q, k, v, o, then gate, up, down (SwiGLU) or up, down (GELU),
    so it recomputes k, o and SwiGLU's up projection, or GELU's down projection, the block's
    last GEMM, which an early-stopping replay never reaches (compute.layer_times)."""
    kv = m.kv_heads * m.head_dim
    second_mlp = [(m.ffn_hidden, m.hidden)] if m.activation == "swiglu" else ([] if early_stop else [(m.hidden, m.ffn_hidden)])
    return [(kv, m.hidden), (m.hidden, m.hidden)] + second_mlp


def recompute_flops_per_token(m: ModelSpec, seq_len: int, recompute, early_stop: bool = False) -> np.ndarray:
    """FLOPs repeated in backward: full = every block's forward again (with early_stop, less
    its last GEMM, the down projection: planner/cost/compute.py layer_times); selective = the
    attention core only (Korthikanti et al. 2022, section 5); selective-op = the GEMMs of
    op_recomputed_gemms (with a fused attention kernel, whose output it keeps)."""
    import numpy as np

    from planner.cost.layout import RC_FULL, RC_OP, RC_SELECTIVE

    rc = np.asarray(recompute)
    full = layer_forward_flops(m, seq_len) - (down_proj_flops(m) if early_stop else 0.0)
    op = sum(2.0 * n * k for n, k in op_recomputed_gemms(m, early_stop))
    per_layer = np.where(
        rc == RC_FULL,
        full,
        np.where(rc == RC_SELECTIVE, attention_core_flops(m, seq_len), np.where(rc == RC_OP, op, 0.0)),
    )
    return m.layers * per_layer


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute, early_stop: bool = False) -> np.ndarray:
    return model_flops_per_token(m, seq_len) + recompute_flops_per_token(m, seq_len, recompute, early_stop)


def megatron_flops_per_token(m: ModelSpec, seq_len: int, full_recompute: bool = False) -> float:
    """Megatron-LM's published formula for GPT models (4h MLP, MHA):
    72 (or 96 with full recompute) * l * h^2 * (1 + s/(6h)) + 6 h V per token."""
    factor = 96.0 if full_recompute else 72.0
    h, l = m.hidden, m.layers
    return factor * l * h * h * (1 + seq_len / (6.0 * h)) + 6.0 * h * m.vocab_size
