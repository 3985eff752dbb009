"""Ranking, measured: where a source measured several layouts of one job, does the cost model
order them as the measurements do, and how much slower than the measured best is the layout
it would pick?

The planner's promise is a ranking (the layout `exaplan plan` picks is the fastest, or close to
it), so the figure of merit per job is not the error of each prediction but

- Spearman's rank correlation between the predicted and the published figure over the job's
  layouts (both in the figure's own unit, so +1 is the same order whether the figure is a time
  or a rate), and
- the pick's regret: the measured time per token of the layout predicted fastest (among those
  predicted to fit, as the search would pick) over the measured fastest's, minus one.

A job is one source (section), model, sequence length, machine and GPU count; its layouts may
differ in global batch and publish different kinds of figure (compared as tokens per second). `exaplan validate --published` reports every job with two layouts or more, fitted and
held-out rows together (each row says which), and holds the ones with at least MIN_LAYOUTS to
the targets: regret <= REGRET_TARGET and Spearman >= SPEARMAN_TARGET.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibration.validate_rows import ValidationRow

MIN_LAYOUTS = 5          # layouts a job needs before it is held to the targets
REGRET_TARGET = 0.03     # the pick at most 3% slower than the measured best
SPEARMAN_TARGET = 0.8


@dataclass
class RankedJob:
    """One job's layouts, as measured and as predicted."""

    section: str
    model: str
    seq_len: int
    machine: str
    gpus: int
    kinds: list[str]               # the figure kinds its rows publish
    rows: list[str]                # row ids, in the data's order
    fitted: int                    # of them fitted (the rest held out)
    spearman: float | None         # None where every prediction (or every measurement) ties
    regret: float                  # measured time per token of the pick / the measured best's - 1
    pick: str                      # the row predicted best among those predicted to fit
    best: str                      # the row measured best
    pick_fits: bool                # False: no layout of the job is predicted to fit; the pick is the fastest anyway

    @property
    def layouts(self) -> int:
        return len(self.rows)

    @property
    def held_to_targets(self) -> bool:
        return self.layouts >= MIN_LAYOUTS

    @property
    def meets_targets(self) -> bool:
        return self.regret <= REGRET_TARGET and self.spearman is not None and self.spearman >= SPEARMAN_TARGET

    @property
    def name(self) -> str:
        return f"{self.section} {self.model} s{self.seq_len} on {self.gpus} x {self.machine}"


def speeds(row: ValidationRow) -> tuple[float, float]:
    """(measured, predicted) tokens per second of the row. Every figure kind is proportional to
    the step time (an iteration time) or to its inverse (a rate, MFU) at the row's own job, so
    the measured step time is the predicted one scaled by the figure's error; layouts of one
    job may differ in kind (a source giving MFU for one and the iteration time for another)
    and in global batch."""
    ratio = row.published / row.predicted if row.kind == "iteration_time_s" else row.predicted / row.published
    tokens = row.global_batch * row.seq_len
    return tokens / (row.step_time_s * ratio), tokens / row.step_time_s


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None where either side is constant."""
    from scipy.stats import spearmanr

    if len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b).statistic)


def rank_job(rows: list[ValidationRow], fitted_ids: set[str]) -> RankedJob:
    """The ranking figures of one job's rows (two or more)."""
    measured, predicted = (np.array(side) for side in zip(*(speeds(r) for r in rows)))
    fits = np.array([r.fits_memory for r in rows])
    candidates = np.flatnonzero(fits) if fits.any() else np.arange(len(rows))
    pick = int(candidates[np.argmax(predicted[candidates])])
    best = int(np.argmax(measured))
    r0 = rows[0]
    return RankedJob(
        section=r0.section, model=r0.model, seq_len=r0.seq_len, machine=r0.machine, gpus=r0.gpus, kinds=sorted({r.kind for r in rows}),
        rows=[r.id for r in rows], fitted=sum(r.id in fitted_ids for r in rows),
        spearman=spearman(predicted.tolist(), measured.tolist()),
        regret=float(measured[best] / measured[pick] - 1.0), pick=rows[pick].id, best=rows[best].id,
        pick_fits=bool(fits.any()))


def ranked_jobs(fitted: list[ValidationRow], held_out: list[ValidationRow], min_layouts: int = 2) -> list[RankedJob]:
    """Every job with at least `min_layouts` rows among the fitted and held-out ones, largest
    first (then by name)."""
    jobs: dict[tuple, list[ValidationRow]] = {}
    for r in fitted + held_out:
        jobs.setdefault((r.section, r.model, r.seq_len, r.machine, r.gpus), []).append(r)
    ids = {r.id for r in fitted}
    out = [rank_job(rows, ids) for rows in jobs.values() if len(rows) >= min_layouts]
    return sorted(out, key=lambda j: (-j.layouts, j.name))


def ranking_summary(jobs: list[RankedJob]) -> dict:
    """Over the jobs held to the targets: how many, how many meet both, the worst regret and
    Spearman, and the median of each."""
    held = [j for j in jobs if j.held_to_targets]
    rho = [j.spearman for j in held if j.spearman is not None]
    regrets = [j.regret for j in held]
    return {
        "jobs": len(jobs), "held_to_targets": len(held), "min_layouts": MIN_LAYOUTS,
        "regret_target": REGRET_TARGET, "spearman_target": SPEARMAN_TARGET,
        "meet_targets": sum(j.meets_targets for j in held),
        "median_regret": float(np.median(regrets)) if regrets else None,
        "max_regret": max(regrets) if regrets else None,
        "median_spearman": float(np.median(rho)) if rho else None,
        "min_spearman": min(rho) if rho else None,
    }


__all__ = ["MIN_LAYOUTS", "REGRET_TARGET", "SPEARMAN_TARGET", "RankedJob", "rank_job", "ranked_jobs",
           "ranking_summary", "spearman"]
