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

# Physical bounds: every figure is finite (no inf or nan anywhere: Spec's allow_inf_nan) and at
# most these, far past any machine or model built or announced, so that no arithmetic of the
# cost model overflows and a typo (1e30 tokens per sequence) is refused naming its field.
MAX_COUNT = 2**20  # layers, heads, devices per node, NICs per node, ... (1,048,576)
MAX_WIDTH = 2**22  # hidden, ffn_hidden, vocabulary (4,194,304)
MAX_SEQ_LEN = 2**26  # tokens per sequence (67,108,864)
MAX_BATCH = 2**30  # sequences per optimizer step
MAX_NODES = 2**24  # nodes of one system (16,777,216)
MAX_TOKENS = 1e18  # token budget
MAX_RATE = 1e9  # TFLOP/s per device, GB/s, Gbit/s per NIC (a million times today's)
MAX_SIZE_GIB = 2.0**30  # GiB per device (an exbibyte)
MAX_TIME = 1e9  # latencies (us), overheads (us or s)
MAX_NAME = 256  # characters of a name
MAX_TEXT = 8192  # characters of a description

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
