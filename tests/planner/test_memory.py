"""Peak memory per device: model states under each sharding, activations, pipeline schedules
and the fit check, each against a hand count from planner/cost/memory.py's accounting
(mixed precision: 2-byte working weights, 4-byte master, 4-byte gradients, 8 bytes of AdamW
moments). Byte counts are exact; ratios are compared to 1e-12 (float rounding)."""

from __future__ import annotations

import numpy as np
import pytest

from machine_models import load_machine
from planner.cost import flops, memory
from planner.cost.layout import (
    RC_FULL,
    RC_NONE,
    RC_OP,
    RC_SELECTIVE,
    SC_1F1B,
    SC_GPIPE,
    SC_INTERLEAVED,
    SC_NONE,
    SH_FSDP,
    SH_GRAD_OP,
    SH_HSDP,
    SH_NONE,
    SH_ZERO1,
    SH_ZERO2,
    Layouts,
)
from planner.cost.step import evaluate
from planner.presets import get_model
from planner.schema.specs import ModelSpec, Precision, TrainingJob

GIB = 2.0**30
TIGHT = dict(rel=1e-12)


def lay(**kw) -> Layouts:
    d = dict(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1, mbs=1, gas=1, vpp=1, schedule=SC_NONE, sharding=SH_NONE,
             recompute=RC_NONE, sp=0)
    d.update(kw)
    return Layouts(**d)


def job(gb=8, seq=512, precision=Precision.bf16, framework: str = "exaplan") -> TrainingJob:
    """exaplan's blocks compiled: no eager surplus, no launch floor (their own tests:
    test_compute.py), so each term here is the one under test."""
    from machine_models import load_framework

    return TrainingJob(global_batch=gb, seq_len=seq, precision=precision,
                       framework=load_framework(framework, compiled=framework == "exaplan"))


def states_per_param(model, j, layouts) -> np.ndarray:
    P = flops.total_params(model)
    p, g, o = memory.model_state_bytes(model, j, layouts)
    return (p + g + o) / P


# --- model states --------------------------------------------------------------------------------


def test_sharding_bytes_per_parameter_mixed_precision():
    """dp = 8, pp = tp = 1, bf16 compute, 16-bit weights (Megatron's distributed optimizer):
    none  = 2 + 4 + 4 + 8       = 18
    zero1 = 2 + 4 + (4 + 8)/8   = 7.5   (working weights and gradients replicated)
    zero2 = 2 + (4 + 4 + 8)/8   = 4     (only the working weights replicated)
    fsdp  = (4 + 4 + 8)/8       = 2     (16-bit copies are gathered per block: buffers)"""
    m, j = get_model("protein-7b"), job(framework="megatron")
    L = Layouts.concat([
        lay(dp_replicate=8, sharding=SH_NONE),
        lay(dp_shard=8, sharding=SH_ZERO1),
        lay(dp_shard=8, sharding=SH_ZERO2),
        lay(dp_shard=8, sharding=SH_FSDP),
        lay(dp_shard=8, sharding=SH_GRAD_OP),
        lay(dp_replicate=2, dp_shard=4, sharding=SH_HSDP),
    ])
    got = states_per_param(m, j, L)
    assert list(got) == pytest.approx([18.0, 6 + 12 / 8, 2 + 16 / 8, 16 / 8, 16 / 8, 16 / 4], **TIGHT)
    assert got[0] > got[1] > got[2] > got[3]
    # Each part separately for ZeRO-1: params 2 + 4/8, gradients 4, moments 8/8.
    P = flops.total_params(m)
    p, g, o = (x / P for x in memory.model_state_bytes(m, j, L))
    assert (p[1], g[1], o[1]) == pytest.approx((2.5, 4.0, 1.0), **TIGHT)
    assert (p[2], g[2], o[2]) == pytest.approx((2.5, 0.5, 1.0), **TIGHT)


def test_exaplans_zero_keeps_fp32_weights_under_autocast():
    """exaplan's runtime runs ZeRO-1/2 of a bf16 job on fp32 weights under autocast: the whole
    fp32 model (4) and autocast's 16-bit copies (2) beside the fp32 master shard (4/8), as
    torch's MemTracker counts a full-size rank (`exaplan check`; the 16-bit count was 30% under
    it); the other kinds as in Megatron's accounting."""
    m = get_model("protein-7b")
    L = Layouts.concat([lay(dp_shard=8, sharding=SH_ZERO1), lay(dp_shard=8, sharding=SH_ZERO2),
                        lay(dp_shard=8, sharding=SH_FSDP)])
    P = flops.total_params(m)
    ours = memory.model_state_bytes(m, job(), L)[0] / P
    theirs = memory.model_state_bytes(m, job(framework="megatron"), L)[0] / P
    assert list(ours) == pytest.approx([6 + 4 / 8, 6 + 4 / 8, 4 / 8], **TIGHT)
    assert list(ours - theirs) == pytest.approx([4.0, 4.0, 0.0], **TIGHT)


def test_sharding_bytes_per_parameter_fp32():
    # fp32: no separate master copy: none 4 + 4 + 8 = 16, zero1 4 + 4 + 8/8, zero2 4 + 12/8, fsdp 16/8.
    m, j = get_model("protein-small"), job(precision=Precision.fp32)
    L = Layouts.concat([lay(dp_replicate=8), lay(dp_shard=8, sharding=SH_ZERO1), lay(dp_shard=8, sharding=SH_ZERO2),
                        lay(dp_shard=8, sharding=SH_FSDP)])
    assert list(states_per_param(m, j, L)) == pytest.approx([16.0, 9.0, 5.5, 2.0], **TIGHT)


@pytest.mark.parametrize("precision, per_param", [(Precision.bf16, (18.0, 6 + 12 / 8)), (Precision.fp16, (20.0, 4 + 16 / 8))])
def test_megatrons_model_states_are_its_readmes_table(precision, per_param):
    """The Megatron-LM README's distributed-optimizer table, bytes a parameter unsharded and
    over d ranks: "bf16 param, fp32 grads" 18 and 6 + 12/d; "fp16 param, fp16 grads" 20 and
    4 + 16/d (fp16 gradients beside the optimizer's fp32 copy of them)."""
    from machine_models import load_framework

    m = get_model("protein-small")
    j = TrainingJob(global_batch=8, seq_len=512, precision=precision, framework=load_framework("megatron"))
    L = Layouts.concat([lay(dp_replicate=8), lay(dp_shard=8, sharding=SH_ZERO1)])
    assert list(states_per_param(m, j, L)) == pytest.approx(list(per_param), **TIGHT)


def test_shard_group_includes_cp_and_tp_divides():
    m, j = get_model("protein-7b"), job()
    P = flops.total_params(m)
    # FSDP over dp_shard 4 x cp 2 = 8 ranks, with tp 2: 16 / 8 / 2 bytes per parameter.
    L = lay(dp_shard=4, cp=2, tp=2, sharding=SH_FSDP)
    p, g, o = memory.model_state_bytes(m, j, L)
    assert float((p + g + o)[0]) == pytest.approx(16 * P / 8 / 2, **TIGHT)


def test_pipeline_stage_holds_its_blocks_and_the_larger_end():
    m = get_model("protein-7b")  # 32 layers
    L = Layouts.concat([lay(pp=1), lay(pp=4), lay(pp=5)])
    emb, head, block = flops.embedding_params(m), flops.head_params(m), flops.layer_params(m)
    assert list(memory.stage_params(m, L)) == [32 * block + emb + head, 8 * block + max(emb, head), 7 * block + max(emb, head)]


def test_sharding_order_of_total_memory_in_evaluate():
    """Whole-device memory (states, buffers, activations, reserve) keeps the order
    none > zero1 > zero2 > fsdp for a 7B model on one 8-GPU node."""
    m, mach = get_model("protein-7b"), load_machine("dgx-h100")
    j = job(gb=8)
    L = Layouts.concat([lay(dp_replicate=8), lay(dp_shard=8, sharding=SH_ZERO1), lay(dp_shard=8, sharding=SH_ZERO2),
                        lay(dp_shard=8, sharding=SH_FSDP)])
    total = evaluate(m, mach, j, L).memory.total
    assert total[0] > total[1] > total[2] > total[3]
    # 18 B/param of 6.5e9 parameters does not fit in 80 GiB; fsdp's 2 B/param does.
    ev = evaluate(m, mach, j, L)
    assert not ev.memory.fits[0] and ev.memory.fits[3]


# --- activations ---------------------------------------------------------------------------------


def test_layer_activations_by_hand():
    """One Llama block, mbs 2 x seq 512, tp 4 without sequence parallelism, bf16:
    attention keeps its norm input and output (2 stream), Q K V, the context, and the fp32
    softmax statistics; the MLP its norm input and output (2 stream), gate, up, act(gate),
    and their product. A stream tensor is T x h x 2 bytes, split over tp only with sp."""
    m, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    j = job(seq=512)
    T, h, f, t, B = 2 * 512, m.hidden, m.ffn_hidden, 4, 2
    kv = m.kv_heads * m.head_dim
    stream = T * h * B
    attention = 2 * stream + T * (h + 2 * kv) * B / t + T * h * B / t + T * (m.heads / t) * 4
    mlp = 2 * stream + 4 * T * f * B / t
    got = memory.layer_activation_bytes(m, mach, j, lay(tp=4, mbs=2))
    assert float(got[0]) == pytest.approx(attention + mlp, **TIGHT)


def test_sequence_parallel_divides_residual_stream_by_tp():
    m, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    j = job(seq=512)
    T, B = 512, 2
    for t in (2, 4, 8):
        without, with_sp = memory.layer_activation_bytes(m, mach, j, Layouts.concat([lay(tp=t), lay(tp=t, sp=1)]))
        # Four residual-stream tensors per block go from T h B to T h B / t.
        assert without - with_sp == pytest.approx(4 * T * m.hidden * B * (1 - 1 / t), **TIGHT)
        # With sp every kept tensor is split over tp: exactly 1/t of the tp = 1 block.
        one = float(memory.layer_activation_bytes(m, mach, j, lay(tp=1))[0])
        assert with_sp == pytest.approx(one / t, **TIGHT)


def test_full_recompute_keeps_only_block_inputs():
    m, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    j = job(seq=512)
    L = Layouts.concat([lay(mbs=4, recompute=RC_NONE), lay(mbs=4, recompute=RC_SELECTIVE), lay(mbs=4, recompute=RC_FULL)])
    per_mb, fixed = memory.activation_bytes(m, mach, j, L)
    # exaplan's runtime without FSDP computes under autocast on fp32 weights: the residual
    # stream, each block's input, is fp32 (the residual adds promote the bf16 block outputs);
    # under FSDP's bf16 MixedPrecisionPolicy it is bf16, as in Megatron (Korthikanti's 2sbh).
    stream = 4 * 512 * m.hidden * 4
    per_layer = float(memory.layer_activation_bytes(m, mach, j, L)[0])
    assert per_mb[2] == pytest.approx(m.layers * stream, **TIGHT)
    fsdp = lay(mbs=4, dp_shard=8, sharding=SH_FSDP, recompute=RC_FULL)
    assert memory.activation_bytes(m, mach, j, fsdp)[0][0] == pytest.approx(m.layers * stream / 2, **TIGHT)
    assert per_mb[0] == pytest.approx(m.layers * per_layer, **TIGHT)
    assert per_mb[2] < per_mb[0] / 8  # one fp32 stream tensor of the ~19 bf16-stream-sized ones a block keeps
    # Fixed part: what the loss holds (torch's eager cross-entropy: the fp32 log-softmax, the
    # nll's fp32 gradient and its own, 12 bytes a logit), or what the last block's backward adds if that is
    # larger: the two never coexist (the loss's backward frees the logits before the last
    # block's backward). That backward adds its MLP's ffn-wide gradients beyond the tensors it
    # frees (SwiGLU: the product's, gate's and up's, less the product it kept: 2 x T f bf16)
    # and, under full recompute, its recomputed working set less the input it kept. Between the
    # two, backward passes the final norm: the last block's output and what the eager RMSNorm
    # keeps and computes there, 24 bytes a stream element (head_bytes; tests/runtime/test_step_memory.py).
    logits = 3 * 4 * 4 * 512 * m.vocab_size
    temporaries = 2 * 4 * 512 * m.ffn_hidden * 2
    head = 24 * 4 * 512 * m.hidden
    assert memory.backward_temporaries_bytes(m, j, L)[0] == pytest.approx(temporaries, **TIGHT)
    assert memory.head_bytes(m, j, L)[0] == pytest.approx(head, **TIGHT)
    assert fixed[0] == pytest.approx(max(logits, temporaries, head), **TIGHT)
    assert fixed[1] == pytest.approx(max(logits, temporaries, head), **TIGHT)
    assert fixed[2] == pytest.approx(max(logits, per_layer - stream + temporaries, head), **TIGHT)
    assert head > temporaries > logits  # protein vocabulary: the final norm's backward is the largest
    # A framework's own loss (a fused kernel: 4 bytes a logit) replaces the eager figure where larger.
    big_vocab = m.model_copy(update={"vocab_size": 32768})
    assert memory.activation_bytes(big_vocab, mach, j, L, per_logit=4.0)[1][0] == pytest.approx(4 * 4 * 512 * 32768, **TIGHT)
    # Flash attention stores no scores, so selective keeps as much as none.
    assert per_mb[1] == per_mb[0]


def test_autocast_copies_and_the_backward_tail():
    """autocast's 16-bit weight copies: 2 bytes a parameter where exaplan's runtime computes
    under autocast on fp32 weights (no FSDP, 16-bit); none under FSDP's bf16 weights, in fp32
    training, or under Megatron's profile (bf16 weights, no per-micro-batch casts). A one-micro-
    batch step with full recompute peaks as its backward ends: every gradient, the first block's
    recomputed working set, no copies (protein-3.5b, 32 x 512 tokens, one H100: measured 52.4
    GiB allocated, docs/gpu/2026-11-26-h100-recompute-eager.json)."""
    from machine_models import load_framework

    m, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    P = flops.total_params(m)
    L = Layouts.concat([lay(mbs=32, gas=1, recompute=RC_FULL), lay(mbs=4, dp_shard=8, sharding=SH_FSDP, recompute=RC_FULL)])
    copies = memory.autocast_copy_bytes(m, job(gb=32), L)
    assert copies[0] == pytest.approx(2 * P, **TIGHT) and copies[1] == 0.0
    assert memory.autocast_copy_bytes(m, job(gb=32, precision=Precision.fp32), L).tolist() == [0.0, 0.0]
    megatron = job(gb=32).model_copy(update={"framework": load_framework("megatron")})
    assert memory.autocast_copy_bytes(m, megatron, L).tolist() == [0.0, 0.0]
    one = lay(mbs=32, gas=1, recompute=RC_FULL)
    compiled = job(gb=32)
    j = compiled.model_copy(update={"framework": compiled.framework.model_copy(update={"compiled": False})})  # eager
    mem = evaluate(m, mach, j, one).memory
    per_mb, fixed = memory.activation_bytes(m, mach, j, one)
    tail = memory.backward_tail_bytes(m, mach, j, one) + memory.backward_temporaries_bytes(m, j, one)
    assert tail[0] > memory.layer_activation_bytes(m, mach, j, one)[0]  # the first block's, and its backward's gradients
    grads = 4.0 * P
    states = float(mem.parameters[0] + mem.optimizer[0] + mem.buffers[0])
    peak = max(float(per_mb[0] + fixed[0]), grads + float(tail[0]) - 2 * P)
    assert float(mem.total[0] - mem.reserve[0]) == pytest.approx(states + peak, **TIGHT)
    assert grads + float(tail[0]) - 2 * P > float(per_mb[0] + fixed[0])  # here the backward's end is the peak
    # Compiled blocks under full recompute cast the weights inside their graphs: no copies, at
    # either end of the step.
    assert memory.copies_never_held(compiled, one.recompute).all() and not memory.copies_never_held(j, one.recompute).any()
    cmem = evaluate(m, mach, compiled, one).memory
    assert float(mem.parameters[0] - cmem.parameters[0]) == pytest.approx(2 * P, **TIGHT)
    c_per_mb, c_fixed = memory.activation_bytes(m, mach, compiled, one)
    c_tail = memory.backward_tail_bytes(m, mach, compiled, one) + memory.backward_temporaries_bytes(m, compiled, one)
    c_states = float(cmem.parameters[0] + cmem.optimizer[0] + cmem.buffers[0])
    c_peak = max(float(c_per_mb[0] + c_fixed[0]), grads + float(c_tail[0]))
    assert float(cmem.total[0] - cmem.reserve[0]) == pytest.approx(c_states + c_peak, **TIGHT)


def test_selective_op_keeps_the_attention_output_and_every_other_gemm():
    """torchtitan's per-op policy on Llama 3.1 8B under FSDP (bf16 weights, fused attention):
    the block's input, q, v, the attention output, gate and down, all bf16, and the fp32
    log-sum-exp: 63,616 bytes a token and layer (docs/model/memory.md: about 62 KB against the 200 KB the
    eager block keeps without recompute). Between full recompute and none; under tp 2 with
    sequence parallelism the column-parallel outputs split, the down projection's output
    (before its reduce-scatter) does not, and both reduce-scatters' outputs are kept."""
    from calibration.published_schema import llama31_model

    m, mach = llama31_model("llama3.1-8b", 32, 4096, 32, 14336), load_machine("dgx-h100")
    j = job(gb=2, seq=8192)
    L = Layouts.concat([lay(mbs=1, dp_shard=8, sharding=SH_FSDP, recompute=r) for r in (RC_NONE, RC_OP, RC_FULL)])
    per_mb, fixed = memory.activation_bytes(m, mach, j, L)
    h, kv, f, T = 4096, 1024, 14336, 8192
    per_token = 2 * (h + h + kv + h + f + h) + 4 * 32
    assert per_token == 63_616
    assert per_mb[1] == pytest.approx(m.layers * T * per_token, **TIGHT)
    assert per_mb[2] < per_mb[1] < per_mb[0]
    assert fixed[1] == fixed[2]  # one block's working set while it is recomputed, as full
    tp = lay(mbs=1, tp=2, sp=1, dp_shard=4, sharding=SH_FSDP, recompute=RC_OP)
    split = 2 * (h / 2 + h / 2 + kv / 2 + h / 2 + f / 2 + h + 2 * h / 2) + 4 * 32 / 2
    assert memory.op_kept_bytes(m, mach, j, tp)[0] == pytest.approx(T * split, **TIGHT)


def test_selective_recompute_drops_the_scores_without_flash():
    m = get_model("protein-small")
    mach = load_machine("dgx-h100").model_copy(update={"flash_attention": False})
    j = job(seq=256)
    L = Layouts.concat([lay(mbs=2, tp=2), lay(mbs=2, tp=2, recompute=RC_SELECTIVE)])
    per_mb, _ = memory.activation_bytes(m, mach, j, L)
    scores = 2.0 * 2 * (m.heads / 2) * 256 * 256 * 2  # scores and probabilities, bf16
    assert per_mb[0] - per_mb[1] == pytest.approx(m.layers * scores, **TIGHT)


# --- pipeline schedules --------------------------------------------------------------------------


def test_microbatches_in_flight_by_schedule():
    f = memory.microbatches_in_flight
    assert float(f(1, 16, 1, SC_NONE)) == 1.0
    assert float(f(4, 16, 1, SC_GPIPE)) == 16.0  # every micro-batch's activations
    assert float(f(4, 16, 1, SC_1F1B)) == 4.0  # at most pp in flight
    assert float(f(4, 2, 1, SC_1F1B)) == 2.0  # fewer micro-batches than stages
    # Interleaved: pp (1 + (pp - 1) / (pp v)) = 4 (1 + 3/8) = 5.5 for pp 4, v 2.
    assert float(f(4, 16, 2, SC_INTERLEAVED)) == pytest.approx(5.5, **TIGHT)
    assert float(f(8, 64, 4, SC_INTERLEAVED)) == pytest.approx(8 * (1 + 7 / 32), **TIGHT)
    # More virtual stages approach 1F1B's pp from above.
    assert float(f(4, 16, 2, SC_INTERLEAVED)) > float(f(4, 16, 4, SC_INTERLEAVED)) > 4.0


def test_gpipe_holds_more_activations_than_1f1b():
    m, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    j = job(gb=32)
    L = Layouts.concat([
        lay(pp=4, dp_replicate=2, mbs=1, gas=16, schedule=SC_GPIPE),
        lay(pp=4, dp_replicate=2, mbs=1, gas=16, schedule=SC_1F1B),
        lay(pp=4, dp_replicate=2, mbs=1, gas=16, schedule=SC_INTERLEAVED, vpp=2),
    ])
    acts = evaluate(m, mach, j, L).memory.activations
    per_mb, working, fixed = memory.activation_parts(m, mach, j, L)
    # GPipe: every stage holds all 16, the last one the loss and final norm besides; 1F1B and
    # interleaved: the first stage's micro-batches outweigh the last stage's one (or 3.5 / 2).
    assert acts[0] == pytest.approx(16 * per_mb[0] + fixed[0], **TIGHT)
    assert acts[1] == pytest.approx(4 * per_mb[1] + working[1], **TIGHT)
    assert acts[2] == pytest.approx(5.5 * per_mb[2] + working[2], **TIGHT)
    assert acts[0] > acts[2] > acts[1]


def test_last_stage_holds_the_loss_and_first_stage_the_micro_batches():
    """With a pipeline the loss and the final norm sit on the last stage, which holds one
    micro-batch in 1F1B ((v-1) pp + 1 chunk-micro-batches interleaved), not on the first with
    its pp: a large vocabulary makes the last stage the peak, a small one the first."""
    f = memory.microbatches_in_flight_last
    assert float(f(4, 16, 1, SC_1F1B)) == 1.0 and float(f(4, 16, 1, SC_GPIPE)) == 16.0
    assert float(f(4, 16, 2, SC_INTERLEAVED)) == pytest.approx((1 * 4 + 1) / 2, **TIGHT)
    assert float(f(1, 8, 1, SC_NONE)) == 1.0
    mach = load_machine("dgx-h100")
    small = get_model("protein-3.5b")
    big_vocab = ModelSpec.model_validate({**small.model_dump(), "name": "big-vocab", "vocab_size": 256_000, "layers": 8})
    j = job(gb=32)
    L = lay(pp=4, dp_replicate=2, mbs=1, gas=16, schedule=SC_1F1B)
    for m in (small, big_vocab):
        per_mb, working, fixed = memory.activation_parts(m, mach, j, L)
        first, last = 4 * per_mb[0] + working[0], per_mb[0] + fixed[0]
        assert evaluate(m, mach, j, L).memory.activations[0] == pytest.approx(max(first, last), **TIGHT)
        assert evaluate(m, mach, j, L).memory.activations[0] < 4 * per_mb[0] + fixed[0]  # never both at once
    per_mb, working, fixed = memory.activation_parts(big_vocab, mach, j, L)
    assert per_mb[0] + fixed[0] > 4 * per_mb[0] + working[0]  # the loss's logits outweigh three micro-batches


# --- the fit check -------------------------------------------------------------------------------


def test_fits_flips_when_device_memory_drops_below_total():
    m, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    j = job(gb=8)
    L = lay(dp_shard=8, sharding=SH_ZERO1)
    ev = evaluate(m, mach, j, L)
    total_gib = float(ev.memory.total[0]) / GIB
    parts = ev.memory
    assert float(parts.total[0]) == pytest.approx(float(parts.parameters[0] + parts.gradients[0] + parts.optimizer[0]
                                                         + parts.activations[0] + parts.buffers[0] + parts.reserve[0]), **TIGHT)
    # Reserve = fragmentation x what each step allocates and frees (activations, buffers) + the fixed reserve.
    churned = float(parts.activations[0] + parts.buffers[0])
    assert float(parts.reserve[0]) == pytest.approx(churned * mach.fragmentation_fraction + mach.memory_reserve_gib * GIB, **TIGHT)
    above = evaluate(m, mach.model_copy(update={"device_memory_gib": total_gib * 1.001}), j, L)
    below = evaluate(m, mach.model_copy(update={"device_memory_gib": total_gib * 0.999}), j, L)
    assert bool(above.memory.fits[0]) and not bool(below.memory.fits[0])
    # The total itself does not depend on the capacity.
    assert float(below.memory.total[0]) == float(ev.memory.total[0])


def test_cpu_terms_optimizer_bytes_and_buffer_copies():
    """optimizer_bytes_per_param sets the optimizer's memory traffic (default: a fused
    AdamW's 28 B in fp32); dp_buffer_copies charges the passes over each data-parallel
    buffer around its collective (0 on GPUs, where they hide on the communication stream;
    none for DistributedDataParallel's bucket views)."""
    m = get_model("protein-small")
    mach = load_machine("dgx-h100")
    j = job(gb=8, seq=256, precision=Precision.fp32)
    L = Layouts.concat([lay(dp_replicate=8), lay(dp_shard=8, sharding=SH_FSDP)])
    base = evaluate(m, mach, j, L)
    P = flops.total_params(m)
    opt = evaluate(m, mach.model_copy(update={"optimizer_bytes_per_param": 56.0}), j, L)
    extra = opt.optimizer_s - base.optimizer_s
    # DDP updates all P parameters, FSDP its 1/8 shard: 28 more bytes each at the HBM rate.
    assert extra[0] == pytest.approx(P * 28 / (mach.memory_bandwidth_gbyte_s * 1e9), rel=1e-6)
    assert extra[1] == pytest.approx(extra[0] / 8, rel=1e-6)
    slow = mach.model_copy(update={"dp_buffer_copies": 2.0, "overlap": mach.overlap.model_copy(update={"dp": 0.0})})
    no_copy = mach.model_copy(update={"overlap": mach.overlap.model_copy(update={"dp": 0.0})})
    with_copies, without = evaluate(m, slow, j, L), evaluate(m, no_copy, j, L)
    # exaplan's DistributedDataParallel reduces the gradients in its buckets (no copies);
    # FSDP2 copies in and out around every collective.
    assert with_copies.dp_s[0] == without.dp_s[0] and with_copies.dp_s[1] > without.dp_s[1]
    assert np.all(with_copies.compute_s == without.compute_s)


def test_dtensor_op_overhead_is_paid_by_tensor_parallel_layouts_only():
    m = get_model("protein-small")
    mach = load_machine("local").model_copy(update={"dtensor_op_overhead_us": 0.0})
    j = job(gb=4, seq=64, precision=Precision.fp32)
    L = Layouts.concat([lay(dp_replicate=2, mbs=2), lay(tp=2, mbs=4)])
    base = evaluate(m, mach, j, L)
    slow = evaluate(m, mach.model_copy(update={"dtensor_op_overhead_us": 100.0}), j, L)
    extra = slow.compute_s - base.compute_s
    assert extra[0] == 0.0
    # 8 blocks x (forward + backward = 3 x 32 operators) x 100 us, one micro-batch
    assert extra[1] == pytest.approx(8 * 96 * 100e-6, rel=1e-9)


def test_fused_swiglu_keeps_one_ffn_wide_tensor_less_per_layer():
    """Megatron's fused bias_swiglu (the megatron profile: swiglu_kept_tensors 3) keeps gate and up
    and the product; torch eager also keeps silu(gate): exactly T x ffn / tp 16-bit elements a
    block less, the rest of the count unchanged."""
    from machine_models import load_framework
    m, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    L = lay(tp=2, dp_shard=4, sharding=SH_ZERO1)
    eager = job(gb=8, seq=1024)
    fused = eager.model_copy(update={"framework": load_framework("megatron")})
    assert memory.swiglu_kept_tensors(eager) == 4 and memory.swiglu_kept_tensors(fused) == 3
    saved = memory.layer_activation_bytes(m, mach, eager, L) - memory.layer_activation_bytes(m, mach, fused, L)
    assert float(saved[0]) == pytest.approx(1 * 1024 * m.ffn_hidden / 2 * 2, **TIGHT)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("weights", ["autocast", "bf16_weights"])
def test_eager_block_keeps_what_the_count_says(weights, activation, norm):
    """exaplan's eager block (runtime/model.py), bf16, its saved tensors counted with
    torch.autograd.graph.saved_tensors_hooks on a CPU (unique storages, two sequence lengths so the
    weights' casts cancel): it keeps layer_activation_bytes' fused count plus EAGER_SAVED_BYTES per
    residual-stream element for its weights and norm (and SwiGLU's casts under autocast), to
    within 0.6 byte (the rotary tables and the norms' fp32 rsqrt, per token rather than per
    element, are not counted). Measured: autocast 18 / 16 / 10 / 8 (RMSNorm or LayerNorm, SwiGLU
    or GELU), 16-bit weights 8 / 0 (by norm)."""
    torch = pytest.importorskip("torch")
    from runtime.model import Block, rope_tables
    from planner.schema.specs import ModelSpec
    from machine_models import load_framework

    spec = ModelSpec(name="t", layers=1, hidden=256, heads=4, kv_heads=4, ffn_hidden=688, vocab_size=32,
                     seq_len=512, activation=activation, norm=norm, position="rope")

    def saved(seq: int) -> int:
        torch.manual_seed(0)
        block = Block(spec) if weights == "autocast" else Block(spec).to(torch.bfloat16)
        x = torch.randn(2, seq, 256, dtype=torch.float32 if weights == "autocast" else torch.bfloat16, requires_grad=True)
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=weights == "autocast"):
            block(x, rope_tables(spec.head_dim, seq))
        return sum(storages.values())

    per_token = (saved(512) - saved(256)) / (2 * 256)
    gpu = load_machine("dgx-h100")
    j = TrainingJob(global_batch=2, seq_len=512, precision=Precision.bf16, framework=load_framework("exaplan"))
    L = lay(mbs=2, sharding=SH_NONE if weights == "autocast" else SH_FSDP, dp_shard=1 if weights == "autocast" else 2)
    counted = float(memory.layer_activation_bytes(spec, gpu, j, L)[0]) / (2 * 512)
    cast = memory.SWIGLU_CAST_BYTES if weights == "autocast" and activation == "swiglu" else 0.0
    assert memory.eager_saved_bytes(spec, gpu, j, L)[0] == memory.EAGER_SAVED_BYTES[(weights, norm)] + cast
    assert abs(per_token - counted) / 256 <= 0.6, (per_token, counted)
    # Compiled blocks and CPUs keep the fused count.
    compiled = j.model_copy(update={"framework": load_framework("exaplan", compiled=True)})
    assert memory.eager_saved_bytes(spec, gpu, compiled, L)[0] == 0.0
    assert memory.eager_saved_bytes(spec, load_machine("local"), j, L)[0] == 0.0
