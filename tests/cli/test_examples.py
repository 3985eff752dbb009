"""The committed example plans load (hash intact) and are what their header command makes."""

import math

import pytest

from cli.examples import EXAMPLES, PLANS_DIR, regenerate
from planner.schema.plan import load_plan

# numpy's transcendental kernels (exp, log, power) take SIMD paths that differ by an ulp or
# two between CPUs (AVX-512 against AVX2), so a plan regenerated on another machine may differ
# in the last bits of its floats, and in the content hash over them: that is not staleness.
REL_TOL = 1e-12


def differences(fresh, committed, path="") -> list[str]:
    """Where two dumped plans differ, floats compared to REL_TOL; the content hash is skipped."""
    if isinstance(fresh, dict) and isinstance(committed, dict):
        out = [f"{path}: keys {sorted(set(fresh) ^ set(committed))}"] if set(fresh) != set(committed) else []
        for key in sorted(set(fresh) & set(committed)):
            if path == "provenance" and key == "content_hash":
                continue
            out += differences(fresh[key], committed[key], f"{path}.{key}" if path else key)
        return out
    if isinstance(fresh, list) and isinstance(committed, list) and len(fresh) == len(committed):
        return [d for i, (a, b) in enumerate(zip(fresh, committed)) for d in differences(a, b, f"{path}[{i}]")]
    if (isinstance(fresh, float) and isinstance(committed, (int, float)) and not isinstance(committed, bool)
            and math.isclose(fresh, committed, rel_tol=REL_TOL, abs_tol=1e-300)):
        return []
    return [] if fresh == committed else [f"{path}: {fresh!r} != {committed!r}"]


def test_differences_sees_a_real_change_and_ignores_an_ulp():
    a = {"prediction": {"step_time_s": 1.7742418652017953, "layout": "tp2"}, "provenance": {"content_hash": "x"}}
    ulp = {"prediction": {"step_time_s": 1.7742418652017955, "layout": "tp2"}, "provenance": {"content_hash": "y"}}
    assert differences(ulp, a) == []
    moved = {"prediction": {"step_time_s": 1.7743, "layout": "tp2"}, "provenance": {"content_hash": "x"}}
    assert differences(moved, a) == ["prediction.step_time_s: 1.7743 != 1.7742418652017953"]
    other = {"prediction": {"step_time_s": 1.7742418652017953, "layout": "tp4"}, "provenance": {"content_hash": "x"}}
    assert differences(other, a) == ["prediction.layout: 'tp4' != 'tp2'"]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_committed_plan_is_current(name, tmp_path):
    committed = load_plan(PLANS_DIR / name)
    header = (PLANS_DIR / name).read_text().splitlines()[1]
    assert header == f"# Regenerate with: exaplan plan {EXAMPLES[name]} -o plans/{name}"
    fresh = load_plan(regenerate(name, tmp_path))
    stale = differences(fresh.model_dump(mode="json"), committed.model_dump(mode="json"))
    assert not stale, f"plans/{name} is stale: run `make plans` and commit the result ({stale[:5]})"
