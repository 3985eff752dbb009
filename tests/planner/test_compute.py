"""Compute time of a block (planner/cost/compute.py): the attention core's backward by kernel,
elementwise traffic by what the model has, and the attention factor's place in it."""

from __future__ import annotations

import pytest

from machine_models import load_machine
from planner.cost import compute
from planner.cost.layout import Layouts
from planner.presets import get_model
from planner.schema.specs import Precision, TrainingJob

MODEL = get_model("protein-7b")
H100 = load_machine("dgx-h100")
EXACT = dict(rel=1e-12, abs=0.0)


def job(seq=4096) -> TrainingJob:
    return TrainingJob(global_batch=64, seq_len=seq, precision=Precision.bf16)


def parts(machine, lay, model=MODEL, seq=4096):
    j = job(seq)
    attn = float(compute.attention_core_time(model, machine, j, lay)[0])
    dense = float(compute.dense_time(model, machine, j, lay)[0])
    elem = float(compute.elementwise_bytes(model, machine, j, lay)[0]) / (machine.memory_bandwidth_gbyte_s * 1e9)
    f, fb = (float(x[0]) for x in compute.layer_times(model, machine, j, lay))
    return attn, dense, elem, f, fb


def test_flash_backward_recomputes_the_scores():
    """FlashAttention-2 (Dao 2023): 5 backward GEMMs against 2 forward, 2.5 x forward; GEMMs
    and elementwise work 2 x forward."""
    lay = Layouts.one(dp=8, mbs=1)
    attn, dense, elem, f, fb = parts(H100, lay)
    assert f == pytest.approx(attn + dense + elem, **EXACT)
    assert fb == pytest.approx(3 * (dense + elem) + 3.5 * attn, **EXACT)
    # Selective recompute repeats the attention core's forward; full recompute the whole forward.
    _, _, _, _, fb_sel = parts(H100, Layouts.one(dp=8, mbs=1, recompute="selective"))
    _, _, _, _, fb_full = parts(H100, Layouts.one(dp=8, mbs=1, recompute="full"))
    assert fb_sel - fb == pytest.approx(attn, **EXACT)
    assert fb_full - fb == pytest.approx(f, **EXACT)


def test_unfused_attention_backward_is_twice_its_forward():
    unfused = H100.model_copy(update={"flash_attention": False})
    attn, dense, elem, _, fb = parts(unfused, Layouts.one(dp=8, mbs=1))
    assert fb == pytest.approx(3 * (dense + elem + attn), **EXACT)
    # It computes the whole score matrix (flash skips the masked half) and moves it through memory.
    flash_attn, _, flash_elem, _, _ = parts(H100, Layouts.one(dp=8, mbs=1))
    assert attn == pytest.approx(2 * flash_attn, **EXACT)
    scores = 32 * 4096 * 4096  # heads x s x s, one sequence
    assert elem - flash_elem == pytest.approx(4 * scores * 2 / (H100.memory_bandwidth_gbyte_s * 1e9), rel=1e-9)


def test_attention_factor_scales_the_attention_core_only():
    lay = Layouts.one(dp=8, mbs=1)
    slow = H100.model_copy(update={"attention_efficiency_factor": H100.attention_efficiency_factor / 2})
    a1, d1, e1, _, _ = parts(H100, lay)
    a2, d2, e2, _, _ = parts(slow, lay)
    assert a2 == pytest.approx(2 * a1, **EXACT)
    assert (d2, e2) == (d1, e1)


def test_rope_traffic_only_for_rotary_positions():
    """Learned positions are added once at the embedding, not in every block: their blocks
    move 2 T (h + kv) elements less."""
    lay = Layouts.one(dp=8, mbs=1)
    learned = MODEL.model_copy(update={"position": "learned"})
    j = job()
    rope_bytes = float(compute.elementwise_bytes(MODEL, H100, j, lay)[0])
    learned_bytes = float(compute.elementwise_bytes(learned, H100, j, lay)[0])
    T, h, kv = 4096, MODEL.hidden, MODEL.kv_heads * MODEL.head_dim
    assert rope_bytes - learned_bytes == pytest.approx(2 * T * (h + kv) * 2, **EXACT)


def test_attention_share_grows_with_sequence_over_hidden():
    """The attention core is 4 s^2 h of the 24 s h^2 (+ MLP) a block computes: its share of
    the forward grows with s / h."""
    lay = Layouts.one(dp=8, mbs=1)
    shares = [a / f for a, _, _, f, _ in (parts(H100, lay, seq=s) for s in (512, 2048, 8192))]
    assert shares == sorted(shares) and shares[-1] > 2 * shares[0]
