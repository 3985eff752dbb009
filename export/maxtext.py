"""`exaplan export PLAN --to maxtext`: the plan as a MaxText 0.2.5 config file.

MaxText 0.2.5 (the `maxtext` wheel; the package is `maxtext`, no longer `MaxText`) starts from a
YAML config and `key=value` overrides: `python3 -m maxtext.trainers.pre_train.train CONFIG.yml
key=value ...`. A config file may inherit another through its `base_config` key
(maxtext/configs/pyconfig.py `_load_config`: resolved beside the file, then in MaxText's own
configs/ folder), so the export writes one: overrides.yml, `base_config: base.yml` (DPO:
`post_train/dpo.yml`, itself on base.yml) and below it every key the plan decides.

Files:
    overrides.yml   the MaxText config: the mesh, the batch split, precision, remat, the model
    run.sh          the command line as a bash array MAXTEXT_ARGS, one process per node
                    (hardware=gpu: MaxText's jax.distributed set-up from NNODES, NODE_RANK,
                    JAX_COORDINATOR_IP and _PORT); extra key=value arguments are passed on
    env.sh          the collective library's environment of the plan, and the XLA flags it implies

The mesh. MaxText names two meshes (maxtext/utils/maxtext_utils.py create_device_mesh): ici_*
within a slice and dcn_* across slices; on GPUs a slice is a node (each host's devices share a
slice_index), so the ici degrees multiply to the devices per node and the dcn degrees to the
nodes (`num_slices`). Its axes in mesh order (configs/base.yml mesh_axes; with pipelining
`stage` moves before `data`, types.py) are exaplan's in rank order:
    pp -> stage (ici/dcn_pipeline_parallelism)   dp_replicate -> data   dp_shard -> fsdp
    cp -> context                                 tp -> tensor_sequence
Ranks fill nodes in order, tp fastest, so each degree is split into ici x dcn from the fastest
axis out: the axes inside a node are wholly ici, one axis may straddle the node boundary
(ici x dcn), the axes outside it are wholly dcn. A plan whose node boundary cuts an axis
unevenly (12 devices a node and tp 8) has no such split: refused.

Tensor parallelism. MaxText's logical rules always shard the residual stream over its tensor
axes: `activation_embed` over `tensor` (the hidden dimension), `activation_norm_length` over
`tensor_sequence` (the sequence, with the weights sharded like `tensor`). `tensor_sequence` is
Megatron's TP + sequence parallelism; a replicated residual stream (TP without SP) is not
expressible, so sequence_parallel false with tp > 1 is refused. (`ici_sequence_parallelism` is
a key of base.yml but no axis of its mesh_axes: it does nothing.)

The batch. MaxText counts its batch per device over ALL devices (types.py
calculate_global_batch_sizes): one forward pass trains int(devices x per_device_batch_size)
sequences, split over the data and fsdp axes; the step accumulates gradient_accumulation_steps
of them. With pipelining that pass is cut into num_pipeline_microbatches microbatches that flow
through the stages in one schedule (layers/pipeline.py: all forwards, then the transposed loop's
backwards: GPipe; num_pipeline_repeats > 1 would be its circular, looping variant). So:
    pp == 1   per_device_batch_size = micro_batch_size x dp / devices,
              gradient_accumulation_steps = grad_accumulation_steps
    pp > 1    per_device_batch_size = global_batch / devices, gradient_accumulation_steps = 1,
              num_pipeline_microbatches = grad_accumulation_steps (a multiple of pp, MaxText
              asserts it), num_layers_per_pipeline_stage = layers / pp, num_pipeline_repeats = 1
per_device_batch_size may be fractional (tp, pp and cp devices share sequences); the value is
the float whose product with the device count MaxText's int() truncates to the exact batch.

Recompute (maxtext/layers/nnx_decoders.py get_remat_policy, layers/pipeline.py):
    none          with pipelining only: set_remat_policy_on_pipeline_iterations false (the stages
                  run their layers unwrapped). Without it MaxText cannot keep everything:
                  pyconfig reads the string "none" as None, and the decoder wraps every layer,
                  scanned or not, in jax.checkpoint with that policy, which saves only the
                  layer's input (full recompute): refused
    full          remat_policy full: each layer keeps its input (decoder_layer_input) only
    selective-op  remat_policy custom keeping what torchtitan's per-op policy keeps: the block's
                  input, query_proj, value_proj, context (the attention kernel's output and
                  log-sum-exp, which MaxText names in its cuDNN kernels only: NVIDIA GPUs,
                  attention cudnn_flash_jax) and, SwiGLU, mlpwi_0 (gate) and mlpwo (down); GELU,
                  mlpwi (up); the rest remat
    selective     (the attention core alone) has no MaxText policy: refused

What MaxText 0.2.5 cannot express is refused with a PlanError naming the plan's field (the
framework profile `maxtext` refuses layouts first, export.base.export_plan).
"""

from __future__ import annotations

import math

from export.base import Derived, Export, env_script
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Precision, Recompute, Schedule, Sharding

VERSION = "0.2.5"
PRETRAIN_MODULE = "maxtext.trainers.pre_train.train"
DPO_MODULE = "maxtext.trainers.post_train.dpo.train_dpo"
CONFIG = "overrides.yml"

# exaplan's mesh axes, fastest first, and the MaxText axis each becomes (ici_<key>/dcn_<key>).
AXES = (("tp", "tensor_sequence"), ("cp", "context"), ("dp_shard", "fsdp"), ("dp_replicate", "data"), ("pp", "pipeline"))
MESH_KEYS = ("data", "pipeline", "fsdp", "context", "tensor", "tensor_sequence")

DTYPES = {Precision.bf16: "bfloat16", Precision.fp32: "float32"}
# What selective-op keeps, by MaxText's checkpoint names (layers/attentions.py, linears.py,
# attention_op.py); every other name of types.py's custom list stays 'remat' (base.yml).
OP_KEPT = {"swiglu": ("query_proj", "value_proj", "context", "mlpwi_0", "mlpwo"),
           "gelu": ("query_proj", "value_proj", "context", "mlpwi")}
ROPE_THETA = 10000  # exaplan's runtime (runtime/model.py rope_tables)
NORM_EPS = 1e-6  # exaplan's runtime RMSNorm
XLA_ALLREDUCE_COMBINE_MB = 31.5  # XLA's default all-reduce combine threshold as the cost model counts it


def export(plan: Plan, target: str = "maxtext") -> Export:
    refuse(plan)
    config = overrides(plan)
    files = {CONFIG: to_yaml(config, plan), "run.sh": run_script(plan), "env.sh": env(plan)}
    return Export(target=target, files=files, derived=Derived.of(plan), notes=notes(plan), versions={"maxtext": VERSION})


def refuse(plan: Plan) -> None:
    """PlanError naming the field for the first thing MaxText 0.2.5 cannot express."""
    m, mesh = plan.model, plan.mesh
    if plan.job.precision not in DTYPES:
        raise PlanError(f"MaxText trains in bf16 or fp32 (dtype), not {plan.job.precision.value}: it has no fp16 "
                        "loss scaling", field="job.precision")
    if plan.sharding.kind in (Sharding.zero2, Sharding.fsdp_grad_op):
        raise PlanError(f"MaxText has no {plan.sharding.kind.value}: its shardings are data (replicas), fsdp "
                        "(parameters resharded, as XLA schedules the gathers), both, and ZeRO-1 "
                        "(shard_optimizer_over_data)", field="sharding.kind")
    if mesh.cp > 1 and plan.sharding.kind in (Sharding.none, Sharding.zero1):
        raise PlanError(f"MaxText shards the weights over its context axis too (base.yml's logical rule 'embed': fsdp, "
                        f"context, ...), so {plan.sharding.kind.value}'s replicated weights cannot have cp > 1; "
                        "fsdp and hsdp shard over dp_shard x cp as MaxText does", field="sharding.kind")
    if plan.recompute == Recompute.none and mesh.pp == 1:
        raise PlanError("MaxText 0.2.5 without pipelining always rematerialises its layers: pyconfig turns "
                        "remat_policy 'none' into None and the decoder wraps each layer in jax.checkpoint with it "
                        "(full recompute); plan with recompute full or selective-op", field="recompute")
    if plan.recompute == Recompute.selective:
        raise PlanError("MaxText has no attention-core-only remat policy (its policies save named matmul "
                        "outputs; norms and activations are always recomputed): use none, full or selective-op",
                        field="recompute")
    if not nvidia(plan):
        if mesh.cp > 1:
            raise PlanError("MaxText's ring attention on GPUs is Transformer Engine's cuDNN kernel (NVIDIA only), not "
                            f"on {plan.machine.device_name}", field="mesh.cp")
        if plan.recompute == Recompute.selective_op:
            raise PlanError("MaxText names the attention output ('context', which selective-op keeps) only in its "
                            f"cuDNN and TPU kernels; {plan.machine.device_name} runs neither", field="recompute")
    if m.norm != "rmsnorm":
        raise PlanError("MaxText's llama2 decoder block normalises with RMSNorm; LayerNorm comes only with "
                        "other blocks' attention and position layouts", field="model.norm")
    if m.position != "rope":
        raise PlanError("MaxText's llama2 decoder block has rotary positions only", field="model.position")
    if plan.job.workload.value == "dpo" and plan.job.reference.value != "in-step":
        raise PlanError("MaxText's DPO (train_dpo, Tunix's DPOTrainer) runs the reference model in every step; "
                        "it reads no precomputed log-probabilities", field="job.reference")
    if mesh.tp > 1 and not plan.sequence_parallel:
        raise PlanError("MaxText always shards the residual stream over its tensor axes (activation_embed over "
                        "tensor, the sequence over tensor_sequence): tensor parallelism with a replicated stream "
                        "(sequence_parallel false) is not expressible; plan with sequence parallelism", field="sequence_parallel")
    if mesh.pp > 1:
        pipe = plan.pipeline
        if pipe.schedule != Schedule.gpipe:
            raise PlanError(f"MaxText's pipeline runs all microbatches forward, then backward (GPipe), not "
                            f"{pipe.schedule.value if pipe.schedule else None}", field="pipeline.schedule")
        if pipe.virtual_stages != 1:
            raise PlanError("MaxText's circular pipeline (num_pipeline_repeats > 1) loops microbatches breadth-first "
                            "through the repeats under GPipe, no exaplan schedule; virtual_stages must be 1",
                            field="pipeline.virtual_stages")
        per = m.layers // mesh.pp
        even = [(i * per, (i + 1) * per) for i in range(mesh.pp)]
        if m.layers % mesh.pp or [(s.first_layer, s.last_layer) for s in pipe.stages] != even:
            raise PlanError(f"MaxText gives every stage num_layers_per_pipeline_stage layers in order; the plan's "
                            f"stages are not {per} layers each", field="pipeline.stages")
        if plan.grad_accumulation_steps % mesh.pp:
            raise PlanError(f"MaxText's num_pipeline_microbatches (the plan's {plan.grad_accumulation_steps} "
                            f"micro-batches) must be a multiple of the stages ({mesh.pp})", field="grad_accumulation_steps")
    mesh_split(plan)


def nvidia(plan: Plan) -> bool:
    return plan.machine.device_name.startswith("NVIDIA")


def mesh_split(plan: Plan) -> dict[str, tuple[int, int]]:
    """MaxText axis -> (ici, dcn): ici within a node (ranks_per_node devices), dcn across nodes."""
    left = plan.ranks_per_node
    out: dict[str, tuple[int, int]] = {}
    for name, axis in AXES:
        degree = getattr(plan.mesh, name)
        if left % degree == 0:
            ici = degree
        elif degree % left == 0:
            ici = left
        else:
            raise PlanError(f"the node boundary ({plan.ranks_per_node} devices) cuts {name} = {degree} unevenly: MaxText's "
                            f"ici x dcn mesh cannot hold it (ranks fill nodes tp fastest)", field=f"mesh.{name}")
        left //= ici
        out[axis] = (ici, degree // ici)
    if plan.sharding.kind == Sharding.zero1:  # ZeRO-1 shards the optimizer over MaxText's data axis
        out["data"], out["fsdp"] = out["fsdp"], (1, 1)
    return out


def per_device_batch(devices: int, sequences: int) -> int | float:
    """MaxText's per_device_batch_size for `sequences` per forward pass over `devices`: the value
    whose int(devices x value) (types.py calculate_global_batch_sizes) is exactly `sequences`."""
    if sequences % devices == 0:
        return sequences // devices
    x = sequences / devices
    while int(devices * x) < sequences:
        x = math.nextafter(x, math.inf)
    if int(devices * x) != sequences:
        raise PlanError(f"no per_device_batch_size gives {sequences} sequences over {devices} devices", field="job.global_batch")
    return x


def overrides(plan: Plan) -> dict:
    """The MaxText keys, in the order overrides.yml lists them."""
    m, mesh, job = plan.model, plan.mesh, plan.job
    dpo = job.workload.value == "dpo"
    world = plan.world_size
    split = mesh_split(plan)
    cfg: dict = {"base_config": "post_train/dpo.yml" if dpo else "base.yml",
                 "run_name": f"exaplan-{m.name}-{plan.nodes}n", "hardware": "gpu", "num_slices": plan.nodes}
    if dpo:
        cfg["model_name"] = "default"  # dpo.yml names a Qwen3 model; the shape below is the plan's
    # the model: llama2 blocks (RMSNorm, RoPE, gated MLP) at the plan's shape
    cfg.update({"decoder_block": "llama2", "base_num_decoder_layers": m.layers, "base_emb_dim": m.hidden,
                "base_num_query_heads": m.heads, "base_num_kv_heads": m.kv_heads, "head_dim": m.head_dim,
                "base_mlp_dim": m.ffn_hidden, "vocab_size": m.vocab_size,
                "mlp_activations": ["silu", "linear"] if m.activation == "swiglu" else ["gelu"],
                "logits_via_embedding": m.tied_embeddings, "normalize_embedding_logits": False,
                "rope_max_timescale": ROPE_THETA, "normalization_layer_epsilon": NORM_EPS,
                "max_target_length": job.seq_len})
    # precision: the compute dtype over fp32 master weights; the gradients' dtype is the one the
    # plan's framework reduces in (fp32, or bf16 under bf16 training where its profile says so)
    grads = "bfloat16" if job.precision == Precision.bf16 and job.framework.grad_reduce_dtype == "bf16" else "float32"
    cfg.update({"dtype": DTYPES[job.precision], "weight_dtype": "float32", "grad_dtype": grads,
                "matmul_precision": "highest" if job.precision == Precision.fp32 else "default"})
    # the batch
    if mesh.pp > 1:
        cfg.update({"per_device_batch_size": per_device_batch(world, job.global_batch), "gradient_accumulation_steps": 1,
                    "num_pipeline_microbatches": plan.grad_accumulation_steps,
                    "num_layers_per_pipeline_stage": m.layers // mesh.pp, "num_pipeline_repeats": 1})
    else:
        cfg.update({"per_device_batch_size": per_device_batch(world, plan.micro_batch_size * mesh.dp),
                    "gradient_accumulation_steps": plan.grad_accumulation_steps})
    cfg["steps"] = max(1, math.ceil(job.token_budget / job.tokens_per_step))
    # the mesh: every axis the plan uses, ici and dcn, the others 1 (base.yml's -1 defaults replaced)
    for key in MESH_KEYS:
        ici, dcn = split.get(key, (1, 1))
        cfg[f"ici_{key}_parallelism"] = ici
        cfg[f"dcn_{key}_parallelism"] = dcn
    cfg["shard_optimizer_over_data"] = plan.sharding.kind == Sharding.zero1
    # attention: a fused kernel on NVIDIA GPUs (the figures the profile takes are cuDNN's); one row a
    # sequence (packing off: the cuDNN kernel's training mask is causal only, blind to packed segments)
    if mesh.cp > 1:  # ring attention, load-balanced over 2 x cp chunks: Transformer Engine's cuDNN kernel
        cfg.update({"attention": "cudnn_flash_te", "context_parallel_strategy": "ring",
                    "context_parallel_load_balance": True, "context_parallel_reorder_strategy": "dual_chunk_swap"})
    elif nvidia(plan):
        cfg["attention"] = "cudnn_flash_jax"
    cfg["packing"] = False
    # recompute
    if plan.recompute == Recompute.none:
        cfg["remat_policy"] = "none"  # pp > 1 (refused otherwise): the pipeline's iterations unwrapped
        cfg["set_remat_policy_on_pipeline_iterations"] = False
    elif plan.recompute == Recompute.full:
        cfg["remat_policy"] = "full"
    else:
        cfg["remat_policy"] = "custom"
        cfg["decoder_layer_input"] = "device"
        for name in OP_KEPT[m.activation]:
            cfg[name] = "device"
    if dpo:
        cfg["use_dpo"] = True
    else:
        cfg["dataset_type"] = "synthetic"
    return cfg


def to_yaml(cfg: dict, plan: Plan) -> str:
    import yaml

    head = [f"# MaxText {VERSION} config for {plan.model.name} on {plan.nodes} x {plan.machine.name} "
            f"({plan.world_size} devices), from the exaplan plan:",
            f"#   {plan.provenance.command}",
            f"# Run: {'python3 -m ' + (DPO_MODULE if plan.job.workload.value == 'dpo' else PRETRAIN_MODULE)} "
            f"{CONFIG} [key=value ...]  (run.sh)",
            f"# mesh: pp {plan.mesh.pp}, dp_replicate {plan.mesh.dp_replicate}, dp_shard {plan.mesh.dp_shard}, "
            f"cp {plan.mesh.cp}, tp {plan.mesh.tp}; sharding {plan.sharding.kind.value}; recompute {plan.recompute.value}"]
    return "\n".join(head) + "\n" + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None, width=100)


def run_script(plan: Plan) -> str:
    module = DPO_MODULE if plan.job.workload.value == "dpo" else PRETRAIN_MODULE
    lines = ["#!/usr/bin/env bash",
             f"# MaxText {VERSION}: {plan.model.name} on {plan.nodes} x {plan.machine.name}, one process per node "
             f"({plan.ranks_per_node} devices each): run this script on every node.",
             f"# {plan.provenance.command}",
             "# Extra arguments are MaxText key=value overrides (base_output_directory=..., dataset keys"
             + (", load_parameters_path=... for DPO's policy)" if module == DPO_MODULE else ")") + ".",
             "set -euo pipefail",
             'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             '# shellcheck source=/dev/null',
             'source "$here/env.sh"']
    if plan.nodes > 1:
        lines += [f"export NNODES={plan.nodes}",
                  f'export NODE_RANK="${{NODE_RANK:-${{SLURM_NODEID:?set NODE_RANK to this node\'s index, 0..{plan.nodes - 1}}}}}"',
                  'export JAX_COORDINATOR_IP="${JAX_COORDINATOR_IP:?set JAX_COORDINATOR_IP to node 0\'s address}"',
                  'export JAX_COORDINATOR_PORT="${JAX_COORDINATOR_PORT:-12345}"']
    lines += [f'MAXTEXT_ARGS=("$here/{CONFIG}" "$@")',
              f"exec python3 -m {module} \"${{MAXTEXT_ARGS[@]}}\""]
    return "\n".join(lines) + "\n"


def env(plan: Plan) -> str:
    text = env_script(plan)
    flags = xla_flags(plan)
    if flags:
        text += f"# XLA's combiner merges the gradient all-reduces up to the plan's bucket ({plan.sharding.ddp_bucket_mb} MB)\n"
        text += f'export XLA_FLAGS="${{XLA_FLAGS:-}} {" ".join(flags)}"\n'
    return text


def xla_flags(plan: Plan) -> list[str]:
    """The XLA flags the plan implies: the gradient all-reduce bucket of a replicated (DDP) plan,
    where it is not XLA's default combine threshold."""
    if plan.sharding.kind != Sharding.none or plan.mesh.dp == 1:
        return []
    mb = plan.sharding.ddp_bucket_mb
    if abs(mb - XLA_ALLREDUCE_COMBINE_MB) < 1e-9:
        return []
    return [f"--xla_gpu_all_reduce_combine_threshold_bytes={int(round(mb * 1e6))}"]


def notes(plan: Plan) -> list[str]:
    out = [f"MaxText {VERSION} needs Python >= 3.12 and its cuda12 extra (pip install 'maxtext[cuda12]==0.2.5'); "
           "the data keys are yours (dataset_type synthetic is written for pretraining)"]
    if plan.job.workload.value == "dpo":
        out.append("dpo: maxtext.trainers.post_train.dpo.train_dpo (Tunix's DPOTrainer) starts from a MaxText checkpoint: "
                   "pass load_parameters_path=... and the preference data (post_train/dpo.yml's hf defaults otherwise)")
    if plan.mesh.pp > 1:
        out.append("pipeline: MaxText shards the embedding and the loss over the stage axis too (batch-parallel), "
                   "not on the first and last stage alone")
    if plan.mesh.cp > 1:
        out.append("context parallelism: ring attention through Transformer Engine (attention cudnn_flash_te), "
                   "packing off (load-balanced dual-chunk-swap)")
    if plan.sharding.kind == Sharding.zero1:
        out.append("zero1: shard_optimizer_over_data keeps the fp32 weights and AdamW moments sharded over the data "
                   "axis and gathers 16-bit weights once per step; where the gradients live is XLA's choice")
    if plan.sharding.kind in (Sharding.fsdp, Sharding.hsdp):
        out.append("fsdp: when each layer's weights are gathered (and whether forward's gathers are kept for "
                   "backward) is XLA's schedule, not a MaxText option")
    if not nvidia(plan):
        out.append(f"{plan.machine.device_name}: MaxText's hardware=gpu path (jax's CUDA or ROCm plugin) with its "
                   "default attention kernel")
    if plan.compile:
        out.append("compile: MaxText's step is always one XLA program (torch.compile does not apply)")
    return out
