"""Compute time of one micro-batch through one transformer block, and through the head.

Each GEMM is timed as FLOPs / (peak * efficiency(d)), with d = (M N K)^(1/3) its size on one
rank, so high tensor parallelism or a small micro-batch lands on the slow part of the
machine's efficiency curve (planner.schema.specs.MatmulEfficiency). Elementwise work (norms,
RoPE, activation, residual adds, unfused softmax, the loss) is memory-bound: the bytes it
must move / (memory bandwidth x elementwise_efficiency) (the roofline's other side; Williams
et al. 2009; elementwise_time). Backward = 2 x forward for GEMMs and a block's elementwise
work; the attention core's backward is modelled by kernel (attention_core_time):

    flash (FlashAttention-2, Dao 2023): forward 2 GEMMs (S = Q K^T, O = P V) over the causal
        half; backward recomputes S and P from the saved softmax statistics and runs dV, dP,
        dQ, dK: 5 GEMMs, 2.5 x the forward FLOPs (the paper's own count);
    unfused: the scores stay in memory, backward 4 GEMMs (2 x forward); softmax traffic over
        the s x s scores is elementwise work.

Each attention GEMM is timed as a GEMM of its size (d = (s_local s head_dim)^(1/3): short
sequences run slower, as FlashAttention-2's own measurements do) and divided by the device
kind's attention_efficiency_factor: what the fused kernel reaches relative to such a GEMM.
FlashAttention-2 reaches 50-73% of A100 peak (Dao 2023) but about 35% of H100's (Shah et al.
2024, FlashAttention-3: it predates Hopper's asynchronous tensor-core instructions, and the
softmax exponentials, on units 256 x slower than H100's tensor cores, are not overlapped
with its GEMMs), against 70-80% for large GEMMs: about 0.75 (A100) and 0.45 (H100).

The elementwise bytes are the least a block's kernels must move, each op fused into one pass
(elementwise_bytes); elementwise_efficiency, fitted per device kind, is the fraction of the
memory bandwidth a training step's elementwise kernels reach on that count. It is well below
a copy's ~0.9 (STREAM copy and triad reach 2.90-2.97 of H100's 3.35 TB/s): activation-sized
tensors (tens of MB) pay each kernel's launch and tail, reductions (norm statistics, weight
gradients) take extra passes, and the frameworks' eager ops move more than the count (an
fp32 upcast and 4-5 kernels for one RMSNorm). Published microbenchmarks on the counted
traffic: a fused RMSNorm kernel reaches 0.35 of H100's bandwidth and PyTorch's eager one
0.15 (bf16, 4 x 4096 x 3072; huggingface kernel-skill, LTX-Video benchmarks); PyTorch's
LayerNorm forward + backward about 0.32 of an A100 80GB's (fp16, 8192 x 4096: 509 us for
5 passes of 67 MB; pytorch/pytorch#87445). Without this figure (at 1) the attention factor
had absorbed the missing time and sat at its floor.
"""

from __future__ import annotations

import numpy as np

from planner.cost import flops as _flops
from planner.cost.layout import RC_FULL, RC_OP, RC_SELECTIVE, SH_NONE, SH_ZERO1, SH_ZERO2, Layouts
from planner.schema.specs import MachineModel, ModelSpec, TrainingJob, bytes_per_element


def matmul_efficiency(machine: MachineModel, dim) -> np.ndarray:
    """Achievable fraction of peak for a GEMM of geometric-mean size `dim`."""
    e = machine.matmul_efficiency
    dim = np.asarray(dim, dtype=np.float64)
    return e.peak_fraction * dim / (dim + e.half_dim)


def gemm_time(machine: MachineModel, job: TrainingJob, M, N, K) -> np.ndarray:
    """Seconds for one forward GEMM of (M x K) @ (K x N) on one device."""
    flops = 2.0 * M * N * K
    dim = np.cbrt(np.asarray(M * N * K, dtype=np.float64))
    return flops / (machine.peak_flops(job.precision) * matmul_efficiency(machine, dim))


def tokens_per_microbatch(job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Tokens one rank's GEMMs see per micro-batch: mbs x seq / cp."""
    return lay.mbs * job.seq_len / lay.cp


# Backward / forward FLOPs of the attention core: FlashAttention-2 recomputes Q K^T (5 GEMMs
# against 2; Dao 2023, whose benchmarks count backward as 2.5 x forward); unfused: 4 against 2.
FLASH_BACKWARD_RATIO = 2.5
UNFUSED_BACKWARD_RATIO = 2.0


def attention_backward_ratio(machine: MachineModel) -> float:
    return FLASH_BACKWARD_RATIO if machine.flash_attention else UNFUSED_BACKWARD_RATIO


# Sequence length from which a fused attention kernel runs at a constant rate: it works in
# tiles of 64-128 queries x keys, so longer sequences add tiles, not larger GEMMs. Measured:
# llm-foundry's tables (calibration/data/llm_foundry_mpt.csv, MPT-1B on 8 GPUs) add a constant
# time per token per unit of sequence from 2k to 32k (A100 3.4-4.0 ns, H100 1.9-2.0 ns for each
# doubling), and FlashAttention-2's own forward + backward benchmarks (Dao 2023, figs. 4-6) are
# within about 10% of their 16k rate from 2k on. Below it the kernel is timed as a GEMM of its
# size, as before.
FLASH_SATURATION_SEQ = 2048


def attention_core_time(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Forward attention core (scores and context) for one micro-batch on one rank. Fused
    (flash) kernels skip the masked half of a causal score matrix, and their rate stops
    growing with the sequence at FLASH_SATURATION_SEQ; unfused ones are batched GEMMs of the
    scores' size."""
    local_s = job.seq_len / lay.cp
    heads = model.heads / lay.tp
    flops = 2.0 * local_s * job.seq_len * model.head_dim  # Q K^T of one head
    kernels = measured_kernels(machine, job)
    if kernels is not None and machine.flash_attention:
        seqs, where = np.unique(np.asarray(local_s, dtype=np.float64), return_inverse=True)
        rate_tflops = np.array([kernels.attention_rate_tflops(model.head_dim, s) for s in seqs])[where].reshape(np.shape(local_s))
        return 2.0 * flops * heads * lay.mbs * 0.5 / (rate_tflops * 1e12)
    if machine.flash_attention:
        size = np.minimum(local_s, FLASH_SATURATION_SEQ) * min(job.seq_len, FLASH_SATURATION_SEQ) * model.head_dim
        rate = matmul_efficiency(machine, np.cbrt(size)) * attention_kernel_speed(job)
    else:
        rate = matmul_efficiency(machine, np.cbrt(local_s * job.seq_len * model.head_dim))
    per_head = flops / (machine.peak_flops(job.precision) * rate)
    causal = 0.5 if machine.flash_attention else 1.0
    return 2.0 * per_head * heads * lay.mbs * causal / machine.attention_efficiency_factor


def measured_kernels(machine: MachineModel, job: TrainingJob):
    """The device kind's measured kernels of exaplan's runtime (planner/schema/kernels.py)
    where the job's framework charges them (its profile's measured_kernels) on a GPU; else None
    (the fitted figures). Their attention rate is of the causal forward + backward: forward
    time is the forward's FLOPs over it, and layer_times adds the backward at
    FLASH_BACKWARD_RATIO x forward, as the rate was counted."""
    from planner.schema.figures import is_cpu

    kernels = getattr(machine, "runtime_kernels", None)
    if kernels is None or not getattr(getattr(job, "framework", None), "measured_kernels", False) or is_cpu(machine):
        return None
    return kernels


def attention_kernel_speed(job: TrainingJob) -> float:
    """The framework's fused attention kernel relative to FlashAttention-2 (its profile's
    attention_kernel_speed; 1 without a profile)."""
    return float(getattr(getattr(job, "framework", None), "attention_kernel_speed", 1.0))


def dense_time(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Forward QKV, output projection and MLP GEMMs of one block for one micro-batch."""
    T = tokens_per_microbatch(job, lay)
    h, f, t = model.hidden, model.ffn_hidden, lay.tp
    kv = model.kv_heads * model.head_dim
    up_cols = 2 * f if model.activation == "swiglu" else f
    return (
        gemm_time(machine, job, T, (h + 2 * kv) / t, h)
        + gemm_time(machine, job, T, h, h / t)
        + gemm_time(machine, job, T, up_cols / t, h)
        + gemm_time(machine, job, T, h, f / t)
    )


def elementwise_bytes(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Bytes one block's memory-bound ops must move in forward for one micro-batch on one
    rank, each op fused into one pass (the count elementwise_efficiency is fitted on).

    Two norms and two residual adds on the (sequence-parallel-split) residual stream
    (read+write: 2 + 3 accesses each), RoPE on Q and K (models with rotary positions; learned
    positions are added once, at the embedding), the MLP activation (reads gate and up,
    writes their product), and without a fused attention kernel the softmax over the s x s
    scores (write scores, read, write probabilities, read for P V). Backward is counted as
    2 x this (layer_times); fused, it moves about 1.5 x: a norm's input gradient (read x and
    dy, write dx) and weight gradient (read both again), 2.5 x its forward; the residual
    gradients' sums (2 reads, 1 write), 1 x; the activation's gradient (its inputs and dy
    read, one gradient per input written), 1.5-1.7 x.
    """
    total = token_elements(model, job, lay)
    if not machine.flash_attention:
        scores = lay.mbs * (model.heads / lay.tp) * (job.seq_len / lay.cp) * job.seq_len
        total = total + 4 * scores
    return total * bytes_per_element(job.precision)


def token_elements(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Elements the norms, residual adds, RoPE and the MLP activation read and write in one
    block's forward for one micro-batch on one rank, fused (elementwise_bytes without the
    unfused softmax's scores)."""
    T = tokens_per_microbatch(job, lay)
    h, f, t = model.hidden, model.ffn_hidden, lay.tp
    kv = model.kv_heads * model.head_dim
    stream = np.where(lay.sp == 1, T / t, T) * h
    total = 2 * 2 * stream + 2 * 3 * stream
    if model.position == "rope":
        total = total + 2 * T * (h + kv) / t
    return total + (3 if model.activation == "swiglu" else 2) * T * f / t


# The share of the elementwise kernels' time that scales with a part's memory bandwidth, across
# parts of one device kind with different memory; the rest runs as on the part the kind's figure
# was fitted or measured on (launches, tails, reductions, caches). From exaplan's own compiled
# norm + residual and SwiGLU kernels, the same shapes timed on an H100 (3.35 TB/s) and an H200
# (4.8 TB/s): medians 2.72 and 3.33 TB/s reached (docs/gpu/2026-11-26-h{1,2}00-kernels.json),
# 1 - 2.72/3.33 = s (1 - 3.35/4.8), s = 0.61. Checked where nothing was fitted (docs/validation/
# published.md): llm-foundry's 41 A100 80GB/40GB pairs (2,039 against 1,555 GB/s) ran 1.03-1.06x
# apart where all of it scaling said 1.06-1.12x, and torchtitan's H100s at 2.4 TB/s.
ELEMENTWISE_BANDWIDTH_SHARE = 0.6


def elementwise_bandwidth(machine: MachineModel, kernels=None) -> float:
    """Bytes per second the elementwise terms divide by: the part's memory bandwidth where the
    figure was fitted or measured on a part like it, else 1 / (s / bandwidth + (1 - s) /
    reference) with s = ELEMENTWISE_BANDWIDTH_SHARE and the reference bandwidth the figure came
    from (the measured kernels' card, or the device kind's elementwise_reference_gbyte_s)."""
    bw = machine.memory_bandwidth_gbyte_s
    ref = machine.elementwise_reference_gbyte_s if kernels is None else kernels.memory_bandwidth_gbyte_s
    if not ref or ref == bw:
        return bw * 1e9
    s = ELEMENTWISE_BANDWIDTH_SHARE
    return 1e9 / (s / bw + (1.0 - s) / ref)


def elementwise_time(machine: MachineModel, nbytes, job: TrainingJob | None = None) -> np.ndarray:
    """Seconds to move `nbytes` through memory-bound elementwise kernels: bytes / (memory
    bandwidth x elementwise_efficiency), the fraction of the copy bandwidth such kernels reach:
    the device kind's fitted figure, or the measured one where the job charges measured kernels
    (the bandwidth as elementwise_bandwidth scales it to this part)."""
    kernels = None if job is None else measured_kernels(machine, job)
    fraction = machine.elementwise_efficiency if kernels is None else kernels.elementwise_efficiency
    return np.asarray(nbytes, dtype=np.float64) / (elementwise_bandwidth(machine, kernels) * fraction)


def weight_traffic_time(machine: MachineModel, job: TrainingJob, params, lay: Layouts) -> np.ndarray:
    """Seconds per micro-batch for `params` weights held on a rank to move their profile's
    weight_bytes_per_param beside the GEMMs (autocast's casts of fp32 weights, fp32 gradient
    accumulation), streamed at EAGER_BANDWIDTH_FRACTION of the memory bandwidth: charged with
    measured kernels only (the fitted figures hold whatever the published runs did instead),
    and not under the FSDP shardings, whose weights arrive in bf16 from their all-gather
    (MixedPrecisionPolicy: runtime/parallel/data_parallel.py). Measured on an H100 in the
    runtime's step: 6.5 ms of casts and accumulation per micro-batch for 0.81 B parameters, 8.0
    ps each, against 24 bytes at this rate, 8.1 ps (docs/gpu/2026-11-26-h100-kernels-step.json)."""
    if measured_kernels(machine, job) is None:
        return np.zeros_like(np.asarray(lay.mbs, dtype=np.float64))
    nbytes = float(getattr(job.framework, "weight_bytes_per_param", 0.0)) * np.asarray(params, dtype=np.float64)
    autocast = np.isin(lay.sharding, (SH_NONE, SH_ZERO1, SH_ZERO2))
    return np.where(autocast, nbytes / (machine.memory_bandwidth_gbyte_s * 1e9 * EAGER_BANDWIDTH_FRACTION), 0.0)


# The fraction of a GPU's memory bandwidth that eager PyTorch's elementwise kernels reach: each is
# one streaming pass over an activation-sized tensor, as fast as a copy. STREAM copy and triad
# reach 0.87-0.89 of H100's 3.35 TB/s (2.90-2.97 TB/s, Azure ND H100 v5); benchmarks/gpu_check.py
# measured a 2 GiB copy at 0.90 of an H100's and 0.88 of an H200's (docs/gpu/).
EAGER_BANDWIDTH_FRACTION = 0.88


def eager_gpu_figure(machine: MachineModel, job: TrainingJob, name: str) -> float | None:
    """The job's framework figure `name` for blocks run eager on a GPU, or None: without the
    figure, with the blocks compiled, or on a CPU (whose fitted figures were measured on the
    eager runtime itself: figures.is_cpu)."""
    from planner.schema.figures import is_cpu

    fw = getattr(job, "framework", None)
    value = getattr(fw, name, None)
    return None if value is None or getattr(fw, "compiled", False) or is_cpu(machine) else float(value)


def eager_extra_time(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Forward seconds one block's unfused (eager) elementwise ops add on a GPU for one
    micro-batch, over the fused count of token_elements: a framework that runs them op by op
    (its profile's eager_bytes_per_element, e, and not `compiled`) moves e bytes per element of
    that count where fused kernels move one element's size; the surplus streams at
    EAGER_BANDWIDTH_FRACTION of the memory bandwidth, or at the device kind's measured
    eager_surplus_efficiency where the job charges measured kernels. Backward is counted as 2 x this
    (layer_times), as the count itself was taken: forward and backward of the runtime's block
    (tests/runtime/test_eager_traffic.py). Zero on a CPU, whose fitted figures were measured
    on the eager runtime itself (figures.is_cpu), and for fused or compiled frameworks."""
    e = eager_gpu_figure(machine, job, "eager_bytes_per_element")
    surplus = 0.0 if e is None else max(e - bytes_per_element(job.precision), 0.0)
    kernels = measured_kernels(machine, job)
    rate = getattr(kernels, "eager_surplus_efficiency", None) or EAGER_BANDWIDTH_FRACTION
    return surplus * token_elements(model, job, lay) / (elementwise_bandwidth(machine, kernels) * rate)


def recompute_early_stop(job: TrainingJob) -> bool:
    """Whether the framework's full recompute stops before each block's last GEMM (its
    profile's recompute_early_stop; False without a profile)."""
    return bool(getattr(getattr(job, "framework", None), "recompute_early_stop", False))


def last_gemm_time(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Forward of a block's last GEMM, the MLP down projection, for one micro-batch."""
    return gemm_time(machine, job, tokens_per_microbatch(job, lay), model.hidden, model.ffn_hidden / lay.tp)


def op_recompute_time(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts, attn, elem) -> np.ndarray:
    """selective-op's replay of one block for one micro-batch: the GEMMs it does not keep
    (flops.op_recomputed_gemms), every elementwise op of the forward (`elem`: norms, RoPE, the
    activation, residual adds; none is kept) and, without a fused attention kernel (whose
    output it keeps), the attention core (`attn`)."""
    T = tokens_per_microbatch(job, lay)
    # Split over tp along N (column-parallel) or K (row-parallel): the same time either way.
    gemms = sum(gemm_time(machine, job, T, n / lay.tp, k) for n, k in _flops.op_recomputed_gemms(model, recompute_early_stop(job)))
    return gemms + elem + (0.0 if machine.flash_attention else attn)


def layer_times(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> tuple[np.ndarray, np.ndarray]:
    """(forward_s, forward+backward+recompute_s) of one block for one micro-batch: GEMMs and
    elementwise work 3 x forward, the attention core 1 + attention_backward_ratio; full
    recompute repeats the forward, selective the attention core's, selective-op what
    op_recompute_time says.

    Early stop (recompute_early_stop: torch's non-reentrant checkpoint since 2.1, PyTorch
    PRs #90105 and #96866): the replay of a checkpointed block raises as soon as the last
    tensor backward needs is saved. Autograd saves an op's inputs before running it, so the
    replay ends when the down projection saves its input, before that GEMM runs: it and the
    residual add after it are never recomputed (a third of a GELU block's dense forward, 2/7 of
    a SwiGLU one's at f = 8h/3). Measured on the runtime's block: tests/runtime/
    test_recompute_cost.py."""
    attn = attention_core_time(model, machine, job, lay)
    dense = dense_time(model, machine, job, lay)
    elem = elementwise_time(machine, elementwise_bytes(model, machine, job, lay), job) + eager_extra_time(model, machine, job, lay)
    forward = attn + dense + elem
    full = forward - last_gemm_time(model, machine, job, lay) if recompute_early_stop(job) else forward
    recompute = np.where(lay.recompute == RC_FULL, full, np.where(lay.recompute == RC_SELECTIVE, attn, 0.0))
    recompute = np.where(lay.recompute == RC_OP, op_recompute_time(model, machine, job, lay, attn, elem), recompute)
    weights = weight_traffic_time(machine, job, _flops.layer_params(model) / lay.tp, lay)
    return forward, 3.0 * (dense + elem) + (1.0 + attention_backward_ratio(machine)) * attn + recompute + weights


# Reads and writes of each fp32 logit by the loss, forward and backward. Megatron's
# vocab-parallel cross-entropy: the cast to fp32 (1.5: a 16-bit read, a write), max (1),
# subtract (2), exp (2), sum (1), divide (2); backward the product with the loss gradient (2)
# and the cast back (1.5): 13. torch's eager cross-entropy: the cast (1.5), log-softmax (max,
# sum of exponentials, write: 4); backward the nll's dense gradient (1), log-softmax's (3) and
# the cast back (1.5): 11. 12 between them.
LOSS_ACCESSES_PER_LOGIT = 12


# A fused cross-entropy kernel over 16-bit logits (flash-attn's cross_entropy, llm-foundry's
# default loss): forward reads each logit once (the log-sum-exp and the loss), backward reads
# it again and writes its gradient in place: 3 x 2 bytes.
FUSED_LOSS_TRAFFIC_BYTES_PER_LOGIT = 6.0


def loss_traffic_bytes_per_logit(job: TrainingJob) -> float:
    """Bytes the loss moves per logit: the framework profile's `loss_traffic_bytes_per_logit`
    where it gives one, else LOSS_ACCESSES_PER_LOGIT fp32 passes."""
    given = getattr(getattr(job, "framework", None), "loss_traffic_bytes_per_logit", None)
    return LOSS_ACCESSES_PER_LOGIT * 4.0 if given is None else float(given)


def head_time(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Forward + backward of the output projection and the cross-entropy (vocab-parallel over
    tp) for one micro-batch: loss_traffic_bytes_per_logit(job) bytes moved per logit (by
    default LOSS_ACCESSES_PER_LOGIT fp32 passes)."""
    T = tokens_per_microbatch(job, lay)
    gemm = gemm_time(machine, job, T, model.vocab_size / lay.tp, model.hidden)
    loss_bytes = loss_traffic_bytes_per_logit(job) * T * model.vocab_size / lay.tp
    weights = weight_traffic_time(machine, job, model.vocab_size * model.hidden / lay.tp, lay)
    return 3.0 * gemm + elementwise_time(machine, loss_bytes, job) + weights


# Operators one block launches for one micro-batch: forward (two norms of ~6 ops, three QKV
# projections, RoPE ~8, attention, output projection, two residual adds, three MLP
# projections, activation and product) ~32; backward about twice that. Full recompute runs
# the forward again, selective the attention alone. The head (norm, projection, loss) ~10
# forward. AdamW without foreach: ~12 ops per parameter tensor.
BLOCK_FORWARD_OPS = 32
OP_KEPT_OPS = 5  # selective-op replays the forward but the four GEMMs and the attention core it keeps
HEAD_FORWARD_OPS = 10
OPTIMIZER_OPS_PER_TENSOR = 12
TENSORS_PER_BLOCK = 9


def forward_overhead_s(machine: MachineModel, blocks) -> np.ndarray:
    """Per micro-batch: op_overhead_us for the operators of a forward pass alone (a frozen
    reference model's)."""
    return machine.op_overhead_us * 1e-6 * (np.asarray(blocks) * BLOCK_FORWARD_OPS + HEAD_FORWARD_OPS)


def _block_ops(recompute) -> np.ndarray:
    """Operators one block launches for one micro-batch: forward, backward and recompute."""
    rc = np.asarray(recompute)
    replay = np.where(rc == RC_FULL, BLOCK_FORWARD_OPS, np.where(rc == RC_SELECTIVE, 1, 0))
    return 3 * BLOCK_FORWARD_OPS + np.where(rc == RC_OP, BLOCK_FORWARD_OPS - OP_KEPT_OPS, replay)


def framework_overhead_s(machine: MachineModel, blocks, recompute, tp=1) -> np.ndarray:
    """Per micro-batch: op_overhead_us for every operator the blocks and the head launch in
    forward, backward and recompute, plus dtensor_op_overhead_us for the blocks' operators
    when they run on tensor-parallel DTensors."""
    dtensor = np.where(np.asarray(tp) > 1, machine.dtensor_op_overhead_us, 0.0)
    return 1e-6 * ((machine.op_overhead_us + dtensor) * blocks * _block_ops(recompute)
                   + machine.op_overhead_us * 3 * HEAD_FORWARD_OPS)


def _launch_us(machine: MachineModel, job: TrainingJob) -> float:
    """The framework's host time per operator on a GPU (its profile's launch_us_per_op) where
    it runs eager; 0 on a CPU (op_overhead_us charges it there), compiled, or without a figure."""
    return float(eager_gpu_figure(machine, job, "launch_us_per_op") or 0.0)


def launch_floor_s(machine: MachineModel, job: TrainingJob, blocks, recompute, reference_forward=False) -> np.ndarray:
    """Per micro-batch: the least time the host takes to issue the operators of the blocks
    and the head (forward, backward, recompute; a frozen reference model's forward too) on a
    GPU, launch_us_per_op each. The GPU cannot finish a micro-batch before its kernels are
    launched, so a micro-batch takes the larger of its GPU time and this (planner/cost/
    step.py unit_costs): a small model on a fast GPU is launch-bound (protein-small on an
    H100: 16 ms a micro-batch whatever its size, docs/gpu/2026-11-26-h100-launch.json)."""
    ops = np.asarray(blocks) * _block_ops(recompute) + 3 * HEAD_FORWARD_OPS
    if reference_forward:
        ops = ops + np.asarray(blocks) * BLOCK_FORWARD_OPS + HEAD_FORWARD_OPS
    return 1e-6 * _launch_us(machine, job) * ops


def step_launch_floor_s(machine: MachineModel, job: TrainingJob) -> float:
    """Per optimizer step: the host's fixed work around the optimizer on a GPU (gradient
    clipping, the fused optimizer's launches, the loss's synchronisation, the step's records:
    the profile's step_launch_s), where the framework runs eager; the optimizer's own time
    is the larger of its GPU time and this (dp.mesh_costs)."""
    fw = getattr(job, "framework", None)
    return float(getattr(fw, "step_launch_s", 0.0) or 0.0) if _launch_us(machine, job) > 0 else 0.0
