"""Section L: llm-foundry's whole benchmark tables, held out (the record: calibration/published_schema.py).

MosaicML's llm-foundry prints, for MPT models of 125M-70B parameters, the measured throughput
of one fully stated layout per row: sequence 512-65,536, 8-512 GPUs, micro-batch, gradient
accumulation, FSDP sharding strategy and activation checkpointing, on H100 80GB and on A100
80GB and 40GB nodes (calibration/data/llm_foundry_mpt.csv, copied cell for cell). Sections C
(H100) and H (A100 80GB) fit ten of these rows; the others are section L, never fitted: a
check of the cost model across sequence length, model size and scale with nothing assumed
but the machine preset.

    foundry_runs()        section L as PublishedRun (the rows of C and H left out)
    foundry_table(run)    which of the source's tables a row comes from

What the rows share (llm-foundry's benchmark setup, scripts/train/benchmarking/submit_benchmarks.py
and the MPT yamls of scripts/train/yamls/pretrain/): MPT (4d GELU MLP, LayerNorm, vocabulary
50368, tied embeddings, learned position embeddings, which change no FLOP count),
FlashAttention in Triton (attn_impl triton, below), PyTorch FSDP with FULL_SHARD or SHARD_GRAD_OP over all GPUs,
activation checkpointing of every block when the table says so (full recompute; whether the
replay stopped before each block's last GEMM depends on the torch the row ran: EARLY_STOP below).
Mixed precision: `amp_bf16` with FSDP's DEFAULT policy reduces gradients in fp32 (the
exaplan profile's fp32 reduction); `bf16` with PURE keeps parameters, gradients and their
reduction in bf16 (recorded as `grad_reduce_bf16`). The machines: H100 rows on dgx-h100
(the MosaicML platform's H100 nodes: 8 GPUs with NVLink, 8 x 400 Gb/s between nodes, listed
as assumed); A100 rows on 8-GPU nodes with "1600 Gbps node-node interconnect (RoCE)", as
dgx-a100-80gb (8 x 200 Gb/s) and, for the 40GB table, dgx-a100-40gb.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

from calibration.published_schema import PublishedLayout, PublishedRun, mpt_model
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import ModelSpec

DATA = Path(__file__).parent / "data" / "llm_foundry_mpt.csv"

SOURCE_L = ("MosaicML llm-foundry, scripts/train/benchmarking/README.md, bf16 tables for H100 80GB, A100 80GB "
            "and A100 40GB (commit 4952183), github.com/mosaicml/llm-foundry; the data in "
            "calibration/data/llm_foundry_mpt.csv")
NOTE_L = (
    "Tokens/s per GPU (Throughput (T/s/GPU)). Every layout field is a column of the table: micro-batch, "
    "gradient accumulation, global batch, sharding strategy over all GPUs, activation checkpointing (full "
    "recompute). FlashAttention, MPT shapes of the llm-foundry yamls."
)

# MPT shapes (scripts/train/yamls/pretrain/mpt-*.yaml): (layers, d_model, heads). The 760m,
# 1b and 3b yamls cut their heads to keep a head dimension of 128 for FlashAttention.
MPT_SHAPES = {
    "125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12), "1b": (24, 2048, 16),
    "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56),
    "70b": (80, 8192, 64),
}
# The source's tables: their machine preset and what the record had to choose.
# The attention kernel: `attn_impl: triton` in the MPT yamls (scripts/train/yamls/pretrain/) and
# as submit_benchmarks.py's default (`--attn_impl`, 'triton' until v0.7.0, March 2024, after every
# table), so every table ran FlashAttention in Triton (llmfoundry/models/layers/flash_attn_triton.py,
# a copy of flash-attn's flash_attn_triton.py, on triton-pre-mlir; on torch 1.13 flash-attn 1.0.x's
# own copy): "Triton forward is generally faster than CUDA forward, while Triton backward is
# generally slower ... Overall Triton forward + backward is slightly slower than CUDA forward +
# backward" (its docstring, against flash-attn 1.x). Charged at flash-attn 1.x's speed (the field
# below; earlier records took flash-attn 1.x itself, the `gpu` extra's, as the kernel).
KERNEL = "flash_attention_v1"
# Full recompute: the benchmark script sets activation_checkpointing_reentrant False (torch's
# non-reentrant checkpoint_wrapper), whose replay stops before each block's last GEMM since
# torch 2.1 (October 2023; planner/cost/compute.py layer_times). Which torch a row ran is not
# printed; its precision columns date it. `bf16` with `PURE` were the script's defaults in May
# 2023 (submit_benchmarks.py: --precisions bf16, --fsdp_config_mixed_precision PURE, image
# mosaicml/pytorch:1.13.1): the whole 40GB table and the 80GB table's two 70b rows, taken as
# replaying whole blocks (recompute_early_stop False). The `amp_bf16` / `DEFAULT` rows (every
# other) are taken as measured on torch 2.1 or later (the profile's early stop). Both assumed;
# the data agree: in the amp_bf16 tables the rows with recompute run faster against the rows
# without than a whole replay allows (13b on A100 80GB: 59.5% MFU at sequence 1024 with
# recompute, 59.6% at 2048 without), in the 40GB table they do not.
EARLY_STOP = "recompute_early_stop"
TABLES = {
    "h100_bf16_large": ("dgx-h100", ["machine", KERNEL]),
    "h100_bf16": ("dgx-h100", ["machine", KERNEL]),
    "a100_80gb": ("dgx-a100-80gb", [KERNEL]),
    "a100_40gb": ("dgx-a100-40gb", []),
}
SHARDINGS = {"FULL_SHARD": Sharding.fsdp, "SHARD_GRAD_OP": Sharding.fsdp_grad_op}
# Rows the calibration set already has (sections C and H): (table, model, seq, gpus).
FITTED = {
    ("h100_bf16", "70b", 2048, 64), ("h100_bf16", "30b", 2048, 32), ("h100_bf16", "13b", 2048, 64),
    ("h100_bf16", "7b", 2048, 8),
    ("a100_80gb", "70b", 2048, 64), ("a100_80gb", "70b", 2048, 32), ("a100_80gb", "30b", 2048, 8),
    ("a100_80gb", "13b", 2048, 8), ("a100_80gb", "13b", 8192, 8), ("a100_80gb", "7b", 2048, 8),
}


def read_table(path: Path = DATA) -> list[dict[str, str]]:
    """The CSV's rows (its '#' lines are the attribution)."""
    with path.open(newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _model(size: str, seq: int) -> ModelSpec:
    layers, d, heads = MPT_SHAPES[size]
    model = mpt_model(f"mpt-{size}", layers, d, heads)
    return model if seq == model.seq_len else model.model_copy(update={"seq_len": seq})


def _run(row: dict[str, str], index: int) -> PublishedRun:
    table, size = row["table"], row["model"]
    seq, gpus = int(row["seq"]), int(row["gpus"])
    machine, assumed = TABLES[table]
    pure = row["mp_mode"] == "PURE"
    recompute = row["activation_checkpointing"] == "True"
    return PublishedRun(
        id=f"L-{table}-{size}-s{seq}-g{gpus}" + (f"-{index}" if index else ""), section="L", source=SOURCE_L,
        model=_model(size, seq), machine=machine, framework="fsdp", gpus=gpus,
        layout=PublishedLayout(dp=gpus, sharding=SHARDINGS[row["sharding"]], micro_batch=int(row["micro_batch"]),
                               global_batch=int(row["global_batch"]),
                               recompute=Recompute.full if recompute else Recompute.none),
        figure=float(row["tokens_per_s_per_gpu"]), kind="tokens_per_s_per_gpu", grad_reduce_bf16=pure, fused_loss=True,
        flash_attention_v1=True, recompute_early_stop=False if pure else None,
        assumed=list(assumed) + ([EARLY_STOP] if recompute else []),
        note=NOTE_L + f" Table {table}; published MFU {row['mfu']}%, precision {row['precision']} ({row['mp_mode']}).",
    )


@lru_cache(maxsize=1)
def _all_runs() -> tuple[PublishedRun, ...]:
    runs, seen = [], {}
    for row in read_table():
        key = (row["table"], row["model"], int(row["seq"]), int(row["gpus"]))
        if key in FITTED:
            continue
        seen[key] = seen.get(key, -1) + 1  # a configuration the table prints twice keeps both rows
        runs.append(_run(row, seen[key]))
    return tuple(runs)


def foundry_runs() -> list[PublishedRun]:
    """Section L: every row of the source's bf16 tables that sections C and H do not fit."""
    return list(_all_runs())


def foundry_table(run: PublishedRun) -> str:
    """The source table a section-L row comes from (h100_bf16_large, h100_bf16, a100_80gb, a100_40gb)."""
    return next(t for t in TABLES if run.id.startswith(f"L-{t}-"))
