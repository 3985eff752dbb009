"""The published training runs exaplan is calibrated on and checked against (the record and its
conventions: calibration/published_schema.py).

    published_runs()   the calibration set: sections A-D here (Megatron-LM README, Korthikanti
                       et al. 2022, llm-foundry H100, fms-fsdp A100) and the fitted section of
                       calibration/published_extra.py (H: llm-foundry A100) and of
                       calibration/published_seed_hw.py (I: Megatron-DeepSpeed on LUMI's MI250X;
                       K: Megatron-DeepSpeed on Aurora's Max 1550);
                       `exaplan validate --published` fits and predicts them
    held_out_runs()    published rows never fitted, only predicted (A: the strong-scaling end points of
                       the same Megatron-LM README; M, calibration/published_own.py:
                       exaplan's own runtime on a lent H200; F: torchtitan on H100s,
                       G: BLOOM-176B with Megatron-DeepSpeed, on hardware that the machine
                       presets only stand in for; the Frontier torchtitan row of I and J's
                       GH200 rows, calibration/published_seed_hw.py; N: NVIDIA's DGX Cloud
                       benchmarking recipes, Llama 3.1 on DGX H100 with NeMo (Megatron-Core),
                       calibration/published_nemo.py; L: the rest of llm-foundry's benchmark
                       tables, calibration/published_foundry.py)
"""

from __future__ import annotations

from calibration.published_extra import fitted_extra_runs, held_out_extra_runs
from calibration.published_seed_hw import fitted_seed_hw_runs, held_out_seed_hw_runs
from calibration.published_schema import (  # noqa: F401 - the record's API, re-exported
    FRAMEWORK_SHARDINGS, FRAMEWORKS, PROFILE_OF, UNITS, FigureKind, FlopConvention, Framework, PublishedLayout,
    PublishedRun, gpt_model, llama_model, mpt_model,
)
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import Precision


SOURCE_A = "Megatron-LM README, weak-scaling table (DGX H100, 2024)"
NOTE_A = (
    "TFLOP/s per GPU by Megatron's formula (model FLOPs, logits included), MFU over 989. "
    "Megatron-Core r0.8.0 (the legend of the README's scaling figures, commit f2e5db4, July 2024), "
    "whose arguments.py forces fp32 gradient reduction under --bf16. bf16 is assumed: neither the README "
    "nor its table and figures name a precision (the reference table says bf16, as do the repository's CI "
    "recipes of that commit, tests/functional_tests/jet_recipes; its GPT-3 example script runs --fp16, under "
    "which the gradients would be reduced in fp16, halving the reduce-scatter: docs/issue-10-log.md, "
    "twenty-first session). "
    "Micro-batch 1 (the usual setting; not in the table). Sequence parallel with tp > 1 "
    "(--tp-comm-overlap requires it). No recompute and no interleaving: not stated, assumed. Against the "
    "latter: the README overlaps 'pipeline-parallel communication (enabled by default)', which r0.8.0 does only "
    "under the interleaved schedule (arguments.py turns overlap_p2p_comm off without "
    "--num-layers-per-virtual-pipeline-stage), and the 119B and 462B stages (23 and 7 layers) allow only one "
    "layer per virtual stage; recorded so (every pipeline row at one layer per virtual stage), the refit puts "
    "H100's attention factor at its ceiling and the leave-one-out errors rise (docs/issue-10-log.md, "
    "nineteenth session), so the rows keep no interleaving."
)
SOURCE_A_STRONG = "Megatron-LM README, strong-scaling text and figure (DGX H100, Megatron-Core r0.8.0, 2024)"
NOTE_A_STRONG = (
    "Held out. The README strong-scales its 177B GPT from 96 to 4,608 H100s at a global batch of 1,152 "
    "sequences, 'leading to a reduction in MFU from 47% to 42%' (MFU by Megatron's formula over 989, "
    "rounded to a percent: +/-1% of the figure). The layout is not given: tensor 8 x pipeline 6, as the "
    "weak-scaling table's 177B row at 2,304 GPUs (a point of the same strong-scaling curve, 44%), so data "
    "parallel GPUs / 48; micro-batch 1, no recompute, no interleaving, as section A assumes. At 96 GPUs "
    "(two replicas, 576 micro-batches a step) neither the bubble nor the gradient traffic shows, so the row "
    "reads the compute alone; at 4,608 (12 micro-batches) the bubble without interleaving is 5/12 of it."
)


def _section_a() -> list[PublishedRun]:
    # (params, heads, hidden, layers, tp, pp, gpus, global batch, TFLOP/s per GPU)
    table = [
        ("1.7b", 16, 2048, 24, 1, 1, 48, 192, 408.8),
        ("7.1b", 32, 4096, 30, 2, 1, 96, 192, 465.9),
        ("16b", 48, 6144, 32, 4, 1, 192, 192, 489.1),
        ("32b", 56, 7168, 48, 8, 1, 384, 192, 459.6),
        ("70b", 64, 8192, 84, 8, 2, 768, 384, 419.7),
        ("119b", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
        ("177b", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
        ("314b", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
        ("462b", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
    ]
    runs = []
    for size, heads, hidden, layers, tp, pp, gpus, gbs, tflops in table:
        assumed = ["precision", "layout.micro_batch", "layout.recompute", "layout.sequence_parallel"]
        if pp > 1:
            assumed.append("layout.vpp")
        runs.append(PublishedRun(
            id=f"A-gpt-{size}", section="A", source=SOURCE_A,
            model=gpt_model(f"gpt-{size}", layers, hidden, heads, vocab=131072, seq=4096),
            machine="dgx-h100", framework="megatron", gpus=gpus,
            layout=PublishedLayout(tp=tp, pp=pp, dp=48, sharding=Sharding.zero1, micro_batch=1, global_batch=gbs,
                                   sequence_parallel=tp > 1),
            tp_comm_overlap=True, figure=tflops, kind="model_tflops_per_gpu", flop_convention="megatron",
            assumed=assumed, note=NOTE_A,
        ))
    return runs


def _section_a_strong() -> list[PublishedRun]:
    """The strong-scaling end points of the same README (held out)."""
    table = next(r for r in _section_a() if r.id == "A-gpt-177b")
    runs = []
    for gpus, mfu in ((96, 0.47), (4608, 0.42)):
        runs.append(table.model_copy(update=dict(
            id=f"A-gpt-177b-strong-g{gpus}", source=SOURCE_A_STRONG, gpus=gpus, figure=mfu, kind="mfu",
            layout=table.layout.model_copy(update=dict(dp=gpus // 48)),
            assumed=table.assumed + ["layout.tp", "layout.pp"], note=NOTE_A_STRONG,
        )))
    return runs


SOURCE_B = "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models', tables"
NOTE_B_MFU = (
    "MFU by Megatron's formula (model FLOPs) over 312 TFLOP/s (A100 fp16). Tensor + sequence "
    "parallel, selective recompute, dp 1; Megatron of 2022: unfused-softmax attention (no "
    "flash kernel). The published HFU counts the recomputed attention core as well."
)
NOTE_B_TIME = (
    "Iteration time (s) of the same run with full recompute instead of selective (the paper's "
    "full -> selective comparison). Unfused-softmax attention, dp 1."
)


def _section_b() -> list[PublishedRun]:
    # (params, heads, hidden, layers, tp, pp, gpus, global batch, micro-batch, vpp, MFU, HFU, full-recompute time)
    table = [
        ("22b", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 0.415, 0.437, 1.42),
        ("175b", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 0.514, 0.528, 18.13),
        ("530b", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 0.560, 0.570, 49.05),
        ("1t", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 0.563, 0.570, 94.42),
    ]
    runs = []
    for size, heads, hidden, layers, tp, pp, gpus, gbs, mbs, vpp, mfu, hfu, t_full in table:
        model = gpt_model(f"gpt-{size}", layers, hidden, heads, vocab=51200, seq=2048)
        common = dict(section="B", source=SOURCE_B, model=model, machine="dgx-a100-80gb", framework="megatron",
                      gpus=gpus, precision=Precision.fp16, flash_attention=False)
        lay = dict(tp=tp, pp=pp, dp=1, sharding=Sharding.none, micro_batch=mbs, global_batch=gbs, vpp=vpp,
                   sequence_parallel=True)
        runs.append(PublishedRun(
            id=f"B-gpt-{size}-selective", layout=PublishedLayout(recompute=Recompute.selective, **lay),
            figure=mfu, kind="mfu", flop_convention="megatron", note=NOTE_B_MFU + f" Published HFU {hfu:.1%}.", **common,
        ))
        runs.append(PublishedRun(
            id=f"B-gpt-{size}-full", layout=PublishedLayout(recompute=Recompute.full, **lay),
            figure=t_full, kind="iteration_time_s", note=NOTE_B_TIME, **common,
        ))
    return runs


SOURCE_C = "MosaicML llm-foundry, scripts/train/benchmarking/README.md, H100 80GB BF16 table"
NOTE_C = (
    "Tokens/s per GPU (the table's MFU is the same measurement under llm-foundry's 6N + 12 l h s "
    "FLOPs per token). FSDP FULL_SHARD over all GPUs, FlashAttention in Triton (attn_impl: triton, the MPT "
    "yamls' and submit_benchmarks.py's setting until March 2024: flash-attn's flash_attn_triton.py, by its docstring "
    "'slightly slower than' flash-attn 1.x forward + backward, charged at 1.x's speed), bf16 autocast, llm-foundry's "
    "default loss (flash-attn's fused cross-entropy over 16-bit logits: fused_loss)."
)
NOTE_C_FILLED = (
    " Micro-batch, accumulation steps and activation checkpointing are not in this row's table; "
    "taken from the llm-foundry README row with the same model, GPUs, sequence length and "
    "throughput, and marked assumed."
)


def _section_c() -> list[PublishedRun]:
    # (model, layers, d, heads, gpus, micro-batch, gas, act ckpt, MFU (published), tokens/s
    # per GPU, fields filled from the llm-foundry README because this row's table has none)
    batch = ["layout.micro_batch", "layout.global_batch"]
    table = [
        ("mpt-70b", 80, 8192, 64, 64, 8, 4, True, 0.4257, 1039, []),
        ("mpt-30b", 48, 7168, 64, 32, 14, 3, True, 0.4392, 2308, batch + ["layout.recompute"]),
        ("mpt-13b", 40, 5120, 40, 64, 2, 1, False, 0.3986, 4800, batch),
        ("mpt-7b", 32, 4096, 32, 8, 6, 1, False, 0.4644, 10643, batch + ["layout.recompute"]),
    ]
    runs = []
    for name, layers, d, heads, gpus, mbs, gas, ckpt, mfu, tps, filled in table:
        runs.append(PublishedRun(
            id=f"C-{name}", section="C", source=SOURCE_C, model=mpt_model(name, layers, d, heads),
            machine="dgx-h100", framework="fsdp", gpus=gpus,
            layout=PublishedLayout(dp=gpus, sharding=Sharding.fsdp, micro_batch=mbs, global_batch=gpus * mbs * gas,
                                   recompute=Recompute.full if ckpt else Recompute.none),
            figure=tps, kind="tokens_per_s_per_gpu",
            assumed=filled + ["flash_attention_v1"] + (["recompute_early_stop"] if ckpt else []), fused_loss=True,
            flash_attention_v1=True,
            note=NOTE_C + f" Published MFU {mfu:.2%}." + (NOTE_C_FILLED if filled else ""),
        ))
    return runs


SOURCE_D = ("IBM foundation-model-stack/fms-fsdp README, throughput table (128 A100 80GB); the cluster: Team PyTorch "
            "at IBM and Meta, 'Maximizing training throughput using PyTorch FSDP' (pytorch.org/blog/maximizing-training, 2024)")
NOTE_D = (
    "Tokens/s per GPU, 16 nodes x 8 A100 80GB, bf16, flash attention (SDPA). Hybrid shard = "
    "hsdp sharded inside the node (8) and replicated across nodes. Global batch not published: "
    "no gradient accumulation assumed (global = micro-batch x 128). Machine: the same team's blog "
    "(same code, 3,700 tokens/s/GPU for the 7b) ran on 'an A100 cluster with 128 GPUs and 400Gbps "
    "inter-node interconnect' with GPUDirect RDMA: the ibm-a100-400g preset (a quarter of "
    "dgx-a100-80gb's 8 x 200 Gb/s; its split into 4 x 100 Gb/s assumed). Gradients reduced in bf16: "
    "fms-fsdp's default policy (mixed_precision: True -> bfSixteen, reduce_dtype bf16; "
    "fms_fsdp/utils/train_utils.py get_policies), not printed with the table, so assumed. Earlier "
    "versions stood these rows on dgx-a100-80gb with fp32 reduction: twice the bytes on four times the "
    "bandwidth, the inter-node traffic at half its time. Blocks eager (scripts/7b.sh-70b.sh: "
    "--use_torch_compile=False), left to the fitted figures (torch_blocks unset): charged the exaplan "
    "profile's eager count, as torchtitan's eager row is, all four rows came out 4-16% slow."
)


def _section_d() -> list[PublishedRun]:
    # (model, layers, hidden, heads, kv heads, ffn, hybrid?, act ckpt, micro-batch, tokens/s per GPU)
    table = [
        ("llama2-7b", 32, 4096, 32, 32, 11008, True, False, 2, 3760),
        ("llama2-13b", 40, 5120, 40, 40, 13824, True, False, 1, 1700),
        ("llama-34b", 48, 8192, 64, 8, 22016, False, True, 8, 772),
        ("llama2-70b", 80, 8192, 64, 8, 28672, False, True, 6, 380),
    ]
    runs = []
    for name, layers, hidden, heads, kv, ffn, hybrid, ckpt, mbs, tps in table:
        runs.append(PublishedRun(
            id=f"D-{name}", section="D", source=SOURCE_D, model=llama_model(name, layers, hidden, heads, kv, ffn),
            machine="ibm-a100-400g", framework="fsdp", gpus=128, grad_reduce_bf16=True,
            layout=PublishedLayout(dp=128, sharding=Sharding.hsdp if hybrid else Sharding.fsdp,
                                   shard_group=8 if hybrid else None, micro_batch=mbs, global_batch=128 * mbs,
                                   recompute=Recompute.full if ckpt else Recompute.none),
            figure=tps, kind="tokens_per_s_per_gpu", assumed=["layout.global_batch", "grad_reduce_bf16"],
            note=NOTE_D + (" Reported elsewhere as 57% MFU." if name == "llama2-7b" else ""),
        ))
    return runs


def published_runs() -> list[PublishedRun]:
    """The calibration set, in section order (a fresh list): sections A-D and the fitted
    sections of calibration/published_extra.py and published_seed_hw.py."""
    return _section_a() + _section_b() + _section_c() + _section_d() + fitted_extra_runs() + fitted_seed_hw_runs()


def held_out_runs() -> list[PublishedRun]:
    """Published rows that no fit sees, predicted to check the model where it was not fitted
    (section L, llm-foundry's whole tables, last)."""
    from calibration.published_foundry import foundry_runs
    from calibration.published_nemo import nemo_runs
    from calibration.published_own import own_gpu_runs

    return (_section_a_strong() + held_out_extra_runs() + held_out_seed_hw_runs() + own_gpu_runs() + nemo_runs()
            + foundry_runs())
