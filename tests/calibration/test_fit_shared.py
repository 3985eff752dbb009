"""Figures that device kinds share in the published-run fit (calibration/fit_figures.py
SHARED_FIGURES): one parameter for the family, every kind of it carrying its value."""

from __future__ import annotations

import numpy as np
import pytest

from calibration import fit_published as cal
from calibration.published import published_runs

H100, A100 = "NVIDIA H100 SXM5", "NVIDIA A100 SXM4"


def _problem(prefixes):
    runs = [r for r in published_runs() if r.id.startswith(prefixes)]
    return cal._Problem.of(runs, cal.StepTimes(cal.machines_of(runs)))


def test_nvidia_kinds_fit_one_elementwise_fraction():
    p = _problem(("A-", "B-"))  # Megatron on H100 (A) and on A100 (B)
    assert (H100, "elementwise_efficiency") in p.params
    assert (A100, "elementwise_efficiency") not in p.params
    assert (A100, "peak_fraction") in p.params  # the other figures stay the kind's own
    x = p.x0()
    i = p.params.index((H100, "elementwise_efficiency"))
    x[i] = 0.42
    fit = p.unpack(x)
    assert fit.device[A100]["elementwise_efficiency"] == fit.device[H100]["elementwise_efficiency"] == pytest.approx(0.42)
    assert set(fit.device[A100]) == set(cal.DEVICE_FIGURES)
    assert cal.shared_notes(fit) == {A100: [f"elementwise_efficiency shared with {H100} (one figure: SHARED_FIGURES)"]}


def test_a_family_member_alone_holds_its_own_figure():
    """A fit without H100 rows (a leave-one-out fold could be one) fits A100's figure itself."""
    p = _problem(("B-",))
    assert (A100, "elementwise_efficiency") in p.params
    assert cal.holder(A100, "elementwise_efficiency", [A100]) == A100
    assert cal.shared_notes(p.unpack(p.x0())) == {}


def test_moving_the_shared_figure_moves_rows_on_both_kinds():
    """The one parameter reaches the A100 rows too: their predictions change with it."""
    p = _problem(("A-gpt-1.7b", "B-gpt-22b"))
    x = p.x0()
    i = p.params.index((H100, "elementwise_efficiency"))
    lo, hi = x.copy(), x.copy()
    lo[i], hi[i] = 0.2, 0.8
    moved = np.abs(np.log(p.predicted(hi) / p.predicted(lo)))
    kinds = [p.device_of[r.id] for r in p.runs]
    assert all(moved[k] > 1e-3 for k, kind in enumerate(kinds)), dict(zip(kinds, moved))
    assert {H100, A100} <= set(kinds)
