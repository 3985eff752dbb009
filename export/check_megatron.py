"""Check `exaplan export --to megatron|megatron-deepspeed` files with Megatron's own code.

megatron: megatron-core 0.19.2's megatron/training (unpacked by `python -m export.fetch_megatron`
into .venv/frameworks/, put first on sys.path): args.txt through its parse_args and
validate_args with WORLD_SIZE = the plan's world, RANK 0 and env.sh's environment; its number of
micro-batches from megatron.core's num_microbatches_calculator; the NullTokenizer and padded
vocabulary from its build_tokenizer; and TransformerConfig from core_transformer_config_from_args.
What they derive (degrees, batch split) is returned; what they interpret differently from the
plan (sequence parallelism, recompute, precision, the gradients' reduction dtype, the model's
shape) is refused.

megatron-deepspeed: the fork's megatron/arguments.py parse_args and validate_args (where
`python -m export.fetch_megatron --fork GIT_DIR` unpacked it), in a separate interpreter (both
packages are called `megatron`), and ds_config.json through DeepSpeed's own DeepSpeedConfig
(export.check_deepspeed), where they are installed; docs/frameworks/megatron-deepspeed.md says
exactly what each covers.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import shlex
import subprocess
import sys
import warnings

from export.base import Derived, Export, environment
from export.fetch_megatron import CORE_DIR, FORK_COMMIT, FORK_DIR, MEGATRON_CORE, core_ready, fork_ready
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Precision, Recompute, Sharding

FETCH = "python -m export.fetch_megatron"


def missing(target: str = "megatron") -> str | None:
    """What is not here for `target`'s check (None: all of it is)."""
    if target == "megatron-deepspeed":
        out = []
        try:
            importlib.import_module("deepspeed")
        except ImportError:
            out.append("deepspeed (pip install -e '.[frameworks]')")
        if not fork_ready(FORK_DIR):
            out.append(f"the Megatron-DeepSpeed fork at {FORK_COMMIT[:7]} ({FETCH} --fork GIT_DIR)")
        return "; ".join(out) or None
    if not core_ready(CORE_DIR):
        return f"megatron-core {MEGATRON_CORE}'s training package ({FETCH})"
    try:
        importlib.import_module("torch")
    except ImportError:
        return "torch"
    return None


def arguments(exported: Export) -> list[str]:
    """args.txt as the argument list parse_args reads."""
    return [tok for line in exported.files["args.txt"].splitlines() if line.strip() for tok in shlex.split(line)]


def env_of(exported: Export) -> dict[str, str]:
    """The variables env.sh exports."""
    out = {}
    for line in exported.files["env.sh"].splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            out[name] = shlex.split(value)[0] if value else ""
    return out


def check(exported: Export, plan: Plan) -> Derived:
    if exported.target == "megatron-deepspeed":
        return check_fork(exported, plan)
    why = missing("megatron")
    if why:
        raise PlanError(f"Megatron's own code is not here: {why}", field="check")
    args, config, microbatches = core_parse(exported, plan)
    problems = core_problems(args, config, plan)
    if problems:
        raise PlanError("megatron-core " + MEGATRON_CORE + " reads the arguments otherwise than the plan: "
                        + "; ".join(problems), field="to")
    return Derived(tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
                   vpp=args.virtual_pipeline_model_parallel_size or 1, cp=args.context_parallel_size,
                   dp=args.data_parallel_size, micro_batch=args.micro_batch_size, accumulation=microbatches,
                   global_batch=args.global_batch_size)


# --------------------------------------------------------------------------------------------
# megatron-core
# --------------------------------------------------------------------------------------------


def load_core():
    """megatron.training.arguments from the unpacked wheel (first on sys.path). Its files are
    for Python 3.12: on 3.11 typing.override (a no-op decorator there, PEP 698) is taken from
    typing_extensions."""
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    path = str(CORE_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)
    loaded = sys.modules.get("megatron")
    where = list(getattr(loaded, "__path__", [])) if loaded is not None else []
    if loaded is not None and not all(str(w).startswith(path) for w in where):
        raise PlanError(f"another `megatron` package is imported in this process ({', '.join(map(str, where))})", field="check")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        from megatron.training import arguments
    return arguments


def device_arch(plan: Plan) -> int:
    """What Megatron's get_device_arch_version (the CUDA compute capability's major) returns on
    the plan's devices: 10 for Blackwell, else 9 or lower (Hopper, Ampere; ROCm reports its own),
    which validate_args treats alike."""
    name = plan.machine.device_name.upper()
    return 10 if any(k in name for k in ("B200", "B100", "GB200", "GB300", "B300")) else 9


def core_parse(exported: Export, plan: Plan):
    """(args, TransformerConfig, number of micro-batches) as megatron-core derives them."""
    margs = load_core()
    from megatron.core import num_microbatches_calculator as nmc
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training.argument_utils import core_transformer_config_from_args

    env = {**env_of(exported), "WORLD_SIZE": str(plan.world_size), "RANK": "0"}
    unset = () if "CUDA_DEVICE_MAX_CONNECTIONS" in env else ("CUDA_DEVICE_MAX_CONNECTIONS",)  # env.sh's, or none
    argv = ["pretrain_gpt.py", *arguments(exported)]
    old_argv, old_arch = sys.argv, margs.get_device_arch_version
    out = io.StringIO()
    try:
        sys.argv = argv
        margs.get_device_arch_version = lambda: device_arch(plan)
        with environment(env, unset), warnings.catch_warnings(), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            warnings.simplefilter("ignore")
            args = margs.parse_args()
            margs.validate_args(args)
            nmc.init_num_microbatches_calculator(0, None, args.global_batch_size, args.micro_batch_size,
                                                 args.data_parallel_size)
            try:
                microbatches = nmc.get_num_microbatches()
            finally:
                nmc.destroy_num_microbatches_calculator()
            build_tokenizer(args)
            # TransformerConfig refuses apply_rope_fusion without Transformer Engine's fused RoPE,
            # which is not installed here: built with it off, every other field as parsed.
            fused_rope, args.apply_rope_fusion = args.apply_rope_fusion, False
            config = core_transformer_config_from_args(args)
            args.apply_rope_fusion = fused_rope
    except SystemExit as e:  # argparse: an unknown or malformed argument
        raise PlanError(f"megatron-core {MEGATRON_CORE}'s parse_args refuses args.txt: {_last(out)} (exit {e.code})",
                        field="to") from None
    except (AssertionError, ValueError, RuntimeError, TypeError) as e:
        raise PlanError(f"megatron-core {MEGATRON_CORE} refuses the arguments: {type(e).__name__}: {e or _last(out)}",
                        field="to") from None
    finally:
        sys.argv, margs.get_device_arch_version = old_argv, old_arch
    return args, config, microbatches


def _last(out: io.StringIO) -> str:
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def core_problems(args, config, plan: Plan) -> list[str]:
    """Where megatron-core's reading of the arguments differs from the plan."""
    import torch

    from export.megatron import grad_reduce_dtype, padded_vocab

    m = plan.model
    p: list[str] = []

    def same(what, got, want):
        if got != want:
            p.append(f"{what}: Megatron has {got!r}, the plan {want!r}")

    same("sequence_parallel", config.sequence_parallel, plan.sequence_parallel)
    same("pipeline chunks (virtual_pipeline_model_parallel_size)", config.virtual_pipeline_model_parallel_size or 1,
         plan.pipeline.virtual_stages)
    granularity = {Recompute.none: None, Recompute.selective: "selective", Recompute.full: "full"}[plan.recompute]
    same("recompute_granularity", config.recompute_granularity, granularity)
    if plan.recompute == Recompute.full:
        same("recompute (method, layers)", (config.recompute_method, config.recompute_num_layers), ("uniform", 1))
    if plan.recompute == Recompute.selective:
        same("recompute_modules", list(config.recompute_modules), ["core_attn"])
    dtype = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16, Precision.fp32: torch.float32}[plan.job.precision]
    same("params_dtype", config.params_dtype, dtype)
    same("use_distributed_optimizer", args.use_distributed_optimizer, plan.sharding.kind == Sharding.zero1)
    if plan.job.precision != Precision.fp32:
        reduce = "fp32" if args.accumulate_allreduce_grads_in_fp32 else {Precision.bf16: "bf16", Precision.fp16: "fp16"}[plan.job.precision]
        same("gradient reduction dtype (accumulate_allreduce_grads_in_fp32)", reduce, grad_reduce_dtype(plan))
    same("num_layers", config.num_layers, m.layers)
    same("hidden_size", config.hidden_size, m.hidden)
    same("num_attention_heads", config.num_attention_heads, m.heads)
    same("num_query_groups", config.num_query_groups or config.num_attention_heads, m.kv_heads)
    same("ffn_hidden_size", config.ffn_hidden_size, m.ffn_hidden)
    same("gated_linear_unit (swiglu)", bool(config.gated_linear_unit), m.activation == "swiglu")
    same("normalization", config.normalization, {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm])
    same("position_embedding_type", args.position_embedding_type, {"rope": "rope", "learned": "learned_absolute"}[m.position])
    same("untie_embeddings_and_output_weights", args.untie_embeddings_and_output_weights, not m.tied_embeddings)
    same("seq_length", args.seq_length, plan.job.seq_len)
    same("padded_vocab_size", args.padded_vocab_size, padded_vocab(m.vocab_size, plan.mesh.tp))
    same("add_bias_linear", config.add_bias_linear, False)
    same("dropout (hidden, attention)", (config.hidden_dropout, config.attention_dropout), (0.0, 0.0))
    # The interleaved schedule's rule (megatron/core/pipeline_parallel/schedules.py): micro-batches
    # run in groups of microbatch_group_size_per_vp_stage (default pp) per model chunk.
    if (config.virtual_pipeline_model_parallel_size or 1) > 1:
        group, m_ = config.microbatch_group_size_per_vp_stage, plan.grad_accumulation_steps
        if not plan.mesh.pp <= group <= m_ or 0 < m_ % group < plan.mesh.pp:
            p.append(f"interleaved schedule: {m_} micro-batches in groups of {group} per chunk at pp {plan.mesh.pp}")
    return p


# --------------------------------------------------------------------------------------------
# megatron-deepspeed
# --------------------------------------------------------------------------------------------

# Run by a separate interpreter with the fork first on sys.path, kept for the process's checks:
# per line of standard input (the argument list and the environment as JSON), the fork's
# parse_args and validate_args, then the NullTokenizer's padded vocabulary; one JSON line back.
FORK_WORKER = r"""
import contextlib, io, json, os, sys, types, warnings
warnings.simplefilter("ignore")
placeholder = types.ModuleType("transformers")  # megatron/tokenizer imports AutoTokenizer for its HF tokenizer class only
def _absent(*a, **k):
    raise RuntimeError("transformers is not installed for the check")
placeholder.AutoTokenizer = type("AutoTokenizer", (), {"from_pretrained": staticmethod(_absent)})
sys.modules.setdefault("transformers", placeholder)
reply = sys.stdout
with contextlib.redirect_stdout(io.StringIO()):
    from megatron import arguments
    from megatron.tokenizer.tokenizer import _NullTokenizer, _vocab_size_with_padding
KEYS = json.loads(sys.argv[1])
for line in sys.stdin:
    request = json.loads(line)
    out = io.StringIO()
    saved = dict(os.environ)
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(request["env"])
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            sys.argv = ["pretrain_gpt.py"] + request["argv"]
            args = arguments.parse_args()
            arguments.validate_args(args)
            vocab = _vocab_size_with_padding(_NullTokenizer(args.vocab_size).vocab_size, args) if args.vocab_size else None
        answer = {**{k: getattr(args, k) for k in KEYS}, "padded_vocab_size": vocab}
    except SystemExit as e:
        answer = {"error": f"parse_args: {' '.join(out.getvalue().strip().splitlines()[-1:])} (exit {e.code})"}
    except Exception as e:
        answer = {"error": f"{type(e).__name__}: {e}"}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    reply.write(json.dumps(answer) + "\n")
    reply.flush()
"""

FORK_KEYS = ["tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
             "data_parallel_size", "ds_sequence_parallel_size", "micro_batch_size", "global_batch_size",
             "sequence_parallel", "no_pipeline_parallel", "deepspeed", "deepspeed_config", "zero_stage",
             "recompute_granularity", "recompute_method", "recompute_num_layers", "deepspeed_activation_checkpointing",
             "checkpoint_num_layers", "bf16", "fp16", "num_layers", "hidden_size", "num_attention_heads",
             "num_key_value_heads", "ffn_hidden_size", "seq_length", "max_position_embeddings", "swiglu",
             "normalization", "use_rotary_position_embeddings", "add_position_embedding",
             "untie_embeddings_and_output_weights", "add_bias_linear", "hidden_dropout", "attention_dropout",
             "use_flash_attn", "use_flash_attn_builder", "distributed_backend", "train_iters"]

_worker: subprocess.Popen | None = None


def _fork_worker() -> subprocess.Popen:
    global _worker
    if _worker is None or _worker.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
        env.update({"DS_ACCELERATOR": "cpu",
                    "PYTHONPATH": os.pathsep.join([str(FORK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])})
        _worker = subprocess.Popen([sys.executable, "-c", FORK_WORKER, json.dumps(FORK_KEYS)], env=env, cwd=str(FORK_DIR),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        atexit.register(_stop_worker)
    return _worker


def _stop_worker() -> None:
    global _worker
    if _worker is not None and _worker.poll() is None:
        _worker.stdin.close()
        try:
            _worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _worker.kill()
    _worker = None


def fork_parse(exported: Export, plan: Plan) -> dict:
    """What the fork's parse_args and validate_args make of args.txt (with env.sh's variables,
    WORLD_SIZE = the plan's world, RANK 0, DeepSpeed on its CPU accelerator)."""
    worker = _fork_worker()
    env = {**env_of(exported), "WORLD_SIZE": str(plan.world_size), "RANK": "0"}
    try:
        worker.stdin.write(json.dumps({"argv": arguments(exported), "env": env}) + "\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
    except (BrokenPipeError, OSError):
        line = ""
    if not line:
        err = worker.stderr.read() if worker.poll() is not None else ""
        _stop_worker()
        raise PlanError(f"the Megatron-DeepSpeed fork's argument code failed: {err.strip()[-500:]}", field="check")
    values = json.loads(line)
    if "error" in values:
        raise PlanError(f"Megatron-DeepSpeed ({FORK_COMMIT[:7]}) refuses the arguments: {values['error']}", field="to")
    return values


def fork_problems(values: dict, ds: dict, plan: Plan) -> list[str]:
    """Where the fork's reading of args.txt differs from the plan or from ds_config.json."""
    from export.megatron import ZERO_STAGE, padded_vocab

    m = plan.model
    p: list[str] = []

    def same(what, got, want):
        if got != want:
            p.append(f"{what}: the fork has {got!r}, the plan {want!r}")

    same("sequence_parallel", values["sequence_parallel"], plan.sequence_parallel)
    same("ds_sequence_parallel_size (Ulysses)", values["ds_sequence_parallel_size"], 1)
    same("no_pipeline_parallel", values["no_pipeline_parallel"], plan.mesh.pp == 1)
    same("deepspeed", (values["deepspeed"], values["deepspeed_config"]), (True, "ds_config.json"))
    stage = ZERO_STAGE[plan.sharding.kind]
    same("zero_stage", int(values["zero_stage"]), stage)
    same("ds_config.json zero_optimization.stage", int(ds.get("zero_optimization", {}).get("stage", 0)), stage)
    granularity = {Recompute.none: None, Recompute.selective: "selective", Recompute.full: "full"}[plan.recompute]
    same("recompute_granularity", values["recompute_granularity"], granularity)
    if plan.recompute == Recompute.full:
        # the pipeline engine's checkpoint interval (GPTModelPipe) and deepspeed.checkpointing's
        # layers per checkpoint (ParallelTransformer._checkpointed_forward): one block each
        same("recompute (method, layers, checkpoint_num_layers)",
             (values["recompute_method"], values["recompute_num_layers"], values["checkpoint_num_layers"]), ("uniform", 1, 1))
        same("deepspeed_activation_checkpointing", values["deepspeed_activation_checkpointing"], True)
    same("precision (bf16, fp16)", (values["bf16"], values["fp16"]),
         (plan.job.precision == Precision.bf16, plan.job.precision == Precision.fp16))
    for key, section in (("bf16", "bf16"), ("fp16", "fp16")):
        enabled = bool(ds.get(section, {}).get("enabled", False))
        same(f"ds_config.json {section}.enabled", enabled, values[key])
    same("num_layers", values["num_layers"], m.layers)
    same("hidden_size", values["hidden_size"], m.hidden)
    same("num_attention_heads", values["num_attention_heads"], m.heads)
    same("num_key_value_heads", values["num_key_value_heads"], m.kv_heads)
    same("ffn_hidden_size", values["ffn_hidden_size"], m.ffn_hidden)
    same("seq_length", values["seq_length"], plan.job.seq_len)
    same("swiglu", values["swiglu"], m.activation == "swiglu")
    same("normalization", values["normalization"], m.norm)
    same("rotary (use_rotary_position_embeddings, add_position_embedding)",
         (values["use_rotary_position_embeddings"], values["add_position_embedding"]),
         (m.position == "rope", m.position == "learned"))
    same("untie_embeddings_and_output_weights", values["untie_embeddings_and_output_weights"], not m.tied_embeddings)
    same("add_bias_linear", values["add_bias_linear"], False)
    same("dropout (hidden, attention)", (values["hidden_dropout"], values["attention_dropout"]), (0.0, 0.0))
    same("FlashAttention (use_flash_attn, use_flash_attn_builder)",
         bool(values["use_flash_attn"] or values["use_flash_attn_builder"]), plan.machine.flash_attention)
    same("padded_vocab_size", values["padded_vocab_size"], padded_vocab(m.vocab_size, plan.mesh.tp))
    return p


def check_fork(exported: Export, plan: Plan) -> Derived:
    why = missing("megatron-deepspeed")
    if why:
        raise PlanError(f"Megatron-DeepSpeed's own code is not here: {why}", field="check")
    from export import check_deepspeed
    from export.megatron import grad_reduce_dtype

    values = fork_parse(exported, plan)
    config = check_deepspeed.parse(exported.files["ds_config.json"])
    problems = fork_problems(values, config, plan)
    mbs, gb, dp = values["micro_batch_size"], values["global_batch_size"], values["data_parallel_size"]
    tp, pp = values["tensor_model_parallel_size"], values["pipeline_model_parallel_size"]
    if gb % (mbs * dp):
        problems.append(f"global batch {gb} is not a multiple of micro-batch {mbs} x dp {dp}")
    fork = Derived(tp=tp, pp=pp, vpp=values["virtual_pipeline_model_parallel_size"] or 1, cp=1, dp=dp, micro_batch=mbs,
                   accumulation=gb // (mbs * dp), global_batch=gb)
    # DeepSpeed's config code with the data-parallel group the fork's mpu gives the engine.
    ds = check_deepspeed.check_config(config, dp=dp, mp=tp * pp)
    deepspeed = Derived(tp=tp, pp=pp, vpp=fork.vpp, cp=1, dp=ds.dp, micro_batch=ds.micro_batch,
                        accumulation=ds.accumulation, global_batch=ds.train_batch_size)
    if deepspeed != fork:
        problems.append(f"DeepSpeed derives {deepspeed} from ds_config.json, the fork's arguments {fork}")
    if (ds.derived_accumulation, ds.derived_micro_batch) != (ds.accumulation, ds.micro_batch):
        problems.append(f"DeepSpeed derives accumulation {ds.derived_accumulation} and micro-batch "
                        f"{ds.derived_micro_batch} from the batch, the file says {ds.accumulation} and {ds.micro_batch}")
    if ds.zero_stage != int(values["zero_stage"]):
        problems.append(f"DeepSpeed's ZeRO stage {ds.zero_stage}, the fork's --zero-stage {values['zero_stage']}")
    if (ds.bf16, ds.fp16) != (values["bf16"], values["fp16"]):
        problems.append(f"DeepSpeed's bf16/fp16 {ds.bf16}/{ds.fp16}, the fork's {values['bf16']}/{values['fp16']}")
    if ds.communication_dtype != grad_reduce_dtype(plan):
        problems.append(f"DeepSpeed reduces gradients in {ds.communication_dtype}, the plan in {grad_reduce_dtype(plan)}")
    if problems:
        raise PlanError(f"Megatron-DeepSpeed ({FORK_COMMIT[:7]}) reads the files otherwise than the plan: "
                        + "; ".join(problems), field="to")
    return fork
