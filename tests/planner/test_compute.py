"""Compute time of a block (planner/cost/compute.py): the attention core's backward by kernel,
elementwise traffic by what the model has, at the device kind's elementwise efficiency, and
the attention factor's place in it."""

from __future__ import annotations

import pytest

from machine_models import load_machine
from planner.cost import compute
from planner.cost.layout import Layouts
from planner.presets import get_model
from planner.schema.figures import BOUNDS, FIGURES, with_figures
from planner.schema.specs import Precision, TrainingJob

MODEL = get_model("protein-7b")
H100 = load_machine("dgx-h100")
EXACT = dict(rel=1e-12, abs=0.0)


def job(seq=4096) -> TrainingJob:
    """The fused count's job: exaplan's blocks compiled (the eager surplus has its own test),
    at the device kinds' fitted figures (the measured kernels: tests/planner/test_measured_kernels.py)."""
    from machine_models import load_framework

    return TrainingJob(global_batch=64, seq_len=seq, precision=Precision.bf16,
                       framework=load_framework("exaplan", compiled=True).model_copy(update={"measured_kernels": False}))


def parts(machine, lay, model=MODEL, seq=4096):
    j = job(seq)
    attn = float(compute.attention_core_time(model, machine, j, lay)[0])
    dense = float(compute.dense_time(model, machine, j, lay)[0])
    elem = float(compute.elementwise_time(machine, compute.elementwise_bytes(model, machine, j, lay))[0]
                 + compute.eager_extra_time(model, machine, j, lay)[0])
    f, fb = (float(x[0]) for x in compute.layer_times(model, machine, j, lay))
    return attn, dense, elem, f, fb


def test_flash_backward_recomputes_the_scores():
    """FlashAttention-2 (Dao 2023): 5 backward GEMMs against 2 forward, 2.5 x forward; GEMMs
    and elementwise work 2 x forward."""
    lay = Layouts.one(dp=8, mbs=1)
    attn, dense, elem, f, fb = parts(H100, lay)
    assert f == pytest.approx(attn + dense + elem, **EXACT)
    assert fb == pytest.approx(3 * (dense + elem) + 3.5 * attn, **EXACT)
    # Selective recompute repeats the attention core's forward; full recompute the whole forward
    # but its last GEMM (the default profile's replay stops early, as torch's does).
    _, _, _, _, fb_sel = parts(H100, Layouts.one(dp=8, mbs=1, recompute="selective"))
    _, _, _, _, fb_full = parts(H100, Layouts.one(dp=8, mbs=1, recompute="full"))
    assert fb_sel - fb == pytest.approx(attn, **EXACT)
    down = float(compute.last_gemm_time(MODEL, H100, job(), Layouts.one(dp=8, mbs=1))[0])
    assert fb_full - fb == pytest.approx(f - down, **EXACT)
    # selective-op (torchtitan's per-op policy) repeats the k, o and up projections and every
    # elementwise op, and keeps the attention kernel's output.
    _, _, _, _, fb_op = parts(H100, Layouts.one(dp=8, mbs=1, recompute="selective-op"))
    h, f_, kv = MODEL.hidden, MODEL.ffn_hidden, MODEL.kv_heads * MODEL.head_dim
    gemms = sum(float(compute.gemm_time(H100, job(), 4096.0, n, k)) for n, k in ((kv, h), (h, h), (f_, h)))
    assert fb_op - fb == pytest.approx(gemms + elem, rel=1e-12)
    assert fb_sel < fb_op < fb_full


def test_unfused_attention_backward_is_twice_its_forward():
    unfused = H100.model_copy(update={"flash_attention": False})
    attn, dense, elem, _, fb = parts(unfused, Layouts.one(dp=8, mbs=1))
    assert fb == pytest.approx(3 * (dense + elem + attn), **EXACT)
    # It computes the whole score matrix (flash skips the masked half) and moves it through memory;
    # up to the flash kernel's saturation length both run at the rate of a GEMM of their size.
    s = compute.FLASH_SATURATION_SEQ
    flash_attn, _, flash_elem, _, _ = parts(H100, Layouts.one(dp=8, mbs=1), seq=s)
    attn, _, elem, _, _ = parts(unfused, Layouts.one(dp=8, mbs=1), seq=s)
    assert attn == pytest.approx(2 * flash_attn, **EXACT)
    scores = 32 * s * s  # heads x s x s, one sequence
    bandwidth = H100.memory_bandwidth_gbyte_s * 1e9 * H100.elementwise_efficiency
    assert elem - flash_elem == pytest.approx(4 * scores * 2 / bandwidth, rel=1e-9)


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


def test_elementwise_time_is_bytes_over_bandwidth_times_efficiency():
    """Memory-bound: bytes / (HBM bandwidth x elementwise_efficiency), nothing else."""
    for eff in (1.0, 0.5, 0.3):
        m = H100.model_copy(update={"elementwise_efficiency": eff})
        t = float(compute.elementwise_time(m, 1e9))
        assert t == pytest.approx(1e9 / (H100.memory_bandwidth_gbyte_s * 1e9 * eff), **EXACT)
    lay = Layouts.one(dp=8, mbs=1)
    nbytes = compute.elementwise_bytes(MODEL, H100, job(), lay)
    _, _, elem, _, _ = parts(H100, lay)
    assert elem == pytest.approx(float(nbytes[0]) / (H100.memory_bandwidth_gbyte_s * 1e9 * H100.elementwise_efficiency),
                                 **EXACT)


def test_elementwise_efficiency_scales_the_elementwise_work_only():
    """Halving the figure doubles the block's elementwise time and the loss's, and touches
    neither the GEMMs nor the attention core; the byte count does not depend on it."""
    lay = Layouts.one(dp=8, mbs=1)
    slow = with_figures(H100, {"elementwise_efficiency": H100.elementwise_efficiency / 2})
    a1, d1, e1, f1, fb1 = parts(H100, lay)
    a2, d2, e2, f2, fb2 = parts(slow, lay)
    assert (a2, d2) == (a1, d1)
    assert e2 == pytest.approx(2 * e1, **EXACT)
    assert f2 - f1 == pytest.approx(e1, **EXACT)
    assert fb2 - fb1 == pytest.approx(3 * e1, **EXACT)  # forward + 2 x forward backward
    j = job()
    assert float(compute.elementwise_bytes(MODEL, slow, j, lay)[0]) == float(compute.elementwise_bytes(MODEL, H100, j, lay)[0])
    T, V = 4096, MODEL.vocab_size
    loss = compute.LOSS_ACCESSES_PER_LOGIT * 4 * T * V / (H100.memory_bandwidth_gbyte_s * 1e9 * H100.elementwise_efficiency)
    h1, h2 = (float(compute.head_time(MODEL, m, j, lay)[0]) for m in (H100, slow))
    assert h2 - h1 == pytest.approx(loss, rel=1e-9)


def test_no_elementwise_traffic_costs_nothing():
    """Zero bytes take no time at any efficiency; traffic a model does not have (RoPE with
    learned positions, the scores' softmax under flash attention) is not slowed by it."""
    for eff in (1.0, 0.05):
        m = H100.model_copy(update={"elementwise_efficiency": eff})
        assert float(compute.elementwise_time(m, [0.0])[0]) == 0.0
    lay = Layouts.one(dp=8, mbs=1)
    learned = MODEL.model_copy(update={"position": "learned"})
    slow = H100.model_copy(update={"elementwise_efficiency": 0.1})
    for m in (H100, slow):
        rope = parts(m, lay)[2] - parts(m, lay, model=learned)[2]
        T, h, kv = 4096, MODEL.hidden, MODEL.kv_heads * MODEL.head_dim
        assert rope == pytest.approx(2 * T * (h + kv) * 2 / (m.memory_bandwidth_gbyte_s * 1e9 * m.elementwise_efficiency), rel=1e-9)
    # Flash attention moves no scores: its elementwise bytes do not grow with s^2 / h.
    j1, j2 = job(2048), job(4096)
    b1, b2 = (float(compute.elementwise_bytes(learned, H100, j, lay)[0]) for j in (j1, j2))
    assert b2 == pytest.approx(2 * b1, **EXACT)


def test_elementwise_efficiency_is_a_bounded_figure():
    """A fitted figure with physical bounds: clamped to (0.01, 1] when written, and never a
    division by zero; the default (1: the copy bandwidth) keeps machines without a fit as
    they were."""
    fig = FIGURES["elementwise_efficiency"]
    assert BOUNDS["elementwise_efficiency"] == (0.05, 1.0)
    assert with_figures(H100, {"elementwise_efficiency": 0.0}).elementwise_efficiency == fig.clamp[0] > 0
    assert with_figures(H100, {"elementwise_efficiency": 3.0}).elementwise_efficiency == 1.0
    assert H100.model_copy(update={"elementwise_efficiency": 1.0}).elementwise_efficiency == 1.0
    assert 0.05 <= H100.elementwise_efficiency <= 1.0


def test_flash_rate_stops_growing_at_the_saturation_length():
    """A fused kernel works in fixed tiles: beyond FLASH_SATURATION_SEQ its time grows as s^2
    (a constant rate); below it, and for unfused GEMMs at every length, the rate still grows
    with the GEMM's size (time grows slower than s^2)."""
    lay = Layouts.one(dp=8, mbs=1)
    s0 = compute.FLASH_SATURATION_SEQ
    flash = {s: parts(H100, lay, seq=s)[0] for s in (s0 // 4, s0 // 2, s0, 2 * s0, 4 * s0)}
    assert flash[2 * s0] / flash[s0] == pytest.approx(4.0, rel=1e-12)
    assert flash[4 * s0] / flash[2 * s0] == pytest.approx(4.0, rel=1e-12)
    assert flash[s0] / flash[s0 // 2] < 3.9 and flash[s0 // 2] / flash[s0 // 4] < 3.9
    unfused = H100.model_copy(update={"flash_attention": False})
    u = {s: parts(unfused, lay, seq=s)[0] for s in (2 * s0, 4 * s0)}
    assert u[4 * s0] / u[2 * s0] < 3.95


def test_attention_kernel_speed_scales_the_fused_kernel_only():
    """A profile's attention_kernel_speed (flash-attn 1.x: 0.5) divides the fused attention
    core's rate and nothing else; unfused attention is plain GEMMs."""
    from planner.schema.specs import FrameworkProfile

    lay = Layouts.one(dp=8, mbs=1)
    slow_job = job().model_copy(update={"framework": FrameworkProfile(attention_kernel_speed=0.5, measured_kernels=False)})
    j = job()
    fast = float(compute.attention_core_time(MODEL, H100, j, lay)[0])
    slow = float(compute.attention_core_time(MODEL, H100, slow_job, lay)[0])
    assert slow == pytest.approx(2 * fast, **EXACT)
    assert float(compute.dense_time(MODEL, H100, slow_job, lay)[0]) == float(compute.dense_time(MODEL, H100, j, lay)[0])
    unfused = H100.model_copy(update={"flash_attention": False})
    assert (float(compute.attention_core_time(MODEL, unfused, slow_job, lay)[0])
            == float(compute.attention_core_time(MODEL, unfused, j, lay)[0]))


def test_fused_loss_moves_six_bytes_a_logit():
    """The head's loss traffic: 12 fp32 passes by default, a profile's loss_traffic_bytes_per_logit
    (a fused kernel over 16-bit logits: 6) where it gives one."""
    from planner.schema.specs import FrameworkProfile

    lay = Layouts.one(dp=8, mbs=1)
    j = job()
    fused = j.model_copy(update={"framework": FrameworkProfile(
        loss_traffic_bytes_per_logit=compute.FUSED_LOSS_TRAFFIC_BYTES_PER_LOGIT, measured_kernels=False)})
    assert compute.loss_traffic_bytes_per_logit(j) == 4 * compute.LOSS_ACCESSES_PER_LOGIT
    T, V = 4096, MODEL.vocab_size
    saved = (48 - 6) * T * V / (H100.memory_bandwidth_gbyte_s * 1e9 * H100.elementwise_efficiency)
    default, cheap = (float(compute.head_time(MODEL, H100, jj, lay)[0]) for jj in (j, fused))
    assert default - cheap == pytest.approx(saved, rel=1e-9)


@pytest.mark.parametrize("tp", [1, 4])
def test_early_stop_leaves_the_down_projection_out_of_full_recompute_only(tp):
    """recompute_early_stop (torch's non-reentrant checkpoint since 2.1) takes the block's
    last GEMM, the down projection at its tensor-parallel size, out of a full recompute's
    replay; a block without recompute or with selective recompute costs the same."""
    from planner.schema.specs import FrameworkProfile

    j = job()
    stops = j.model_copy(update={"framework": FrameworkProfile(recompute_early_stop=True)})
    whole = j.model_copy(update={"framework": FrameworkProfile(recompute_early_stop=False)})
    down = compute.gemm_time(H100, j, 4096.0, MODEL.hidden, MODEL.ffn_hidden / tp)
    for recompute in ("none", "selective", "full"):
        lay = Layouts.one(dp=8, tp=tp, mbs=1, recompute=recompute)
        saved = float(compute.layer_times(MODEL, H100, whole, lay)[1][0] - compute.layer_times(MODEL, H100, stops, lay)[1][0])
        expected = float(down) if recompute == "full" else 0.0
        assert saved == pytest.approx(expected, rel=1e-9, abs=1e-15)
        # the forward itself is unchanged
        assert float(compute.layer_times(MODEL, H100, whole, lay)[0][0]) == float(compute.layer_times(MODEL, H100, stops, lay)[0][0])


def test_eager_blocks_move_their_counted_bytes_on_a_gpu_only():
    """exaplan's eager runtime (the default profile) moves eager_bytes_per_element bytes per
    element of the fused count; the surplus streams at EAGER_BANDWIDTH_FRACTION of the memory
    bandwidth. Nothing is added when the blocks are compiled, for a fused framework, or on a CPU
    (whose fitted figures were measured eager)."""
    from machine_models import load_framework

    lay = Layouts.one(dp=1, mbs=8)
    fitted = {"measured_kernels": False}  # the measured kernels' own surplus rate: tests/planner/test_measured_kernels.py
    j = TrainingJob(global_batch=8, seq_len=512, precision=Precision.bf16, framework=load_framework("exaplan").model_copy(update=fitted))
    assert j.framework.eager_bytes_per_element == load_framework("exaplan").eager_bytes_per_element > 2
    elements = compute.elementwise_bytes(MODEL, H100, j, lay) / 2  # flash attention: no scores in the count
    assert float(elements[0]) == pytest.approx(float(compute.token_elements(MODEL, j, lay)[0]), **EXACT)
    extra = compute.eager_extra_time(MODEL, H100, j, lay)
    expected = (j.framework.eager_bytes_per_element - 2) * elements / (H100.memory_bandwidth_gbyte_s * 1e9 * compute.EAGER_BANDWIDTH_FRACTION)
    assert float(extra[0]) == pytest.approx(float(expected[0]), **EXACT)
    # fp32: the same bytes per element, 4 of them already in the count
    j32 = j.model_copy(update={"precision": Precision.fp32})
    extra32 = compute.eager_extra_time(MODEL, H100, j32, lay)
    assert float(extra32[0]) == pytest.approx(float(extra[0]) * (j.framework.eager_bytes_per_element - 4)
                                              / (j.framework.eager_bytes_per_element - 2), **EXACT)
    compiled = j.model_copy(update={"framework": load_framework("exaplan", compiled=True).model_copy(update=fitted)})
    megatron = j.model_copy(update={"framework": load_framework("megatron")})
    cpu = load_machine("local", ranks=2)
    for jj, m in ((compiled, H100), (megatron, H100), (j, cpu)):
        assert float(compute.eager_extra_time(MODEL, m, jj, lay)[0]) == 0.0
    f_eager, _ = compute.layer_times(MODEL, H100, j, lay)
    f_comp, _ = compute.layer_times(MODEL, H100, compiled, lay)
    assert float(f_eager[0] - f_comp[0]) == pytest.approx(float(extra[0]), rel=1e-9)


def test_compile_is_only_for_a_profile_with_eager_blocks():
    from machine_models import load_framework
    from planner.schema.errors import PlanError

    assert load_framework("exaplan", compiled=True).compiled
    with pytest.raises(PlanError, match="fused already") as e:
        load_framework("megatron", compiled=True)
    assert e.value.field == "compile"


def test_a_small_model_on_a_gpu_is_launch_bound():
    """Eager blocks on a GPU: a micro-batch takes at least its operators x launch_us_per_op,
    a step at least step_launch_s around the optimizer; protein-small's micro-batches are
    launch-bound on an H100 (their size does not matter), protein-3.5b's are not. The figures
    are the ones the evidence gives: per micro-batch and per step from the runs at 1 and 4
    micro-batches a step (docs/gpu/2026-11-26-h100-launch.json)."""
    import json
    from pathlib import Path

    from machine_models import load_framework
    from planner.cost.step import evaluate

    runs = json.loads((Path(__file__).resolve().parents[2] / "docs/gpu/2026-11-26-h100-launch.json").read_text())
    median = {name: p["best"]["exaplan"]["median_s"] for name, p in runs["plans"].items()}
    per_mb = (median["demo_1gpu_mbs1x4"] - median["demo_1gpu"]) / 3
    per_step = median["demo_1gpu"] - per_mb
    fw = load_framework("exaplan")
    small = get_model("protein-small")
    ops = small.layers * 3 * compute.BLOCK_FORWARD_OPS + 3 * compute.HEAD_FORWARD_OPS
    assert fw.launch_us_per_op * 1e-6 * ops == pytest.approx(per_mb, rel=0.02)
    assert fw.step_launch_s == pytest.approx(per_step, rel=0.05)
    j = TrainingJob(global_batch=16, seq_len=128, precision=Precision.fp32)
    steps = {}
    for mbs in (1, 4):
        ev = evaluate(small, H100, j, Layouts.one(dp=1, mbs=mbs, gas=16 // mbs))
        steps[mbs] = float(ev.step_time_s[0])
    assert steps[1] == pytest.approx(16 * per_mb + per_step, rel=0.03)  # launch-bound: 16 micro-batches
    assert steps[4] == pytest.approx(4 * per_mb + per_step, rel=0.03)
    compiled = j.model_copy(update={"framework": load_framework("exaplan", compiled=True)})
    megatron = j.model_copy(update={"framework": load_framework("megatron")})
    for other in (compiled, megatron):
        assert float(evaluate(small, H100, other, Layouts.one(dp=1, mbs=4, gas=4)).step_time_s[0]) < 0.5 * steps[4]
    cpu = load_machine("local", ranks=1)
    assert float(compute.launch_floor_s(cpu, j, 8, 0)) == 0.0 and compute.step_launch_floor_s(cpu, j) == 0.0
    big = get_model("protein-3.5b")
    jb = TrainingJob(global_batch=32, seq_len=512, precision=Precision.bf16)
    lay = Layouts.one(dp=1, mbs=8, gas=4)
    _, fb = compute.layer_times(big, H100, jb, lay)
    assert float(compute.launch_floor_s(H100, jb, big.layers, 0)) < 0.25 * float(fb[0]) * big.layers  # 32 ms of 207
