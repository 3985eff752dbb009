"""The figures the published-run fit varies, their bounds, first guesses and the rules that tie
them (calibration/fit_published.py fits them; this module holds only data and their reasons)."""

from __future__ import annotations

import numpy as np

from calibration.published import FRAMEWORKS
from planner.schema.figures import narrowed

DEVICE_FIGURES = ("peak_fraction", "half_dim", "attention_efficiency_factor", "elementwise_efficiency")
FRAMEWORK_FIGURES = ("overlap_dp", "step_overhead_s")
FIGURES = DEVICE_FIGURES + FRAMEWORK_FIGURES
# This fit's bounds: the physical ones (planner/schema/figures.py) narrowed to what a GPU
# framework's published run can mean.
BOUNDS = narrowed({
    "peak_fraction": (0.3, 0.95),
    "half_dim": (16.0, 4096.0),
    # The attention kernel's rate relative to a GEMM of its size (planner/cost/compute.py).
    # Floor 0.3 for any kind; a device kind with a published kernel rate has a floor of its
    # own (ATTENTION_RATE_FLOOR). Lower, the factor stands for work that is not attention
    # (at its old floor, 0.2, it absorbed per-token work of the small-hidden rows).
    "attention_efficiency_factor": (0.3, 1.0),
    # A copy reaches ~0.9 of HBM bandwidth (STREAM on H100); eager, unfused kernels ~0.15 of
    # the fused count (compute.py). Outside that the figure would be absorbing other work.
    "elementwise_efficiency": (0.15, 0.9),
    # Some traffic always shows (the first all-gather, the last reduce-scatter: the floors
    # of the cost model), and a framework that hid none of it would not prefetch at all.
    "overlap_dp": (0.1, 1.0),
    # Seconds per optimizer step; above a second it would no longer be a fixed overhead.
    "step_overhead_s": (0.0, 1.0),
})
# The least rate (fraction of peak) a FlashAttention-2-class kernel reaches on a device kind
# at the saturated tile of compute.FLASH_SATURATION_SEQ and head dimension 128, as published.
# H100: FlashAttention-2's causal forward at sequence 2k, head dimension 128, runs at 298
# TFLOP/s on an H100 SXM5, 0.30 of 989 (Shah et al. 2024, FlashAttention-3, fig. 5). The
# factor multiplies the efficiency of a GEMM of the tile's size, (2048 x 2048 x 128)^(1/3) =
# 813: the floor is this rate over that efficiency on the first-guess curve (attention_floor).
# Without it the H100 factor sat at 0.38 (0.21 of peak) and llm-foundry's H100 runs at 8k-64k
# tokens (section L, never fitted) came out 20-40% slow.
# A100: FlashAttention-2 reaches "50-73% of the theoretical maximum FLOPs/s on A100" (Dao
# 2023; sequences from 512, head dimensions from 64): 0.50. Without it the factor rested on one
# row (H-mpt-13b-s8192): left out, it fell to 0.60 and that row came out 21% too slow.
ATTENTION_RATE_FLOOR = {"NVIDIA H100 SXM5": 0.30, "NVIDIA A100 SXM4": 0.50}
ATTENTION_SATURATED_DIM = (2048.0 * 2048.0 * 128.0) ** (1.0 / 3.0)

# First guesses: device_kinds.yaml before any fit (validate_published(fitted=False) predicts
# with them, and the weak prior pulls towards them).
FIRST_GUESSES = {
    # attention: FlashAttention-2 (backward counted as 2.5 x forward, as the cost model now
    # does) reaches 50-73% of A100 peak (Dao 2023) and about 35% of H100's (Shah et al. 2024),
    # where a GEMM of the saturated tile's size (813) reaches about 0.64 (A100) and 0.55
    # (H100) on these curves: 0.75 and 0.64.
    "NVIDIA H100 SXM5": {"peak_fraction": 0.75, "half_dim": 300.0, "attention_efficiency_factor": 0.64,
                         "elementwise_efficiency": 0.6},
    "NVIDIA A100 SXM4": {"peak_fraction": 0.8, "half_dim": 200.0, "attention_efficiency_factor": 0.75,
                         "elementwise_efficiency": 0.6},
    # MI250X: the first guesses of device_kinds.yaml (fitted since section I's LUMI rows).
    "AMD MI250X GCD": {"peak_fraction": 0.6, "half_dim": 300.0, "attention_efficiency_factor": 0.5,
                       "elementwise_efficiency": 0.35},
    # Max 1550: the first guesses of device_kinds.yaml before section K was fitted (a kind
    # without an entry here would start from, and be pulled towards, whatever the last refit
    # wrote: a fit that depends on its own history).
    "Intel Max 1550 tile": {"peak_fraction": 0.55, "half_dim": 300.0, "attention_efficiency_factor": 0.5,
                            "elementwise_efficiency": 0.35},
}
FRAMEWORK_FIRST_GUESSES = {fw: {"overlap_dp": 0.9, "step_overhead_s": 0.0} for fw in FRAMEWORKS}
# DeepSpeed's engine hides little: ZeRO-1/2's overlap_comm is off by default and the pipeline
# engine reduces gradients after the flush; a fixed cost per step of tens of ms (the seed
# paper's stack: machine_models/frameworks.yaml).
FRAMEWORK_FIRST_GUESSES["deepspeed"] = {"overlap_dp": 0.5, "step_overhead_s": 0.05}
# A framework figure is fitted only where its rows can see it: moved across its whole
# bounded range (at the first guesses), it must change some row's predicted figure by at
# least the model's typical error on a row (the leave-one-out median is 3-5%); otherwise it
# is held at its first guess (`_Problem.held`). The fixed cost per step cannot be told from
# 31-350 s pipelined steps (the LUMI rows: 1 s is at most 3.2% of the shortest), and a fit
# would let it soak up their other residuals (it went to 0.73 s, a third of the seed paper's
# steps); DeepSpeed's figures were held so until the Max 1550 rows (2 s steps) joined the fit.
IDENTIFIABLE = 0.05
# The framework whose figures the shipped machine models carry: exaplan's runtime (torch
# FSDP2 / DDP) is an FSDP framework.
SHIPPED_FRAMEWORK = "fsdp"
# Weight of the pull towards the first guess, per unit of figure (log for half_dim, seconds
# for step_overhead_s), against residuals in log error: 0.05 moves a figure freely when the
# rows say so (one row 5% off outweighs it).
PRIOR_WEIGHT = 0.05
# A fixed cost per step (seconds) is pulled harder: a 50 ms move weighs as much as one row 5%
# off. Most rows' steps are long (the FSDP rows' 1-160 s, the LUMI rows' 31-350 s), where tens
# of ms barely show, so the rows let it trade against the overlap: fitted at PRIOR_WEIGHT,
# the FSDP figures had two minima the rows could not tell apart (overlap 0.16 with no cost per
# step, 0.33 with 87 ms; log-error sums within 1% of each other), and the fit took either by
# noise. The launches, clipping and metric syncs a framework adds to a step are tens of ms.
PRIOR_WEIGHTS = {"step_overhead_s": 1.0}
# Coarse grid of starting points over figures the fit can stall on (the attention and
# overhead figures trade off against the matmul curve), and how many of its best points the
# gradient fit starts from. overlap.dp is not in the grid: the scan below covers it.
GRID_STARTS = {
    "attention_efficiency_factor": (0.3, 0.6, 0.9),
    "step_overhead_s": (0.0, 0.15, 0.3),
}
GRID_KEEP = 1
# The exposed-traffic terms are max(traffic - min(traffic, compute) x overlap, floor): flat in
# overlap.dp where every row of a framework sits at its floor, so a gradient cannot leave such a
# stretch. After the gradient fit, each framework's overlap.dp is scanned over OVERLAP_SCAN
# with its step overhead re-chosen on OVERHEAD_SCAN (see _refit_from_scans).
OVERLAP_SCAN = tuple(np.round(np.arange(0.1, 1.0001, 0.05), 3))
OVERHEAD_SCAN = tuple(np.round(np.arange(0.0, 0.5001, 0.01), 3))
# Device kinds that share fitted figures with a fitted kind (no published rows of their own).
SHARES_FIGURES_WITH = {"NVIDIA GH200": "NVIDIA H100 SXM5", "NVIDIA H200 SXM": "NVIDIA H100 SXM5"}
# Figures that fitted device kinds share: one parameter for each family, the first kind of it in
# the fit holding it. The fraction of HBM bandwidth that the frameworks' elementwise kernels
# reach (norms, residuals, activations, the loss's passes: the same CUDA kernels of the same
# frameworks on both NVIDIA generations) is a property of the kernels and of NVIDIA's memory
# system, not of the chip: fitted apart, H100's and A100's came out 0.330 and 0.333. Apart,
# the H100's rested on one row (A-gpt-1.7b, the only small-hidden H100 row, where elementwise
# work is a sixth of the step): left out, it fell to 0.20 and that row came out 18% slow;
# shared, the A100 rows hold it (8% slow). AMD's and Intel's kernels keep their own.
SHARED_FIGURES = {"elementwise_efficiency": ("NVIDIA H100 SXM5", "NVIDIA A100 SXM4")}
FIT_COMMAND = "exaplan validate --published --refit"
FIT_MARK = "# fit:"  # starts the comment lines the refit writes (and replaces) in device_kinds.yaml
