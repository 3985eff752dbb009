"""Published GEMM microbenchmarks that join the fit of the published runs (fit_published).

A device kind's published runs often come from one shape family, which cannot tell the matmul
curve's height (peak_fraction) from its half size (half_dim), nor either from the attention
and elementwise figures: section K's Aurora rows (2-node Llama 3 runs at sequence 8,192,
micro-batch 1, vocabulary 128k) fit as well with large GEMMs at 157 TFLOP/s per tile as at
the 207 ALCF measured. A benchmark of the kind's GEMM library at a stated size pins the curve
where training's large GEMMs run: it enters the fit as one more residual, the curve's rate at
that size against the measured one in log error, weighted as one published run
(WEIGHT: one row 5% off costs as much as the benchmark 5% off).

Only kinds with a published measurement taken as training runs it (every device of the node
busy, the default clocks) are listed; the other kinds' curves are pinned by their rows'
variety of shapes (A: nine model sizes on H100; B, C, D, L on A100) or by nothing more
(MI250X: section I)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GemmBenchmark:
    size: int  # m = n = k
    tflops: float  # per device, every device of the node busy
    precision: str
    source: str
    machine: str  # a machine preset of the kind, whose shipped figures report() checks


GEMM_BENCHMARKS = {
    "Intel Max 1550 tile": GemmBenchmark(
        8192, 207.0, "bf16",
        "ALCF, Aurora node-performance-overview (argonne-lcf/user-guides, docs/aurora/node-performance-overview; "
        "src/gemm.cpp: oneMKL gemm, bf16 inputs, fp32 output, m = n = k = 8192, best of 100): 2,487 TFLOP/s per node "
        "with one rank per tile (207 per tile; 256 on one tile alone), at Aurora's default 1.5 GHz", "aurora"),
}
WEIGHT = 1.0


def curve_tflops(figures: dict[str, float], peak_tflops: float, size: float) -> float:
    """The matmul curve's rate for a square GEMM of `size` (planner.cost.compute.matmul_efficiency)."""
    return figures["peak_fraction"] * size / (size + figures["half_dim"]) * peak_tflops


def residuals(device_figures: dict[str, dict[str, float]], peaks: dict[str, dict[str, float]]) -> list[float]:
    """One weighted log error per benchmarked kind among `device_figures` (kind -> figures);
    `peaks`: kind -> precision -> peak TFLOP/s of a machine of that kind."""
    out = []
    for kind, figures in device_figures.items():
        bench = GEMM_BENCHMARKS.get(kind)
        if bench is not None:
            predicted = curve_tflops(figures, peaks[kind][bench.precision], bench.size)
            out.append(WEIGHT * math.log(predicted / bench.tflops))
    return out


def report() -> list[dict]:
    """Per benchmark: the shipped figures' curve at its size against the measurement."""
    from machine_models import load_machine

    out = []
    for kind, bench in GEMM_BENCHMARKS.items():
        m = load_machine(bench.machine)
        e = m.matmul_efficiency
        rate = curve_tflops({"peak_fraction": e.peak_fraction, "half_dim": e.half_dim},
                            m.peak_flops(bench.precision) / 1e12, bench.size)
        out.append({"device": kind, "size": bench.size, "precision": bench.precision, "measured_tflops": bench.tflops,
                    "curve_tflops": rate, "error": rate / bench.tflops - 1, "source": bench.source})
    return out


def report_lines() -> list[str]:
    """report() as the lines `exaplan validate --published` prints."""
    return [f"GEMM benchmark, {b['device']}: {b['size']}^3 {b['precision']} at {b['curve_tflops']:.0f} TFLOP/s on the "
            f"fitted curve, {b['measured_tflops']:g} measured ({100 * b['error']:+.1f}%; fitted as one more row)"
            for b in report()]
