"""Section M: exaplan's own runtime, measured on GPUs lent to this project (the record:
calibration/published_schema.py). Held out: predicted as a check, never fitted.

  M  protein-3.5b (3.24 B parameters) in bf16 on one NVIDIA H200, the plan
     plans/gpu/protein-3.5b_1xh200.yaml (dgx-h200 with one device: micro-batch 32, global batch
     32 x 512, no recompute, no sharding), run by `exaplan run --io-mode synthetic` through
     benchmarks/gpu_check.py on 2026-11-26 (README "On a GPU"; the measurements, with the
     driver's logs, in docs/gpu/2026-11-26-h200-{compile,eager}.json).

The H200's device kind copies the H100 fit (no published H200 rows), so nothing fitted has seen
this GPU or this runtime on a GPU. Two rows of one plan: the blocks compiled (`--compile`: the
norms, rotary embeddings, SwiGLU and residual adds fused, which is what the cost model counts)
and eager (each of those a separate fp32 kernel under autocast, which it does not count).
"""

from __future__ import annotations

from calibration.published_schema import PublishedLayout, PublishedRun
from planner.presets import get_model
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import Precision

SOURCE_M = ("exaplan's own measurement on a lent NVIDIA H200 (141 GB, driver 580.159.04, torch 2.11.0+cu130, "
            "cuDNN flash attention), 2026-11-26: docs/gpu/2026-11-26-h200-{compile,eager}.json "
            "(benchmarks/gpu_check.py)")
NOTE_M = (
    "Tokens/s on one GPU: 16,384 tokens per step over the best run's median step (12 steps, the first 4 "
    "dropped). exaplan's runtime with its exaplan profile (recorded under framework fsdp, whose profile "
    "it is): one rank, no data parallelism, bf16 autocast on fp32 weights, fused AdamW. Machine dgx-h200 "
    "(an H200 SXM in a DGX H200; the lent one is an H200 of the same 141 GB / 4.8 TB/s part)."
)
TOKENS_PER_STEP = 32 * 512
# The best run's median step time (s): docs/gpu/2026-11-26-h200-{compile,eager}.json,
# plans["protein-3.5b_1xh200(+compile)"]["best"]["exaplan"]["median_s"].
MEDIAN_STEP_S = {"compile": 0.5734, "eager": 0.7338}


def own_gpu_runs() -> list[PublishedRun]:
    layout = PublishedLayout(dp=1, sharding=Sharding.none, micro_batch=32, global_batch=32, recompute=Recompute.none)
    return [
        PublishedRun(
            id=f"M-protein-3.5b-h200-{mode}", section="M", source=SOURCE_M, model=get_model("protein-3.5b"),
            machine="dgx-h200", framework="fsdp", gpus=1, layout=layout, precision=Precision.bf16,
            figure=round(TOKENS_PER_STEP / step, 1), kind="tokens_per_s_per_gpu", flop_convention="none",
            assumed=[], note=NOTE_M + (" Blocks compiled (exaplan run --compile)." if mode == "compile" else
                                       " Eager (no --compile): unfused elementwise kernels the model does not count."),
        )
        for mode, step in MEDIAN_STEP_S.items()
    ]
