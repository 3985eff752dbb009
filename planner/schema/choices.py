"""The layout choices a plan names (data-parallel sharding, activation recompute, pipeline
schedule) as plain enums: no pydantic, so that the command line builds its parser and
`exaplan --help` without importing the schema (planner/schema/framework.py re-exports them).
"""

from __future__ import annotations

from enum import Enum


class Sharding(str, Enum):
    """How data-parallel ranks hold parameters, gradients and optimizer state."""

    none = "none"  # DDP: everything replicated, gradients allreduced
    zero1 = "zero1"  # optimizer state sharded over dp
    zero2 = "zero2"  # optimizer state and gradients sharded over dp
    fsdp = "fsdp"  # everything sharded, parameters resharded after forward (FULL_SHARD)
    fsdp_grad_op = "fsdp-grad-op"  # everything sharded, gathered parameters kept to backward
    hsdp = "hsdp"  # fsdp inside a shard group of dp_shard ranks, replicated across groups


class Recompute(str, Enum):
    """Activation recompute levels (memory kept: none > selective > selective-op > full)."""

    none = "none"  # keep every activation
    selective = "selective"  # recompute the attention core only (Korthikanti et al. 2022)
    full = "full"  # keep only each block's input; recompute the block in backward
    selective_op = "selective-op"  # torchtitan's per-op policy: keep the attention core's and every other GEMM's output


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved_1f1b = "interleaved-1f1b"


__all__ = ["Recompute", "Schedule", "Sharding"]
