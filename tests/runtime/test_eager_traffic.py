"""What the runtime's eager blocks move through memory, against what the cost model charges.

The cost model counts a block's elementwise work as fused kernels would move it (planner/cost/
compute.py token_elements, at the precision's element size). exaplan's runtime runs its blocks
eager unless compiled: RMSNorm in fp32 in five ops, rotary embeddings in fp32 through unbind
and stack, SiLU and the product, the residual adds, each op reading and writing whole tensors,
forward and backward. The exaplan profile's `eager_bytes_per_element` says how many bytes
they move per element of the fused count; the cost model adds the surplus on GPUs
(compute.eager_extra_time). Counted here operator by operator with a TorchDispatchMode:
every ATen op's tensor inputs and outputs, except the GEMMs and the attention kernel (timed
separately) and views (no traffic), for the three ways the runtime computes (bf16 weights
under FSDP's mixed-precision policy, fp32 weights under bf16 autocast, fp32). The per-token
part is the difference between two sequence lengths (the weights' casts, per micro-batch,
cancel out).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

from machine_models import load_framework
from planner.cost import compute
from planner.cost.layout import Layouts
from planner.schema.specs import ModelSpec, Precision, TrainingJob
from runtime.model import Block, rope_tables

# protein-3.5b's proportions (ffn / hidden = 11008 / 4096, head dimension 128), smaller.
HIDDEN, HEADS, FFN = 512, 4, 1376
TIMED = ("mm", "addmm", "bmm", "matmul", "linear")


class ByteCounter(TorchDispatchMode):
    """Bytes read and written by every ATen op that is neither a GEMM, the attention kernel
    nor a view."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in TIMED or "scaled_dot_product" in name:
            return out
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr() for t in ins}
        if outs and all(o.untyped_storage().data_ptr() in storages for o in outs) and not name.endswith("_"):
            return out  # a view of an input
        self.bytes += sum(t.numel() * t.element_size() for t in ins + outs)
        return out


def _spec(seq: int) -> ModelSpec:
    return ModelSpec(name="block", layers=1, hidden=HIDDEN, heads=HEADS, kv_heads=HEADS, ffn_hidden=FFN,
                     vocab_size=32, seq_len=seq)


def block_bytes(seq: int, mode: str) -> int:
    """Bytes one block's forward and backward move outside its GEMMs and attention, one sequence."""
    torch.manual_seed(0)
    spec = _spec(seq)
    block = Block(spec)
    dtype = torch.bfloat16 if mode == "bf16-weights" else torch.float32
    block = block.to(dtype)
    x = torch.randn(1, seq, HIDDEN, dtype=dtype, requires_grad=True)
    rope = rope_tables(spec.head_dim, seq)
    counter = ByteCounter()
    with counter:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            y = block(x, rope)
        grad = torch.ones_like(y)
        counter.bytes -= 2 * grad.numel() * grad.element_size()  # ones_like's write: the test's, not the block's
        y.backward(grad)
    return counter.bytes


def eager_bytes_per_element(mode: str) -> float:
    """Per-token bytes of the eager block over the cost model's fused element count of its
    forward, times 3 (forward and backward, as layer_times counts elementwise work)."""
    precision = Precision.fp32 if mode == "fp32" else Precision.bf16
    lay = Layouts.one(dp=1, mbs=1)
    per_seq = {}
    for seq in (256, 512):
        job = TrainingJob(global_batch=1, seq_len=seq, precision=precision)
        per_seq[seq] = (block_bytes(seq, mode), 3 * float(compute.token_elements(_spec(seq), job, lay)[0]))
    (b1, e1), (b2, e2) = per_seq[256], per_seq[512]
    return (b2 - b1) / (e2 - e1)


@pytest.mark.parametrize("mode", ["bf16-weights", "autocast", "fp32"])
def test_the_profile_says_what_the_eager_block_moves(mode):
    counted = eager_bytes_per_element(mode)
    figure = load_framework("exaplan").eager_bytes_per_element
    # One figure for the three paths (9.4, 10.9 and 10.2 counted when it was set): each within 10%.
    assert counted == pytest.approx(figure, rel=0.10), f"{mode}: {counted:.2f} bytes per element"
    # More than a fused kernel's one element, in any precision: the norms and RoPE run in fp32.
    assert counted > 4.0
