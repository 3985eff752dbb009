"""Data-parallel traffic and model states of a mesh (level 2 of planner.cost.step): the terms
the row level overlaps with compute, and the optimizer's time.

    F  all-gathers under the forward (ZeRO's updated weights, FSDP's blocks)
    K  reduce-scatters under the backward (ZeRO's and FSDP's gradients; FSDP's refetch)
    S  allreduces under the last backward (DDP's buckets, HSDP across replicas, the ZeRO
       buckets of a framework that allreduces them), for each DDP bucket size

each with its total and its floor (what can never hide: one bucket or block), paid every
micro-batch or once a step. F and K come by reduce-scatter/all-gather algorithm, S by
allreduce algorithm (planner.cost.comm).

Which collective a framework's ZeRO-1/2 issues (ZERO_COLLECTIVES):
  - Megatron-LM's distributed optimizer reduce-scatters each gradient bucket
    (param_and_grad_buffer.py start_grad_sync: _reduce_scatter_base) in buckets of
    max(40M, 1M x dp) parameters ("larger DP sizes need larger buckets to ensure collectives
    do not become latency-bound", distributed_data_parallel_config.py, 2024), under the last
    micro-batch's backward with --overlap-grad-reduce, and with --overlap-param-gather
    all-gathers the updated weights bucket by bucket in forward pre-hooks of the next step's
    first micro-batch (distrib_optimizer.py); exaplan's runtime reduce-scatters 25 MiB
    buckets (runtime/parallel/zero.py).
  - DeepSpeed's ZeRO-1/2 (stage_1_and_2.py) allreduces each reduce bucket (5e8 elements):
    since 0.12.4 (PR #4695, zero_optimization.use_multi_rank_bucket_allreduce, on by
    default) average_tensor packs the slices every rank owns into one tensor and allreduces
    it, each rank keeping its own slice ("instead of reduce operations": one reduce per
    owning rank before); with overlap_comm under the last backward (ZeRO-1: only at the
    gradient-accumulation boundary). Its step() then all-gathers the updated 16-bit weights
    (runtime/utils.py all_gather_dp_groups: one all_gather_into_tensor per parameter
    group; Megatron-DeepSpeed makes two, with and without weight decay, the second holding
    only the norms' 1-D weights: megatron/optimizer/__init__.py get_param_groups) before
    returning, so nothing hides them. So the library's allreduce algorithms
    apply (NCCL's and RCCL's double binary tree: latency 2 log2(nodes) hops, against a
    ring's one hop per rank), and the weights' ring all-gather, the only all-gather NCCL and
    RCCL offer with several GPUs per node (PAT needs one: NCCL 2.23+, tuning.cc), pays its
    n - 1 hop latencies twice a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import comm, compute
from planner.cost.layout import SH_FSDP, SH_GRAD_OP, SH_HSDP, SH_NONE, SH_ZERO1, SH_ZERO2, Layouts
from planner.cost.memory import (autocast_copy_bytes, buffer_bytes, model_state_bytes, pipeline_grad_bytes, reference_bytes,
                                 stage_params, zero_on_fp32_weights)
from planner.cost.topology import LinkTiers
from planner.schema.specs import MachineModel, ModelSpec, Precision, TrainingJob

# DDP bucket sizes of exaplan's runtime (MB); each framework's: FrameworkProfile.ddp_buckets_mb.
DDP_BUCKETS_MB = (25.0, 100.0, 400.0)


@dataclass(frozen=True)
class ZeroCollectives:
    """How a framework's ZeRO-1/2 moves gradients and the updated weights."""

    grads_allreduced: bool = False  # each gradient bucket allreduced (not reduce-scattered)
    gather_hidden: bool = True  # the weights' all-gather may run under the next forward
    gather_calls: int = 1  # all-gathers of the weights a step (one per parameter group)
    # The allreduced gradients (S: DDP, HSDP, allreducing ZeRO) may run under the last backward
    # with a pipeline too; False: only after the pipeline has flushed, under no compute.
    allreduce_hidden_in_pipeline: bool = True


# Frameworks whose ZeRO-1/2 differ from the default (reduce-scatter per bucket, all-gather
# that may hide under the forward), by profile name: FrameworkProfile has no field for it
# yet. DeepSpeed: see the module docstring; its pipeline engine reduces the gradients in the
# ReduceGrads instruction that TrainSchedule issues after the last micro-batch's backward
# (deepspeed/runtime/pipe/schedule.py, engine.py _exec_reduce_grads), with no compute left.
ZERO_COLLECTIVES = {"deepspeed": ZeroCollectives(grads_allreduced=True, gather_hidden=False, gather_calls=2,
                                                 allreduce_hidden_in_pipeline=False)}


def zero_collectives(job: TrainingJob) -> ZeroCollectives:
    """How the job's framework moves gradients and weights (ZERO_COLLECTIVES, else the default)."""
    return ZERO_COLLECTIVES.get(job.framework.name, ZeroCollectives())


@dataclass
class MeshCosts:
    """Data-parallel traffic of a mesh, as terms the row level overlaps with compute:
    F (under forward) and K (under backward), by reduce-scatter/all-gather algorithm, and S
    (allreduced gradients, under the last backward) by allreduce algorithm and DDP bucket
    size; each paid every micro-batch (`*_per_mb`) or once a step. Totals and floors (s)."""

    F_total: dict[int, np.ndarray]
    F_floor: dict[int, np.ndarray]
    K_total: dict[int, np.ndarray]
    K_floor: dict[int, np.ndarray]
    F_per_mb: np.ndarray
    K_per_mb: np.ndarray
    S_total: dict[int, list[np.ndarray]]  # by allreduce algorithm, one per DDP bucket size
    S_floor: dict[int, list[np.ndarray]]
    S_per_mb: np.ndarray
    parameters: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    buffers: np.ndarray
    optimizer_s: np.ndarray
    reference: np.ndarray  # dpo: the frozen reference model's parameters (bytes per device)
    autocast_copies: np.ndarray  # the parameters' 16-bit autocast copies (memory.autocast_copy_bytes)
    pipeline_grads: np.ndarray  # gradients a pipeline's deferred sync accumulates unsharded (memory.pipeline_grad_bytes)


@dataclass
class _MeshTraffic:
    """What every data-parallel term of a mesh needs (arrays over meshes)."""

    m: Layouts
    tiers: LinkTiers
    M_grad: np.ndarray  # gradient bytes of a rank's stage, in the framework's reduction dtype
    M_w: np.ndarray  # 16-bit (or fp32) weight bytes of the same
    n_blocks: np.ndarray
    zb: np.ndarray  # ZeRO gradient buckets
    zero: np.ndarray
    fsdp: np.ndarray
    copy_s: float  # s per byte of the framework's buffer copies around a collective
    zc: ZeroCollectives
    ddp_views: np.ndarray | bool = False  # exaplan's DDP (ddp_impl ddp): gradients are bucket views, no copies

    @property
    def single(self) -> np.ndarray:
        return self.m.grad_group == 1


def _sharded_terms(d: _MeshTraffic, rsag_codes) -> tuple[dict, dict, dict, dict]:
    """F and K by reduce-scatter/all-gather algorithm. ZeRO-1/2 reduce-scatter the gradients
    in the framework's buckets (Megatron-LM's distributed optimizer: max(40M, 1M x dp)
    parameters; exaplan's runtime: 25 MiB of fp32), ZeRO-1 once a step under the last
    backward, ZeRO-2 every micro-batch, unless the framework allreduces them (S terms); both
    all-gather the updated 16-bit weights before the next forward, behind it where the
    framework prefetches (floor: one block's share), else exposed whole. FSDP all-gathers
    each block before forward (and again before backward when resharded) and
    reduce-scatters its gradients. ZeRO's gradients already sit in its flat buckets (hooks
    add them during backward) and only the gathered weights are copied back: half the
    buffer passes, on the all-gather."""
    m, s = d.m, d.m.sharding
    pl_grad = comm.place(m.grad_group, m.tp, d.tiers)
    pl_shard = comm.place(m.shard_group, m.tp, d.tiers)
    zero_rs = d.zero & (not d.zc.grads_allreduced)
    refetch = np.where(s == SH_GRAD_OP, 0.0, 1.0)
    F_total, F_floor, K_total, K_floor = {}, {}, {}, {}
    for r in rsag_codes:
        rs_bucket = comm.reduce_scatter(r, pl_grad, d.M_grad / d.zb)
        ag_grad_group = comm.all_gather(r, pl_grad, d.M_w) + d.copy_s / 2 * d.M_w
        # A further parameter group's all-gather: its bytes are negligible, its hops are not.
        ag_grad_group = ag_grad_group + (d.zc.gather_calls - 1) * comm.all_gather(r, pl_grad, 0.0)
        ag_block = comm.all_gather(r, pl_shard, d.M_w / d.n_blocks) + d.copy_s * d.M_w / d.n_blocks
        rs_block = comm.reduce_scatter(r, pl_shard, d.M_grad / d.n_blocks) + d.copy_s * d.M_grad / d.n_blocks
        ag_floor = ag_grad_group / d.n_blocks if d.zc.gather_hidden else ag_grad_group
        F_total[r] = np.where(d.zero, ag_grad_group, np.where(d.fsdp, d.n_blocks * ag_block, 0.0))
        F_floor[r] = np.where(d.zero, ag_floor, np.where(d.fsdp, ag_block, 0.0))
        K_total[r] = np.where(zero_rs, d.zb * rs_bucket, np.where(d.fsdp, d.n_blocks * (refetch * ag_block + rs_block), 0.0))
        K_floor[r] = np.where(zero_rs, rs_bucket, np.where(d.fsdp, rs_block, 0.0))
        for terms in (F_total, F_floor, K_total, K_floor):
            terms[r] = np.where(d.single, 0.0, terms[r])
    return F_total, F_floor, K_total, K_floor


def _allreduced_terms(d: _MeshTraffic, ar_codes, ddp_buckets_mb) -> tuple[dict, dict]:
    """S by allreduce algorithm, one per DDP bucket size: DDP's bucketed allreduce of all
    gradients, HSDP's allreduce of the shards across replicas, and the ZeRO buckets of a
    framework that allreduces them (the DDP bucket size does not apply to those)."""
    m, s = d.m, d.m.sharding
    G = np.maximum(m.shard_group, 1)
    pl_grad = comm.place(m.grad_group, m.tp, d.tiers)
    pl_rep = comm.place(m.dp_replicate, m.dp_shard * m.cp * m.tp, d.tiers)
    hsdp, ddp = s == SH_HSDP, s == SH_NONE
    zero_ar = d.zero & d.zc.grads_allreduced
    bytes_ = np.where(hsdp, d.M_grad / G, d.M_grad)
    S_total, S_floor = {}, {}
    for a in ar_codes:
        per_zero = comm.allreduce(a, pl_grad, d.M_grad / d.zb) + d.copy_s * d.M_grad / d.zb
        S_total[a], S_floor[a] = [], []
        for mb in ddp_buckets_mb:
            n = np.maximum(np.ceil(bytes_ / (mb * 1e6)), 1)
            per_ddp = comm.allreduce(a, pl_grad, bytes_ / n) + np.where(d.ddp_views, 0.0, d.copy_s) * bytes_ / n
            per_hsdp = comm.allreduce(a, pl_rep, bytes_ / n) + d.copy_s * bytes_ / n
            per = np.where(hsdp, per_hsdp, np.where(ddp, per_ddp, np.where(zero_ar, per_zero, 0.0)))
            per = np.where(d.single, 0.0, per)
            S_total[a].append(np.where(zero_ar, d.zb, n) * per)
            S_floor[a].append(per)
    return S_total, S_floor


def mesh_costs(model: ModelSpec, machine: MachineModel, job: TrainingJob, m: Layouts, tiers: LinkTiers, algos,
               ddp_buckets_mb: tuple[float, ...] = DDP_BUCKETS_MB) -> MeshCosts:
    s, fw = m.sharding, job.framework
    P = stage_params(model, m) / m.tp
    grad_bytes = fw.grad_reduce_bytes(job.precision)  # fp32 unless the framework reduces in the 16-bit dtype
    M_grad = P * grad_bytes
    zero = (s == SH_ZERO1) | (s == SH_ZERO2)
    zero_bucket_bytes = grad_bytes * np.maximum(fw.zero_bucket_params, fw.zero_bucket_params_per_rank * m.grad_group)
    # Each collective's buffer also passes through memory around it (FSDP2's copy-in to a
    # flat buffer and copy-out; DDP's and ZeRO's bucket copies): in line on a CPU, hidden on
    # the communication stream of a GPU (machine.dp_buffer_copies passes, read + write).
    d = _MeshTraffic(
        m, tiers, M_grad, P * np.where((job.precision == Precision.fp32) | zero_on_fp32_weights(job, m), 4.0, 2.0),
        np.ceil(model.layers / m.pp),
        zb=np.maximum(np.ceil(M_grad / zero_bucket_bytes), 1), zero=zero,
        fsdp=(s == SH_FSDP) | (s == SH_GRAD_OP) | (s == SH_HSDP),
        copy_s=machine.dp_buffer_copies * 2.0 / (machine.memory_bandwidth_gbyte_s * 1e9),
        zc=zero_collectives(job),
        # The runtime's DistributedDataParallel (planner.schema.plan.ddp_impl_for) reduces the
        # gradients in place in its buckets (gradient_as_bucket_view); FSDP2's replicate
        # copies them in and out like the sharded kinds.
        ddp_views=(s == SH_NONE) & (m.tp == 1) & (m.pp == 1) & (job.precision != Precision.fp16) & (fw.name == "exaplan"),
    )
    ar_codes, rsag_codes = algos
    F_total, F_floor, K_total, K_floor = _sharded_terms(d, rsag_codes)
    S_total, S_floor = _allreduced_terms(d, ar_codes, ddp_buckets_mb)
    params, grads, opt = model_state_bytes(model, job, m)
    opt_params = np.where(s == SH_NONE, P, P / np.maximum(m.shard_group, 1))
    # AdamW reads and writes its shard (fp32 weights, gradients, two moments, the 16-bit
    # copy), plus the framework's fixed cost per step.
    per_param = machine.optimizer_bytes_per_param or (30.0 if job.precision != Precision.fp32 else 28.0)
    optimizer_s = opt_params * per_param / (machine.memory_bandwidth_gbyte_s * 1e9)
    # Operators the optimizer launches: per parameter tensor, or per flat bucket under ZeRO.
    tensors = np.where(zero, d.zb, d.n_blocks * compute.TENSORS_PER_BLOCK + 3)
    # The host's fixed work per step: measured for the framework where it has it (step_launch_s,
    # a floor under the optimizer on a GPU), else the fitted step_overhead_s of its rows.
    launch_floor = compute.step_launch_floor_s(machine, job)
    fixed = machine.step_overhead_s if launch_floor == 0.0 else 0.0
    optimizer_s = optimizer_s + fixed + machine.op_overhead_us * 1e-6 * compute.OPTIMIZER_OPS_PER_TENSOR * tensors
    optimizer_s = np.maximum(optimizer_s, launch_floor)
    return MeshCosts(
        F_total, F_floor, K_total, K_floor,
        F_per_mb=d.fsdp, K_per_mb=d.fsdp | (s == SH_ZERO2),
        S_total=S_total, S_floor=S_floor, S_per_mb=zero & d.zc.grads_allreduced & (s == SH_ZERO2),
        parameters=params, gradients=grads, optimizer=opt, buffers=buffer_bytes(model, job, m), optimizer_s=optimizer_s,
        reference=reference_bytes(model, job, m), autocast_copies=autocast_copy_bytes(model, job, m),
        pipeline_grads=pipeline_grad_bytes(model, job, m),
    )
