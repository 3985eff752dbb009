"""Published rows with unpublished layout fields, validated by searching only those fields."""

from __future__ import annotations

import json

from calibration.published import held_out_runs, published_runs
from calibration.search_unstated import SEARCHABLE, search_unstated, stated_pins
from calibration.validate_published import validate_searched
from cli.main import main
from machine_models import load_machine


def test_pins_keep_what_the_source_published_and_free_what_it_did_not():
    for run in published_runs():
        pins = stated_pins(run)
        free = {SEARCHABLE[a] for a in run.assumed if a in SEARCHABLE}
        if not free:
            assert pins is None
            continue
        given = pins.given()
        assert not free & set(given), run.id
        assert given["tp"] == run.layout.tp and given["pp"] == run.layout.pp and given["dp"] == run.layout.dp


def test_the_search_keeps_the_published_fields():
    run = next(r for r in published_runs() if r.id == "C-mpt-30b")
    row = search_unstated(run, load_machine(run.machine))
    assert row is not None and row.free == ["mbs", "recompute"]
    assert row.layout.startswith("dp32 fsdp") and row.error is not None and abs(row.error) < 0.5


def test_validate_lists_every_row_with_searchable_fields(capsys):
    """Fitted rows and the held-out rows listed one by one (section L, summarised, is not
    searched); the table prints both."""
    searched = validate_searched()
    listed = published_runs() + [r for r in held_out_runs() if r.section != "L"]
    expected = {r.id for r in listed if any(a in SEARCHABLE for a in r.assumed)}
    assert {s.id for s in searched} == expected
    assert {"A-gpt-32b", "A-gpt-177b-strong-g4608"} <= expected and not any(i.startswith("L-") for i in expected)
    assert main(["validate", "--published", "--search-unstated"]) == 0
    assert "A-gpt-177b-strong-g4608" in capsys.readouterr().out
    assert main(["validate", "--published", "--search-unstated", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {s["id"] for s in data["searched_unstated"]} == expected
