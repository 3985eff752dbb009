"""`exaplan validate --published --loo` states the issue's targets against the leave-one-out
errors (calibration/validate_published.py loo_targets)."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from rich.console import Console

from calibration.validate_published import LOO_TARGETS, loo_targets, published_json, render_published, validate_published


def test_the_targets_line_says_which_are_met_and_which_rows_break_the_maximum():
    """`validate --published --loo` states the issue's targets (median <= 3%, max <= 10%, at
    least 25 rows) against the leave-one-out errors, naming the rows past the maximum."""
    rows = validate_published()[:26]
    assert loo_targets(rows) is None and "targets" not in published_json(rows)
    errs = [0.01] * 20 + [0.02, -0.025, 0.05, 0.08, -0.203, 0.115]
    rows = [dataclasses.replace(r, loo_error=e) for r, e in zip(rows, errs)]
    t = loo_targets(rows)
    assert t["median"]["met"] and t["median"]["value"] == pytest.approx(0.01)
    assert not t["max"]["met"] and t["max"]["value"] == pytest.approx(0.203)
    assert list(t["max"]["rows_over"].values()) == [-0.203, 0.115]
    assert t["rows"] == {"target": LOO_TARGETS["rows"], "value": 26, "met": True}
    out = io.StringIO()
    render_published(rows, Console(file=out, width=400))
    line = next(x for x in out.getvalue().splitlines() if x.startswith("targets:"))
    assert "(20.3%: NOT met: " in line and f"{rows[-2].id} -20.3%, {rows[-1].id} +11.5%" in line
    assert "(1.0%: met)" in line and "(26: met)" in line
    assert json.loads(json.dumps(published_json(rows)))["targets"]["max"]["met"] is False
