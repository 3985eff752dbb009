"""The published training runs exaplan is calibrated on and checked against: data files, one per
published source, in calibration/data/published/ (read by calibration/published_files.py; the
record and its conventions: calibration/published_schema.py).

    published_runs()   the calibration set, fitted and predicted by `exaplan validate --published`:
                       A Megatron-LM README (DGX H100), B Korthikanti et al. 2022 (DGX A100),
                       C llm-foundry H100, D fms-fsdp A100, H llm-foundry A100, I LUMI's MI250X
                       (Megatron-DeepSpeed), K Aurora's Max 1550 (Megatron-DeepSpeed)
    held_out_runs()    published rows never fitted, only predicted: A's strong-scaling end points,
                       F torchtitan on H100, G BLOOM-176B, I torchtitan on Frontier, J Apertus on
                       GH200, M exaplan's own runtime on lent GPUs (calibration/published_own.py),
                       N NVIDIA's DGX Cloud recipes (NeMo), L llm-foundry's whole tables
                       (calibration/published_foundry.py)
    section_runs(s)    every row of section `s`, fitted and held out, in file order

Why a row is held out is said in its file: its machine preset only stands in for the hardware
it ran on, its figure was not stable, its device kind borrows another's figures, or it checks a
profile where nothing was fitted.
"""

from __future__ import annotations

from calibration.published_files import PublishedDataError, shipped_runs
from calibration.published_foundry import foundry_runs
from calibration.published_own import own_gpu_runs
from calibration.published_schema import (  # noqa: F401 - the record's API, re-exported
    FRAMEWORK_SHARDINGS, FRAMEWORKS, PROFILE_OF, UNITS, FigureKind, FlopConvention, Framework, PublishedLayout,
    PublishedRun,
)

# The data files in the order their rows are fitted and predicted.
FILES = (
    "megatron-lm-readme.yaml",          # A
    "korthikanti-2022.yaml",            # B
    "llm-foundry-h100.yaml",            # C
    "fms-fsdp-a100.yaml",               # D
    "torchtitan-h100.yaml",             # F (held out)
    "bloom-176b.yaml",                  # G (held out)
    "llm-foundry-a100.yaml",            # H
    "lumi-llm-scaling.yaml",            # I, LUMI
    "frontier-torchtitan.yaml",         # I, Frontier (held out)
    "apertus-gh200.yaml",               # J (held out)
    "aurora-megatron-deepspeed.yaml",   # K
    "exaplan-own-gpu.yaml",             # M (held out)
    "dgxc-benchmarking-nemo.yaml",      # N (held out)
    "llm-foundry-tables.yaml",          # L (held out)
)
# Files of their own form, read by their own module; every row held out.
READERS = {"exaplan-own-gpu.yaml": own_gpu_runs, "llm-foundry-tables.yaml": foundry_runs}


def all_runs() -> list[tuple[PublishedRun, bool]]:
    """(record, held out) of every row of every file, in FILES order (fresh records);
    PublishedDataError where an id is a row of two files."""
    out, owner = [], {}
    for name in FILES:
        rows = [(r, True) for r in READERS[name]()] if name in READERS else shipped_runs((name,))
        for run, held in rows:
            if owner.setdefault(run.id, name) != name:
                raise PublishedDataError(f"{name}: row {run.id}: id: already a row of {owner[run.id]}")
            out.append((run.model_copy(deep=True), held))
    return out


def published_runs() -> list[PublishedRun]:
    """The calibration set, in file order (a fresh list of fresh records)."""
    return [run for run, held in all_runs() if not held]


def held_out_runs() -> list[PublishedRun]:
    """Published rows that no fit sees, predicted to check the model where it was not fitted
    (section L, llm-foundry's whole tables, last)."""
    return [run for run, held in all_runs() if held]


def section_runs(section: str) -> list[PublishedRun]:
    """Every row of `section` (fitted and held out), in file order."""
    return [run for run, _ in all_runs() if run.section == section]
