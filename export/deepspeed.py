"""A plan as DeepSpeed 0.19.8 reads it: ds_config.json (`ds_config`), shared with the
megatron-deepspeed target, and the `deepspeed` target for a user's own model under
`deepspeed.initialize` (ds_config.json, env.sh, deepspeed_env, launch.txt).

The names are DeepSpeed 0.19.8's (deepspeed/runtime/config.py, runtime/zero/config.py,
runtime/activation_checkpointing/config.py, comm/config.py). What it takes from the plan:

  train_batch_size                 job.global_batch: samples per optimizer step (dpo: pairs, below)
  train_micro_batch_size_per_gpu   micro_batch_size
  gradient_accumulation_steps      grad_accumulation_steps
  zero_optimization.stage          sharding.kind: none 0, zero1 1, zero2 2, fsdp 3 (hsdp and
                                   fsdp-grad-op are refused: DeepSpeed has neither)
  zero_optimization buckets        the plan's framework figures (zero_bucket_params; fsdp: one block)
  bf16 / fp16                      job.precision (fp32: neither)
  communication_data_type          the plan's gradient-reduction dtype, where it differs from
                                   DeepSpeed's default (the training dtype: engine.py)
  activation_checkpointing         recompute (the recompute itself is the model's code)

A DPO plan counts pairs (job.global_batch): DeepSpeed counts samples, and one sample of the
exported batch is one (chosen, rejected) pair. train_batch_size = global_batch pairs and
train_micro_batch_size_per_gpu = micro_batch_size pairs, each micro-batch 2 x micro_batch_size
sequences through the policy. DeepSpeed only checks the product (train = micro x accumulation x
data-parallel ranks) and reports samples/s, so this is a statement about the data loader: it
yields micro_batch_size pairs per rank and micro-step.
"""

from __future__ import annotations

import json

from export.base import EXPORT_DIR, Derived, Export, env_script
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Precision, Recompute, Sharding

DEEPSPEED_VERSION = "0.19.8"

STAGES = {Sharding.none: 0, Sharding.zero1: 1, Sharding.zero2: 2, Sharding.fsdp: 3}

# DeepSpeed's ZeRO stage 0 allreduces the gradients in buckets of this many elements, fixed in
# its code (engine.py MEMORY_OPT_ALLREDUCE_SIZE, the default of allreduce_gradients, which
# backward calls without one): no config key sets it.
STAGE0_BUCKET_ELEMENTS = 500_000_000

# The gradient-clipping norm of exaplan's runtime (runtime/trainer.py clip_grad_norm_(..., 1.0)),
# whose clipped step the prediction charges; DeepSpeed's default is 0 (no clipping).
GRADIENT_CLIPPING = 1.0
STEPS_PER_PRINT = 1  # a throughput line every step: `exaplan calibrate --from-log` takes their median
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def ds_config(plan: Plan) -> dict:
    """The DeepSpeed config of the plan (a dict for json.dumps). Complete for both DeepSpeed
    targets: tensor and pipeline parallelism are the model code's (Megatron-DeepSpeed's
    arguments), and the data-parallel degree that DeepSpeed divides the batch by is then
    the plan's dp (its mpu's data-parallel group). PlanError naming the field for what
    DeepSpeed cannot express."""
    kind = plan.sharding.kind
    if kind == Sharding.hsdp:
        raise PlanError("DeepSpeed 0.19.8 has no hybrid sharding (shard within dp_shard ranks, replicate across "
                        "dp_replicate): ZeRO++'s hpZ (zero_optimization.zero_hpz_partition_size) keeps only a second "
                        "copy of the parameters within a group and shards gradients and optimizer state over all "
                        "data-parallel ranks, and MiCS (mics_shard_size) was removed (runtime/config.py); plan with "
                        "`--framework deepspeed` (zero1, zero2 or fsdp)", field="sharding.kind")
    if kind == Sharding.fsdp_grad_op:
        raise PlanError("DeepSpeed 0.19.8 has no ZeRO stage that shards parameters and keeps every gathered one from "
                        "forward to backward (FSDP's SHARD_GRAD_OP): ZeRO-3 releases them after use; plan with "
                        "`--framework deepspeed` (zero1, zero2 or fsdp)", field="sharding.kind")
    if kind == Sharding.fsdp and not plan.sharding.reshard_after_forward:
        raise PlanError("fsdp without resharding after forward is fsdp-grad-op, which DeepSpeed has not",
                        field="sharding.reshard_after_forward")
    if plan.recompute == Recompute.selective_op:
        raise PlanError("selective-op is torchtitan's per-op policy; DeepSpeed's checkpointing "
                        "(deepspeed.checkpointing.checkpoint) recomputes whole functions: none, selective "
                        "(the attention core) or full (each block)", field="recompute")
    stage = STAGES[kind]
    precision = plan.job.precision
    reduce = _reduce_dtype(plan)
    config: dict = {
        "train_batch_size": plan.job.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accumulation_steps,
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": True,
        "gradient_clipping": GRADIENT_CLIPPING,
        "zero_optimization": _zero_section(plan, stage, reduce),
    }
    if precision == Precision.bf16:
        config["bf16"] = {"enabled": True}
    elif precision == Precision.fp16:
        # Dynamic loss scaling at DeepSpeed's own defaults, written out (runtime/constants.py).
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    if reduce != precision.value:
        config["communication_data_type"] = reduce
    if plan.recompute != Recompute.none:
        config["activation_checkpointing"] = {
            "partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False,
            "number_checkpoints": plan.model.layers, "synchronize_checkpoint_boundary": False, "profile": False}
    # One line per collective on rank 0, which `exaplan calibrate --from-comms-log` reads: DeepSpeed
    # logs a call only with verbose (utils/comms_logging.py append), at INFO, and its logger
    # stands at WARNING unless log_level says otherwise (utils/logging.py; engine.py applies
    # log_level); the throughput lines (utils/timer.py) are INFO too.
    config["comms_logger"] = {"enabled": True, "verbose": True, "prof_all": True, "debug": False}
    config["log_level"] = "info"
    return config


def _reduce_dtype(plan: Plan) -> str:
    """The dtype the plan's prediction reduces gradients in (its framework's figures)."""
    fw, precision = plan.job.framework, plan.job.precision
    if precision == Precision.fp32:
        return "fp32"
    if precision == Precision.fp16:
        return fw.fp16_grad_reduce_dtype
    return fw.grad_reduce_dtype


def block_params(plan: Plan, tp: int | None = None) -> int:
    """Parameters of one transformer block on one tensor-parallel rank (attention and MLP split
    over tp, the two norms whole), as planner/cost/flops.py counts them."""
    m, tp = plan.model, plan.mesh.tp if tp is None else tp
    kv = m.kv_heads * (m.hidden // m.heads)
    attention = 2 * m.hidden * m.hidden + 2 * m.hidden * kv
    mlp = (3 if m.activation == "swiglu" else 2) * m.hidden * m.ffn_hidden
    norms = 2 * m.hidden * (1 if m.norm == "rmsnorm" else 2)
    return (attention + mlp) // tp + norms


def model_params(plan: Plan) -> int:
    """All parameters of the model: an upper bound of what one rank's gradients hold."""
    m = plan.model
    embedding = m.vocab_size * m.hidden + (m.seq_len * m.hidden if m.position == "learned" else 0)
    head = m.hidden * (1 if m.norm == "rmsnorm" else 2) + (0 if m.tied_embeddings else m.vocab_size * m.hidden)
    return m.layers * block_params(plan, tp=1) + embedding + head


def _zero_section(plan: Plan, stage: int, reduce: str) -> dict:
    fw = plan.job.framework
    if stage == 0:
        _check_stage0_bucket(plan, reduce)
        return {"stage": 0}
    section: dict = {"stage": stage, "overlap_comm": plan.mesh.pp == 1, "contiguous_gradients": True}
    if stage in (1, 2):
        # The cost model's ZeRO-1/2 bucket (planner/cost/dp.py): max(zero_bucket_params,
        # zero_bucket_params_per_rank x dp) parameters; DeepSpeed allreduces each reduce bucket
        # (use_multi_rank_bucket_allreduce, reduce_scatter: its defaults, written out).
        section["reduce_bucket_size"] = int(max(fw.zero_bucket_params, fw.zero_bucket_params_per_rank * plan.mesh.dp))
        section["reduce_scatter"] = True
        section["use_multi_rank_bucket_allreduce"] = True
        return section
    # fsdp as ZeRO-3: the plan holds the block in use and the prefetched one gathered, and one
    # block of unsharded gradients (planner/cost/memory.py buffer_bytes), and reshards after
    # forward (nothing kept gathered for backward: reuse distance 0).
    block = block_params(plan)
    section.update({"reduce_bucket_size": block, "stage3_prefetch_bucket_size": block,
                    "stage3_max_live_parameters": 2 * block, "stage3_max_reuse_distance": 0})
    return section


def _check_stage0_bucket(plan: Plan, reduce: str) -> None:
    """ZeRO stage 0's allreduce bucket is DeepSpeed's fixed 5e8 elements: the plan's DDP bucket
    must be that, or the whole gradient must fit in one bucket of either size (one allreduce
    either way, as the plan charged)."""
    if plan.mesh.dp == 1:
        return  # no gradient allreduce
    ds_mb = STAGE0_BUCKET_ELEMENTS * _BYTES[reduce] / 1e6
    plan_mb = plan.sharding.ddp_bucket_mb
    grad_mb = model_params(plan) * _BYTES[reduce] / 1e6
    if plan_mb == ds_mb or grad_mb <= min(plan_mb, ds_mb):
        return
    raise PlanError(f"DeepSpeed's ZeRO stage 0 allreduces gradients in fixed buckets of 5e8 elements ({ds_mb:,.0f} MB "
                    f"in {reduce}: engine.py MEMORY_OPT_ALLREDUCE_SIZE, no config key), the plan's are "
                    f"{plan_mb:,.0f} MB for {grad_mb:,.0f} MB of gradients", field="sharding.ddp_bucket_mb")


def refusals(plan: Plan) -> None:
    """What a user's own model under deepspeed.initialize cannot take from a config."""
    for axis, what in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context")):
        degree = getattr(plan.mesh, axis)
        if degree > 1:
            raise PlanError(f"{what} parallelism ({axis} {degree}) is the model code's, not a ds_config's: the "
                            f"deepspeed target is data parallelism and ZeRO for your own model; export to "
                            f"megatron-deepspeed for Megatron's {what}-parallel model", field=f"mesh.{axis}")


def export(plan: Plan, target: str) -> Export:
    """The deepspeed target (megatron-deepspeed is export/megatron.py's, with `ds_config`)."""
    if target != "deepspeed":
        raise PlanError(f"export.deepspeed writes the deepspeed target, not {target}", field="to")
    refusals(plan)
    config = ds_config(plan)
    notes = model_notes(plan)
    files = {
        "ds_config.json": json.dumps(config, indent=2) + "\n",
        "env.sh": env_script(plan),
        "deepspeed_env": "".join(f"{k}={v}\n" for k, v in sorted(plan.collectives.env.items())),
        "launch.txt": launch_text(plan, config, notes),
    }
    # What each rank passes to the user's script (`exaplan launch --framework deepspeed --entry
    # train.py`): deepspeed.add_config_arguments' flags, read by deepspeed.initialize(args=...).
    argv = ["--deepspeed", "--deepspeed_config", f"{EXPORT_DIR}/ds_config.json"]
    return Export(target=target, files=files, derived=Derived.of(plan), notes=notes,
                  versions={"deepspeed": DEEPSPEED_VERSION}, argv=argv)


def model_notes(plan: Plan) -> list[str]:
    """What the plan asks of the model code that a ds_config cannot say."""
    notes = ["pass your AdamW (the plan's optimizer) to deepspeed.initialize(optimizer=...); ds_config.json holds "
             "no optimizer or learning-rate schedule"]
    stage = STAGES[plan.sharding.kind]
    if stage == 3:
        notes.append("ZeRO-3 (sharding fsdp): build the model under deepspeed.zero.Init(config_dict_or_path="
                     "'ds_config.json') so that no rank ever holds all of it")
    if plan.recompute == Recompute.full:
        notes.append(f"recompute full: your model wraps each of its {plan.model.layers} blocks in "
                     "deepspeed.checkpointing.checkpoint, after deepspeed.checkpointing.configure(None, "
                     "deepspeed_config='ds_config.json'); the config's activation_checkpointing section alone "
                     "recomputes nothing")
    elif plan.recompute == Recompute.selective:
        notes.append("recompute selective: your model wraps each block's attention core (softmax(QK^T)V, not the "
                     "projections) in deepspeed.checkpointing.checkpoint, after deepspeed.checkpointing.configure("
                     "None, deepspeed_config='ds_config.json'); the config alone recomputes nothing")
    if plan.compile:
        notes.append("compile: the plan was predicted with compiled blocks: call engine.compile() (or torch.compile "
                     "your blocks) after deepspeed.initialize")
    if plan.job.workload.value == "dpo":
        ref = ("and the frozen reference's forward over the same pairs, its weights whole on each rank "
               "(ZeRO-3: shard them too, e.g. a second deepspeed.initialize of the reference at stage 3)"
               if plan.job.reference_in_step else "against the stored reference log-probabilities")
        notes.append(f"dpo: one DeepSpeed sample is one (chosen, rejected) pair: train_batch_size "
                     f"{plan.job.global_batch} pairs, {plan.micro_batch_size} pairs per rank per micro-step "
                     f"({2 * plan.micro_batch_size} sequences through the policy, {ref})")
    notes.append("comms_logger on: DeepSpeed synchronizes after every collective it logs (comm/comm.py timed_op), "
                 "so communication stops overlapping compute; set comms_logger.enabled false for the timed run "
                 "once the log has been read")
    return notes


def launch_text(plan: Plan, config: dict, notes: list[str]) -> str:
    """launch.txt: the deepspeed launcher for the plan's world, and what to read in the log."""
    n, r, w = plan.nodes, plan.ranks_per_node, plan.world_size
    stage = config["zero_optimization"]["stage"]
    p = plan.prediction
    lines = [
        f"DeepSpeed {DEEPSPEED_VERSION}: {plan.model.name} on {n} x {plan.machine.name} ({r} ranks a node, {w} "
        f"ranks, all data-parallel), ZeRO stage {stage}, {plan.job.precision.value}.",
        f"Batch: {config['train_micro_batch_size_per_gpu']} per rank x {config['gradient_accumulation_steps']} "
        f"accumulation x {plan.mesh.dp} ranks = train_batch_size {config['train_batch_size']} "
        + ("(chosen, rejected) pairs" if plan.job.workload.value == "dpo" else "sequences")
        + f" of {plan.job.seq_len} tokens.",
        f"Plan: {plan.provenance.command}",
        "",
        "Your training script (train.py here) calls deepspeed.add_config_arguments(parser) and",
        "  engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, optimizer=torch.optim.AdamW(...))",
        "then, per micro-batch of train_micro_batch_size_per_gpu samples: loss = ...; engine.backward(loss); engine.step()",
        "(DeepSpeed steps the optimizer every gradient_accumulation_steps micro-batches).",
        "",
    ]
    if n == 1:
        lines += ["On its node:",
                  f"  source env.sh && deepspeed --num_gpus {r} train.py --deepspeed --deepspeed_config ds_config.json"]
    else:
        lines += [
            f"On {n} nodes (pdsh; hostfile: {n} lines 'HOSTNAME slots={r}'; DS_ENV_FILE carries env.sh's variables "
            "to every node):",
            f"  DS_ENV_FILE=$PWD/deepspeed_env deepspeed --hostfile hostfile --num_nodes {n} --num_gpus {r} "
            "--master_addr FIRST_HOST train.py --deepspeed --deepspeed_config ds_config.json",
        ]
    lines += [
        f"Any other launcher that starts {w} processes with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
        "MASTER_PORT set (torchrun, srun, mpiexec) works too: source env.sh in each first.",
        "",
        "Reading the log back (DeepSpeed logs on rank 0 at log_level info; keep rank 0's output as LOG):",
        "  exaplan calibrate --from-log LOG --plan PLAN     the step time (train_batch_size / CurrSamplesPerSec), "
        "throughput and MaxMemAllocated against the prediction, after checking the batch and world DeepSpeed printed",
        f"    (the plan predicts {p.step_time_s:.4g} s a step, {config['train_batch_size'] / p.step_time_s:,.4g} "
        f"samples/s, {p.memory_gib_per_device:.3g} GiB a device)",
        f"  exaplan calibrate --from-comms-log LOG --group-size {plan.mesh.dp} --base MACHINE     what the logged "
        "collectives (comms_logger: 'comm op: ... | time (ms): ... | msg size: ...') reached on the NICs",
        "  'time (ms) | fwd ... | bwd ... | step ...' lines (wall_clock_breakdown) split each step.",
    ]
    if plan.job.workload.value != "pretrain":
        lines.append(f"  (calibrate --from-log reads pretraining runs only: for {plan.job.workload.value}, step time = "
                     f"{config['train_batch_size']} pairs / CurrSamplesPerSec by hand)")
    lines += [
        "",
        "Notes:",
    ]
    lines += [f"  - {note}" for note in notes]
    return "\n".join(lines) + "\n"
