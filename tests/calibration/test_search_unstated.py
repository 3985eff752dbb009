"""Published rows with unpublished layout fields, validated by searching only those fields."""

from __future__ import annotations

import json

from calibration.published import held_out_runs, published_runs
from calibration.search_unstated import SEARCHABLE, precisions, search_unstated, stated_pins
from calibration.validate_published import predict
from cli.main import main
from machine_models import load_machine


def test_pins_keep_what_the_source_published_and_free_what_it_did_not():
    for run in published_runs():
        pins = stated_pins(run)
        free = {SEARCHABLE[a] for a in run.assumed if a in SEARCHABLE}
        if not free and len(precisions(run)) == 1:
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
    listed = published_runs() + [r for r in held_out_runs() if r.section != "L"]
    expected = {r.id for r in listed if any(a in SEARCHABLE for a in r.assumed) or len(precisions(r)) > 1}
    assert {"A-gpt-32b", "A-gpt-177b-strong-g4608"} <= expected and not any(i.startswith("L-") for i in expected)
    assert main(["validate", "--published", "--search-unstated", "--json"]) == 0  # calibration.validate_published.validate_searched
    data = json.loads(capsys.readouterr().out)
    assert {s["id"] for s in data["searched_unstated"]} == expected
    assert main(["validate", "--published", "--search-unstated"]) == 0
    out = capsys.readouterr().out
    assert "A-gpt-177b-strong-g4608" in out and "\u2026" not in out  # no row id or layout cut short


def test_an_unstated_16_bit_precision_is_searched_as_both():
    """Section A's precision is unstated (the README names none): the search tries bf16 and
    fp16, which Megatron reduces in fp32 and fp16, and keeps the faster; a recorded precision
    is kept as it is."""
    runs = {r.id: r for r in published_runs()}
    assert precisions(runs["A-gpt-32b"]) == ["bf16", "fp16"]
    assert precisions(runs["C-mpt-7b"]) == [runs["C-mpt-7b"].precision]
    run = runs["A-gpt-32b"].model_copy(update={"assumed": ["precision"]})  # the layout pinned whole
    row = search_unstated(run, load_machine(run.machine))
    assert row.free == ["precision"] and row.layout.endswith("| fp16")
    as_recorded = predict(run, load_machine(run.machine))[0]
    assert row.predicted > 1.05 * as_recorded  # half the gradient bytes on its one NIC per rank
