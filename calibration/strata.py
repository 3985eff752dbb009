"""The strata a published row belongs to, and how often the held-out rows of each fall inside
the interval a plan would show: where the intervals know what they do not know, and where
they do not.

A row's strata are its device kind, framework, data-parallel sharding, whether it pipelines,
and bands of world size, sequence length and model size: the directions in which a query can
lie away from the fitted rows. `exaplan validate --published` reports the coverage of the
80% intervals per stratum over the held-out rows (never fitted) and marks every stratum of at
least MIN_STRATUM_ROWS rows below MIN_COVERAGE.
"""

from __future__ import annotations

import numpy as np

STRATA = ("device", "framework", "sharding", "pipeline", "world", "seq_len", "model_size")
MIN_STRATUM_ROWS = 10   # a stratum this large is held to MIN_COVERAGE
MIN_COVERAGE = 0.70     # issue target: at least 70% inside in every stratum of >= 10 rows

_WORLD = ((1, "1"), (8, "2-8"), (64, "9-64"), (512, "65-512"), (4096, "513-4,096"))
_SEQ = ((4095, "< 4k"), (8191, "4k-8k"))
_PARAMS = ((1e9, "< 1B"), (1e10, "1B-10B"), (1e11, "10B-100B"))


def _band(value: float, bands: tuple, last: str) -> str:
    return next((name for bound, name in bands if value <= bound), last)


def strata_of(device: str, framework: str, sharding: str, pp: int, gpus: int, seq_len: int, params: float) -> dict[str, str]:
    """The stratum of each dimension, as names."""
    return {"device": device, "framework": framework, "sharding": sharding, "pipeline": "pp > 1" if pp > 1 else "no pp",
            "world": "1 GPU" if gpus == 1 else _band(gpus, _WORLD, "> 4,096") + " GPUs", "seq_len": _band(seq_len, _SEQ, ">= 8k"),
            "model_size": _band(params, _PARAMS, ">= 100B")}


def coverage_by_stratum(rows) -> dict[str, dict[str, dict]]:
    """Per dimension and stratum: rows, the fraction inside their interval, and whether the
    stratum is held to MIN_COVERAGE and meets it (rows without an interval are left out)."""
    out: dict[str, dict[str, dict]] = {}
    for dim in STRATA:
        by: dict[str, list[bool]] = {}
        for r in rows:
            if r.inside_interval is not None and r.strata:
                by.setdefault(r.strata[dim], []).append(bool(r.inside_interval))
        out[dim] = {}
        for name in sorted(by, key=lambda k: (-len(by[k]), k)):
            inside = float(np.mean(by[name]))
            held = len(by[name]) >= MIN_STRATUM_ROWS
            out[dim][name] = {"rows": len(by[name]), "inside": inside, "held_to_target": held,
                              "meets_target": (not held) or inside >= MIN_COVERAGE}
    return out


def short_strata(coverage: dict[str, dict[str, dict]]) -> list[tuple[str, str, dict]]:
    """The strata held to the target that miss it: (dimension, stratum, figures)."""
    return [(dim, name, s) for dim, part in coverage.items() for name, s in part.items() if not s["meets_target"]]


__all__ = ["MIN_COVERAGE", "MIN_STRATUM_ROWS", "STRATA", "coverage_by_stratum", "short_strata",
           "strata_of"]
