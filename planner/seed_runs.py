"""The seed paper's runs (MProt-DPO, Dharuman et al., SC24): each system at the scale it
reached, with the layout its launch scripts used (data parallelism + ZeRO-1, micro-batch 8 for
the 3.5B model, sequence 512, no model parallelism, Megatron-DeepSpeed) and the sustained rate
it published (Table 3: sustained mixed-precision FLOP/s over whole iterations, communication
and I/O included, counted with DeepSpeed's FLOP profiler; Leonardo is not in the table).

What the paper does not give: the global batch (so the accumulation steps) and whether the
FLOP count includes the DPO reference model's forward passes. exaplan compares like with
like: the model FLOPs of a pretraining step as the trainer executes them (forward + backward,
no recompute), at SEED_ACCUMULATION micro-batches per step on every machine (the README
argues the choice; tests/planner/test_seed_paper.py checks it). Used by the demo, the example
plans and the seed tests."""

from __future__ import annotations

from dataclasses import dataclass

# Micro-batches per optimizer step assumed for the paper's runs (not published in the paper):
# the paper's own public Aurora scaling config accumulates 8 (ramanathanlab/Megatron-DeepSpeed,
# ds_configs/3p5B.json: gradient_accumulation_steps 8), taken for every machine. It is read
# from the authors' scripts, not chosen to fit the published rates (any count from 2 to 8
# puts all four in their intervals; 1 and 16 do not).
SEED_ACCUMULATION = 8


@dataclass(frozen=True)
class SeedRun:
    machine: str
    nodes: int
    published_tflops_per_rank: float | None = None  # MProt-DPO Table 3, sustained, per rank
    model: str = "protein-3.5b"
    micro_batch: int = 8
    framework: str = "deepspeed"


SEED_RUNS = (
    SeedRun("aurora", 3200, 107.0),  # 1,280 per node, 12 tiles
    SeedRun("alps", 2060, 354.0),
    SeedRun("frontier", 2048, 64.7),  # per GCD
    SeedRun("leonardo", 1500),
    SeedRun("pdx", 400, 403.0),
)
