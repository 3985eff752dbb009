"""What a what-if sweep returns: one WhatifPoint per (model, machine, node count, varied
values), and the answers to the questions asked of them (WhatifResult)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

NAN = math.nan


@dataclass(frozen=True)
class WhatifPoint:
    """The best layout at one point of the sweep and what it predicts. Times and rates carry
    the uncertainty interval (machine_models/uncertainty.py) as _lo/_hi; floats are nan where
    nothing fits (then `reason` says why) or where the machine has no power: section (energy)."""

    model: str
    machine: str
    nodes: int
    varied: dict[str, str]  # field -> value label ("x2", "400"); empty without --vary
    fits: bool
    reason: str  # "" when it fits
    layout: str  # human-readable best layout ("" when nothing fits)
    step_time_s: float = NAN
    step_time_lo_s: float = NAN
    step_time_hi_s: float = NAN
    tokens_per_s: float = NAN
    tokens_per_s_lo: float = NAN
    tokens_per_s_hi: float = NAN
    tflops_per_device: float = NAN  # model FLOPs (6N-style, as the trainer executes them) per device
    mfu: float = NAN
    days: float = NAN
    days_lo: float = NAN
    days_hi: float = NAN
    node_hours: float = NAN
    node_hours_lo: float = NAN
    node_hours_hi: float = NAN
    energy_kwh: float | None = None  # None: the machine file has no power: section
    energy_kwh_lo: float | None = None
    energy_kwh_hi: float | None = None
    scaling_efficiency: float = NAN  # per-device tokens/s against the smallest fitting node count of its group
    global_batch_seqs: int = 0  # sequences per optimizer step (dpo: 2 per pair)
    global_batch_tokens: int = 0
    fitted: bool = False  # the device kind and framework were fitted to published runs
    uncertainty_basis: str = ""
    ranks: int = 0
    devices_per_node: int = 0

    @property
    def group(self) -> tuple:
        """(model, machine, varied): the points of one scaling curve."""
        return (self.model, self.machine, tuple(sorted(self.varied.items())))

    def as_json(self) -> dict:
        """Plain JSON (nan -> None)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


@dataclass
class WhatifResult:
    """Every point and the answers: `deadline` (per group: the fewest nodes that meet it, the
    cheapest point that meets it, else the best achievable, with a sentence), `fastest`
    (machines ranked per model at equal node counts and at their cheapest), `knees` (per
    group, keyed like WhatifPoint.group: the node count where scaling efficiency first falls
    below the threshold, None if it never does; `knee_details` the same with sentences), `warnings`,
    `device_status` (device kind -> fitted / copied from ... / unfitted)."""

    points: list[WhatifPoint]
    inputs: dict
    command: str
    deadline: list[dict] = field(default_factory=list)
    fastest: list[dict] = field(default_factory=list)
    knees: dict[tuple, int | None] = field(default_factory=dict)  # WhatifPoint.group -> knee node count
    knee_details: list[dict] = field(default_factory=list)  # per group: threshold, efficiency, sentence
    warnings: list[str] = field(default_factory=list)
    device_status: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0  # the sweep's wall-clock time

    def as_json(self) -> dict:
        def conv(v):
            if isinstance(v, WhatifPoint):
                return v.as_json()
            if isinstance(v, dict):
                return {str(k): conv(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [conv(x) for x in v]
            if isinstance(v, float) and math.isnan(v):
                return None
            return v

        return dict(command=self.command, inputs=conv(self.inputs), points=[p.as_json() for p in self.points],
                    deadline=conv(self.deadline), fastest=conv(self.fastest), knees=conv(self.knee_details),
                    warnings=list(self.warnings), device_status=dict(self.device_status), seconds=self.seconds)
