"""The physical bounds of every spec's figures, the field types built on them, and `Spec`, the
base of every spec (planner/schema/specs.py lists the specs).

Every figure carries its unit in its name; every spec forbids unknown fields.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


PosInt = Annotated[int, Field(gt=0)]
PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
# Efficiencies divide a time: above zero (0 would make every step last forever).
Efficiency = Annotated[float, Field(gt=0, le=1)]

from planner.schema.limits import (MAX_BATCH, MAX_COUNT, MAX_NAME, MAX_NODES, MAX_RATE, MAX_SEQ_LEN,  # noqa: F401
                                    MAX_SIZE_GIB, MAX_TEXT, MAX_TIME, MAX_TOKENS, MAX_WIDTH)

Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
Rate = Annotated[float, Field(gt=0, le=MAX_RATE)]
Time = Annotated[float, Field(ge=0, le=MAX_TIME)]
PosTime = Annotated[float, Field(gt=0, le=MAX_TIME)]
# Names print in reports and job scripts: printable, no control characters, bounded.
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=r"^[^\x00-\x1f\x7f]+$")]
Text = Annotated[str, Field(max_length=MAX_TEXT, pattern=r"^[^\x00-\x08\x0b-\x1f\x7f]*$")]


class Spec(BaseModel):
    """Base of every spec: strict about unknown fields, validated on assignment, every float
    finite (inf and nan refused naming the field)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)
