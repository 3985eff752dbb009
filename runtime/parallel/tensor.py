"""Tensor parallelism (Megatron-style, through DTensor's parallelize_module), optionally with
sequence parallelism (Korthikanti et al. 2022).

Per block, over the "tp" mesh axis:

    attention.wq / wk / wv   ColwiseParallel     heads split: each rank holds heads / tp query
                                                 heads and kv_heads / tp key/value heads (the
                                                 model's views use -1 heads, so the local
                                                 count works unchanged)
    attention.wo             RowwiseParallel     partial sums -> allreduce (or reduce-scatter
                                                 onto the sequence with SP)
    feed_forward.w1 / w3     ColwiseParallel     gate / up
    feed_forward.w2          RowwiseParallel     down
    attention_norm, ffn_norm replicated          (SP: SequenceParallel, i.e. run on this rank's
                                                 slice of the sequence, weights replicated)

and on the ends of the model (torchtitan's choices): the token embedding row-wise (vocabulary
split; masked lookup, then allreduce, or reduce-scatter onto the sequence with SP), learned
position embeddings row-wise over positions, the final norm sequence-parallel with SP, the
output head column-wise with the logits gathered to the full vocabulary on every rank
(`loss_fn` then runs unchanged; loss_parallel is not used).

With sequence parallelism the residual stream between blocks is a plain tensor holding this
rank's contiguous slice of the sequence, shape (batch, seq / tp, hidden): every block starts
with PrepareModuleInput(..., use_local_output=True) so that it always receives a plain
tensor (a DTensor arriving at a block with plain-tensor parameters fails with "mixed
torch.Tensor and DTensor" on CPU/gloo, as seen with torch 2.13). A pipeline
stage without the embedding therefore receives (batch, seq / tp, hidden) hidden states, and
one without the head sends them. Without sequence parallelism the stream is the full
(batch, seq, hidden) tensor, replicated over tp.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

__all__ = ["apply_tp"]


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard `model` (a ProteinLM or a pipeline chunk of one) over `tp_mesh` in place.
    A no-op when the tp axis has one rank. Call on the meta-device model, before recompute
    and data parallelism."""
    if tp_mesh.size() == 1:
        return
    if getattr(model.spec, "tied_embeddings", False):
        raise NotImplementedError("tensor parallelism with tied embeddings: the head would need the row-wise "
                                  "embedding weight as a column-wise one; untie them (all presets are untied)")
    sp = sequence_parallel
    stream = Shard(1) if sp else Replicate()  # layout of the residual stream between blocks

    ends: dict[str, object] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        ends["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
    if getattr(model, "pos_embeddings", None) is not None:
        # Looked up with arange(seq): output (seq, hidden), so the sequence is dim 0 here.
        ends["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                 output_layouts=Shard(0) if sp else Replicate())
    if getattr(model, "norm", None) is not None and sp:
        ends["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        ends["output"] = ColwiseParallel(input_layouts=stream, output_layouts=Replicate(), use_local_output=True)
    if ends:
        parallelize_module(model, tp_mesh, ends)

    for block in model.layers.values():
        layer_plan: dict[str, object] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=stream),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=stream),
        }
        if getattr(block.feed_forward, "w3", None) is not None:
            layer_plan["feed_forward.w3"] = ColwiseParallel()
        if sp:
            layer_plan.update({
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None),
                                                desired_input_layouts=(Replicate(), None)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
            # The block's input (from the embedding, the previous block or a pipeline
            # receive) is this rank's sequence slice, as a plain tensor.
            parallelize_module(block, tp_mesh, PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Shard(1), None), use_local_output=True))
        parallelize_module(block, tp_mesh, layer_plan)
