"""Section M: exaplan's own runtime on lent GPUs, held out (the data, what each case tests and
its evidence: calibration/data/published/exaplan-own-gpu.yaml; the record:
calibration/published_schema.py).

    own_gpu_runs()             section M as PublishedRun, in the file's order
    CASES                      case -> (card, plan, sequence, global batch, micro-batch, model)
    evidence_file(case, mode)  the run's measurement, docs/gpu/<this>
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field

from calibration.published_files import DATA_DIR, Citation, PublishedDataError, read_yaml, validated
from calibration.published_schema import PublishedLayout, PublishedRun
from planner.presets import get_model
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import PosInt, Precision, Spec

FILE = DATA_DIR / "exaplan-own-gpu.yaml"
Mode = Literal["compile", "eager", "jax"]


class Card(Spec):
    machine: str = Field(description="The preset the card is predicted on.")
    part: str = Field(description="What the preset describes and what the lent card is.")


class Case(Spec):
    card: str
    plan: str = Field(description="plans/gpu/<model>_1x<plan>.yaml")
    seq_len: PosInt
    global_batch: PosInt
    micro_batch: PosInt
    model: str = Field(description="A model preset, or a key of the file's models (protein-3.5b's fields overridden).")
    recompute: Recompute = Recompute.none


class Run(Spec):
    case: str
    mode: Mode
    median_step_s: float = Field(gt=0)
    evidence: str = Field(min_length=1, description="docs/gpu/<evidence>")


class OwnFile(Spec):
    citation: Citation
    software: dict[Literal["torch", "jax"], str]
    notes: dict[Literal["torch", "jax", "compile", "eager", "jax-mode"], str]
    cards: dict[str, Card]
    models: dict[str, dict[str, str | int]] = Field(default_factory=dict)
    cases: dict[str, Case]
    runs: list[Run] = Field(min_length=1)


@lru_cache(maxsize=1)
def own_file() -> OwnFile:
    data = validated(OwnFile, read_yaml(FILE), FILE.name)
    for i, run in enumerate(data.runs, 1):
        if run.case not in data.cases:
            raise PublishedDataError(f"{FILE.name}: run {i} ({run.case} {run.mode}): case: {run.case!r} is not in cases")
    for name, case in data.cases.items():
        if case.card not in data.cards:
            raise PublishedDataError(f"{FILE.name}: case {name}: card: {case.card!r} is not in cards")
    return data


CASES = {name: (c.card, c.plan, c.seq_len, c.global_batch, c.micro_batch, c.model) for name, c in own_file().cases.items()}


def evidence_file(case: str, mode: str) -> str:
    """The case's measurement, docs/gpu/<this>."""
    return next(r.evidence for r in own_file().runs if (r.case, r.mode) == (case, mode))


def case_model(case: str):
    """The model a case ran: its preset, or the file's override of protein-3.5b, at the case's sequence."""
    data = own_file()
    c = data.cases[case]
    base = get_model("protein-3.5b") if c.model in data.models else get_model(c.model)
    return base.model_copy(update={**data.models.get(c.model, {}), "seq_len": c.seq_len})


def _run(data: OwnFile, run: Run) -> PublishedRun:
    case = data.cases[run.case]
    card = data.cards[case.card]
    jax = run.mode == "jax"
    notes = data.notes
    return PublishedRun(
        id=f"M-{case.model}-{run.case}-{run.mode}", section="M",
        source=f"{data.citation.title}, {data.software['jax' if jax else 'torch']}: docs/gpu/{run.evidence}",
        model=case_model(run.case), machine=card.machine, framework="fsdp", gpus=1,
        layout=PublishedLayout(dp=1, sharding=Sharding.none, micro_batch=case.micro_batch,
                               global_batch=case.global_batch, recompute=case.recompute),
        precision=Precision.bf16, torch_blocks=None if jax else "compiled" if run.mode == "compile" else "eager",
        exaplan_runtime=True, jax_backend=jax,
        figure=round(case.global_batch * case.seq_len / run.median_step_s, 1), kind="tokens_per_s_per_gpu",
        flop_convention="none", assumed=[],
        note=f"{notes['jax' if jax else 'torch']} Machine {card.machine} ({card.part}). "
             + notes["jax-mode" if jax else run.mode] + f" Median step {run.median_step_s} s.",
    )


@lru_cache(maxsize=1)
def _own_runs() -> tuple[PublishedRun, ...]:
    data = own_file()
    return tuple(_run(data, run) for run in data.runs)


def own_gpu_runs() -> list[PublishedRun]:
    """Section M as PublishedRun (held out: calibration.published.held_out_runs)."""
    return [r.model_copy(deep=True) for r in _own_runs()]
