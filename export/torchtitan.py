"""`exaplan export PLAN --to torchtitan`: the plan as torchtitan 0.3.0 command-line overrides.

torchtitan 0.3.0 builds its job from a Python config function (`--module M --config F`, looked
up by `torchtitan.config.ConfigManager`) and tyro overrides `--section.field value`; it reads no
TOML. The model is exaplan's protein Llama, which no torchtitan flavor has, so the export writes
the config module too (`exaplan_protein.py`: torchtitan's own Llama 3 blocks at the plan's
shape, the llama3 parallelize and pipeline functions), put on PYTHONPATH by train.sh.

Files:
    overrides.txt       one override per line (shell words), `--module`/`--config` first; `#` lines
                        are comments
    train.sh            the same as a bash array TITAN_ARGS, and the torchrun line that starts it
    exaplan_protein.py  the config function `exaplan_protein()`: the model, the loss, the plan's
                        activation checkpointing, data defaults; run as a script it is torchtitan.train
    env.sh              the collective library's environment of the plan

The plan's batch split in torchtitan's terms. torchtitan's `training.local_batch_size` is what
one data-parallel rank runs per gradient-accumulation step; it derives the accumulation steps
as global / (local x dp) and, with pipeline parallelism, splits each local batch into
local / `pipeline_parallel_microbatch_size` pipeline microbatches, each accumulation step a full
pipeline flush. exaplan's grad_accumulation_steps are micro-batches of one optimizer step, and
with pp > 1 the micro-batches of ONE pipeline schedule. So:
    pp == 1   local_batch_size = micro_batch_size        (torchtitan accumulates the plan's steps)
    pp > 1    local_batch_size = micro_batch_size x grad_accumulation_steps,
              pipeline_parallel_microbatch_size = micro_batch_size (one flush, the plan's
              microbatches; torchtitan's own accumulation is 1)
    global_batch_size = job.global_batch in both.

What torchtitan 0.3.0 cannot express is refused with a PlanError naming the plan's field (the
framework profile `torchtitan` refuses the layouts first, export.base.export_plan).
"""

from __future__ import annotations

import shlex

from export.base import EXPORT_DIR, Derived, Export, env_script
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Precision, Recompute, Schedule, Sharding

VERSION = "0.3.0"
MODULE = "exaplan_protein"  # the config module the export writes (--module), and its function (--config)
CONFIG_FN = "exaplan_protein"
ATTENTION = "flex"  # torchtitan's language-model attention backends: flex, flex_flash (Hopper+), varlen; sdpa refused
ROPE_THETA = 10000.0  # exaplan's runtime (runtime/model.py rope_tables)

SCHEDULES = {Schedule.gpipe: "GPipe", Schedule.one_f_one_b: "1F1B", Schedule.interleaved_1f1b: "Interleaved1F1B"}
DTYPES = {Precision.bf16: "bfloat16", Precision.fp32: "float32"}
# torchtitan's activation checkpointing (distributed/activation_checkpoint.py; on the command line
# the tyro subcommands activation-checkpoint:none|full|selective): SelectiveAC is its per-op SAC
# (save every compute op's output but every second matmul's), exaplan's selective-op. The export
# sets it in the config function, so the command line takes overrides in any order (tyro reads
# no option after a subcommand, and `exaplan launch --run-args` appends them).
CHECKPOINTING = {Recompute.none: ("none", "None"), Recompute.full: ("full", "FullAC.Config()"),
                 Recompute.selective_op: ("selective", "SelectiveAC.Config()")}


def export(plan: Plan, target: str = "torchtitan") -> Export:
    refuse(plan)
    args = overrides(plan)
    notes = [f"torchtitan {VERSION}: put this folder on PYTHONPATH (train.sh does) so that --module {MODULE} imports "
             f"{MODULE}.py; the tokenizer (--hf_assets_path) and the protein dataset (--dataloader.dataset_path) are yours"]
    if plan.sharding.kind == Sharding.none and plan.mesh.dp > 1:
        notes.append("sharding none: torchtitan replicates through FSDP2 (fully_shard over the dp_replicate axis, shard "
                     "degree 1), one gradient allreduce per transformer block")
        if plan.sharding.ddp_impl == "ddp":
            notes.append("the plan's sharding.ddp_impl ddp is exaplan's runtime's torch DistributedDataParallel; "
                         "torchtitan runs FSDP2's replicate form instead (gradients copied into its buffers)")
    header = (f"# torchtitan {VERSION} overrides, one a line, of {plan.provenance.command}\n"
              f"# activation checkpointing ({CHECKPOINTING[plan.recompute][0]}) is set by {MODULE}.py; "
              f"appending activation-checkpoint:NAME (last) would replace it\n")
    files = {
        "overrides.txt": header + "".join(" ".join(shlex.quote(w) for w in words) + "\n" for words in args),
        "train.sh": train_script(plan, args),
        f"{MODULE}.py": config_module(plan),
        "env.sh": env_script(plan),
    }
    notes.append(f"exaplan launch --framework torchtitan runs {MODULE}.py of the export (torchtitan.train with this "
                 "folder importable); torchtitan.train itself needs the folder on PYTHONPATH")
    return Export(target=target, files=files, derived=Derived.of(plan), notes=notes, versions={"torchtitan": VERSION},
                  argv=[w for words in args for w in words], entry=f"{EXPORT_DIR}/{MODULE}.py")


# --------------------------------------------------------------------------------------------
# What torchtitan 0.3.0 cannot run
# --------------------------------------------------------------------------------------------


def refuse(plan: Plan) -> None:
    """PlanError naming the plan's field for the first thing torchtitan 0.3.0 cannot express."""
    for field, message in refusals(plan):
        raise PlanError(message, field=field)


def refusals(plan: Plan) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    model, mesh, kind = plan.model, plan.mesh, plan.sharding.kind
    if plan.job.workload.value != "pretrain":
        out.append(("job.workload", f"torchtitan {VERSION}'s Trainer trains next-token prediction only; it has no "
                                    f"{plan.job.workload.value} trainer"))
    if plan.job.precision not in DTYPES:
        out.append(("job.precision", f"torchtitan's training.mixed_precision_param is bfloat16 or float32, not "
                                     f"{plan.job.precision.value}"))
    elif plan.job.precision == Precision.bf16 and plan.job.framework.grad_reduce_dtype != "fp32":
        out.append(("job.framework.grad_reduce_dtype", "torchtitan's training.mixed_precision_reduce is float32 only, "
                                                       f"not {plan.job.framework.grad_reduce_dtype}"))
    if plan.recompute not in CHECKPOINTING:
        out.append(("recompute", f"torchtitan's activation checkpointing is none, full, selective (per-op: exaplan's "
                                 f"selective-op) or memory-budget; it has no {plan.recompute.value} (attention-core-only) "
                                 "recompute"))
    if kind in (Sharding.zero1, Sharding.zero2):
        out.append(("sharding.kind", f"torchtitan shards with FSDP2 (fsdp, fsdp-grad-op, hsdp) or replicates (none); "
                                     f"it has no {kind.value}"))
    if kind == Sharding.none and mesh.cp > 1:
        out.append(("sharding.kind", f"with context parallelism torchtitan always shards the parameters over the cp "
                                     f"ranks (FSDP2 over dp_shard x cp); sharding none replicates them over cp {mesh.cp}: "
                                     "use fsdp or hsdp"))
    if kind == Sharding.none and mesh.dp_replicate > 1:
        block = block_gradient_mib(plan)
        if plan.sharding.ddp_bucket_mb > block:
            out.append(("sharding.ddp_bucket_mb", f"torchtitan reduces the replicated gradients one transformer block "
                                                  f"at a time ({block:.1f} MiB of fp32 gradients a rank); it has no "
                                                  f"bucket of {plan.sharding.ddp_bucket_mb:g} MB"))
    for name, theirs in (("activation", "swiglu"), ("norm", "rmsnorm"), ("position", "rope")):
        if getattr(model, name) != theirs:
            out.append((f"model.{name}", f"torchtitan's Llama 3 blocks use {theirs}, not {getattr(model, name)}"))
    if model.tied_embeddings and mesh.pp > 1:
        out.append(("model.tied_embeddings", "torchtitan does not tie the embedding and the head under pipeline "
                                             "parallelism (Decoder.Config.update_from_config)"))
    if mesh.pp > 1:
        if plan.pipeline.schedule not in SCHEDULES:
            out.append(("pipeline.schedule", f"torchtitan runs {', '.join(s.value for s in SCHEDULES)}"))
        for i, part in enumerate(model_parts(plan)):
            if not part:
                out.append((f"pipeline.stages[{i}]", "an empty stage (no layer, embedding or head): torchtitan builds "
                                                     "a pipeline stage from the modules it names"))
    return out


def layer_params(plan: Plan) -> int:
    """Parameters of one transformer block: q and o (h x h), k and v (h x kv_heads x head_dim),
    the SwiGLU's three matrices (h x ffn_hidden) and two RMSNorm scales (planner/cost/flops.py
    counts the same for the blocks torchtitan builds; the profile's ddp_bucket_per_block plans
    this bucket)."""
    m = plan.model
    kv = m.kv_heads * (m.hidden // m.heads)
    return 2 * m.hidden * m.hidden + 2 * m.hidden * kv + 3 * m.hidden * m.ffn_hidden + 2 * m.hidden


def block_gradient_mib(plan: Plan) -> float:
    """One block's fp32 gradients on one tensor-parallel rank (MiB): torchtitan's unit of
    gradient reduction (an FSDP2 unit per block), and the smallest unit of exaplan's runtime's
    replicate, which groups blocks into units of at least sharding.ddp_bucket_mb MiB."""
    return layer_params(plan) / plan.mesh.tp * 4 / 2**20


# --------------------------------------------------------------------------------------------
# The overrides
# --------------------------------------------------------------------------------------------


def model_parts(plan: Plan) -> list[list[str]]:
    """`parallelism.module_fqns_per_model_part`: the module names of each (virtual) stage, in
    model order, from the plan's stages (torchtitan puts stage i on pp rank i % pp, the plan's
    order for every schedule it runs)."""
    parts = []
    for st in plan.pipeline.stages:
        names = ["tok_embeddings"] if st.embedding else []
        names += [f"layers.{i}" for i in range(st.first_layer, st.last_layer)]
        names += ["norm", "lm_head"] if st.head else []
        parts.append(names)
    return parts


def local_batch(plan: Plan) -> int:
    """training.local_batch_size: a data-parallel rank's sequences per torchtitan accumulation step."""
    return plan.micro_batch_size * (plan.grad_accumulation_steps if plan.mesh.pp > 1 else 1)


def reshard_policy(plan: Plan) -> str:
    """parallelism.fsdp_reshard_after_forward, always explicit (torchtitan's `default` keeps
    gathered parameters under pipeline parallelism and frees them otherwise)."""
    if plan.sharding.kind == Sharding.none:
        return "never"  # replicated: the gathered copy is the whole model, kept like DDP's
    if plan.sharding.kind == Sharding.fsdp_grad_op:
        return "never"
    if plan.sharding.kind == Sharding.fsdp:
        return "always"
    return "always" if plan.sharding.reshard_after_forward else "never"


def overrides(plan: Plan) -> list[list[str]]:
    """torchtitan's command line for the plan: one override (its words) per entry."""
    mesh = plan.mesh
    # none: dp_replicate ranks, shard degree 1 (the plan's dp_shard); fsdp kinds: dp_shard (x 1
    # replica); hsdp: both. Explicit degrees: torchtitan's -1 (the rest) is never written.
    out = [["--module", MODULE], ["--config", CONFIG_FN],
           ["--parallelism.data_parallel_replicate_degree", str(mesh.dp_replicate)],
           ["--parallelism.data_parallel_shard_degree", str(mesh.dp_shard)],
           ["--parallelism.fsdp_reshard_after_forward", reshard_policy(plan)],
           ["--parallelism.tensor_parallel_degree", str(mesh.tp)],
           ["--parallelism.enable_sequence_parallel" if plan.sequence_parallel else "--parallelism.no_enable_sequence_parallel"],
           ["--parallelism.context_parallel_degree", str(mesh.cp)]]
    if mesh.cp > 1:
        # cp rank r keeps chunks r and 2cp-1-r of 2cp (exaplan's runtime/parallel/context.py)
        out.append(["--parallelism.context_parallel_load_balancer", "headtail"])
    out.append(["--parallelism.pipeline_parallel_degree", str(mesh.pp)])
    if mesh.pp > 1:
        out += [["--parallelism.pipeline_parallel_schedule", SCHEDULES[plan.pipeline.schedule]],
                ["--parallelism.module_fqns_per_model_part", *(",".join(p) for p in model_parts(plan))],
                ["--parallelism.pipeline_parallel_microbatch_size", str(plan.micro_batch_size)]]
    out += [["--training.local_batch_size", str(local_batch(plan))],
            ["--training.global_batch_size", str(plan.job.global_batch)],
            ["--training.seq_len", str(plan.job.seq_len)],
            ["--training.dtype", "float32"],  # fp32 master weights and optimizer state, as exaplan plans them
            ["--training.mixed_precision_param", DTYPES[plan.job.precision]],
            ["--training.mixed_precision_reduce", "float32"],
            # The plan's prediction is of eager kernel launches (the profile's launch_us_per_op);
            # torchtitan captures the forward and backward in a CUDA graph unless told not to
            # (and must not under pipeline parallelism).
            ["--training.disable_cuda_graphs"],
            ["--compile.enable" if plan.compile else "--compile.no_enable"]]
    if plan.compile:
        out.append(["--compile.components", "model"])  # each transformer block, as exaplan compiles them
    return out


def train_script(plan: Plan, args: list[list[str]]) -> str:
    def line(words):
        return "  " + " ".join(shlex.quote(w) for w in words)

    return "\n".join([
        "#!/usr/bin/env bash",
        f"# torchtitan {VERSION} arguments of the plan ({plan.provenance.command}).",
        "# Source it (it sets TITAN_ARGS, the environment and PYTHONPATH), then start torchtitan on every node:",
        "#",
        f"#   torchrun --nnodes {plan.nodes} --nproc_per_node {plan.ranks_per_node} --rdzv_backend c10d \\",
        "#       --rdzv_endpoint \"$MASTER_ADDR:29500\" -m torchtitan.train \"${TITAN_ARGS[@]}\"",
        "#",
        "# PROTEIN_TOKENIZER: a folder holding the Hugging Face tokenizer of the protein vocabulary",
        f"# ({plan.model.vocab_size} ids); PROTEIN_DATA: a dataset `datasets.load_dataset` reads, one protein",
        "# sequence a row in its `sequence` (or `text`) column. `python exaplan_protein.py ARGS` runs torchtitan.train",
        "# too, with this folder importable (no PYTHONPATH needed).",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'source "$HERE/env.sh"',
        'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"',
        ': "${PROTEIN_TOKENIZER:=./assets/protein-tokenizer}"',
        ': "${PROTEIN_DATA:=./data/protein}"',
        "TITAN_ARGS=(",
        *(line(w) for w in args),
        '  --hf_assets_path "$PROTEIN_TOKENIZER"',
        '  --dataloader.dataset_path "$PROTEIN_DATA"',
        ")",
        "",
    ])


# exaplan_protein.py after its constants: torchtitan's Llama 3 parts at the shape they give.
CONFIG_BODY = '''
from functools import partial

import torch.nn as nn
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.config import TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401 (one is used)
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
from torchtitan.models.llama3 import parallelize_llama
from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer
'''

CONFIG_FUNCTIONS = '''

def _normal(std):
    return {"weight": partial(nn.init.trunc_normal_, std=std, a=-3 * std, b=3 * std), "bias": nn.init.zeros_}


def _load_protein(path):
    from datasets import load_dataset

    return load_dataset(path, split="train")


def _sequence(sample):
    return sample["sequence"] if "sequence" in sample else sample["text"]


# One protein sequence a row; the path comes from --dataloader.dataset_path.
DATASETS["protein"] = DatasetConfig(path="./data/protein", loader=_load_protein, sample_processor=_sequence)


def model_config() -> Llama3Model.Config:
    norm = {"weight": nn.init.ones_}
    rope = ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=SEQ_LEN, theta=ROPE_THETA)
    layers = []
    for i in range(LAYERS):
        out_init = _normal(0.02 / (2 * (i + 1)) ** 0.5)  # depth-scaled output projections
        layers.append(Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=DIM, param_init=norm),
            ffn_norm=RMSNorm.Config(normalized_shape=DIM, param_init=norm),
            attention=make_gqa_config(dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, wqkv_param_init=_normal(0.02),
                                      wo_param_init=out_init, inner_attention=get_attention_config(ATTENTION),
                                      fuse_qkv=True, rope=rope),
            feed_forward=make_ffn_config(dim=DIM, hidden_dim=FFN_HIDDEN, w1_param_init=_normal(0.02),
                                         w2w3_param_init=out_init),
        ))
    return Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB, enable_weight_tying=TIED,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM,
                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=norm),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_normal(DIM ** -0.5)),
        layers=layers,
    )


def exaplan_protein() -> Trainer.Config:
    spec = ModelSpec(name="llama3", flavor="exaplan-protein", model=model_config(), parallelize_fn=parallelize_llama,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=None, state_dict_adapter=None)
    return Trainer.Config(
        model_spec=spec,
        hf_assets_path="./assets/protein-tokenizer",
        loss=CrossEntropyLoss.Config(global_vocab_size=VOCAB),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="protein"),
        training=TrainingConfig(seq_len=TRAIN_SEQ_LEN),
        activation_checkpoint=CHECKPOINTING,  # the plan's recompute
    )


if __name__ == "__main__":  # python exaplan_protein.py ARGS: torchtitan.train, with this folder on sys.path
    from torchtitan.train import main

    main()
'''


def config_module(plan: Plan) -> str:
    """exaplan_protein.py: torchtitan's Llama 3 model config at the plan's shape (the plan's
    figures as constants, then CONFIG_FUNCTIONS, which read them)."""
    m = plan.model
    constants = {"LAYERS": m.layers, "DIM": m.hidden, "HEADS": m.heads, "KV_HEADS": m.kv_heads, "FFN_HIDDEN": m.ffn_hidden,
                 "VOCAB": m.vocab_size, "SEQ_LEN": max(plan.job.seq_len, m.seq_len), "TRAIN_SEQ_LEN": plan.job.seq_len,
                 "TIED": m.tied_embeddings, "ATTENTION": ATTENTION, "ROPE_THETA": ROPE_THETA}
    header = (f'"""torchtitan {VERSION} config module of an exaplan plan: `--module {MODULE} --config {CONFIG_FN}`.\n\n'
              "The protein Llama of the plan built from torchtitan's own Llama 3 parts (GQA attention with\n"
              "fused QKV and rotary embeddings, SwiGLU feed-forward, RMSNorm), parallelized and pipelined by\n"
              "torchtitan's llama3 functions. Written by `exaplan export --to torchtitan` from the plan this\n"
              "command made:\n"
              '"""\n' + "".join(f"# {line}\n" for line in plan.provenance.command.splitlines()))
    lines = [f"{k} = {v!r}" for k, v in constants.items()]
    lines.append(f"CHECKPOINTING = {CHECKPOINTING[plan.recompute][1]}  # recompute: {plan.recompute.value}")
    return header + CONFIG_BODY + "\n" + "\n".join(lines) + "\n" + CONFIG_FUNCTIONS
