"""The training job: batch, sequence length, precision, token budget, workload (pretraining or
DPO) and the framework it runs with.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.schema.bounds import MAX_BATCH, MAX_SEQ_LEN, MAX_TOKENS, Spec
from planner.schema.framework import FrameworkProfile, job_refusals
from planner.schema.machine import Precision


class Workload(str, Enum):
    pretrain = "pretrain"
    dpo = "dpo"  # preference tuning (Rafailov et al. 2023): a global batch of (chosen, rejected) pairs


class Reference(str, Enum):
    in_step = "in-step"  # a frozen reference model's forward passes run in every step
    precomputed = "precomputed"  # its log-probabilities were computed once and stored with the pairs


class TrainingJob(Spec):
    """What to train: batch held fixed, sequence length, precision, token budget."""

    global_batch: Annotated[int, Field(gt=0, le=MAX_BATCH)] = Field(
        description="Sequences per optimizer step (dpo: pairs); never changed by the search.")
    seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] = Field(description="Tokens per sequence.")
    precision: Precision = Field(Precision.bf16, description="Compute precision; accumulation and reduction are fp32.")
    optimizer: Literal["adamw"] = Field("adamw", description="Optimizer (AdamW: two fp32 moments per parameter).")
    workload: Workload = Field(Workload.pretrain, description="pretrain, or dpo (each sample a chosen and a rejected sequence).")
    reference: Reference = Field(
        Reference.in_step, description="dpo: the frozen reference model runs in every step (in-step: its forward "
                                       "passes and its parameters count), or its log-probabilities were precomputed."
    )
    token_budget: float = Field(1e9, gt=0, le=MAX_TOKENS, description="Tokens to train on, for time-to-train.")
    framework: FrameworkProfile = Field(default_factory=FrameworkProfile,
                                        description="The training software (default: exaplan's own runtime).")

    @model_validator(mode="after")
    def _check_precision(self) -> "TrainingJob":
        if self.precision not in self.framework.precisions:
            raise ValueError(f"precision: {precision_message(self.precision, self.framework)}")
        problems = job_refusals(self.framework, self.workload.value, self.reference.value)
        if problems:
            raise ValueError(problems[0].removeprefix("job."))
        return self

    @property
    def sequences_per_sample(self) -> int:
        """Sequences the policy runs per sample of the global batch: 2 for a dpo pair."""
        return 2 if self.workload == Workload.dpo else 1

    @property
    def reference_in_step(self) -> bool:
        return self.workload == Workload.dpo and self.reference == Reference.in_step

    @property
    def tokens_per_step(self) -> int:
        """Tokens the policy trains on per step (dpo: both sequences of every pair)."""
        return self.global_batch * self.sequences_per_sample * self.seq_len


def precision_message(precision: Precision | str, framework: FrameworkProfile) -> str:
    """Why a job of this precision cannot run with this framework."""
    return (f"{Precision(precision).value} is not one the framework {framework.name} trains in "
            f"({', '.join(p.value for p in framework.precisions)})")
