"""How robust is the planner's first choice? Draw the fitted figures of the machine within
their uncertainty and re-rank the search's finalists under each draw.

Each fitted figure (matmul peak fraction and half-size, attention factor, hidden fraction of
data-parallel traffic, per-step overhead) is multiplied by exp(sigma z), z standard normal,
independently per figure and draw, with sigma = u / 1.2816: u is the relative half-width of
the prediction's interval (the 80% conformal bound of the leave-one-out |error|, see
machine_models/uncertainty.py), and 1.2816 the 80th percentile of |z|. Values are clamped
to each figure's physical range (planner/schema/figures.py). The finalists are the layouts
the search re-scored (its best FINALISTS by the fast scores); a draw's winner is the finalist
with the least step time under it. The draws run as one evaluation of finalists x draws rows
whose machine carries each drawn figure as an array over the rows (the cost model's figures
broadcast): about 10 ms for 200 draws of 64 finalists, where a loop over draws took 0.8 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.cost.layout import Layouts, Space
from planner.cost.step import evaluate_space
from planner.schema.figures import BOUNDS, FIGURES, figures_of, framework_machine
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
    n = len(finalists)
    offset = np.asarray(step_time_s, float) - evaluate_space(model, machine, job, Space.of(finalists), detail=False,
                                                                      memory=False).step_time_s
    base = figures_of(machine, DRAWN_FIGURES)
    sigma = max(half_width, 0.0) / P80_OF_ABS_NORMAL
    # All draws in one evaluation: the finalists repeated once per draw (draw-major), the
    # machine carrying each drawn figure as an array over those rows. z is drawn in the order
    # a loop over draws, then figures, would draw it.
    z = rng.standard_normal((draws, len(base)))
    drawn = machine
    for j, (name, value) in enumerate(base.items()):
        lo, hi = BOUNDS[name]
        clamp_lo, clamp_hi = FIGURES[name].clamp
        per_draw = np.clip(np.clip(value * np.exp(sigma * z[:, j]), lo, hi),
                           -np.inf if clamp_lo is None else clamp_lo, np.inf if clamp_hi is None else clamp_hi)
        drawn = FIGURES[name].set(drawn, np.repeat(per_draw, n))
    rows = Space.of(finalists.take(np.tile(np.arange(n), draws)))
    step = evaluate_space(model, drawn, job, rows, detail=False, memory=False).step_time_s.reshape(draws, n) + offset
    wins = np.bincount(np.argmin(step, axis=1), minlength=n)
    return Robustness(draws, float(wins[0] / draws), {int(i): int(c) for i, c in enumerate(wins) if c})
