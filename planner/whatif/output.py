"""A what-if result as CSV rows (one per point; the same points and fields as the JSON)."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import fields
from pathlib import Path

from planner.whatif.types import WhatifPoint, WhatifResult

VARY_PREFIX = "vary:"


def csv_columns(result: WhatifResult) -> list[str]:
    """The point fields in order, `varied` spread into one column per varied field."""
    varied = list(dict.fromkeys(k for p in result.points for k in p.varied))
    out = []
    for f in fields(WhatifPoint):
        if f.name == "varied":
            out += [VARY_PREFIX + k for k in varied]
        else:
            out.append(f.name)
    return out


def csv_text(result: WhatifResult) -> str:
    cols = csv_columns(result)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for p in result.points:
        row = p.as_json()
        varied = row.pop("varied")
        row.update({VARY_PREFIX + k: v for k, v in varied.items()})
        w.writerow({k: _cell(row.get(k)) for k in cols})
    return buf.getvalue()


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def write_csv(result: WhatifResult, path: str | Path, force: bool = True) -> None:
    from planner.schema.files import write_new

    write_new(path, csv_text(result), "the CSV (--csv)", force)
