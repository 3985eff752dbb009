"""Activation recompute (activation checkpointing), at the plan's level.

    none       keep every activation.
    selective  recompute the attention core only (Korthikanti et al. 2022): the
               `scaled_dot_product_attention` call of every block runs under non-reentrant
               torch.utils.checkpoint. Kept for backward: everything the block keeps without
               recompute except what the attention core itself saves, i.e. the core's inputs
               (the rotated q, k and v) stay, and its internals are dropped: the s x s scores
               and probabilities of the math kernel, or the output and log-sum-exp of a fused
               (flash) kernel. Recomputed in backward: the core alone (QK^T, softmax, PV), about
               4 b s^2 h FLOPs per block. This is planner/cost/memory.py's "selective": with a
               fused kernel the saving is small (no s x s tensor exists), without one it is the
               whole scores term.
    full       keep only each block's input; the whole block is recomputed in backward
               (checkpoint_wrapper, non-reentrant, around every Block).
    selective-op
               torchtitan's per-op selective checkpointing (torchtitan/distributed/
               activation_checkpoint.py, selective_ac_option "op"): every block runs under
               non-reentrant checkpoint with a policy that keeps the output of the fused
               attention kernel, of every other matmul (the 1st, 3rd, 5th and 7th of the
               block: q, v, gate, down; k, o and up are recomputed) and of tensor-parallel
               reduce-scatters, and recomputes every other op (norms, RoPE, SiLU, products,
               residual adds). planner/cost/memory.py op_kept_bytes and flops.op_recomputed_gemms.

Call after tensor parallelism and before data parallelism (the trainer's fixed order). Full
and selective-op recompute wrap each block, so parameter names gain "_checkpoint_wrapped_module."
(runtime.model.canonical_name and DCP's state-dict helpers remove it). Selective recompute
keeps the module tree unchanged: it replaces each Attention module's `forward` with one that
runs the original under a TorchFunctionMode that reroutes only the attention-core call.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from planner.schema.plan import Recompute

__all__ = ["apply_recompute", "RecomputeAttentionCore", "op_policy_context"]

_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}

# selective-op: the ops whose outputs are kept, besides every other matmul (the fused
# attention kernels of every backend, and tensor-parallel reduce-scatters, as torchtitan).
_OP_KEPT = {getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
) if hasattr(torch.ops.aten, name)} | {torch.ops._c10d_functional.reduce_scatter_tensor.default}
_MM = torch.ops.aten.mm.default


def op_policy_context():
    """The context pair of one block's selective-op checkpoint (a fresh matmul count per call,
    in forward and in the recompute alike, so both keep the same matmuls)."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func == _MM:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            keep = counts[mode] % 2 == 1
        else:
            keep = func in _OP_KEPT
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class RecomputeAttentionCore(TorchFunctionMode):
    """Inside this mode, every scaled_dot_product_attention call runs under non-reentrant
    checkpoint: its inputs are saved, its internals are recomputed in backward. Every other
    call passes through unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SDPA and torch.is_grad_enabled():
            # The mode is not active inside this handler, nor during the recompute in
            # backward, so `func` here is the plain kernel.
            return checkpoint(func, *args, use_reentrant=False, **kwargs)
        return func(*args, **kwargs)


def _with_core_recompute(forward):
    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        with RecomputeAttentionCore():
            return forward(*args, **kwargs)

    return wrapped


def apply_recompute(model: nn.Module, level: Recompute | str) -> None:
    """Apply the plan's recompute level to every block of `model` (a ProteinLM or a pipeline
    chunk) in place."""
    level = Recompute(level)
    if level == Recompute.none:
        return
    for key, block in list(model.layers.items()):
        if level == Recompute.full:
            model.layers[key] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        elif level == Recompute.selective_op:
            model.layers[key] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                                   context_fn=op_policy_context)
        else:
            attention = block.attention
            if getattr(attention, "_exaplan_core_recompute", False):
                continue  # applied already
            attention.forward = _with_core_recompute(attention.forward)
            attention._exaplan_core_recompute = True
