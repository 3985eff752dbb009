"""Section M: exaplan's own runtime, measured on GPUs lent to this project (the record:
calibration/published_schema.py). Held out: predicted as a check, never fitted.

  M  protein-3.5b (3.24 B parameters) in bf16 on one GPU, the planner's one-GPU plans for the
     card, run by `exaplan run --io-mode synthetic` through benchmarks/gpu_check.py on
     2026-11-26 (README "On a GPU"; the measurements, with the driver's logs, in docs/gpu/):
       - one NVIDIA H200, plans/gpu/protein-3.5b_1xh200.yaml (dgx-h200 with one device:
         micro-batch 32, no accumulation): docs/gpu/2026-11-26-h200-{compile,eager}.json;
       - one NVIDIA H100 80GB HBM3, plans/gpu/protein-3.5b_1xh100.yaml (dgx-h100 with one
         device: micro-batch 8, 4 accumulation steps): docs/gpu/2026-11-26-h100-{compile,eager}.json.

The H200's device kind copies the H100 fit (no published H200 rows); the H100's is fitted, but
to other frameworks' runs (Megatron-LM, llm-foundry, fms-fsdp), never to this runtime on a GPU.
Two rows per card: the blocks compiled (`--compile`: the norms, rotary embeddings, SwiGLU and
residual adds fused, which is the elementwise count of the cost model) and eager (each of those
op by op: the exaplan profile's eager_bytes_per_element, a count of the runtime's operators,
not a fit to these rows).
"""

from __future__ import annotations

from calibration.published_schema import PublishedLayout, PublishedRun
from planner.presets import get_model
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import Precision

SOURCE_M = ("exaplan's own measurement on a lent GPU (torch 2.11.0+cu130, cuDNN flash attention), 2026-11-26: "
            "docs/gpu/2026-11-26-{card}-{{compile,eager}}.json (benchmarks/gpu_check.py)")
NOTE_M = (
    "Tokens/s on one GPU: 16,384 tokens per step over the best run's median step (12 steps, the first 4 "
    "dropped). exaplan's runtime with its exaplan profile (recorded under framework fsdp, whose profile "
    "it is): one rank, no data parallelism, bf16 autocast on fp32 weights, fused AdamW."
)
CARDS = {
    "h200": ("dgx-h200", 32, "an H200 SXM in a DGX H200; the lent one is an H200 of the same 141 GB / 4.8 TB/s part"),
    "h100": ("dgx-h100", 8, "an H100 SXM5 in a DGX H100; the lent one is an H100 80GB HBM3, the same part"),
}
TOKENS_PER_STEP = 32 * 512
# The best run's median step time (s): docs/gpu/2026-11-26-{card}-{mode}.json,
# plans["protein-3.5b_1x{card}(+compile)"]["best"]["exaplan"]["median_s"].
MEDIAN_STEP_S = {("h200", "compiled"): 0.5734, ("h200", "eager"): 0.7338,
                 ("h100", "compiled"): 0.6642, ("h100", "eager"): 0.9143}


def own_gpu_runs() -> list[PublishedRun]:
    runs = []
    for (card, mode), step in MEDIAN_STEP_S.items():
        machine, mbs, part = CARDS[card]
        runs.append(PublishedRun(
            id=f"M-protein-3.5b-{card}-{'compile' if mode == 'compiled' else 'eager'}", section="M",
            source=SOURCE_M.format(card=card), model=get_model("protein-3.5b"), machine=machine, framework="fsdp",
            gpus=1, layout=PublishedLayout(dp=1, sharding=Sharding.none, micro_batch=mbs, global_batch=32,
                                           recompute=Recompute.none),
            precision=Precision.bf16, exaplan_runtime=mode, figure=round(TOKENS_PER_STEP / step, 1),
            kind="tokens_per_s_per_gpu", flop_convention="none", assumed=[],
            note=f"{NOTE_M} Machine {machine} ({part}). "
                 + ("Blocks compiled (exaplan run --compile)." if mode == "compiled" else
                    "Eager (no --compile): unfused elementwise kernels (eager_bytes_per_element)."),
        ))
    return runs
