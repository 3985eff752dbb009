"""A plan as Megatron's arguments: `exaplan export PLAN --to megatron|megatron-deepspeed`.

megatron: Megatron-LM's training arguments at megatron-core 0.19.2 (pretrain_gpt.py of the
Megatron-LM checkout of that release; its parser is megatron/training/arguments.py).
megatron-deepspeed: the arguments of the Megatron-DeepSpeed fork that the MProt-DPO runs used
(ramanathanlab/Megatron-DeepSpeed, branch aurora, export.fetch_megatron.FORK_COMMIT), with
DeepSpeed's ds_config.json (export.deepspeed.ds_config); a dpo plan runs its dpo_training.py.

Files: args.txt (one argument per line, `--name value`, as parse_args takes them), args.sh (the
same as a bash array, MEGATRON_ARGS, and a commented launch), env.sh (the collective library's
environment, and CUDA_DEVICE_MAX_CONNECTIONS where Megatron requires it), ds_config.json
(megatron-deepspeed). docs/frameworks/megatron.md and megatron-deepspeed.md map every field.
"""

from __future__ import annotations

import json
import math
import shlex

from export.base import EXPORT_DIR, Derived, Export, env_script
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Precision, Recompute, Schedule, Sharding

MEGATRON_CORE = "0.19.2"
DEEPSPEED = "0.19.8"
# ramanathanlab/Megatron-DeepSpeed, branch aurora (the MProt-DPO scaling runs): export.fetch_megatron.
FORK_COMMIT = "f2da6e31d9258461593aeaacf6a5773ae02322ef"
FORK = f"ramanathanlab/Megatron-DeepSpeed@{FORK_COMMIT[:7]}"

ZERO_STAGE = {Sharding.none: 0, Sharding.zero1: 1, Sharding.zero2: 2, Sharding.fsdp: 3}
# Megatron's --distributed-backend for the machine's collective library (torch's nccl backend is
# RCCL on ROCm); megatron-core offers nccl and gloo, the fork nccl, gloo and ccl (oneCCL).
BACKENDS = {"megatron": {"nccl": "nccl", "rccl": "nccl"},
            "megatron-deepspeed": {"nccl": "nccl", "rccl": "nccl", "oneccl": "ccl"}}


def export(plan: Plan, target: str) -> Export:
    if target not in BACKENDS:
        raise PlanError(f"export.megatron writes megatron or megatron-deepspeed, not {target!r}", field="to")
    fork = target == "megatron-deepspeed"
    _refuse(plan, target)
    notes: list[str] = []
    args = fork_args(plan, notes) if fork else core_args(plan, notes)
    files = {"args.txt": "".join(" ".join(a) + "\n" for a in args),
             "args.sh": args_script(plan, target, args),
             "env.sh": env_file(plan)}
    versions = {"megatron-core": MEGATRON_CORE}
    if fork:
        from export.deepspeed import ds_config  # the deepspeed target's builder (export/deepspeed.py)

        files["ds_config.json"] = json.dumps(ds_config(plan), indent=1) + "\n"
        versions = {"Megatron-DeepSpeed": FORK, "deepspeed": DEEPSPEED}
    # What each rank passes to the entry point (`exaplan launch --framework`): args.txt's words,
    # ds_config.json where it was written.
    argv = [f"{EXPORT_DIR}/ds_config.json" if w == "ds_config.json" else w for a in args for w in a]
    entry = "dpo_training.py" if plan.job.workload.value == "dpo" else "pretrain_gpt.py"
    return Export(target=target, files=files, derived=Derived.of(plan), notes=notes, versions=versions, argv=argv,
                  entry=entry)


# --------------------------------------------------------------------------------------------
# What Megatron cannot express
# --------------------------------------------------------------------------------------------


def _refuse(plan: Plan, target: str) -> None:
    """PlanError naming the field of the first thing the target cannot express (the profile's
    constraints are checked before, by export.base.export_plan; these hold whatever profile the
    plan was made with)."""
    problems: list[tuple[str, str]] = []
    fork = target == "megatron-deepspeed"
    pipe, mesh = plan.pipeline, plan.mesh
    if plan.sharding.kind not in ((ZERO_STAGE if fork else (Sharding.none, Sharding.zero1))):
        offered = "ZeRO stages 0-3 (none, zero1, zero2, fsdp)" if fork else \
            "DDP (none) and its distributed optimizer (zero1)"
        problems.append(("sharding.kind", f"{target} runs {offered}, not {plan.sharding.kind.value}"))
    if plan.recompute not in (Recompute.none, Recompute.selective, Recompute.full):
        problems.append(("recompute", f"{target}'s --recompute-granularity is selective or full, not {plan.recompute.value}"))
    if mesh.pp > 1:
        schedules = (Schedule.one_f_one_b,) if fork else (Schedule.one_f_one_b, Schedule.interleaved_1f1b)
        if pipe.schedule not in schedules:
            problems.append(("pipeline.schedule", f"{target} runs {', '.join(s.value for s in schedules)}, not "
                             f"{pipe.schedule.value if pipe.schedule else None}"
                             + (" (DeepSpeed's pipeline engine has no interleaving)" if fork else "")))
        chunks = mesh.pp * pipe.virtual_stages
        even = plan.model.layers // chunks
        if plan.model.layers % chunks or any(s.last_layer - s.first_layer != even for s in pipe.stages):
            problems.append(("pipeline.stages", f"{target} splits the {plan.model.layers} layers evenly over pp x virtual "
                             f"stages = {chunks}; the plan's stages hold "
                             f"{', '.join(str(s.last_layer - s.first_layer) for s in pipe.stages)}"))
        if fork and plan.sharding.kind not in (Sharding.none, Sharding.zero1):
            problems.append(("sharding.kind", f"DeepSpeed's pipeline engine runs ZeRO stage 0 or 1, not "
                             f"{plan.sharding.kind.value} (stage {ZERO_STAGE.get(plan.sharding.kind)})"))
    if fork and mesh.cp > 1:
        problems.append(("mesh.cp", "Megatron-DeepSpeed has no ring context parallelism (its sequence parallelism "
                         f"across ranks is DeepSpeed-Ulysses); cp must be 1, got {mesh.cp}"))
    library = plan.machine.collective_library.value
    if library not in BACKENDS[target]:
        runs = "NVIDIA or AMD GPUs (nccl, rccl)" if not fork else "nccl, rccl or oneccl"
        problems.append(("machine.collective_library", f"{target} trains on {runs}; the machine's library is {library}"
                         + ("; on oneCCL machines (Aurora) export --to megatron-deepspeed" if library == "oneccl" else "")))
    if plan.model.position == "learned" and plan.job.seq_len > plan.model.seq_len:
        problems.append(("job.seq_len", f"learned positions hold model.seq_len = {plan.model.seq_len} positions "
                         f"(--max-position-embeddings), fewer than job.seq_len = {plan.job.seq_len}"))
    if plan.job.workload.value == "dpo":
        if not fork:
            problems.append(("job.workload", "Megatron-LM has no DPO trainer (pretrain_gpt.py pretrains); the MProt-DPO "
                             "trainer is Megatron-DeepSpeed's dpo_training.py: export --to megatron-deepspeed"))
        else:
            if mesh.pp > 1:
                problems.append(("mesh.pp", "the MProt-DPO trainer (dpo_training.py) calls the model's forward itself, "
                                 "which DeepSpeed's pipeline engine does not allow: pp must be 1, got " + str(mesh.pp)))
            if plan.job.reference.value != "in-step":
                problems.append(("job.reference", "dpo_training.py runs the frozen reference model's forward in every "
                                 "micro-step (in-step); it cannot read precomputed log-probabilities"))
            if plan.sharding.kind == Sharding.fsdp:
                problems.append(("sharding.kind", "dpo_training.py builds the reference model under ZeRO-3's "
                                 "partitioned init (--zero-stage 3) and then starts it without ZeRO: ZeRO stage 3 "
                                 "(fsdp) cannot run DPO there; use zero1 or zero2"))
    if problems:
        field, message = problems[0]
        rest = "; ".join(f"{f}: {m}" for f, m in problems[1:])
        raise PlanError(message + (f" (also {rest})" if rest else ""), field=field)


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def train_iters(plan: Plan) -> int:
    """Optimizer steps to the plan's token budget."""
    return max(1, math.ceil(plan.job.token_budget / plan.job.tokens_per_step))


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron's embedding rows for `vocab` tokens at --make-vocab-size-divisible-by 1: the next
    multiple of tp (its vocab-parallel embedding splits the rows over the tp ranks)."""
    return -(-vocab // tp) * tp


def _layout(plan: Plan, fork: bool) -> list[list[str]]:
    """Degrees and batch."""
    mesh, pipe = plan.mesh, plan.pipeline
    out = [["--tensor-model-parallel-size", str(mesh.tp)], ["--pipeline-model-parallel-size", str(mesh.pp)]]
    if not fork:
        out.append(["--context-parallel-size", str(mesh.cp)])
        if mesh.cp > 1:
            out.append(["--cp-comm-type", "p2p"])  # ring attention, as the cost model charges it
    elif mesh.pp == 1:
        out.append(["--no-pipeline-parallel"])  # GPTModel under deepspeed.initialize, not the pipeline engine
    if pipe.virtual_stages > 1:
        out.append(["--num-layers-per-virtual-pipeline-stage", str(plan.model.layers // (mesh.pp * pipe.virtual_stages))])
    if plan.sequence_parallel:
        out.append(["--sequence-parallel"])
    out += [["--micro-batch-size", str(plan.micro_batch_size)], ["--global-batch-size", str(plan.job.global_batch)],
            ["--train-iters", str(train_iters(plan))]]
    return out


def _model(plan: Plan, fork: bool) -> list[list[str]]:
    m = plan.model
    out = [["--num-layers", str(m.layers)], ["--hidden-size", str(m.hidden)], ["--num-attention-heads", str(m.heads)]]
    if fork:
        out.append(["--num-key-value-heads", str(m.kv_heads)])
    elif m.kv_heads != m.heads:
        out += [["--group-query-attention"], ["--num-query-groups", str(m.kv_heads)]]
    positions = m.seq_len if m.position == "learned" else max(m.seq_len, plan.job.seq_len)
    out += [["--ffn-hidden-size", str(m.ffn_hidden)], ["--seq-length", str(plan.job.seq_len)],
            ["--max-position-embeddings", str(positions)]]
    if m.activation == "swiglu":
        out.append(["--swiglu"])
    out.append(["--normalization", {"rmsnorm": "rmsnorm", "layernorm": "layernorm"}[m.norm] if fork
                else {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]])
    if m.position == "rope":
        out.append(["--use-rotary-position-embeddings"] if fork else ["--position-embedding-type", "rope"])
    elif not fork:
        out.append(["--position-embedding-type", "learned_absolute"])
    if not m.tied_embeddings:
        out.append(["--untie-embeddings-and-output-weights"])
    # exaplan's model (runtime/model.py): no biases, no dropout.
    out += [["--disable-bias-linear"], ["--attention-dropout", "0.0"], ["--hidden-dropout", "0.0"]]
    # No tokenizer file: the NullTokenizer takes the vocabulary's size (megatron-core's as given,
    # the fork's plus one end-of-document id), padded to a multiple of tp only.
    out += [["--tokenizer-type", "NullTokenizer"], ["--vocab-size", str(m.vocab_size - 1 if fork else m.vocab_size)],
            ["--make-vocab-size-divisible-by", "1"]]
    return out


def _precision(plan: Plan) -> list[list[str]]:
    return {Precision.bf16: [["--bf16"]], Precision.fp16: [["--fp16"]], Precision.fp32: []}[plan.job.precision]


def _recompute(plan: Plan, fork: bool) -> list[list[str]]:
    if plan.recompute == Recompute.selective:
        return [["--recompute-granularity", "selective"]]
    if plan.recompute == Recompute.full:
        # Megatron's full recompute with --recompute-method uniform over 1 layer checkpoints each
        # transformer layer's input and replays the whole layer in backward: exaplan's full.
        out = [["--recompute-granularity", "full"], ["--recompute-method", "uniform"], ["--recompute-num-layers", "1"]]
        return out + ([["--deepspeed-activation-checkpointing"]] if fork else [])
    return []


def grad_reduce_dtype(plan: Plan) -> str:
    """The dtype the plan's framework profile reduces gradients in, for its precision."""
    fw = plan.job.framework
    return {Precision.bf16: fw.grad_reduce_dtype, Precision.fp16: fw.fp16_grad_reduce_dtype}.get(plan.job.precision, "fp32")


def core_args(plan: Plan, notes: list[str]) -> list[list[str]]:
    """Megatron-LM's arguments (megatron-core 0.19.2, megatron/training/arguments.py)."""
    out = _layout(plan, fork=False)
    kind = plan.sharding.kind
    if kind == Sharding.zero1:
        out += [["--use-distributed-optimizer"], ["--overlap-grad-reduce"], ["--overlap-param-gather"]]
    else:
        out.append(["--overlap-grad-reduce"])
    out += _recompute(plan, fork=False) + _precision(plan)
    reduce = grad_reduce_dtype(plan)
    if plan.job.precision == Precision.bf16:
        out.append(["--grad-reduce-in-bf16"] if reduce == "bf16" else ["--accumulate-allreduce-grads-in-fp32"])
    elif plan.job.precision == Precision.fp16 and reduce == "fp32":
        out.append(["--accumulate-allreduce-grads-in-fp32"])
    grad_bytes = 4 if reduce == "fp32" or plan.job.precision == Precision.fp32 else 2
    if kind == Sharding.none and plan.job.framework.name != "megatron":
        out.append(["--ddp-bucket-size", str(int(plan.sharding.ddp_bucket_mb * 1e6 / grad_bytes))])
    else:
        notes.append("gradient buckets: Megatron's own size, max(40M, 1M x dp) parameters (what the megatron profile models)")
    out += _model(plan, fork=False)
    out.append(["--attention-backend", "flash" if plan.machine.flash_attention else "unfused"])
    out.append(["--distributed-backend", BACKENDS["megatron"][plan.machine.collective_library.value]])
    # Every step's time and TFLOP/s in the log, to read against the plan's prediction.
    out += [["--log-interval", "1"], ["--log-throughput"]]
    _vocab_note(plan, notes)
    notes.append("data and optimizer are not in the plan: add --data-path (or --mock-data) and --lr etc. "
                 "(args.sh shows where); --optimizer adam is Megatron's AdamW (decoupled weight decay)")
    return out


def fork_args(plan: Plan, notes: list[str]) -> list[list[str]]:
    """Megatron-DeepSpeed's arguments (the fork's megatron/arguments.py) and DeepSpeed's switches."""
    out = _layout(plan, fork=True)
    out += _recompute(plan, fork=True) + _precision(plan) + _model(plan, fork=True)
    if plan.machine.flash_attention:
        intel = plan.machine.collective_library.value == "oneccl"
        out.append(["--use-flash-attn-builder"] if intel else ["--use-flash-attn-v2"])
    out += [["--optimizer", "adamw"],
            ["--distributed-backend", BACKENDS["megatron-deepspeed"][plan.machine.collective_library.value]],
            ["--deepspeed"], ["--deepspeed_config", "ds_config.json"], ["--zero-stage", str(ZERO_STAGE[plan.sharding.kind])],
            ["--log-interval", "1"]]
    if plan.recompute == Recompute.selective and plan.machine.flash_attention:
        notes.append("recompute selective: the fork checkpoints the attention core only where it is unfused; with "
                     "FlashAttention it keeps no scores to drop (the plan counts none) and replays nothing")
    if plan.job.workload.value == "dpo":
        notes.append("dpo: run dpo_training.py; --micro-batch-size counts (chosen, rejected) pairs, each micro-step "
                     "one forward of 2 x micro-batch sequences and the reference model's; give the pairs' halves as "
                     "--data-file-list-p (chosen) and --data-file-list-u (rejected)")
    _vocab_note(plan, notes)
    notes.append("gradient reduction, buckets and the optimizer's state: ds_config.json (DeepSpeed reads them; "
                 "Megatron's own DDP flags have no effect under --deepspeed)")
    return out


def _vocab_note(plan: Plan, notes: list[str]) -> None:
    rows = padded_vocab(plan.model.vocab_size, plan.mesh.tp)
    if rows != plan.model.vocab_size:
        notes.append(f"vocabulary: {plan.model.vocab_size} tokens padded to {rows} embedding rows (a multiple of tp {plan.mesh.tp})")


# --------------------------------------------------------------------------------------------
# Scripts
# --------------------------------------------------------------------------------------------


def needs_single_connection(plan: Plan) -> bool:
    """Megatron's validate_args requires CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor or context
    parallelism (megatron-core, before Blackwell) or sequence parallelism (the fork)."""
    return plan.mesh.tp > 1 or plan.mesh.cp > 1 or plan.sequence_parallel


def env_file(plan: Plan) -> str:
    text = env_script(plan)
    if needs_single_connection(plan):
        text += ("# Megatron orders tensor-parallel communication and compute on one CUDA stream connection "
                 "(validate_args requires it with tp, cp or sequence parallelism).\n"
                 "export CUDA_DEVICE_MAX_CONNECTIONS=1\n")
    return text


def args_script(plan: Plan, target: str, args: list[list[str]]) -> str:
    fork = target == "megatron-deepspeed"
    dpo = plan.job.workload.value == "dpo"
    script = "dpo_training.py" if dpo else "pretrain_gpt.py"
    what = (f"Megatron-DeepSpeed ({FORK}, DeepSpeed {DEEPSPEED})" if fork else f"Megatron-LM (megatron-core {MEGATRON_CORE})")
    lines = ["#!/usr/bin/env bash",
             f"# {what} arguments of the plan; written by exaplan export --to {target}.",
             f"# {plan.provenance.command}",
             f"# {plan.nodes} nodes x {plan.ranks_per_node} ranks = {plan.world_size}: tp {plan.mesh.tp}, pp {plan.mesh.pp}, "
             f"cp {plan.mesh.cp}, dp {plan.mesh.dp}; global batch {plan.job.global_batch}"
             + (" pairs" if dpo else "") + ".",
             "# shellcheck disable=SC2034  # read by the launch that sources this file",
             "MEGATRON_ARGS=("]
    if fork:  # ds_config.json beside this file, wherever the job starts
        lines.insert(-2, 'EXPORT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"')
    lines += ["    " + " ".join('"$EXPORT_DIR/ds_config.json"' if t == "ds_config.json" else shlex.quote(t) for t in a)
              for a in args]
    lines.append(")")
    data = ("--data-file-list-p chosen.txt --data-file-list-u rejected.txt --split 100,0,0" if dpo
            else "--data-path /path/to/tokens_text_document --split 99,1,0")
    lines += ["",
              "# Not in the plan: the data and the optimizer's schedule. For example:",
              f"#   DATA_ARGS=({data})" + ("" if fork else "   # or (--mock-data)"),
              "#   OPT_ARGS=(--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2000 --weight-decay 0.1 --clip-grad 1.0)",
              "#",
              "# Launch on every node (the collective environment first):",
              "#   source env.sh; source args.sh",
              f"#   torchrun --nnodes {plan.nodes} --nproc-per-node {plan.ranks_per_node} --rdzv-backend c10d \\",
              '#       --rdzv-endpoint "$MASTER_ADDR:29500" \\',
              f'#       {script} "${{MEGATRON_ARGS[@]}}" "${{DATA_ARGS[@]}}" "${{OPT_ARGS[@]}}"']
    if fork:
        lines += ["# (from the fork's checkout; the MProt-DPO runs launched with mpiexec:",
                  f"#   mpiexec -n {plan.world_size} --ppn {plan.ranks_per_node} python3 {script} \"${{MEGATRON_ARGS[@]}}\" ...)"]
    else:
        lines.append("# (from the Megatron-LM checkout of megatron-core " + MEGATRON_CORE + ")")
    return "\n".join(lines) + "\n"
