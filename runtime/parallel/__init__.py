"""Parallelism for the runtime: one apply_* per technique, applied in a fixed order to every
model part (the whole model, or each pipeline chunk) on the meta device:

    1. apply_tp(part, mesh["tp"], plan.sequence_parallel)      tensor (+ sequence) parallelism
    2. apply_cp(part, mesh["cp"])                              context parallelism (inputs:
                                                               context.shard_sequence slices)
    3. apply_recompute(part, plan.recompute)                   activation recompute
    4. (torch.compile of each block, optional)
    5. handle = apply_data_parallel(part, mesh, plan)          DDP / FSDP2 / HSDP / ZeRO-1/2

then part.to_empty(device), init_weights, part.setup_rope(device), and
handle.build_optimizer(...). Pipeline parallelism (runtime.parallel.pipeline) splits the
model before step 1.
"""

from runtime.parallel.context import apply_cp, shard_sequence
from runtime.parallel.data_parallel import DataParallelHandle, apply_data_parallel, clip_grad_norm_
from runtime.parallel.recompute import apply_recompute
from runtime.parallel.tensor import apply_tp
from runtime.parallel.zero import ZeroOptimizer

__all__ = ["apply_tp", "apply_cp", "shard_sequence", "apply_recompute", "apply_data_parallel", "DataParallelHandle",
           "clip_grad_norm_", "ZeroOptimizer"]
