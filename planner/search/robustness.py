"""How robust is the planner's first choice? Draw the fitted figures of the machine within
their uncertainty and re-rank the search's finalists under each draw.

Each fitted figure (matmul peak fraction and half-size, attention factor, hidden fraction of
data-parallel traffic, per-step overhead) is multiplied by exp(sigma z), z standard normal,
independently per figure and draw, with sigma = u / 1.2816: u is the relative half-width of
the prediction's interval (the 80% conformal bound of the leave-one-out |error|, see
machine_models/uncertainty.py), and 1.2816 the 80th percentile of |z|. Values are clamped
to each figure's physical range (planner/schema/figures.py). The finalists are the layouts
the search re-scored (its best FINALISTS by the fast scores); a draw's winner is the finalist
with the least step time under it. About 4 ms a draw for 64 finalists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.cost.layout import Layouts, Space
from planner.cost.step import evaluate_space
from planner.schema.figures import BOUNDS, figures_of, framework_machine, with_figures
from planner.schema.specs import MachineModel, ModelSpec, TrainingJob

DRAWN_FIGURES = ("peak_fraction", "half_dim", "attention_efficiency_factor", "overlap_dp", "step_overhead_s")
P80_OF_ABS_NORMAL = 1.2816


@dataclass
class Robustness:
    draws: int
    stays_first: float  # fraction of draws in which the first choice stays first
    winners: dict[int, int] = field(default_factory=dict)  # finalist index -> draws it won

    def as_json(self, labels: list[str]) -> dict:
        return {"draws": self.draws, "stays_first": self.stays_first,
                "winners": {labels[i]: n / self.draws for i, n in sorted(self.winners.items(), key=lambda kv: -kv[1])}}


def ranking_robustness(model: ModelSpec, machine: MachineModel, job: TrainingJob, finalists: Layouts,
                       step_time_s: np.ndarray, half_width: float, draws: int = 200, seed: int = 0) -> Robustness:
    """Re-rank `finalists` (best first, with their library-consistent `step_time_s`) under
    `draws` draws of the fitted figures. Each draw scores them fast (every communicator's
    cheapest algorithm) plus each finalist's unperturbed difference between the two, so a
    draw that changes nothing ranks them as the search did."""
    rng = np.random.default_rng(seed)
    # The framework's own figures are drawn too: apply them, then let the machine carry them.
    machine = framework_machine(machine, job.framework)
    job = job.model_copy(update={"framework": job.framework.model_copy(update={"overlap_dp": None,
                                                                                "step_overhead_s": None,
                                                                                "cpu_figures": {}})})
    space = Space.of(finalists)
    offset = np.asarray(step_time_s, float) - evaluate_space(model, machine, job, space, detail=False,
                                                                      memory=False).step_time_s
    base = figures_of(machine, DRAWN_FIGURES)
    sigma = max(half_width, 0.0) / P80_OF_ABS_NORMAL
    wins = np.zeros(len(finalists), dtype=int)
    for _ in range(draws):
        drawn = {name: min(max(value * float(np.exp(sigma * rng.standard_normal())), BOUNDS[name][0]), BOUNDS[name][1])
                 for name, value in base.items()}
        step = evaluate_space(model, with_figures(machine, drawn), job, space, detail=False,
                              memory=False).step_time_s + offset
        wins[int(np.argmin(step))] += 1
    return Robustness(draws, float(wins[0] / draws), {int(i): int(n) for i, n in enumerate(wins) if n})
