"""Parameter and FLOP counts, by hand from the architecture and against published figures.

Hand counts are exact integers: they must equal planner.cost.flops exactly. Published sizes
are nominal (rounded names, a 32k-token vocabulary in the originals), so they are checked
within a stated relative tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.cost import flops
from planner.cost.layout import RC_FULL, RC_NONE, RC_SELECTIVE
from planner.presets import MODEL_PRESETS, PROTEIN_VOCAB_PADDED, get_model
from planner.schema.specs import ModelSpec


def llama_params_by_hand(layers: int, h: int, f: int, heads: int, kv_heads: int, vocab: int) -> int:
    """Llama block: Q and O (h x h), K and V (h x kv_heads * head_dim), SwiGLU gate/up/down
    (3 h f), two RMSNorm scales (2h); plus the embedding (V h), final RMSNorm (h) and an
    untied output head (V h). No biases."""
    head_dim = h // heads
    attn = 2 * h * h + 2 * h * kv_heads * head_dim
    block = attn + 3 * h * f + 2 * h
    return layers * block + vocab * h + h + vocab * h


# (preset, published nominal size, relative tolerance, where the figure comes from)
PUBLISHED = [
    # MProt-DPO launch scripts state 3.24e9 for the "3.5B" model: same architecture, so 0.5%.
    ("protein-3.5b", 3.24e9, 0.005),
    # Llama-2-7B's 6.74e9 includes 2 x 32000 x 4096 = 0.26e9 of vocabulary; the protein model
    # without it is ~6.48e9. Nominal 6.5e9, 1%.
    ("protein-7b", 6.5e9, 0.01),
    # Llama-2-70B is 6.9e10 with a 32k vocabulary (0.52e9 of it); here 6.85e10. 1%.
    ("protein-70b", 6.9e10, 0.01),
]


@pytest.mark.parametrize("name", ["protein-3.5b", "protein-7b", "protein-70b", "protein-small", "protein-tiny"])
def test_preset_params_equal_hand_count(name):
    m = MODEL_PRESETS[name]
    assert m.vocab_size == PROTEIN_VOCAB_PADDED == 32
    assert (m.activation, m.norm, m.position, m.tied_embeddings) == ("swiglu", "rmsnorm", "rope", False)
    expected = llama_params_by_hand(m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.vocab_size)
    assert flops.total_params(m) == expected


def test_protein_3_5b_written_out():
    # 16 x (4 h^2 + 3 h f + 2 h) + 2 V h + h, h = 4096, f = 11008, V = 32, MHA.
    h, f = 4096, 11008
    per_block = 4 * h * h + 3 * h * f + 2 * h
    assert per_block == 202_383_360
    total = 16 * per_block + 2 * 32 * h + h
    assert total == 3_238_400_000
    assert flops.total_params(get_model("protein-3.5b")) == total


@pytest.mark.parametrize("name,nominal,rel", PUBLISHED)
def test_published_sizes(name, nominal, rel):
    assert flops.total_params(MODEL_PRESETS[name]) == pytest.approx(nominal, rel=rel)


def test_small_presets_are_cpu_sized():
    # presets.py promises "about 25M and 1M": small within 20-30M, tiny within 0.5-1.5M.
    assert 20e6 <= flops.total_params(MODEL_PRESETS["protein-small"]) <= 30e6
    assert 0.5e6 <= flops.total_params(MODEL_PRESETS["protein-tiny"]) <= 1.5e6


def _gpt(layers=24, hidden=1024, heads=16, vocab=51200, seq=2048) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden, vocab_size=vocab,
                     seq_len=seq, activation="gelu", norm="layernorm", position="learned", tied_embeddings=False)


@pytest.mark.parametrize("layers,hidden,heads,vocab,seq", [
    (24, 1024, 16, 51200, 2048),  # GPT-2 medium-like
    (96, 12288, 96, 51200, 2048),  # GPT-3 175B
    (4, 128, 4, 32, 128),
])
def test_megatron_formula_equals_model_flops(layers, hidden, heads, vocab, seq):
    """Narayanan et al. 2021, eq. 3 per token: 72 l h^2 (1 + s/(6h) + V/(12 h l)). With a
    GELU 4h MLP and MHA our count is exactly this (3 x forward, full s x s scores)."""
    m = _gpt(layers, hidden, heads, vocab, seq)
    by_hand = 72.0 * layers * hidden**2 * (1 + seq / (6.0 * hidden) + vocab / (12.0 * hidden * layers))
    # Both sides are sums of exact products of integers below 2**53 -> agree to rounding.
    assert flops.model_flops_per_token(m, seq) == pytest.approx(by_hand, rel=1e-12)
    assert flops.megatron_flops_per_token(m, seq) == pytest.approx(by_hand, rel=1e-12)
    # With full recompute Megatron's 96 replaces 72 on the block term: our hardware FLOPs.
    by_hand_rc = 96.0 * layers * hidden**2 * (1 + seq / (6.0 * hidden)) + 6.0 * hidden * vocab
    assert float(flops.hardware_flops_per_token(m, seq, RC_FULL)) == pytest.approx(by_hand_rc, rel=1e-12)
    assert flops.megatron_flops_per_token(m, seq, full_recompute=True) == pytest.approx(by_hand_rc, rel=1e-12)


def test_gpt_params_by_hand():
    # GPT block: 4h^2 + 8h^2 weights, biases 4h (qkv 3h + o h) + 5h (4h + h), 2 LayerNorms 4h.
    # This model has no linear biases, so 12 h^2 + 4h; learned positions s h; untied head.
    m = _gpt(24, 1024, 16, 51200, 2048)
    h = 1024
    expected = 24 * (12 * h * h + 4 * h) + 51200 * h + 2048 * h + 2 * h + 51200 * h
    assert flops.total_params(m) == expected


def test_model_flops_close_to_6N_for_short_sequences():
    # 6 N per token ignores the attention core (12 l s h); for s << h the two agree.
    m = get_model("protein-3.5b")
    s = 512
    six_n = 6.0 * (flops.total_params(m) - flops.embedding_params(m))  # lookups cost nothing
    attention_core = 3.0 * m.layers * 4.0 * s * m.hidden
    assert flops.model_flops_per_token(m, s) == pytest.approx(six_n + attention_core, rel=1e-4)


def test_gqa_reduces_kv_params():
    mha = get_model("protein-70b").model_copy(update={"kv_heads": 64})
    gqa = get_model("protein-70b")
    assert gqa.kv_heads == 8
    h, d = gqa.hidden, gqa.head_dim
    saved_per_layer = 2 * h * (64 - 8) * d  # K and V shrink from 64 to 8 heads
    assert flops.attention_params(mha) - flops.attention_params(gqa) == saved_per_layer
    assert flops.total_params(mha) - flops.total_params(gqa) == gqa.layers * saved_per_layer
    assert flops.qkv_flops(mha) - flops.qkv_flops(gqa) == 2.0 * saved_per_layer
    # Q and the output projection do not change.
    assert flops.attention_params(gqa) == 2 * h * h + 2 * h * 8 * d


def test_tied_embeddings_drop_the_head_matrix():
    m = get_model("protein-small")
    tied = m.model_copy(update={"tied_embeddings": True})
    assert flops.total_params(m) - flops.total_params(tied) == m.vocab_size * m.hidden


@pytest.mark.parametrize("name", ["protein-3.5b", "protein-70b", "protein-tiny"])
def test_recompute_hardware_flops_exceed_model_flops(name):
    m = get_model(name)
    s = m.seq_len
    model = flops.model_flops_per_token(m, s)
    hw = flops.hardware_flops_per_token(m, s, np.array([RC_NONE, RC_SELECTIVE, RC_FULL]))
    assert hw[0] == model
    assert model < hw[1] < hw[2]
    # Selective repeats the attention core; full repeats every block's forward.
    assert hw[1] - model == pytest.approx(m.layers * 4.0 * s * m.hidden, rel=1e-12)
    assert hw[2] - model == pytest.approx(m.layers * flops.layer_forward_flops(m, s), rel=1e-12)
    # Full recompute: blocks cost 4 forwards instead of 3 -> ratio just under 4/3.
    assert 1.3 < hw[2] / model < 4 / 3


def test_early_stop_takes_the_down_projection_out_of_full_recompute_flops():
    from planner.cost.layout import RC_FULL, RC_NONE, RC_SELECTIVE

    m, s = get_model("protein-3.5b"), 512
    rc = np.array([RC_NONE, RC_SELECTIVE, RC_FULL])
    saved = flops.hardware_flops_per_token(m, s, rc) - flops.hardware_flops_per_token(m, s, rc, early_stop=True)
    assert list(saved) == [0.0, 0.0, 2.0 * m.hidden * m.ffn_hidden * m.layers]
