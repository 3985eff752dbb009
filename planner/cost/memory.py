"""Peak memory per device: model states, activations, buffers and a reserve.

Model states follow ZeRO (Rajbhandari et al. 2020) with this project's precision rule: a
16-bit working copy of the weights, fp32 master weights, fp32 gradients (accumulation and
reduction in fp32, as in the seed runs) and AdamW's two fp32 moments. Activations follow
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
written tensor by tensor for a Llama block (no dropout; SwiGLU keeps gate, up, activation
and product op by op, or gate and up and the product when fused: swiglu_kept_tensors), with
sequence parallelism splitting the residual-stream tensors over tp. The reserve charges
fragmentation on the memory each step allocates and frees, not on the model states.

Checked against published figures (tests/planner/test_memory_published.py): for a GPT block
the count is Korthikanti's Table 2 (no parallelism, tensor, sequence parallel, selective and
full recompute) less its three 1-byte dropout masks, and the busiest pipeline rank holds
Korthikanti's L layers (1F1B) or L (1 + (p-1)/(p v)) (interleaved); every published run of
calibration/data/published/ is predicted to fit in 80 GB, and so is every row of llm-foundry's
H100 and A100-80GB benchmark tables once the loss is its fused kernel (LOSS_BYTES_PER_LOGIT).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import flops
from planner.cost.compute import eager_gpu_figure
from planner.cost.layout import (
    RC_FULL,
    RC_NONE,
    RC_OP,
    RC_SELECTIVE,
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
from planner.schema.specs import MachineModel, ModelSpec, Precision, TrainingJob, bytes_per_element
from planner.schema.plan import Plan

GIB = 2.0**30


@dataclass
class MemoryParts:
    """Bytes per device, arrays over layouts."""

    parameters: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    buffers: np.ndarray
    reserve: np.ndarray
    total: np.ndarray
    fits: np.ndarray
    reference: np.ndarray | float = 0.0  # dpo: the frozen reference model's parameters


def fully_sharded(sharding: np.ndarray) -> np.ndarray:
    """The FSDP kinds (fsdp, hsdp, fsdp-grad-op): parameters sharded and gathered per block,
    held in 16-bit by the runtime's MixedPrecisionPolicy."""
    return (sharding == SH_FSDP) | (sharding == SH_HSDP) | (sharding == SH_GRAD_OP)


def stage_params(model: ModelSpec, lay: Layouts) -> np.ndarray:
    """Parameters held by one pipeline rank before tensor parallelism: its share of the
    blocks, plus the embedding and the head (both on the only stage when pp = 1; the larger
    of the two on the heaviest stage otherwise)."""
    blocks = np.ceil(model.layers / lay.pp) * flops.layer_params(model)
    emb, head = flops.embedding_params(model), flops.head_params(model)
    ends = np.where(lay.pp == 1, emb + head, max(emb, head))
    return blocks + ends


def model_state_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parameters, gradients, optimizer state) bytes per device under each sharding."""
    P = stage_params(model, lay) / lay.tp
    mixed = job.precision != Precision.fp32
    working = 2.0 if mixed else 4.0  # the weights the forward pass reads
    master = 4.0 if mixed else 0.0  # fp32 copy the optimizer updates
    grad, moments = 4.0, 8.0
    G = lay.shard_group.astype(np.float64)
    s = lay.sharding
    fully = fully_sharded(s)
    # FSDP keeps one sharded fp32 parameter (the master when mixed); 16-bit copies are
    # gathered per block and counted as buffers.
    params = np.where(fully, P * (master if mixed else working) / G, np.where(s == SH_NONE, P * (working + master), P * working + P * master / G))
    # ZeRO under autocast (exaplan's runtime: autocast_on_fp32_weights) keeps the whole model in
    # fp32 beside autocast's 16-bit copies, and its fp32 master shard: measured by `exaplan
    # check` (torch's MemTracker at full size), where the 16-bit-weights count was 30% under.
    params = np.where(zero_on_fp32_weights(job, lay), P * (4.0 + working) + P * master / G, params)
    grads = np.where((s == SH_ZERO2) | fully, P * grad / G, P * grad)
    if job.precision == Precision.fp16 and job.framework.grad_reduce_bytes(job.precision) == 2:
        # fp16 gradients beside the optimizer's fp32 copy of them (Megatron-LM README, distributed
        # optimizer: "fp16 param, fp16 grads" 20 bytes a parameter, 4 + 16/d sharded, against
        # "bf16 param, fp32 grads" 18 and 6 + 12/d; DeepSpeed's fp16 ZeRO keeps the same pair).
        grads = np.where((s == SH_ZERO2) | fully, P * 2.0 / G, P * 2.0) + np.where(s == SH_NONE, P * 4.0, P * 4.0 / G)
    opt = np.where(s == SH_NONE, P * moments, P * moments / G)
    return params, grads, opt


def stream_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """One residual-stream-sized tensor of a micro-batch (T x h), split over tp with
    sequence parallelism."""
    T = lay.mbs * job.seq_len / lay.cp
    return np.where(lay.sp == 1, T / lay.tp, T) * model.hidden * bytes_per_element(job.precision)


def layer_activation_bytes(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Bytes one block keeps for backward, per micro-batch, without recompute."""
    T = lay.mbs * job.seq_len / lay.cp
    B = bytes_per_element(job.precision)
    h, f, t = model.hidden, model.ffn_hidden, lay.tp
    kv = model.kv_heads * model.head_dim  # grouped-query attention: K and V have kv_heads heads
    stream = stream_bytes(model, job, lay)
    attention = 2 * stream + T * (h + 2 * kv) * B / t + T * h * B / t + T * (model.heads / t) * 4
    mlp = 2 * stream + (swiglu_kept_tensors(job) if model.activation == "swiglu" else 2) * T * f * B / t
    scores = scores_bytes(model, machine, job, lay)
    return attention + mlp + scores + eager_saved_bytes(model, machine, job, lay) * stream / B


# Bytes per residual-stream element (token x hidden) that exaplan's eager block keeps for backward
# beyond the fused count, in 16-bit training (runtime/model.py, counted with saved-tensor hooks by
# tests/planner/test_memory.py), by weights and norm. With fp32 weights under autocast the stream
# is fp32: both norms' outputs are fp32 where the count has 16-bit (2 x 2), the q, k and v Linear
# layers each cast the attention norm's output to 16-bit where the count has one (2 x 2), and the
# RMSNorm keeps its fp32 normalised input for the weight's product (2 x 4; torch's fused
# LayerNorm keeps nothing beyond its input): 16 with RMSNorm, 8 with LayerNorm. With 16-bit
# weights (FSDP's MixedPrecisionPolicy) the RMSNorm's fp32 copy of its input (2 x 4): 8, and 0
# with LayerNorm. Under autocast a SwiGLU block's gate and up projections each cast the MLP
# norm's output: SWIGLU_CAST_BYTES more.
EAGER_SAVED_BYTES = {("autocast", "rmsnorm"): 16.0, ("autocast", "layernorm"): 8.0,
                     ("bf16_weights", "rmsnorm"): 8.0, ("bf16_weights", "layernorm"): 0.0}
SWIGLU_CAST_BYTES = 2.0


def eager_saved_bytes(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """EAGER_SAVED_BYTES per stream element for blocks run eager on a GPU in 16-bit training
    (the framework profile's eager_bytes_per_element set, not compiled: compute.eager_gpu_figure):
    the FSDP kinds hold 16-bit weights, the other shardings fp32 weights under autocast; 0
    otherwise (fused or compiled blocks, fp32 training, CPUs, whose runs are fitted)."""
    if job.precision == Precision.fp32 or eager_gpu_figure(machine, job, "eager_bytes_per_element") is None:
        return np.zeros(len(lay))
    cast = SWIGLU_CAST_BYTES if model.activation == "swiglu" else 0.0
    return np.where(fully_sharded(lay.sharding), EAGER_SAVED_BYTES[("bf16_weights", model.norm)],
                    EAGER_SAVED_BYTES[("autocast", model.norm)] + cast)


def swiglu_kept_tensors(job: TrainingJob) -> int:
    """ffn-wide tensors a SwiGLU block keeps: the job's framework profile's `swiglu_kept_tensors`
    (torch eager 4: gate, up, silu(gate) and their product; a fused kernel such as Megatron's
    bias_swiglu 3: gate and up as one tensor and the product, silu recomputed in backward)."""
    return int(getattr(getattr(job, "framework", None), "swiglu_kept_tensors", 4))


def scores_bytes(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Without a fused kernel the s x s scores and probabilities are stored (2 tensors)."""
    if machine.flash_attention:
        return np.zeros(len(lay))
    B = bytes_per_element(job.precision)
    return 2.0 * lay.mbs * (model.heads / lay.tp) * (job.seq_len / lay.cp) * job.seq_len * B


def microbatches_in_flight(pp, gas, vpp, schedule) -> np.ndarray:
    """Micro-batches whose activations the busiest pipeline rank holds at once:
    1 without a pipeline, all of them in GPipe, min(pp, m) in 1F1B, and
    pp (1 + (pp-1)/(pp v)) in interleaved 1F1B (Narayanan et al. 2021, Korthikanti 2022)."""
    p, m, v = (np.asarray(x, dtype=np.float64) for x in (pp, gas, vpp))
    interleaved = p * (1 + (p - 1) / (p * v))
    out = np.where(schedule == SC_GPIPE, m, np.minimum(p, m))
    out = np.where(schedule == SC_INTERLEAVED, np.minimum(interleaved, m), out)
    return np.where(schedule == SC_NONE, 1.0, out)


def microbatches_in_flight_last(pp, gas, vpp, schedule) -> np.ndarray:
    """Micro-batches whose activations the last pipeline rank (the loss's) holds at once: 1 in
    1F1B (each backward follows its forward), all in GPipe, and ((v-1) pp + 1) / v in
    interleaved 1F1B (its warm-up, (v-1) pp chunk-forwards, plus one: Narayanan et al. 2021's
    schedule as Megatron-LM runs it, for the rank whose chunks hold a stage's layers each)."""
    p, m, v = (np.asarray(x, dtype=np.float64) for x in (pp, gas, vpp))
    out = np.where(schedule == SC_GPIPE, m, np.minimum(1.0, m))
    out = np.where(schedule == SC_INTERLEAVED, np.minimum(((v - 1) * p + 1) / v, m), out)
    return np.where(schedule == SC_NONE, 1.0, out)


# Bytes one logit costs at the loss, where a step's memory peaks (every kept activation of
# the last micro-batch alive), by how the framework computes the loss:
#   eager: torch's cross_entropy on an fp32 copy of the logits (exaplan's runtime,
#       runtime/model.py loss_fn; torchtitan; fms-fsdp) keeps the fp32 log-softmax; at the
#       start of backward the nll's dense fp32 gradient and the log-softmax's fp32 input
#       gradient meet it: 12, the default (measured on the runtime's loss with torch's
#       MemTracker, fp32 and bf16 logits alike: tests/runtime/test_recompute_cost.py; the
#       end of the forward pass, 16-bit logits, their fp32 copy and the log-softmax, 10).
#   vocab-parallel: Megatron's cross-entropy keeps fp32 logits and computes the softmax and
#       the gradient in place (Korthikanti et al. 2022, sec. 4.3: 4 s b v / t): 4.
#   fused: one kernel (flash-attn's cross_entropy, llm-foundry's default loss_fn) keeps the
#       16-bit logits and writes a 16-bit gradient: 4.
# A framework profile that gives `loss_bytes_per_logit` sets it (loss_bytes_per_logit(job)).
LOSS_BYTES_PER_LOGIT = {"eager": 12.0, "vocab-parallel": 4.0, "fused": 4.0}


def loss_bytes_per_logit(job: TrainingJob) -> float:
    """Bytes per logit at the loss: the job's framework profile's `loss_bytes_per_logit`
    where it gives one, else torch's eager cross-entropy (LOSS_BYTES_PER_LOGIT["eager"])."""
    given = getattr(getattr(job, "framework", None), "loss_bytes_per_logit", None)
    return LOSS_BYTES_PER_LOGIT["eager"] if given is None else float(given)


def loss_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts, per_logit: float | None = None) -> np.ndarray:
    """What the loss holds for one micro-batch on the last stage: its logits at `per_logit`
    bytes each (default loss_bytes_per_logit(job)), the vocabulary split over tp (a
    vocab-parallel head and loss, as Megatron's and torchtitan's; exaplan's runtime gathers
    the whole vocabulary on every tp rank, tp times this, immaterial for the 32-token protein
    vocabulary)."""
    per_logit = loss_bytes_per_logit(job) if per_logit is None else per_logit
    T = lay.mbs * job.seq_len / lay.cp
    return per_logit * T * model.vocab_size / lay.tp


def head_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """What the last stage holds, beyond its blocks' kept tensors, as its backward passes the
    final norm, per micro-batch: the framework profile's head_bytes_per_element for the model's
    norm, per residual-stream element (the last block's output, which no block keeps, the norm's
    kept tensors and its backward's gradients); 0 for a norm the profile does not give. exaplan's
    eager norms, measured with MemTracker on the runtime (tests/runtime/test_step_memory.py)
    with an fp32 stream (fp32 weights, with or without autocast): RMSNorm 24 bytes (fp32
    inside), LayerNorm 12; with 16-bit weights 22 and 6. With a protein vocabulary the loss
    holds far less than this."""
    given = getattr(getattr(job, "framework", None), "head_bytes_per_element", None) or {}
    T = lay.mbs * job.seq_len / lay.cp
    return np.where(lay.sp == 1, T / lay.tp, T) * model.hidden * float(given.get(model.norm, 0.0))


def autocast_on_fp32_weights(job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Where a 16-bit job computes under autocast on fp32 weights: a framework whose weights
    are cast per micro-batch (its profile's weight_bytes_per_param, exaplan's runtime: DDP, ZeRO
    and one rank), not under the FSDP kinds' 16-bit MixedPrecisionPolicy. There the residual
    stream is fp32 (the residual adds promote the 16-bit block outputs), and autocast's 16-bit
    weight copies live from the forward pass until each block's backward."""
    on = job.precision != Precision.fp32 and float(getattr(getattr(job, "framework", None), "weight_bytes_per_param", 0.0)) > 0
    return np.asarray(on & ~fully_sharded(lay.sharding), dtype=bool)


def pipeline_grad_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Gradients a pipeline stage accumulates unsharded when the schedule defers FSDP2's sync to
    its last micro-batch (the profile's pipeline_unsharded_grads; torch.distributed.pipelining):
    the stage's fp32 gradients beside the sharded ones under fsdp, fsdp-grad-op and hsdp, and
    under replicate (kind none) the 16-bit gradients beside its fp32 ones. Counted where there
    is a pipeline and more than one micro-batch (step._row_memory)."""
    if not getattr(job.framework, "pipeline_unsharded_grads", False):
        return np.zeros(len(lay))
    P = stage_params(model, lay) / lay.tp
    mixed = job.precision != Precision.fp32
    return np.where(fully_sharded(lay.sharding), P * 4.0, np.where((lay.sharding == SH_NONE) & mixed, P * 2.0, 0.0))


def zero_on_fp32_weights(job: TrainingJob, lay: Layouts) -> np.ndarray:
    """ZeRO-1/2 of a 16-bit job on fp32 weights under autocast (exaplan's runtime, its
    ZeroOptimizer): the weights its step all-gathers are fp32, 4 bytes a parameter."""
    zero = (lay.sharding == SH_ZERO1) | (lay.sharding == SH_ZERO2)
    return zero & autocast_on_fp32_weights(job, lay)


def compiled_step(job: TrainingJob) -> bool:
    """The profile's whole step is one XLA graph (the JAX backend): fp32 weights cast at use as
    under autocast, but the residual stream stays in the compute dtype (jaxrt casts the
    embedding) and any recompute recomputes the casts instead of saving them (jax's
    saved_residuals of a bf16 block: tests/jaxrt/test_jax_model.py)."""
    return bool(getattr(getattr(job, "framework", None), "compiled_step", False))


def autocast_copy_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """The 16-bit weight copies of autocast_on_fp32_weights (model_state_bytes counts them as
    the working copy): gone by the end of a backward pass, whose blocks free them as they finish
    (and which full recompute never saved)."""
    return np.where(autocast_on_fp32_weights(job, lay), stage_params(model, lay) / lay.tp * 2.0, 0.0)


def backward_temporaries_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Gradients a block's backward holds beside its kept tensors, per micro-batch: the MLP's
    ffn-wide ones at once, less the kept tensor they replace (SwiGLU: the product's gradient,
    then the gate's and the up projection's, while the product itself is freed: 2; GELU: the
    activation's input gradient beside its output's, which replaces the freed output: 1),
    16-bit under autocast, split over tp. With copies_never_held, set against the H100 runs
    of tests/planner/test_memory_gpu_measured.py."""
    T = lay.mbs * job.seq_len / lay.cp
    wide = 2 if model.activation == "swiglu" else 1
    return wide * T * model.ffn_hidden * bytes_per_element(job.precision) / lay.tp


def copies_never_held(job: TrainingJob, recompute) -> np.ndarray:
    """Where autocast's weight copies (autocast_copy_bytes) are never held: blocks compiled
    (the framework profile's `compiled`) under full or selective-op recompute cast each weight
    inside their graphs, into no autocast cache, and save no cast for backward, which recomputes
    it (measured on an H100: docs/gpu/2026-11-26-h100-recompute2-compile.json and
    2026-11-26-h100-op-compile.json peak 4-7 GiB under the eager runs with protein-3.5b's 3.5 B
    parameters, 6.5 GiB of copies). Eager blocks keep them in autocast's cache through the
    forward pass."""
    rc = np.asarray(recompute)
    if compiled_step(job):  # XLA: every recompute level recomputes the casts (compiled_step)
        return rc != RC_NONE
    compiled = bool(getattr(getattr(job, "framework", None), "compiled", False))
    return compiled & ((rc == RC_FULL) | (rc == RC_OP))


def backward_tail_bytes(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Activations alive as a backward pass ends: the first block's kept tensors (under full
    recompute, its recomputed working set; selective recompute drops the scores)."""
    per_layer = layer_activation_bytes(model, machine, job, lay)
    return per_layer - np.where(lay.recompute == RC_SELECTIVE, scores_bytes(model, machine, job, lay), 0.0)


def kept_input_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """A checkpointed block's input, which full and selective-op recompute keep: one stream
    tensor, fp32 under autocast_on_fp32_weights."""
    fp32 = autocast_on_fp32_weights(job, lay) & (not compiled_step(job))
    return stream_bytes(model, job, lay) * np.where(fp32, 4.0 / bytes_per_element(job.precision), 1.0)


def op_kept_bytes(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """What one block keeps under selective-op recompute, per micro-batch (runtime/parallel/
    recompute.py; torchtitan's "op" policy): its input (kept_input_bytes), the outputs of the
    GEMMs it keeps (q, v, and gate and down for SwiGLU or up for GELU: flops.op_recomputed_gemms
    names the others), the down projection's before its tensor-parallel reduction (T x h on every
    rank), with sequence parallelism both reduce-scatters' outputs, and with a fused attention
    kernel its output and fp32 log-sum-exp. Nothing elementwise: norms, RoPE and the activation
    are recomputed."""
    T = lay.mbs * job.seq_len / lay.cp
    B = bytes_per_element(job.precision)
    h, f, t = model.hidden, model.ffn_hidden, lay.tp
    kv = model.kv_heads * model.head_dim
    gemms = T * (h + kv + f) * B / t + (T * h * B if model.activation == "swiglu" else 0.0)
    reduce_scatters = np.where((lay.sp == 1) & (t > 1), 2 * T * h * B / t, 0.0)
    core = T * h * B / t + T * (model.heads / t) * 4 if machine.flash_attention else 0.0
    return kept_input_bytes(model, job, lay) + gemms + reduce_scatters + core


def xla_selective_kept_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """What one block keeps under the JAX backend's selective recompute, per micro-batch
    (jaxrt/model.py: jax's dots_with_no_batch_dims_saveable): its input and the outputs of the
    matmuls against weights that backward needs (q, k, v and the attention's output projection;
    gate and up for SwiGLU, the up projection for GELU), the row-parallel projection's before its
    tensor-parallel reduction (T x h on every rank); everything else (norms, RoPE, the attention
    core, the activation) is recomputed (jax's saved_residuals: tests/jaxrt/test_jax_model.py)."""
    T = lay.mbs * job.seq_len / lay.cp
    B = bytes_per_element(job.precision)
    h, f, t = model.hidden, model.ffn_hidden, lay.tp
    kv = model.kv_heads * model.head_dim
    wide = 2 if model.activation == "swiglu" else 1
    return kept_input_bytes(model, job, lay) + T * (h + 2 * kv + wide * f) * B / t + T * h * B


def activation_parts(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts,
                     per_logit: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes per in-flight micro-batch, the first stage's fixed bytes, the last stage's fixed
    bytes) of activations; with one stage the last one's are its own.
    Per micro-batch: its blocks' kept tensors (full recompute keeps each block's input only,
    fp32 under autocast_on_fp32_weights; selective drops the attention scores; selective-op
    keeps op_kept_bytes; the JAX backend's selective, xla_selective_kept_bytes). Fixed on every
    stage: what the last block's backward adds, its MLP's gradients (backward_temporaries_bytes)
    and, under full or selective-op recompute (and XLA's selective), its
    recomputed working set less what it kept (the kept tensors are part of it, counted once).
    On the last stage, the largest of that, what the loss holds (loss_bytes, `per_logit` bytes
    a logit) and what the final norm's backward holds (head_bytes): the three never coexist,
    backward passes the loss, then the norm, then the blocks, each freeing what it held."""
    block = backward_tail_bytes(model, machine, job, lay)  # what a block keeps without recompute, its working set with it
    full, op = lay.recompute == RC_FULL, lay.recompute == RC_OP
    kept = np.where(full, kept_input_bytes(model, job, lay), np.where(op, op_kept_bytes(model, machine, job, lay), block))
    replayed = full | op  # blocks whose backward rebuilds their working set
    if compiled_step(job):  # XLA's selective keeps the matmuls' outputs and replays the rest
        xla_sel = lay.recompute == RC_SELECTIVE
        kept = np.where(xla_sel, xla_selective_kept_bytes(model, job, lay), kept)
        replayed = replayed | xla_sel
    per_microbatch = np.ceil(model.layers / lay.pp) * kept
    working = np.where(replayed, np.maximum(block - kept, 0.0), 0.0) + backward_temporaries_bytes(model, job, lay)
    last = np.maximum(np.maximum(working, loss_bytes(model, job, lay, per_logit)), head_bytes(model, job, lay))
    return per_microbatch, working, last


def activation_bytes(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts,
                     per_logit: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per in-flight micro-batch, fixed bytes) of activations on the last pipeline stage
    (with one stage, the only one): activation_parts without the first stage's fixed bytes."""
    per_microbatch, _, last = activation_parts(model, machine, job, lay, per_logit)
    return per_microbatch, last


def buffer_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """Communication buffers: FSDP's gathered 16-bit blocks (the one in use and the one
    prefetched; the whole stage when parameters stay gathered to backward) and one block of
    unsharded gradients; otherwise two 25 MB gradient buckets in flight."""
    working = 4.0 if job.precision == Precision.fp32 else 2.0
    block = flops.layer_params(model) / lay.tp
    P = stage_params(model, lay) / lay.tp
    s = lay.sharding
    fsdp_like = (s == SH_FSDP) | (s == SH_HSDP)
    in_use = np.minimum(2.0, np.ceil(model.layers / lay.pp))  # the block in use and the prefetched one
    gathered = np.where(fsdp_like, in_use * block * working, np.where(s == SH_GRAD_OP, P * working, 0.0))
    grads = np.where(fsdp_like | (s == SH_GRAD_OP), block * 4.0, 0.0)
    buckets = np.where((s == SH_ZERO2) | (s == SH_ZERO1) | (s == SH_NONE), 2 * 25e6, 0.0)
    return gathered + grads + buckets


def reference_bytes(model: ModelSpec, job: TrainingJob, lay: Layouts) -> np.ndarray:
    """dpo with the reference in the step: a frozen copy of the policy's working weights,
    laid out like the policy (sharded over the shard group under fsdp, hsdp and grad-op,
    whole on each rank otherwise), with no gradients and no optimizer state. Where the policy
    keeps fp32 weights under autocast, so does its copy (the runtime builds the reference with
    the policy's own build: `exaplan check` counted 4 bytes a parameter)."""
    if not job.reference_in_step:
        return np.zeros(len(lay))
    fp32 = (job.precision == Precision.fp32) | autocast_on_fp32_weights(job, lay)
    working = np.where(fp32, 4.0, 2.0)
    P = stage_params(model, lay) / lay.tp
    s = lay.sharding
    sharded = fully_sharded(s)
    return np.where(sharded, P / np.maximum(lay.shard_group, 1), P) * working


def reserve_bytes(machine: MachineModel, churned) -> np.ndarray:
    """Runtime context and workspace, plus fragmentation in proportion to the memory allocated
    and freed every step (`churned`: activations and communication buffers). Model states
    (weights, gradients, optimizer moments) are allocated once, in large blocks or contiguous
    buffers (Megatron's and DeepSpeed's flat buffers, FSDP's flat shards), and never free a gap
    for the caching allocator to split."""
    return churned * machine.fragmentation_fraction + machine.memory_reserve_gib * GIB


def rank_parameters(plan: Plan, pp_rank: int) -> int:
    """The planner's parameter count for a rank of pipeline rank `pp_rank`: its stages' blocks,
    the embedding and head where it holds them, / tp, / the shard group of fully sharded kinds."""
    model = plan.model
    stages = [s for s in plan.pipeline.stages if s.pp_rank == pp_rank] if plan.mesh.pp > 1 else []
    if stages:
        blocks = sum(s.last_layer - s.first_layer for s in stages)
        embedding, head = any(s.embedding for s in stages), any(s.head for s in stages)
    else:
        blocks, embedding, head = model.layers, True, True
    total = (blocks * flops.layer_params(model) + embedding * flops.embedding_params(model)
             + head * flops.head_params(model))
    sharded = plan.sharding.kind.value in ("fsdp", "fsdp-grad-op", "hsdp")
    group = plan.mesh.dp_shard * plan.mesh.cp if sharded else 1
    return round(total / plan.mesh.tp / group)


def in_flight_on_rank(pp: int, gas: int, vpp: int, schedule: int, pp_rank: int) -> float:
    """Micro-batches whose activations pipeline rank `pp_rank` holds at once (in units of its
    whole stage): all of them in GPipe, min(pp - k, m) in 1F1B (rank k's warm-up of pp - k - 1
    forwards, plus one), and ((v-1) pp + 2 (pp - k - 1) + 1) / v in interleaved 1F1B (Megatron's
    warm-up of its chunks); at k = 0 and k = pp - 1, microbatches_in_flight and _last."""
    if schedule == SC_NONE or pp == 1:
        return 1.0
    if schedule == SC_GPIPE:
        return float(gas)
    if schedule == SC_INTERLEAVED:
        return float(min(((vpp - 1) * pp + 2 * (pp - pp_rank - 1) + 1) / vpp, gas))
    return float(min(pp - pp_rank, gas))
