"""The committed example plans load (hash intact) and are what their header command makes."""

import pytest

from cli.examples import EXAMPLES, PLANS_DIR, regenerate
from planner.schema.plan import load_plan


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_committed_plan_is_current(name, tmp_path):
    committed = load_plan(PLANS_DIR / name)
    header = (PLANS_DIR / name).read_text().splitlines()[1]
    assert header == f"# Regenerate with: exaplan plan {EXAMPLES[name]} -o plans/{name}"
    fresh = load_plan(regenerate(name, tmp_path))
    assert fresh.model_dump(mode="json") == committed.model_dump(mode="json"), (
        f"plans/{name} is stale: run `make plans` and commit the result")
