"""What full recompute costs in the runtime, against what the cost model charges for it.

The runtime's full recompute is torch's non-reentrant checkpoint_wrapper around every block
(runtime/parallel/recompute.py). Its replay stops as soon as backward has every tensor it
needs, which is before the block's last GEMM (the MLP down projection) runs: the cost model
charges a replay of the forward less that GEMM where the framework profile says
recompute_early_stop (planner/cost/compute.py layer_times), and the exaplan profile says so.
Counted here with torch's FLOP counter: the matmul FLOPs backward adds under full recompute.

Selective-op recompute (torchtitan's per-op policy) keeps the attention kernel's output and
every other matmul's: the FLOPs its backward adds are the planner's op_recomputed_gemms, and
what its blocks keep between forward and backward, measured with torch's MemTracker, is the
planner's op_kept_bytes to the byte.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from machine_models import load_framework, load_machine
from planner.cost.flops import recompute_flops_per_token
from planner.cost.layout import RC_OP, SC_NONE, SH_NONE, Layouts
from planner.cost.memory import kept_input_bytes, op_kept_bytes
from planner.schema.specs import ModelSpec, Precision, TrainingJob
from runtime.model import ProteinLM
from runtime.parallel.recompute import apply_recompute

BATCH, SEQ = 2, 32
SPECS = [
    ModelSpec(name="swiglu", layers=3, hidden=64, heads=4, kv_heads=2, ffn_hidden=160, vocab_size=32, seq_len=SEQ),
    ModelSpec(name="gelu", layers=2, hidden=48, heads=4, kv_heads=4, ffn_hidden=192, vocab_size=32, seq_len=SEQ,
              activation="gelu", norm="layernorm", position="learned"),
]


def _flops(spec: ModelSpec, level: str, early_stop: bool = True) -> tuple[int, int]:
    """(forward, backward) FLOPs of one step of `spec` under recompute `level`."""
    torch.manual_seed(0)
    model = ProteinLM(spec)
    model.setup_rope()
    apply_recompute(model, level)
    tokens = torch.randint(0, spec.vocab_size, (BATCH, SEQ))
    with set_checkpoint_early_stop(early_stop):  # read when the forward builds its frames
        with FlopCounterMode(display=False) as fwd:
            loss = model(tokens).float().mean()
        with FlopCounterMode(display=False) as bwd:
            loss.backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


def _down_projection_flops(spec: ModelSpec) -> int:
    return 2 * BATCH * SEQ * spec.ffn_hidden * spec.hidden * spec.layers


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_full_recompute_replays_each_block_but_its_last_gemm(spec):
    _, plain = _flops(spec, "none")
    _, full = _flops(spec, "full")
    _, whole = _flops(spec, "full", early_stop=False)
    # Without early stop the replay is the blocks' whole forward; with it (torch's default),
    # exactly the down projections are left out.
    assert whole - full == _down_projection_flops(spec)
    assert 0 < full - plain < whole - plain


def test_the_exaplan_profile_charges_what_the_runtime_runs():
    assert load_framework("exaplan").recompute_early_stop
    # Megatron-LM's and DeepSpeed's reentrant checkpointing replays whole blocks.
    assert not load_framework("megatron").recompute_early_stop
    assert not load_framework("deepspeed").recompute_early_stop


@pytest.mark.parametrize("early_stop", [True, False], ids=["early-stop", "whole-replay"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_selective_op_recomputes_the_gemms_the_planner_charges(spec, early_stop):
    _, plain = _flops(spec, "none", early_stop)
    _, op = _flops(spec, "selective-op", early_stop)
    _, full = _flops(spec, "full", early_stop)
    charged = float(recompute_flops_per_token(spec, SEQ, RC_OP, early_stop)[()]) * BATCH * SEQ
    # k, o and the second MLP GEMM (GELU's down projection only without early stop); the
    # attention kernel's output is kept, so its FLOPs do not recur.
    assert op - plain == charged
    assert 0 < op - plain < full - plain


def _kept_activation_bytes(spec: ModelSpec, level: str) -> int:
    """Activation bytes alive after one forward of `spec` under recompute `level` (MemTracker)."""
    torch.manual_seed(0)
    model = ProteinLM(spec)
    model.setup_rope()
    apply_recompute(model, level)
    tokens = torch.randint(0, spec.vocab_size, (BATCH, SEQ))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss = model(tokens).float().mean()
        kept = sum(v[_MemRefType.ACT] for v in tracker.get_tracker_snapshot("current").values())
    loss.backward()
    return kept


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_selective_op_keeps_what_the_planner_counts(spec):
    machine = load_machine("dgx-h100")  # a fused attention kernel, as the CPU's SDPA here
    job = TrainingJob(global_batch=BATCH, seq_len=SEQ, precision=Precision.fp32, framework=load_framework("exaplan"))
    lay = Layouts(pp=np.array([1]), dp_replicate=1, dp_shard=1, cp=1, tp=1, mbs=BATCH, gas=1, vpp=1,
                  schedule=SC_NONE, sharding=SH_NONE, recompute=RC_OP, sp=0)
    # Both keep each block's input and share the rest of the step (embedding, logits, loss):
    # the difference is what selective-op keeps beyond the input, block by block.
    measured = _kept_activation_bytes(spec, "selective-op") - _kept_activation_bytes(spec, "full")
    counted = spec.layers * (op_kept_bytes(spec, machine, job, lay) - kept_input_bytes(spec, job, lay))
    assert measured == pytest.approx(float(counted[0]), rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_eager_loss_peaks_at_the_bytes_the_planner_counts(dtype):
    """The runtime's loss (torch's cross-entropy over an fp32 copy of the logits) peaks at the
    start of its backward: the fp32 log-softmax it kept, the nll's dense fp32 gradient and the
    log-softmax's input gradient, 12 bytes a logit (memory.LOSS_BYTES_PER_LOGIT["eager"],
    the exaplan profile's loss_bytes_per_logit), measured with MemTracker."""
    from planner.cost.memory import LOSS_BYTES_PER_LOGIT
    from runtime.model import loss_fn

    torch.manual_seed(0)
    tokens, vocab, hidden = 512, 8192, 64
    weight = torch.randn(vocab, hidden, dtype=dtype, requires_grad=True)
    x = torch.randn(1, tokens, hidden, dtype=dtype)
    targets = torch.randint(0, vocab, (1, tokens))
    tracker = MemTracker()
    with tracker:
        logits = x @ weight.t()
        loss = loss_fn(logits, targets)
        del logits
        loss.backward()
        peak = sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values())
    per_logit = (peak - weight.numel() * weight.element_size()) / (tokens * vocab)  # less the weight's gradient
    assert per_logit == pytest.approx(LOSS_BYTES_PER_LOGIT["eager"], rel=0.05)
    assert load_framework("exaplan").loss_bytes_per_logit == LOSS_BYTES_PER_LOGIT["eager"]
