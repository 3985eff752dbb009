"""The JSON files calibration reads (a run's summary.json and metrics.jsonl, a kernels file of
benchmarks/gpu_kernels.py), bounded like every other input: `read_text` (planner/schema/files.py)
refuses a device, a FIFO, a directory, a binary file or one over 64 MiB, and `check_json_nesting`
refuses a document nested deeper than MAX_NESTING levels before `json.loads` builds it (json,
like PyYAML, builds nested values recursively: ~900 levels end in a RecursionError)."""

from __future__ import annotations

import json
import re
from typing import Any

from planner.schema.errors import PlanError
from planner.schema.files import MAX_NESTING

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def check_json_nesting(text: str, field: str, max_depth: int = MAX_NESTING) -> None:
    """PlanError naming `field` when the JSON text opens more than `max_depth` arrays and
    objects inside one another (brackets inside strings do not count); malformed JSON is left
    to json.loads."""
    if text.count("[") + text.count("{") <= max_depth:
        return  # cannot nest deeper: the common case, one pass in C
    depth, bare = 0, _STRING.sub('""', text)  # JSON strings hold no raw newline: the lines stay
    for m in _BRACKET.finditer(bare):
        if m.group() in "[{":
            depth += 1
            if depth > max_depth:
                line = bare.count("\n", 0, m.start()) + 1
                raise PlanError(f"nested more than {max_depth} levels deep (line {line}); no exaplan file needs more "
                                "than a few", field=field)
        else:
            depth -= 1


def loads(text: str, field: str) -> Any:
    """json.loads of `text` with its nesting bounded (PlanError naming `field`); malformed JSON
    raises json.JSONDecodeError (a ValueError) as json.loads does."""
    check_json_nesting(text, field)
    try:
        return json.loads(text)
    except RecursionError:
        raise PlanError(f"nested too deeply (over {MAX_NESTING} levels)", field=field) from None
