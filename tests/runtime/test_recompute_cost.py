"""What full recompute costs in the runtime, against what the cost model charges for it.

The runtime's full recompute is torch's non-reentrant checkpoint_wrapper around every block
(runtime/parallel/recompute.py). Its replay stops as soon as backward has every tensor it
needs, which is before the block's last GEMM (the MLP down projection) runs: the cost model
charges a replay of the forward less that GEMM where the framework profile says
recompute_early_stop (planner/cost/compute.py layer_times), and the exaplan profile says so.
Counted here with torch's FLOP counter: the matmul FLOPs backward adds under full recompute.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from machine_models import load_framework
from planner.schema.specs import ModelSpec
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
