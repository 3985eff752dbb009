"""The published runs as data (calibration/data/published/*.yaml, calibration/published_files.py):
`exaplan validate --published --json` gives exactly the committed results
(docs/results/validate-published.json), and the loader refuses a bad file with one message
naming the file, the row and the field.

The committed file is regenerated with
    exaplan validate --published --json > docs/results/validate-published.json
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from calibration import published
from calibration.published_files import DATA_DIR, PublishedDataError, file_runs, load_runs
from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "validate-published.json"


def _same(a, b, path="$"):
    """Equal JSON values, floats to 1e-9 (what another libm may differ by), else the first difference."""
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        return None if ok else f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a.keys() ^ b.keys())} differ"
        return next((d for k in a if (d := _same(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _same(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {a!r} != {b!r}"


def test_validate_published_json_equals_the_committed_results(capsys):
    """The committed results are the command's output (it has no volatile field: no wall time):
    rows, predictions and summaries do not move unless the file is regenerated with them."""
    assert main(["validate", "--published", "--json"]) == 0
    fresh = json.loads(capsys.readouterr().out)
    committed = json.loads(RESULTS.read_text())
    diff = _same(fresh, committed)
    assert diff is None, f"{diff}; regenerate: exaplan validate --published --json > docs/results/validate-published.json"


def test_every_file_cites_its_source_and_every_row_is_loaded():
    files = sorted(DATA_DIR.glob("*.yaml"))
    assert {f.name for f in files} == set(published.FILES)
    for f in files:
        citation = yaml.safe_load(f.read_text())["citation"]
        assert citation["title"] and (citation.get("url") or citation.get("reference")), f.name
        if "github.com" in (citation.get("url") or ""):
            assert citation.get("licence"), f"{f.name}: a repository's figures name its licence"
    runs = published.all_runs()
    assert len({r.id for r, _ in runs}) == len(runs) == len(published.published_runs()) + len(published.held_out_runs())


def test_the_notes_narrate_no_history():
    for f in DATA_DIR.glob("*.yaml"):
        text = f.read_text().lower()
        for word in ("issue-10-log", "session", "sitting"):
            assert word not in text, (f.name, word)


# --- refusals -------------------------------------------------------------------------------

GOOD = {
    "citation": {"title": "A test table", "url": "https://example.org/table"},
    "defaults": {"section": "Z", "machine": "dgx-h100", "framework": "fsdp", "kind": "tokens_per_s_per_gpu",
                 "layout": {"sharding": "fsdp", "micro_batch": 1}},
    "models": {"tiny": {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 1024, "seq_len": 512}},
    "rows": [{"id": "Z-one", "model": "tiny", "gpus": 8, "layout": {"dp": 8, "global_batch": 8}, "figure": 1000.0,
              "assumed": ["layout.micro_batch"], "note": "Row one."},
             {"id": "Z-two", "model": "tiny", "gpus": 16, "layout": {"dp": 16, "global_batch": 16}, "figure": 900.0,
              "held_out": True}],
}


def _write(tmp_path: Path, data: dict, name: str = "test.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _with(change) -> dict:
    data = json.loads(json.dumps(GOOD))
    change(data)
    return data


def test_a_good_file_loads_with_its_defaults_models_and_citation(tmp_path):
    (one, held_one), (two, held_two) = file_runs(_write(tmp_path, GOOD))
    assert (one.id, held_one, two.id, held_two) == ("Z-one", False, "Z-two", True)
    assert one.model.name == "tiny" and one.layout.sharding.value == "fsdp" and two.layout.dp == 16
    assert one.source == "A test table, https://example.org/table" and one.note == "Row one."
    assert one.assumed == ["layout.micro_batch"] and two.assumed == []


@pytest.mark.parametrize("change, names", [
    (lambda d: d["rows"][0].update(flops=1.0), ["row Z-one", "flops", "Extra inputs are not permitted"]),
    (lambda d: d["rows"][1]["layout"].update(pipeline=2), ["row Z-two", "layout.pipeline"]),
    (lambda d: d["rows"][0].update(figure="fast"), ["row Z-one", "figure"]),
    (lambda d: d["rows"][0].update(gpus=4), ["row Z-one", "published GPUs 4"]),
    (lambda d: d["rows"][0].update(model="huge"), ["row Z-one", "model", "'huge'"]),
    (lambda d: d["rows"][0].update(held_out="yes"), ["row Z-one", "held_out"]),
    (lambda d: d.pop("citation"), ["citation", "Field required"]),
    (lambda d: d["citation"].pop("url"), ["citation", "url or a reference"]),
    (lambda d: d["rows"][1].update(id="Z-one"), ["row Z-one", "id", "already"]),
    (lambda d: d.update(rows=[]), ["rows"]),
], ids=["unknown-field", "unknown-layout-field", "wrong-type", "inconsistent", "unknown-model", "held-out-type",
        "no-citation", "citation-without-url", "duplicate-id", "no-rows"])
def test_a_bad_file_is_refused_naming_file_row_and_field(tmp_path, change, names):
    with pytest.raises(PublishedDataError) as err:
        file_runs(_write(tmp_path, _with(change)))
    message = str(err.value)
    assert message.startswith("test.yaml") and "\n" not in message
    for name in names:
        assert name in message, message


def test_an_id_in_two_files_is_refused(tmp_path):
    first = _write(tmp_path, GOOD, "first.yaml")
    second = _write(tmp_path, _with(lambda d: d.update(rows=d["rows"][1:])), "second.yaml")
    with pytest.raises(PublishedDataError, match=r"second.yaml: row Z-two: id: already a row of first.yaml"):
        load_runs([first, second])


def test_a_file_that_is_not_yaml_is_refused(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("rows: [unclosed\n")
    with pytest.raises(PublishedDataError, match="broken.yaml"):
        file_runs(path)
