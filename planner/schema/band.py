"""One machine's own step-time interval, measured by its calibration (`exaplan calibrate
--from-runs`, and so `calibrate --arrival`): refitted without each layout it ran, each run
predicted by a fit that never saw its layout, and the 80% conformal bound of those errors
(machine_models/uncertainty.py conformal_bound). Where a machine carries one, it stands in for
its device kind's half of every interval (uncertainty.py uncertainty_of; the framework's half
stays): a CPU or a new GPU cluster has no published rows, and its own runs are the
out-of-sample errors that speak for its figures."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class StepTimeBand(BaseModel):
    """A machine's step-time interval from its own calibration runs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    half_width: Annotated[float, Field(gt=0, le=1)] = Field(
        description="Relative half-width: the true step time lies within predicted x (1 +/- this) for about 80% of "
                    "layouts, from the leave-one-layout-out errors of the calibration runs (at most 1, as every interval's).")
    runs: Annotated[int, Field(ge=1, le=100000)] = Field(description="Layouts the bound comes from.")
    basis: str = Field("", max_length=8192, description="The runs and the command that measured them.")
