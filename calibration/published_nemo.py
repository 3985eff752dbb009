"""Section N: NVIDIA's DGX Cloud benchmarking recipes for Llama 3.1 pre-training (NeMo 24.09,
Megatron-Core) on DGX H100, bf16: three weak-scaling series with every layout degree printed
(the record: calibration/published_schema.py). Held out: predicted with the megatron profile's
fitted figures, never fitted.

Source: github.com/NVIDIA/dgxc-benchmarking, llama3.1/README_8b.md, README_70b.md and
README_405b.md (commit 143b90d, "Expected Performance", the "24.09 BF16" tables; the recipe's
launch.sh runs NeMo 24.09's megatron_gpt_pretraining.py with the NeMo Framework Launcher's
conf/training/llama/llama3_1_{8b,70b,405b}.yaml, its configure.sh sets the global batch and, for
the 405B, the layers of its reduced runs). What the tables print: TP, PP, CP, VP, micro-batch,
accumulation, the global batch per GPU count (8B: 128 per 8 GPUs; 70B: 128 per 64; 405B: 252
per 576) and the training step time (s, "train_step_timing" of the last of 50 steps). Every
row is kept in that unit, so no FLOP convention is involved (the README's MFU counts full,
non-causal attention).

What the tables do not print, read from the launcher's configs (`assumed`): no activation
recompute (activations_checkpoint_granularity null), sequence parallelism with TP
(sequence_parallel true for 70B; TP 1 for 8B), Transformer Engine's tensor-parallel
communication overlap (ub_tp_comm_overlap true for 70B and 405B), the distributed optimizer
(mcore_distributed_optim for 8B, Apex's distributed_fused_adam for 70B: both ZeRO-1 with the
gradient reduce-scatter and the weights' all-gather overlapped, fp32 gradient reduction, NeMo's
default grad_sync_dtype), cuDNN fused attention (NVTE_FUSED_ATTN=1), fused RoPE and
cross-entropy. The machine: NVIDIA's DGX Cloud clusters are DGX H100 (8 H100 SXM5 80 GB over
NVSwitch, 8 x 400 Gb/s per node), the dgx-h100 preset; the README does not name the cluster.
The 405B runs on 32-192 GPUs cut the model to 7-42 layers and are left out.

Why held out: these are Megatron-Core runs two software releases after the Megatron-LM README
rows the megatron profile is fitted to (section A), with context parallelism, which no fitted
row has; they check that profile where nothing was fitted, and weak scaling on H100 (each
series holds within 2% of flat from its smallest to its largest run).
"""

from __future__ import annotations

from typing import Any

from calibration.published_extra import llama31_model
from calibration.published_schema import PublishedLayout, PublishedRun
from planner.schema.plan import Sharding
from planner.schema.specs import ModelSpec

SOURCE_N = ("NVIDIA DGX Cloud benchmarking, github.com/NVIDIA/dgxc-benchmarking llama3.1/README_{8b,70b,405b}.md "
            "(commit 143b90d, 'Llama 3.1 ... 24.09 BF16' tables; NeMo 24.09)")
NOTE_N = (
    "Training step time (s) as printed. DGX H100 (dgx-h100 preset; the cluster is not named). Layout degrees, "
    "micro-batch and global batch as printed (global batch from the table or configure.sh). From the NeMo "
    "launcher's llama3_1 configs (not printed, assumed): no recompute, sequence parallelism and Transformer "
    "Engine TP overlap with TP > 1, distributed optimizer (ZeRO-1) with overlapped gradient and weight sync in "
    "fp32, cuDNN fused attention."
)
ASSUMED_N = ["machine", "layout.recompute", "layout.sequence_parallel", "tp_comm_overlap", "layout.sharding"]


# (GPUs, step time s) per series, as the BF16 tables print them.
STEPS_8B = ((8, 12.91), (16, 13.00), (32, 13.05), (64, 13.08), (128, 13.10))
STEPS_70B = ((64, 14.72), (128, 14.73), (256, 14.80), (512, 14.89), (1024, 14.92), (2048, 14.98))
STEPS_405B = ((576, 17.20), (1152, 17.52), (2304, 17.62))


def _series(model: ModelSpec, steps, *, tp: int, pp: int, cp: int, vpp: int, gbs_per_gpu: float) -> list[dict[str, Any]]:
    rows = []
    for gpus, step_s in steps:
        dp = gpus // (tp * pp * cp)
        gbs = round(gbs_per_gpu * gpus)
        rows.append(dict(
            id=f"N-{model.name}-g{gpus}", section="N", source=SOURCE_N, model=model, machine="dgx-h100",
            framework="megatron", gpus=gpus,
            layout=PublishedLayout(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, sharding=Sharding.zero1, micro_batch=1,
                                   global_batch=gbs, sequence_parallel=tp > 1),
            tp_comm_overlap=tp > 1, figure=step_s, kind="iteration_time_s",
            assumed=list(ASSUMED_N), note=NOTE_N + f" TP {tp}, PP {pp}, CP {cp}, VP {vpp if pp > 1 else 'n/a'}, "
                                                   f"micro-batch 1, global batch {gbs}."))
    return rows


def nemo_run_records() -> list[dict[str, Any]]:
    """Section N as the keyword arguments of PublishedRun, unvalidated."""
    return (_series(llama31_model("llama3.1-8b", 32, 4096, 32, 14336), STEPS_8B, tp=1, pp=1, cp=2, vpp=1,
                    gbs_per_gpu=128 / 8)
            + _series(llama31_model("llama3.1-70b", 80, 8192, 64, 28672), STEPS_70B, tp=4, pp=4, cp=2, vpp=5,
                      gbs_per_gpu=128 / 64)
            + _series(llama31_model("llama3.1-405b", 126, 16384, 128, 53248), STEPS_405B, tp=8, pp=9, cp=2, vpp=7,
                      gbs_per_gpu=252 / 576))


def nemo_runs() -> list[PublishedRun]:
    """Section N as PublishedRun (held out: calibration.published.held_out_runs)."""
    return [PublishedRun.model_validate(r) for r in nemo_run_records()]
