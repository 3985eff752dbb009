"""The seed paper's runs (MProt-DPO, Dharuman et al., SC24): each system at the scale it
reached, with the layout and step its launch scripts ran (Megatron-DeepSpeed, data parallelism
+ ZeRO-1, no model parallelism, protein-3.5b at sequence 512) and the sustained rate it
published (Table 3: sustained mixed-precision FLOP/s over whole iterations, communication and
I/O included, counted with DeepSpeed's FLOP profiler; Leonardo is not in the table).

The step, from the authors' public scripts (ramanathanlab/Megatron-DeepSpeed, August 2024:
dpo_training.py, run by run_alcf_scaling_3p5B.sh on Aurora; dpo_training_ref.py, run by
run_dgxcluster_scaling_3p5B.sh on a DGX H100 cluster): every micro-step concatenates
`--micro-batch-size` (8) chosen and 8 rejected sequences into one policy forward of 16
sequences, runs the frozen reference model's forward over the same 16 under no_grad, and
backpropagates the DPO loss through the policy; DeepSpeed's engine applies the optimizer every
`gradient_accumulation_steps` (8) micro-steps. That is exaplan's dpo workload with the
reference in the step and a micro-batch of 8 pairs.

The FLOP count (SEED_FLOP_COUNT): the policy's model FLOPs (forward + backward, no recompute)
over the whole iteration's time, the reference model's forward timed but not counted. The
paper does not say; its count comes from DeepSpeed's FLOP profiler, which each engine runs on
its own forward at `profile_step` (1 in the scripts' ds_configs/3p5B.json) of its own
global_steps, which only step() advances: the policy's engine steps, the reference's (built
by a second deepspeed.initialize, never stepped) never reaches step 1, so its forward is never
profiled. Counting it too (`rate_with_reference`) would raise every prediction by a third of
the policy's own count. docs/validation/seed-paper.md sets both counts, and the pretraining step of the earlier
convention, beside the published rates."""

from __future__ import annotations

from dataclasses import dataclass

# Micro-batches per optimizer step assumed for the paper's runs (not published in the paper):
# the paper's own public Aurora scaling config accumulates 8 (ramanathanlab/Megatron-DeepSpeed,
# ds_configs/3p5B.json: gradient_accumulation_steps 8), taken for every machine. It is read
# from the authors' scripts, not chosen to fit the published rates (at 8 and 16 all four lie
# in their intervals; at 4 all but Aurora; at 2 Alps and Frontier; at 1 none).
SEED_ACCUMULATION = 8

# What the published rate counts, as a key of planner.cost.flops.step_flops: "policy" (the
# policy's model FLOPs only; see the docstring), not "executed" (the reference's forward too).
SEED_FLOP_COUNT = "policy"


@dataclass(frozen=True)
class SeedRun:
    machine: str
    nodes: int
    published_tflops_per_rank: float | None = None  # MProt-DPO Table 3, sustained, per rank
    model: str = "protein-3.5b"
    micro_batch: int = 8  # pairs per micro-step (--micro-batch-size: 8 chosen + 8 rejected sequences)
    framework: str = "deepspeed"
    workload: str = "dpo"  # the reference model's forward runs in every micro-step


SEED_RUNS = (
    SeedRun("aurora", 3200, 107.0),  # 1,280 per node, 12 tiles
    SeedRun("alps", 2060, 354.0),
    SeedRun("frontier", 2048, 64.7),  # per GCD
    SeedRun("leonardo", 1500),
    SeedRun("pdx", 400, 403.0),
)
