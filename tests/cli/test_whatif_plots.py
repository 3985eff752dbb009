"""exaplan whatif --plots DIR (the PNGs of report.plots.save_plots, each written to a temporary
file and renamed; exit 2 naming plots when DIR cannot be made), and one real sweep with every
output at once: the HTML report parses and every plot in it is a non-empty PNG, the same plots
are saved by --plots, and the CSV and the JSON carry the same points, field by field."""

from __future__ import annotations

import base64
import csv
import errno
import json
import math
from html.parser import HTMLParser

import pytest

from cli.main import main
from planner.whatif import WhatifPoint

PNG = b"\x89PNG\r\n\x1a\n"
SWEEP = ["whatif", "--model", "protein-small", "--machine", "dgx-h100,local", "--nodes", "1:4", "--tokens", "1e9",
         "--vary", "machine.nic_gbit_s=x1,x2", "--vary", "model.layers=6,12"]  # local: 1 node, no power: section
ONE = ["whatif", "--model", "protein-small", "--machine", "dgx-h100", "--nodes", "1:4", "--tokens", "1e9"]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


class Doc(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.imgs, self.rows, self.text = [], [], 0, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.rows += tag == "tr"
        if tag == "img":
            self.imgs.append(dict(attrs).get("src") or "")

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def every_output(tmp_path_factory):
    """One sweep with --json, --csv, --report and --plots (two varied fields: all three plots)."""
    d = tmp_path_factory.mktemp("whatif")
    paths = dict(csv=d / "points.csv", report=d / "r.html", plots=d / "plots" / "new")
    rc = main([*SWEEP, "--json", "--csv", str(paths["csv"]), "--report", str(paths["report"]),
               "--plots", str(paths["plots"])])
    assert rc == 0
    return paths


def test_the_report_parses_and_every_plot_is_a_non_empty_png(every_output, capsys):
    html = every_output["report"].read_text(encoding="utf-8")
    doc = Doc()
    doc.feed(html)
    doc.close()
    assert doc.tags[:2] == ["html", "head"] and "body" in doc.tags and "script" not in doc.tags
    assert len(doc.imgs) == 3  # scaling, Pareto, heat map (two varied fields)
    for src in doc.imgs:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png.startswith(PNG) and len(png) > 1000
    text = "".join(doc.text)
    assert "No heat map" not in text and "exaplan whatif --model protein-small" in text
    assert doc.rows >= 2 * 3 * 2 * 2  # every point has a row (machines x nodes x nic x layers), plus the other tables


def test_plots_saves_the_same_plots_as_the_report(every_output):
    files = sorted(every_output["plots"].iterdir())
    assert [f.name for f in files] == ["heatmap.png", "pareto.png", "scaling.png"]  # no temporary file left
    doc = Doc()
    doc.feed(every_output["report"].read_text(encoding="utf-8"))
    embedded = [base64.b64decode(src.split(",", 1)[1]) for src in doc.imgs]
    saved = [(every_output["plots"] / f"{name}.png").read_bytes() for name in ("scaling", "pareto", "heatmap")]
    assert saved == embedded and all(png.startswith(PNG) and len(png) > 1000 for png in saved)


def _same(csv_cell: str, json_value) -> bool:
    if json_value is None:
        return csv_cell == ""
    if isinstance(json_value, bool):
        return csv_cell == str(json_value)
    if isinstance(json_value, float):
        return float(csv_cell) == json_value or (math.isnan(float(csv_cell)) and math.isnan(json_value))
    if isinstance(json_value, int):
        return int(csv_cell) == json_value
    return csv_cell == str(json_value)


def test_csv_and_json_carry_the_same_points_field_by_field(every_output, capsys):
    rc, out, _ = run(capsys, *SWEEP, "--json")
    assert rc == 0
    points = json.loads(out)["points"]
    rows = list(csv.DictReader(every_output["csv"].open()))
    assert len(rows) == len(points) == 2 * 3 * 2 * 2
    fields = set(WhatifPoint.__dataclass_fields__) - {"varied"}
    assert set(rows[0]) == fields | {"vary:machine.nic_gbit_s", "vary:model.layers"}
    for p, r in zip(points, rows):
        for k in fields:
            assert _same(r[k], p[k]), (k, r[k], p[k])
        assert {k: r["vary:" + k] for k in p["varied"]} == p["varied"]
    assert any(p["energy_kwh"] is None for p in points if p["fits"])  # local has no power: section
    assert any(not p["fits"] for p in points) and all(p["fits"] or p["reason"] for p in points)


def test_plots_in_the_table_output(capsys, tmp_path):
    rc, out, err = run(capsys, *ONE, "--plots", str(tmp_path / "p"))
    assert rc == 0 and err == ""
    assert f"plots in {tmp_path / 'p'}: scaling.png, pareto.png" in out
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["pareto.png", "scaling.png"]  # nothing varied


@pytest.mark.parametrize("where", ["blocker", "blocker/sub", "blocker/sub/deeper"])
def test_plots_dir_that_cannot_be_made_is_exit_2_naming_plots_and_nothing_written(capsys, tmp_path, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    rc, out, err = run(capsys, *SWEEP, "--plots", str(tmp_path / where), "--csv", str(tmp_path / "c.csv"),
                       "--report", str(tmp_path / "r.html"))
    assert rc == 2 and out == ""
    assert err.startswith("exaplan whatif: error: plots: cannot create the directory ") and err.count("\n") == 1
    assert f"{blocker} is not a directory" in err
    assert list(tmp_path.iterdir()) == [blocker] and blocker.read_text() == "a file, not a directory"


def test_a_failure_while_saving_is_exit_2_and_leaves_the_previous_plots_whole(capsys, tmp_path, monkeypatch):
    import report.plots as rp

    argv = [*ONE, "--plots", str(tmp_path)]
    assert run(capsys, *argv)[0] == 0
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    real = rp.write_atomic

    def half_then_full():
        yield b"\x89PNG half a file"
        raise OSError(errno.ENOSPC, "No space left")

    def full_disk(path, chunks):
        real(path, half_then_full() if path.name == "pareto.png" else chunks)

    monkeypatch.setattr(rp, "write_atomic", full_disk)
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and "give --force" in err  # the earlier plots are kept without --force
    rc, out, err = run(capsys, *argv, "--force")
    assert rc == 2 and out == ""
    assert err == f"exaplan whatif: error: plots: cannot write the plots in {tmp_path}: No space left\n"
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before  # whole, no temporary file left
