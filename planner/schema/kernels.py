"""What exaplan's own runtime's kernels were measured to reach on one device kind.

The device kinds' fitted figures (device_kinds.yaml: matmul curve, attention factor,
elementwise fraction) are effective rates, fitted to other frameworks' published runs: each
absorbs what that software does beside its kernels. exaplan's runtime on a GPU is a known
piece of software whose kernels can be timed one by one (benchmarks/gpu_kernels.py, `make
bench-gpu-kernels`); where a device kind carries such a measurement (`runtime_kernels:` in
device_kinds.yaml), a framework profile with `measured_kernels: true` (exaplan's) is charged
at those rates instead (planner/cost/compute.py):

  attention_tflops       causal attention forward + backward, TFLOP/s, by head dimension and
                         sequence, through torch's scaled_dot_product_attention as the runtime
                         calls it (the backend torch picks on the device), counted as the
                         cost model counts it: the causal half, backward 2.5 x forward;
  elementwise_efficiency the compiled norm + residual and SwiGLU kernels' rate on the cost
                         model's count of their traffic, over the memory bandwidth;
  eager_surplus_efficiency  the rate of what eager blocks move beyond that count (the profile's
                         eager_bytes_per_element surplus): the runtime's eager block's other
                         kernels less its compiled block's, over the surplus the count gives.

The GEMMs keep the fitted curve: in the runtime's own step its GEMM kernels measured within 8%
of it (`exaplan validate --kernels`), closer than the forward-only microbenchmarks (which run
20-26% faster than the curve: cuBLAS's backward GEMMs and the step's allocations are slower).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

_Rate = Annotated[float, Field(gt=0, le=1e9)]


class RuntimeKernels(BaseModel):
    """exaplan's runtime's kernels measured on one device kind (benchmarks/gpu_kernels.py)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    source: str = Field(max_length=8192, description="Where and how it was measured: the kernel file, the card, "
                                                     "torch and cuDNN versions.")
    attention_tflops: dict[int, dict[int, _Rate]] = Field(
        description="Head dimension -> sequence -> causal attention forward + backward TFLOP/s (the causal half, "
                    "backward 2.5 x forward), through torch's scaled_dot_product_attention as the runtime calls it.")
    elementwise_efficiency: Annotated[float, Field(gt=0, le=1)] = Field(
        description="The compiled elementwise kernels' rate on the cost model's count of their traffic, over the "
                    "memory bandwidth (the median of the measured cases).")

    memory_bandwidth_gbyte_s: _Rate | None = Field(
        None, description="The memory bandwidth (GB/s) of the card they were measured on: a part of the kind with "
                          "other memory scales only a share of their time (planner/cost/compute.py "
                          "elementwise_bandwidth); None: all of it.")
    eager_surplus_efficiency: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="The rate of the eager blocks' traffic beyond the fused count, over the memory bandwidth "
                          "(planner/cost/compute.py eager_extra_time); None: a copy's rate (EAGER_BANDWIDTH_FRACTION).")

    @field_validator("attention_tflops")
    @classmethod
    def _table(cls, table: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
        if not table or any(not row for row in table.values()):
            raise ValueError("at least one head dimension with at least one sequence")
        if any(k <= 0 for k in table) or any(s <= 0 for row in table.values() for s in row):
            raise ValueError("head dimensions and sequences are positive")
        return table

    def attention_rate_tflops(self, head_dim: int, seq: float) -> float:
        """The measured rate at the nearest measured head dimension (on a log scale),
        interpolated linearly in log(sequence) between measured sequences. Past the longest
        one the rate stays; below the shortest it falls in proportion to the sequence (fewer
        tiles than the device has units to run them)."""
        nearest = min(self.attention_tflops, key=lambda d: abs(math.log(d / head_dim)))
        points = sorted(self.attention_tflops[nearest].items())
        seqs = [math.log(s) for s, _ in points]
        rates = [r for _, r in points]
        if seq <= points[0][0]:
            return rates[0] * seq / points[0][0]
        x = math.log(seq)
        for (x0, r0), (x1, r1) in zip(zip(seqs, rates), zip(seqs[1:], rates[1:])):
            if x <= x1:
                return r0 + (r1 - r0) * (x - x0) / (x1 - x0)
        return rates[-1]
