"""More published training runs (the record: calibration/published_schema.py).

Sections (each with its SOURCE_* and NOTE_*, as in published.py):
  F  torchtitan (PyTorch FSDP2, TP), Llama 3.1 8B / 70B on H100 (Meta's Grand Teton hosts).
  G  BLOOM-176B (BigScience, Megatron-DeepSpeed with ZeRO-1) on Jean Zay, 384 A100 80GB.
  H  MosaicML llm-foundry (PyTorch FSDP), MPT on A100 80GB with 1600 Gbps RoCE between nodes.

Every figure is one the source prints; every field it does not print is chosen in the
record's note and listed in `assumed` ("machine" where the machine preset is a stand-in for
hardware no preset describes exactly). Nothing here is predicted.

`extra_run_records()` gives the records as plain dicts; `extra_runs()` validates them into
PublishedRun. Section H is fitted with the rest (`fitted_extra_runs`, part of
calibration.published.published_runs); sections F and G are held out (`held_out_extra_runs`,
HELD_OUT_SECTIONS): predicted on a stand-in preset as a check, never fitted.
"""

from __future__ import annotations

from typing import Any

from calibration.published_schema import PublishedLayout, PublishedRun, mpt_model
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import ModelSpec, Precision

# --------------------------------------------------------------------------------------------
# F: torchtitan, Llama 3.1 on H100
# --------------------------------------------------------------------------------------------

SOURCE_F = ("torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (Tables 1 and 3) and "
            "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (the 'None (bfloat16)' rows, vanilla TP), "
            "github.com/pytorch/torchtitan")
NOTE_F = (
    "Tokens/s per GPU (TPS/GPU, read at the 90th iteration). Hardware: Meta Grand Teton hosts, 8 H100 with "
    "NVLink, 96 GB HBM2e at 2.4 TB/s per GPU, 400 Gb/s RDMA per GPU, run at the default 500 W power limit "
    "(torchtitan: its peak lies between H100 SXM and NVL): the grand-teton-h100 preset, which has all of "
    "that but the power limit (the datasheet's 989 TFLOP/s at 700 W: compute-bound rows err fast), so the "
    "rows stay held out. Until 2026-11-27 dgx-h100 (3.35 TB/s) stood in: the compiled rows came out "
    "+13-14% and torch.compile's speedup 1.25x against 1.16x published. bf16 (mixed precision "
    "through FSDP2, fp32 reduction), SDPA flash attention, Llama 3 tokenizer (vocab 128256). Sequence length "
    "8192: the llama3 train_configs at the benchmark's torchtitan commits (not printed in the tables). "
    "torchtitan's selective activation checkpointing ('op' policy, activation_checkpoint.py: keeps the SDPA "
    "output and every other matmul's, recomputes the rest) is exaplan's selective-op level."
)


NOTE_F_EAGER = (
    "Its blocks run eager: torchtitan's Llama block is exaplan's (nn.RMSNorm, SwiGLU, RoPE, SDPA, as PyTorch "
    "ops), so the exaplan profile's count of what eager blocks move (eager_bytes_per_element, counted on "
    "exaplan's block) and its launch figures are taken for it (torch_blocks, assumed). The compiled rows "
    "(torch.compile) are recorded compiled."
)


def llama31_model(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    """Llama 3.1 as torchtitan (section F) and NeMo (section N, published_nemo.py) build it:
    SwiGLU, RMSNorm, RoPE, 8 KV heads, untied, vocab 128256, seq 8192 (ffn = 1.3 x 8/3 d
    rounded up to multiple_of, torchtitan's llama3 args)."""
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=8, ffn_hidden=ffn,
                     vocab_size=128256, seq_len=8192, activation="swiglu", norm="rmsnorm", position="rope",
                     tied_embeddings=False)


def _section_f() -> list[dict[str, Any]]:
    llama8b = llama31_model("llama3.1-8b", 32, 4096, 32, 14336)
    llama70b = llama31_model("llama3.1-70b", 80, 8192, 64, 28672)
    common = dict(section="F", source=SOURCE_F, machine="grand-teton-h100", framework="fsdp", kind="tokens_per_s_per_gpu")
    return [
        *_section_f_fsdp(llama8b, common),
        dict(id="F-llama3.1-8b-fsdp8-tp8", model=llama8b, gpus=64,
             layout=PublishedLayout(tp=8, dp=8, sharding=Sharding.fsdp, micro_batch=12, global_batch=96,
                                    recompute=Recompute.selective_op, sequence_parallel=True),
             figure=4378.0, assumed=["model.seq_len", "layout.global_batch", "layout.recompute"],
             torch_blocks="compiled",
             note=NOTE_F + " FSDP 8 x TP 8 (torchtitan's TP plan shards norms and dropout over the sequence: "
                           "sequence parallel), torch.compile, per-op selective checkpointing, local batch 12 "
                           "per data-parallel rank; global batch 12 x 8 = 96 (not printed).", **common),
        dict(id="F-llama3.1-70b-fsdp32-tp8", model=llama70b, gpus=256,
             layout=PublishedLayout(tp=8, dp=32, sharding=Sharding.fsdp, micro_batch=16, global_batch=512,
                                    recompute=Recompute.full, sequence_parallel=True),
             figure=597.3, assumed=["model.seq_len", "layout.global_batch"], torch_blocks="compiled",
             note=NOTE_F + " FSDP 32 x TP 8 with sequence parallelism, torch.compile, full activation "
                           "checkpointing, local batch 16; global batch 16 x 32 = 512 as the same setup's "
                           "Table 4 in llama3_h100_202412 prints (the asyncTP file does not).", **common),
    ]


def _section_f_fsdp(llama8b: ModelSpec, common: dict[str, Any]) -> list[dict[str, Any]]:
    """The bf16 rows of llama3_h100_202412's 1D FSDP set-up (Tables 1 and 3): eager and
    torch.compile at 128 GPUs and at 8. Each pair differs only in torch.compile, so their ratio
    checks the count of what eager blocks move against the same machine, whatever its peak."""
    def row(rid: str, gpus: int, blocks: str, tps: float, table: str) -> dict[str, Any]:
        assumed = ["model.seq_len", "layout.recompute"] + (["torch_blocks"] if blocks == "eager" else [])
        return dict(id=rid, model=llama8b, gpus=gpus,
                    layout=PublishedLayout(dp=gpus, sharding=Sharding.fsdp, micro_batch=2, global_batch=2 * gpus,
                                           recompute=Recompute.selective_op),
                    figure=tps, assumed=assumed, torch_blocks=blocks,
                    note=NOTE_F + f" {table}: 1D FSDP over {gpus} GPUs, local batch 2, global {2 * gpus}, "
                    + ("eager (no torch.compile). " + NOTE_F_EAGER if blocks == "eager" else "torch.compile."),
                    **common)
    return [row("F-llama3.1-8b-fsdp128", 128, "eager", 5605.0, "Table 3 ('FSDP', 67.0 GiB)"),
            row("F-llama3.1-8b-fsdp8", 8, "eager", 5762.0, "Table 1 ('FSDP', 82.4 GiB)"),
            row("F-llama3.1-8b-fsdp8-compiled", 8, "compiled", 6667.0, "Table 1 ('FSDP + torch.compile', 77.0 GiB)"),
            row("F-llama3.1-8b-fsdp128-compiled", 128, "compiled", 6514.0,
                "Table 3 ('FSDP + torch.compile', 62.0 GiB)")]


# --------------------------------------------------------------------------------------------
# G: BLOOM-176B, Megatron-DeepSpeed
# --------------------------------------------------------------------------------------------

SOURCE_G = ("BigScience, train/tr11-176B-ml/README.md (model, replica setup, hardware) and chronicles.md "
            "(training log at GBS 2048), github.com/bigscience-workshop/bigscience; Le Scao et al. 2022, "
            "'BLOOM: A 176B-Parameter Open-Access Multilingual Language Model'")
NOTE_G = (
    "Seconds per optimizer step from the training log at full batch (iteration 12695: 'elapsed time per "
    "iteration (s): 105.22', global batch 2048, 'TFLOPs: 149.02', the latter hardware FLOPs, 8 N per token "
    "with recompute). 48 nodes x 8 A100 80GB SXM with NVLink; between nodes 4 Omni-Path links per node "
    "(100 Gb/s each), where the dgx-a100-80gb preset that stands in has 8 x 200 Gb/s InfiniBand HDR, so "
    "`machine` is listed as assumed. Megatron-DeepSpeed (2022): TP 4, PP 12, DP 8, ZeRO stage 1, "
    "micro-batch 2, bf16, activation checkpointing (full recompute), fused-softmax attention (no flash "
    "kernel), no sequence parallelism. BLOOM: 70 layers, hidden 14336, 112 heads, 4h GELU MLP, LayerNorm "
    "(plus one after the embedding), ALiBi (no position parameters: 'rope' is the parameter-free choice), "
    "tied embeddings, vocabulary 250880 (padded), sequence 2048. The tied embedding is balanced as a "
    "pipeline layer ('type:transformer|embedding': 5 blocks + embedding on the first and last stage); "
    "exaplan places stages itself."
)


def _section_g() -> list[dict[str, Any]]:
    bloom = ModelSpec(name="bloom-176b", layers=70, hidden=14336, heads=112, kv_heads=112, ffn_hidden=4 * 14336,
                      vocab_size=250880, seq_len=2048, activation="gelu", norm="layernorm", position="rope",
                      tied_embeddings=True)
    return [dict(
        id="G-bloom-176b", section="G", source=SOURCE_G, model=bloom, machine="dgx-a100-80gb", framework="deepspeed",
        gpus=384, layout=PublishedLayout(tp=4, pp=12, dp=8, sharding=Sharding.zero1, micro_batch=2, global_batch=2048,
                                         recompute=Recompute.full),
        precision=Precision.bf16, flash_attention=False, figure=105.22, kind="iteration_time_s",
        assumed=["machine"], note=NOTE_G,
    )]


# --------------------------------------------------------------------------------------------
# H: llm-foundry, MPT on A100 80GB
# --------------------------------------------------------------------------------------------

SOURCE_H = ("MosaicML llm-foundry, scripts/train/benchmarking/README.md, 'A100 80GB with 1600 Gbps node-node "
            "interconnect (RoCE)' table, github.com/mosaicml/llm-foundry")
NOTE_H = (
    "Tokens/s per GPU (the table's MFU is the same measurement under llm-foundry's 6N + 12 l h s FLOPs per "
    "token). Every layout field is a column of the table: micro-batch, gradient accumulation, global batch, "
    "FULL_SHARD over all GPUs, activation checkpointing. FlashAttention in Triton (attn_impl: triton, as section C; "
    "charged at flash-attn 1.x's speed), bf16 (amp_bf16; the 70b rows "
    "pure bf16), llm-foundry's default loss (flash-attn's fused cross-entropy: fused_loss). 8 A100 80GB per node with 1600 Gbps RoCE between nodes, as the dgx-a100-80gb preset "
    "(8 x 200 Gb/s)."
)


def _section_h() -> list[dict[str, Any]]:
    # (model, layers, d, heads, seq, gpus, micro-batch, gas, act ckpt, MFU (published), tokens/s per GPU)
    table = [
        ("mpt-70b", 80, 8192, 64, 2048, 64, 8, 4, True, 0.5333, 410),
        ("mpt-70b", 80, 8192, 64, 2048, 32, 2, 16, True, 0.4856, 373),
        ("mpt-30b", 48, 7168, 64, 2048, 8, 3, 21, True, 0.5530, 916),
        ("mpt-13b", 40, 5120, 40, 2048, 8, 2, 3, False, 0.5957, 2262),
        ("mpt-13b", 40, 5120, 40, 8192, 8, 5, 3, True, 0.5607, 1795),
        ("mpt-7b", 32, 4096, 32, 2048, 8, 6, 2, False, 0.6423, 4641),
    ]
    runs = []
    for name, layers, d, heads, seq, gpus, mbs, gas, ckpt, mfu, tps in table:
        pure = name == "mpt-70b"  # the table's bf16 PURE rows (the May 2023 campaign)
        model = mpt_model(name, layers, d, heads)
        if seq != model.seq_len:
            model = ModelSpec.model_validate({**model.model_dump(), "seq_len": seq})
        runs.append(dict(
            id=f"H-{name}-s{seq}-g{gpus}", section="H", source=SOURCE_H, model=model, machine="dgx-a100-80gb",
            framework="fsdp", gpus=gpus,
            layout=PublishedLayout(dp=gpus, sharding=Sharding.fsdp, micro_batch=mbs, global_batch=gpus * mbs * gas,
                                   recompute=Recompute.full if ckpt else Recompute.none),
            figure=float(tps), kind="tokens_per_s_per_gpu",
            assumed=["flash_attention_v1"] + (["recompute_early_stop"] if ckpt else []), fused_loss=True,
            flash_attention_v1=True,
            grad_reduce_bf16=pure,  # PURE mixed precision: bf16 reduction
            # and torch 1.13: whole blocks replayed (calibration/published_foundry.py)
            recompute_early_stop=False if pure else None,
            note=NOTE_H + f" Published MFU {mfu:.2%}, sequence {seq}.",
        ))
    return runs


# --------------------------------------------------------------------------------------------
# Public
# --------------------------------------------------------------------------------------------


def extra_run_records() -> list[dict[str, Any]]:
    """The extra rows (sections F-H) as the keyword arguments of PublishedRun, unvalidated."""
    return _section_f() + _section_g() + _section_h()


def extra_runs() -> list[PublishedRun]:
    """The extra rows validated as PublishedRun (needs the sections and framework values that
    calibration.published gains when they are merged)."""
    return [PublishedRun.model_validate(r) for r in extra_run_records()]


# Held out: the rows whose machine preset only stands in for the hardware they ran on (F:
# Grand Teton H100s at a 500 W power limit, which grand-teton-h100 does not model; G: Jean Zay's A100s with 4 x 100 Gb/s
# Omni-Path per node, a fifth of dgx-a100-80gb's network): fitting them would move the
# device-kind and framework figures to absorb the difference.
HELD_OUT_SECTIONS = ("F", "G")


def fitted_extra_runs() -> list[PublishedRun]:
    """The extra rows the fits use (every section but HELD_OUT_SECTIONS)."""
    return [r for r in extra_runs() if r.section not in HELD_OUT_SECTIONS]


def held_out_extra_runs() -> list[PublishedRun]:
    """The extra rows that are only predicted (HELD_OUT_SECTIONS)."""
    return [r for r in extra_runs() if r.section in HELD_OUT_SECTIONS]
