"""The seed paper's runs (MProt-DPO, SC24; MProt-DPO, SC24): each system at the scale it reached,
with the layout its launch scripts used (data parallelism + ZeRO-1, micro-batch 8 for the
3.5B model, sequence 512, no model parallelism). Used by the demo and the example plans."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SeedRun:
    machine: str
    nodes: int
    model: str = "protein-3.5b"
    micro_batch: int = 8


SEED_RUNS = (
    SeedRun("aurora", 3200),
    SeedRun("alps", 2060),
    SeedRun("frontier", 2048),
    SeedRun("leonardo", 1500),
    SeedRun("pdx", 400),
)
