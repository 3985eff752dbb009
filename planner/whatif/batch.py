"""The global batch of a what-if sweep, and the critical-batch estimate it is checked against.

Estimate: DeepSeek LLM (DeepSeek-AI, "DeepSeek LLM: Scaling Open-Source Language Models with
Longtermism", arXiv:2401.02954, 2024, section 3.1, eq. 1), fitted on IsoFLOP sweeps:

    B_opt = 0.2920 * C ** 0.3271      (tokens per optimizer step)
    C     = M * D                     (FLOPs: M non-embedding FLOPs per token, D tokens)
    M     = 6 * N_non_embedding + 6 * n_layer * d_model * l_seq

(DeepSeek write M = 72 n_layer d_model^2 + 6 n_layer d_model l_seq, which is the form above for
their block, whose non-embedding parameters are 12 n_layer d_model^2; exaplan counts the
block's parameters as they are.) Past B_opt the loss reached for the same compute rises; it
is an estimate fitted on text, not a hard limit, and proteins may differ.

Fair comparison (the default): one global batch for every machine and node count of a model,
B_opt in sequences rounded down to m x 2^k, m the odd part of the least common multiple of
the machines' devices per node (3 when Aurora's 12 tiles are in the sweep), so that the
data-parallel degrees of every machine can divide it.
"""

from __future__ import annotations

import math

from planner.cost.flops import layer_params
from planner.schema.specs import ModelSpec

DEEPSEEK_COEFFICIENT = 0.2920
DEEPSEEK_EXPONENT = 0.3271
SOURCE = "DeepSeek LLM (arXiv:2401.02954, 2024), B_opt = 0.2920 C^0.3271 tokens, C = M D"


def flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """M: non-embedding training FLOPs per token, attention included (DeepSeek's measure)."""
    return 6.0 * model.layers * layer_params(model) + 6.0 * model.layers * model.hidden * seq_len


def critical_batch_tokens(model: ModelSpec, seq_len: int, tokens: float) -> float:
    """B_opt (tokens per step) for training `model` on `tokens` tokens."""
    return DEEPSEEK_COEFFICIENT * (flops_per_token(model, seq_len) * tokens) ** DEEPSEEK_EXPONENT


def odd_part_of_lcm(devices_per_node: list[int]) -> int:
    m = 1
    for d in devices_per_node:
        m = m * d // math.gcd(m, d)
    while m % 2 == 0:
        m //= 2
    return m


def default_global_batch(model: ModelSpec, seq_len: int, tokens: float, devices_per_node: list[int],
                         sequences_per_sample: int = 1) -> int:
    """The sweep's one global batch in samples (dpo: pairs of `sequences_per_sample` = 2
    sequences): B_opt rounded down to m x 2^k samples, at least m."""
    m = odd_part_of_lcm(devices_per_node)
    samples = critical_batch_tokens(model, seq_len, tokens) / (seq_len * sequences_per_sample)
    if samples < m:
        return m
    return m * 2 ** int(math.floor(math.log2(samples / m)))
