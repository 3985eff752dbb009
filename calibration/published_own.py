"""Section M: exaplan's own runtime, measured on GPUs lent to this project (the record:
calibration/published_schema.py). Held out: predicted as a check, never fitted.

  M  protein-3.5b (3.24 B parameters) in bf16 on one GPU, the planner's one-GPU plans for the
     card, run by `exaplan run --io-mode synthetic` through benchmarks/gpu_check.py on
     2026-11-26 (README "On a GPU"; the measurements, with the driver's logs, in docs/gpu/):
       - one NVIDIA H200, plans/gpu/protein-3.5b_1xh200.yaml (dgx-h200 with one device:
         micro-batch 32, no accumulation): docs/gpu/2026-11-26-h200-{compile,eager}.json;
       - one NVIDIA H100 80GB HBM3, plans/gpu/protein-3.5b_1xh100.yaml (dgx-h100 with one
         device: micro-batch 8, 4 accumulation steps): docs/gpu/2026-11-26-h100-{compile,eager}.json;
       - the same H100 card kind at sequence 2048, plans/gpu/protein-3.5b_1xh100_s2048.yaml
         (micro-batch 2, 8 accumulation steps; attention 4x the share of the step), measured
         after the eager figure was set, as its check: docs/gpu/2026-11-26-h100-s2048-*.json;
       - a small hidden size at a long sequence on the same card kind,
         plans/gpu/protein-1.2b-h2048_1xh100_s4096.yaml (protein-3.5b's block at section A's
         1.7B shape: hidden 2,048, 16 heads of 128, 24 blocks, 1.2 B parameters; 16 x 4,096
         tokens, micro-batch 4, 4 accumulation steps), measured 2026-11-26 after the kernel
         benchmark (docs/gpu/2026-11-26-h100-kernels.json), never predicted before:
         docs/gpu/2026-11-26-h100-h2048-s4096-*.json. The fitted figures alone were 11%
         (eager) and 29% (compiled) slow on it: README "Kernels against the cost model's terms";
       - two cases predicted before they ran, with the measured kernels (planner/schema/
         kernels.py; docs/gpu/2026-11-26-h100-heldout-predictions.json): the same block at
         8 x 8,192 tokens (plans/gpu/protein-1.2b-h2048_1xh100_s8192.yaml, micro-batch 2), and
         a narrow one, hidden 1,024 with 16 heads of 64 (plans/gpu/protein-0.3b-h1024_1xh100_
         s2048.yaml, 64 x 2,048 tokens at micro-batch 8): docs/gpu/2026-11-26-h100-heldout-*.json;
       - the first of them on an H200 too (plans/gpu/protein-1.2b-h2048_1xh200_s8192.yaml,
         micro-batch 4), predicted before it ran with the H100's kernels copied
         (docs/gpu/2026-11-26-h200-heldout-predictions.json), the H200's own kernels measured
         in the same call: docs/gpu/2026-11-26-h200-heldout-*.json, 2026-11-26-h200-kernels.json;
       - a mid-sized block (hidden 1,536, 12 heads of 128; plans/gpu/protein-0.7b-h1536_1xh100_
         s1024.yaml, 64 x 1,024 tokens at micro-batch 8), predicted before it ran with the eager
         surplus's measured rate, its check (docs/gpu/2026-11-26-h100-heldout2-*.json);
       - the first runs with activation recompute, predicted before they ran (docs/gpu/
         2026-11-26-h100-recompute-predictions.json): full recompute on protein-3.5b at 32 x 512
         tokens in one micro-batch (plans/gpu/protein-3.5b_1xh100_full.yaml) and on the 1.2B
         block at 16 x 4,096 in one (..._s4096_full.yaml), selective on the 1.2B block at
         8 x 8,192, micro-batch 2 (..._s8192_sel.yaml): docs/gpu/2026-11-26-h100-recompute-*.json;
       - full recompute with accumulation, predicted before they ran under the memory model the
         three above led to (docs/gpu/2026-11-26-h100-recompute2-predictions.json): protein-3.5b
         at 16 x 2,048 tokens, micro-batch 8 (..._s2048_full.yaml), and the 1.2B block at
         16 x 4,096, micro-batch 4 (..._s4096_full4.yaml; eager: its compiled run finished,
         1,383.5 ms a step in the log, but the call's time ran out before its file was written;
         measured again below, 1,384.4 ms):
         docs/gpu/2026-11-26-h100-recompute2-*.json;
       - the first runs with selective-op recompute (torchtitan's per-op policy), predicted
         before they ran (docs/gpu/2026-11-26-h100-op-predictions.json): protein-3.5b at 32 x 512
         tokens in one micro-batch (..._op.yaml), the 1.2B block at 16 x 4,096, micro-batch 8
         (..._s4096_op.yaml), and at 8 x 8,192, micro-batch 4 (..._s8192_op.yaml):
         docs/gpu/2026-11-26-h100-op-*.json;
       - after the memory terms those led to, predicted before they ran (docs/gpu/2026-11-26-
         h100-op2-predictions.json): selective-op with accumulation, protein-3.5b at 16 x 2,048
         tokens, micro-batch 4 (..._s2048_op.yaml), and the compiled twin of the 1.2B full-
         recompute run with accumulation (..._s4096_full4.yaml): docs/gpu/2026-11-26-h100-op2-*.json.

  M  exaplan's JAX backend (jaxrt/) on the same H100 card kind, 2026-11-27, the JAX twins of
     the plans above (`exaplan plan --backend jax`; cli/examples.py JAX_TWINS), mode "jax":
     protein-3.5b at the backend's own pick (micro-batch 16) and at the torch plan's 8, the
     1.2B block at 16 x 4,096 (docs/gpu/2026-11-27-h100-jax.json), measured before the jax
     profile charged the measured kernels (its prediction then: the fitted figures alone);
     then, predicted before they ran with them (docs/gpu/2026-11-27-h100-jax-blind-
     predictions.json), the 1.2B block at 8 x 8,192 and the narrow one at 64 x 2,048
     (docs/gpu/2026-11-27-h100-jax-blind.json). Not pooled into any uncertainty: five runs on
     one GPU state no band for the jax profile.

The H200's device kind copies the H100 fit (no published H200 rows); the H100's is fitted, but
to other frameworks' runs (Megatron-LM, llm-foundry, fms-fsdp), never to this runtime on a GPU.
These rows (exaplan_runtime) are predicted as `exaplan plan` predicts the runtime: at the
kinds' measured kernels of the runtime (attention, elementwise work, the weights' traffic per
micro-batch: README "Measured kernels"), the GEMMs on the fitted curve.
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
    "Tokens/s on one GPU: the tokens of a step (16,384; the s2048 case 32,768, the s4096 case 65,536) over the "
    "best run's median step (12 steps, the first 4 dropped; the s2048 and s4096 cases 10 and 3; the recompute cases 9 and 3). exaplan's runtime with its exaplan profile (recorded under framework fsdp, whose profile "
    "it is): one rank, no data parallelism, bf16 autocast on fp32 weights, fused AdamW."
)
SOURCE_JAX = ("exaplan's own measurement on a lent GPU (jax 0.11.2 with CUDA 13, cuDNN flash attention), 2026-11-27: "
              "docs/gpu/{file} (benchmarks/gpu_check.py)")
NOTE_JAX = ("Tokens/s on one GPU: the tokens of a step over the run's median step (10 steps, the first 3 dropped; the "
            "blind pair 9 and 3). exaplan's JAX backend (exaplan run on a plan made with --backend jax; recorded under "
            "framework fsdp, predicted with the jax profile): one rank, fp32 weights cast to bf16 at use, optax AdamW.")
CARDS = {
    "h200": ("dgx-h200", "an H200 SXM in a DGX H200; the lent one is an H200 of the same 141 GB / 4.8 TB/s part"),
    "h100": ("dgx-h100", "an H100 SXM5 in a DGX H100; the lent one is an H100 80GB HBM3, the same part"),
}
# (card, plan: plans/gpu/<model>_1x<plan>.yaml, sequence length, global batch, micro-batch, model)
CASES = {"h200": ("h200", "h200", 512, 32, 32, "protein-3.5b"), "h100": ("h100", "h100", 512, 32, 8, "protein-3.5b"),
         "h100-s2048": ("h100", "h100_s2048", 2048, 16, 2, "protein-3.5b"),
         "h100-s4096": ("h100", "h100_s4096", 4096, 16, 4, "protein-1.2b-h2048"),
         "h100-s8192": ("h100", "h100_s8192", 8192, 8, 2, "protein-1.2b-h2048"),
         "h100-h1024": ("h100", "h100_s2048", 2048, 64, 8, "protein-0.3b-h1024"),
         "h200-s8192": ("h200", "h200_s8192", 8192, 8, 4, "protein-1.2b-h2048"),
         "h100-h1536": ("h100", "h100_s1024", 1024, 64, 8, "protein-0.7b-h1536"),
         "h100-full": ("h100", "h100_full", 512, 32, 32, "protein-3.5b"),
         "h100-s4096-full": ("h100", "h100_s4096_full", 4096, 16, 16, "protein-1.2b-h2048"),
         "h100-s8192-sel": ("h100", "h100_s8192_sel", 8192, 8, 2, "protein-1.2b-h2048"),
         "h100-s2048-full": ("h100", "h100_s2048_full", 2048, 16, 8, "protein-3.5b"),
         "h100-s4096-full4": ("h100", "h100_s4096_full4", 4096, 16, 4, "protein-1.2b-h2048"),
         "h100-op": ("h100", "h100_op", 512, 32, 32, "protein-3.5b"),
         "h100-s4096-op": ("h100", "h100_s4096_op", 4096, 16, 8, "protein-1.2b-h2048"),
         "h100-s8192-op": ("h100", "h100_s8192_op", 8192, 8, 4, "protein-1.2b-h2048"),
         "h100-s2048-op": ("h100", "h100_s2048_op", 2048, 16, 4, "protein-3.5b"),
         "h100-jax": ("h100", "h100_jax", 512, 32, 16, "protein-3.5b"),
         "h100-jax-mbs8": ("h100", "h100_jax_mbs8", 512, 32, 8, "protein-3.5b"),
         "h100-s4096-jax": ("h100", "h100_s4096_jax", 4096, 16, 4, "protein-1.2b-h2048"),
         "h100-s8192-jax": ("h100", "h100_s8192_jax", 8192, 8, 2, "protein-1.2b-h2048"),
         "h100-h1024-jax": ("h100", "h100_s2048_jax", 2048, 64, 8, "protein-0.3b-h1024"),
         "h100-s2048-full-jax": ("h100", "h100_s2048_jax_full", 2048, 16, 8, "protein-3.5b"),
         "h100-s2048-op-jax": ("h100", "h100_s2048_jax_op", 2048, 16, 4, "protein-3.5b"),
         "h100-s8192-sel-jax": ("h100", "h100_s8192_jax_sel", 8192, 8, 2, "protein-1.2b-h2048"),
         "h100-sel-jax": ("h100", "h100_jax_search", 512, 32, 32, "protein-3.5b")}
# The recompute level of a case (none unless given).
RECOMPUTE = {"h100-full": Recompute.full, "h100-s4096-full": Recompute.full, "h100-s8192-sel": Recompute.selective,
             "h100-s2048-full": Recompute.full, "h100-s4096-full4": Recompute.full,
             "h100-op": Recompute.selective_op, "h100-s4096-op": Recompute.selective_op,
             "h100-s8192-op": Recompute.selective_op, "h100-s2048-op": Recompute.selective_op,
             "h100-s2048-full-jax": Recompute.full, "h100-s2048-op-jax": Recompute.selective_op,
             "h100-s8192-sel-jax": Recompute.selective, "h100-sel-jax": Recompute.selective}
# Models other than the presets: protein-3.5b's block at section A's 1.7B shape.
MODELS = {"protein-1.2b-h2048": dict(name="protein-1.2b-h2048", layers=24, hidden=2048, heads=16, kv_heads=16,
                                     ffn_hidden=5504),
          "protein-0.3b-h1024": dict(name="protein-0.3b-h1024", layers=24, hidden=1024, heads=16, kv_heads=16,
                                     ffn_hidden=2752),
          "protein-0.7b-h1536": dict(name="protein-0.7b-h1536", layers=24, hidden=1536, heads=12, kv_heads=12,
                                     ffn_hidden=4096)}
# The best run's median step time (s): docs/gpu/2026-11-26-<case>-<mode>.json,
# plans["protein-3.5b_1x<plan>(+compile)"]["best"]["exaplan"]["median_s"]. The s2048 case was
# measured after eager_bytes_per_element was set from the count (with the first two cases'
# eager runs beside it), as its check.
MEDIAN_STEP_S = {("h200", "compile"): 0.5734, ("h200", "eager"): 0.7338,
                 ("h100", "compile"): 0.6642, ("h100", "eager"): 0.9143,
                 ("h100-s2048", "compile"): 1.3573, ("h100-s2048", "eager"): 1.8649,
                 ("h100-s4096", "compile"): 1.1077, ("h100-s4096", "eager"): 1.8194,
                 ("h100-s8192", "compile"): 1.2754, ("h100-s8192", "eager"): 1.9797,
                 ("h100-h1024", "compile"): 0.7059, ("h100-h1024", "eager"): 1.5227,
                 ("h200-s8192", "compile"): 1.2156, ("h200-s8192", "eager"): 1.7498,
                 ("h100-h1536", "compile"): 0.6367, ("h100-h1536", "eager"): 1.2442,
                 ("h100-full", "compile"): 0.7253, ("h100-full", "eager"): 1.0285,
                 ("h100-s4096-full", "compile"): 1.3436, ("h100-s4096-full", "eager"): 2.2692,
                 ("h100-s8192-sel", "compile"): 1.4071, ("h100-s8192-sel", "eager"): 2.0671,
                 ("h100-s2048-full", "compile"): 1.4697, ("h100-s2048-full", "eager"): 2.0974,
                 ("h100-s4096-full4", "eager"): 2.3448,
                 ("h100-op", "compile"): 0.6636, ("h100-op", "eager"): 0.9727,
                 ("h100-s4096-op", "compile"): 1.2119, ("h100-s4096-op", "eager"): 2.1491,
                 ("h100-s8192-op", "compile"): 1.3802, ("h100-s8192-op", "eager"): 2.3159,
                 ("h100-s2048-op", "compile"): 1.3997, ("h100-s2048-op", "eager"): 2.0306,
                 ("h100-s4096-full4", "compile"): 1.3844,
                 # the JAX backend: docs/gpu/2026-11-27-h100-jax{,-blind}.json
                 ("h100-jax", "jax"): 0.5843, ("h100-jax-mbs8", "jax"): 0.6386, ("h100-s4096-jax", "jax"): 1.0773,
                 ("h100-s8192-jax", "jax"): 1.2365, ("h100-h1024-jax", "jax"): 0.6792,
                 # recompute, each predicted before it ran: docs/gpu/2026-11-27-h100-jax-{full,recompute,search}.json
                 ("h100-s2048-full-jax", "jax"): 1.4136, ("h100-s2048-op-jax", "jax"): 1.3486,
                 ("h100-s8192-sel-jax", "jax"): 1.3630, ("h100-sel-jax", "jax"): 0.5610}
# The evidence file of a case: docs/gpu/2026-11-26-<evidence(case, mode)>-<mode>.json (EVIDENCE,
# or EVIDENCE_BY_MODE for a run measured in a later call than its twin).
EVIDENCE = {"h200": "h200", "h100": "h100", "h100-s2048": "h100-s2048", "h100-s4096": "h100-h2048-s4096",
            "h100-s8192": "h100-heldout", "h100-h1024": "h100-heldout", "h200-s8192": "h200-heldout",
            "h100-h1536": "h100-heldout2", "h100-full": "h100-recompute", "h100-s4096-full": "h100-recompute",
            "h100-s8192-sel": "h100-recompute", "h100-s2048-full": "h100-recompute2",
            "h100-s4096-full4": "h100-recompute2", "h100-op": "h100-op", "h100-s4096-op": "h100-op",
            "h100-s8192-op": "h100-op", "h100-s2048-op": "h100-op2"}
EVIDENCE_BY_MODE = {("h100-s4096-full4", "compile"): "h100-op2"}
# The JAX backend's evidence files (docs/gpu/<file>).
JAX_EVIDENCE = {"h100-jax": "2026-11-27-h100-jax.json", "h100-jax-mbs8": "2026-11-27-h100-jax.json",
                "h100-s4096-jax": "2026-11-27-h100-jax.json", "h100-s8192-jax": "2026-11-27-h100-jax-blind.json",
                "h100-h1024-jax": "2026-11-27-h100-jax-blind.json", "h100-s2048-full-jax": "2026-11-27-h100-jax-full.json",
                "h100-s2048-op-jax": "2026-11-27-h100-jax-recompute.json",
                "h100-s8192-sel-jax": "2026-11-27-h100-jax-recompute.json", "h100-sel-jax": "2026-11-27-h100-jax-search.json"}


def evidence(case: str, mode: str) -> str:
    return EVIDENCE_BY_MODE.get((case, mode), EVIDENCE[case])


def evidence_file(case: str, mode: str) -> str:
    """The case's measurement, docs/gpu/<this>."""
    return JAX_EVIDENCE[case] if mode == "jax" else f"2026-11-26-{evidence(case, mode)}-{mode}.json"


def case_model(case: str):
    """The model a case ran: its preset, or MODELS' override of protein-3.5b, at the case's sequence."""
    name, seq = CASES[case][5], CASES[case][2]
    base = get_model("protein-3.5b") if name in MODELS else get_model(name)
    return base.model_copy(update={**MODELS.get(name, {}), "seq_len": seq})


def own_gpu_runs() -> list[PublishedRun]:
    runs = []
    for (case, mode), step in MEDIAN_STEP_S.items():
        card, _, seq, gbs, mbs, name = CASES[case]
        machine, part = CARDS[card]
        jax = mode == "jax"
        runs.append(PublishedRun(
            id=f"M-{name}-{case}-{mode}", section="M",
            source=SOURCE_JAX.format(file=evidence_file(case, mode)) if jax else SOURCE_M.format(card=evidence(case, mode)),
            model=case_model(case), machine=machine, framework="fsdp",
            gpus=1, layout=PublishedLayout(dp=1, sharding=Sharding.none, micro_batch=mbs, global_batch=gbs,
                                           recompute=RECOMPUTE.get(case, Recompute.none)),
            precision=Precision.bf16, torch_blocks=None if jax else "compiled" if mode == "compile" else "eager",
            exaplan_runtime=True, jax_backend=jax,
            figure=round(gbs * seq / step, 1), kind="tokens_per_s_per_gpu", flop_convention="none", assumed=[],
            note=f"{NOTE_JAX if jax else NOTE_M} Machine {machine} ({part}). "
                 + ("The JAX backend (jaxrt/): one jit-compiled step." if jax else
                    "Blocks compiled (exaplan run --compile)." if mode == "compile" else
                    "Eager (no --compile): unfused elementwise kernels (eager_bytes_per_element)."),
        ))
    return runs
