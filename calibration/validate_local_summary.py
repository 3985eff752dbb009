"""What `exaplan validate --local` concludes from its rows: each layout's errors, the Spearman
rank correlation of predicted against measured step time, the planner's first choice against
the fastest measured, the targets met or missed, gathered in a `ValidationReport`
(calibration/validate_local_report.py writes and prints it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

TARGETS = dict(median_abs_step_error=0.10, spearman=0.90, first_choice_miss=0.05, median_abs_memory_error=0.15)


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman rank correlation (nan with fewer than 3 points or a constant series)."""
    from scipy.stats import spearmanr

    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) < 3 or np.all(p == p[0]) or np.all(m == m[0]):
        return float("nan")
    return float(spearmanr(p, m).statistic)


def first_choice(names: Sequence[str], predicted: Sequence[float], measured: Sequence[float]) -> dict[str, Any]:
    """The planner's first choice (lowest predicted) against the fastest measured: names, and
    how much slower the first choice ran (measured / fastest measured - 1; 0 when it was)."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    i, j = int(np.argmin(p)), int(np.argmin(m))
    return dict(first_choice=names[i], fastest=names[j], first_choice_is_fastest=i == j,
                first_choice_miss=float(m[i] / m[j] - 1.0))


def relative_error(measured, predicted):
    """measured / predicted - 1 (as runtime/metrics.py); None where either is missing or predicted is 0."""
    if measured is None or predicted is None or not predicted:
        return None
    return measured / predicted - 1.0


@dataclass
class ValidationReport:
    model: str
    machine: str
    ranks: int
    steps: int
    job: dict
    rows: list[dict]
    baseline_rss_gib: float | None
    memory_reserve_gib: float
    median_abs_step_error: float | None = None
    max_abs_step_error: float | None = None
    median_abs_memory_error: float | None = None
    max_abs_memory_error: float | None = None
    median_abs_memory_error_raw: float | None = None
    max_abs_memory_error_raw: float | None = None
    spearman: float | None = None
    first_choice: dict = field(default_factory=dict)
    targets: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)

    @property
    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "ok"]

    def to_json(self) -> dict:
        return _clean(asdict(self))


def _clean(x):
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def summarise(rows: list[dict]) -> dict[str, Any]:
    """Aggregate errors, Spearman and the first-choice check over the rows that ran."""
    ok = [r for r in rows if r["status"] == "ok"]
    out: dict[str, Any] = {}
    if not ok:
        return out
    se = np.abs([r["step_time_error"] for r in ok])
    out["median_abs_step_error"], out["max_abs_step_error"] = float(np.median(se)), float(np.max(se))
    for key, suffix in (("memory_error", ""), ("memory_error_raw", "_raw")):
        vals = np.abs([r[key] for r in ok if r.get(key) is not None])
        if len(vals):
            out[f"median_abs_memory_error{suffix}"], out[f"max_abs_memory_error{suffix}"] = float(np.median(vals)), float(np.max(vals))
    pred = [r["predicted_step_time_s"] for r in ok]
    meas = [r["measured_step_time_s"] for r in ok]
    out["spearman"] = spearman(pred, meas)
    out["first_choice"] = first_choice([r["name"] for r in ok], pred, meas)
    t = TARGETS
    got = dict(median_abs_step_error=out["median_abs_step_error"], spearman=out["spearman"],
               first_choice_miss=out["first_choice"]["first_choice_miss"],
               median_abs_memory_error=out.get("median_abs_memory_error"))
    out["targets"] = {
        k: dict(target=t[k], value=v, met=None if v is None or (isinstance(v, float) and math.isnan(v))
                else (v >= t[k] if k == "spearman" else v <= t[k]))
        for k, v in got.items()
    }
    return out
