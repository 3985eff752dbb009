"""The what-if report (report/): a self-contained, escaped HTML file with the plots embedded,
written atomically; the Pareto front; the heat map only with two varied fields."""

from __future__ import annotations

import base64
import importlib.util
import json
import dataclasses
import re
from html.parser import HTMLParser

import pytest
from whatif_fakes import HOSTILE, FakeResult, fake_result, point, sweep

from report import plots
from report.plots import _umask
from report.data import knees, pareto_front
from report.whatif import write_report

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def result() -> FakeResult:
    return fake_result()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[FakeResult, str]:
    """The fake result's report, drawn once for the tests that only read it."""
    res = fake_result()
    path = tmp_path_factory.mktemp("report") / "r.html"
    write_report(res, path)
    return res, path.read_text(encoding="utf-8")


class Doc(HTMLParser):
    """Tags, attributes and text of a document, as a browser's parser sees them."""

    def __init__(self):
        super().__init__()
        self.tags, self.attrs, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend((tag, k, v or "") for k, v in attrs)

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> Doc:
    d = Doc()
    d.feed(html)
    d.close()
    return d


def images(doc: Doc) -> list[bytes]:
    out = []
    for tag, k, v in doc.attrs:
        if tag == "img" and k == "src":
            assert v.startswith("data:image/png;base64,"), v[:60]
            out.append(base64.b64decode(v.split(",", 1)[1], validate=True))
    return out


def test_the_report_is_written_self_contained_with_the_plots(result, tmp_path):
    path = tmp_path / "r.html"
    write_report(result, path)
    html = path.read_text(encoding="utf-8")
    doc = parse(html)
    assert "script" not in doc.tags  # no JavaScript, and the hostile name did not become a tag
    for tag, k, v in doc.attrs:
        if k in ("src", "href"):
            assert not re.match(r"\s*(https?:)?//", v), (tag, k, v[:80])
    assert "<link" not in html and "@import" not in html and "url(" not in html
    pngs = images(doc)
    assert len(pngs) >= 2
    for png in pngs:
        assert png.startswith(PNG) and len(png) > 1000
    text = "".join(doc.text)
    assert result.command in text
    assert "No heat map" in text  # nothing varied: skipped with a note
    assert [p.name for p in plots.render(result)] == ["scaling", "pareto", "heatmap"]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # not the temporary file's 0600


def test_hostile_strings_are_escaped_everywhere(written):
    _, html = written
    assert "<script" not in html and "<b>x</b>" not in html
    assert "&lt;script&gt;" in html
    text = "".join(parse(html).text)
    # the parsed text carries the name as written: in the points table, the inputs, the warnings, fastest
    assert text.count(HOSTILE) >= 4 + 1


def test_the_status_table_names_every_device_kind(written):
    result, html = written
    section = html[html.index("<h2>Device kinds</h2>"):html.index("<h2>Warnings</h2>")]
    text = "".join(parse(section).text)
    for kind, status in result.device_status.items():
        assert kind in text and status in text
    assert section.count('class="unfitted"') == 2 and section.count('class="fitted"') == 1


def test_unknown_energy_and_nan_figures_are_shown_as_such(written):
    text = "".join(parse(written[1]).text)
    assert "unknown" in text  # aurora's 16-node point has no energy
    assert "nan" not in text.lower().replace("nanos", "")
    assert "fits nowhere" in text


def test_answers_deadline_fastest_and_knees(written):
    result, html = written
    answers = "".join(parse(html[html.index("<h2>Answers</h2>"):html.index("<h2>Plots</h2>")]).text)
    assert "64 nodes meet 7 days" in answers and "nothing meets 7 days" in answers
    assert "protein-3.5b on frontier" in answers and "64" in answers
    assert knees(result) == {("protein-3.5b", "frontier", ()): 64}


@pytest.mark.parametrize("key", [("protein-3.5b", "frontier", ""), ("protein-3.5b", "frontier"),
                                 "protein-3.5b on frontier", ("protein-3.5b", "frontier", frozenset())])
def test_knee_keys_in_any_reasonable_form(result, key):
    result.knees = {key: 32}
    assert knees(result) == {("protein-3.5b", "frontier", ()): 32}


def test_a_failure_mid_write_leaves_no_file(result, tmp_path, monkeypatch):
    import report.whatif as rw

    def boom(_result):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(rw, "_points", boom)  # after the head, the inputs and the plots were written
    path = tmp_path / "r.html"
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_report(result, path)
    assert list(tmp_path.iterdir()) == []
    path.write_text("the previous report")
    with pytest.raises(RuntimeError):
        write_report(result, path)
    assert path.read_text() == "the previous report" and list(tmp_path.iterdir()) == [path]


def test_the_pareto_front_on_a_hand_made_set():
    def p(days, nh, fits=True):
        return dataclasses.replace(point(nodes=16), days=days, node_hours=nh, fits=fits)

    a, b, c = p(10, 100), p(5, 200), p(2, 400)        # the front: each faster and dearer
    d, e = p(6, 250), p(10, 150)                        # dominated by b and a
    f, g = p(1, 50, fits=False), p(float("nan"), 10)    # does not fit; no figures
    h = p(2, 400)                                       # equal to c: c (first) is kept
    assert pareto_front([d, c, a, e, f, b, g, h]) == [a, b, c]
    assert pareto_front([]) == []
    assert pareto_front([a]) == [a]


def test_the_heat_map_only_with_two_varied_fields(tmp_path):
    two = [{"machine.nic_gbit_s": nic, "machine.device_memory_gib": mem} for nic in ("x0.5", "x1", "x2")
           for mem in ("64", "128")]
    res = FakeResult(points=sweep(varied=two, node_counts=(16, 32)), inputs={}, command="exaplan whatif ...")
    assert plots.heatmap_png(res).startswith(PNG)
    written = plots.save_plots(res, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["heatmap.png", "pareto.png", "scaling.png"]
    assert all(p.read_bytes().startswith(PNG) for p in written)
    write_report(res, tmp_path / "r.html")
    assert len(images(parse((tmp_path / "r.html").read_text()))) == 3

    for varied in ([{"machine.nic_gbit_s": v} for v in ("x0.5", "x2")], None,
                   [{"a": "1", "b": "2", "c": "3"}]):
        res = FakeResult(points=sweep(varied=varied, node_counts=(16, 32)), inputs={}, command="c")
        assert plots.heatmap_png(res) is None
        assert "No heat map" in plots.heatmap_skipped(res)
        assert [p.name for p in plots.save_plots(res, tmp_path / "one")] == ["scaling.png", "pareto.png"]


def test_nothing_fits_still_gives_a_report(tmp_path):
    res = FakeResult(points=[point(fits=False), point(machine="aurora", fits=False)], inputs={"tokens": 1e12},
                     command="exaplan whatif --model protein-70b ...")
    write_report(res, tmp_path / "r.html")
    text = "".join(parse((tmp_path / "r.html").read_text()).text)
    assert "No scaling curves" in text and "No Pareto plot" in text and "fits nowhere" in text


def test_hostile_varied_fields_and_an_empty_sweep(tmp_path):
    two = [{"<i>f</i>$": a, "g&$x$": b} for a in ("<1>", "$2$") for b in ("x0.5", "x2")]
    res = FakeResult(points=sweep(machines=("m$1$",), varied=two, node_counts=(16, 32), model="<m>"),
                     inputs={"<k>": "<v>"}, command="exaplan whatif --vary '<i>f</i>$=<1>,$2$'")
    write_report(res, tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "<i>" not in html and "<1>" not in html and "<m>" not in html and "<k>" not in html
    assert len(images(parse(html))) == 3
    empty = FakeResult(points=[], inputs={}, command="exaplan whatif")
    write_report(empty, tmp_path / "e.html")
    text = "".join(parse((tmp_path / "e.html").read_text()).text)
    assert "0 points" in text and "No heat map" in text
    assert plots.save_plots(empty, tmp_path / "none") == []


def test_group_labels_in_any_form():
    from report.data import varied_label
    from report.whatif import _key_label

    assert varied_label({"a": "x2", "b": "1"}) == varied_label((("a", "x2"), ("b", "1"))) == "a=x2, b=1"
    assert varied_label(("a=x2",)) == "a=x2" and varied_label("a=x2") == "a=x2"
    assert _key_label(("m", "frontier", frozenset({("a", "x2")}))) == "m on frontier [a=x2]"
    assert _key_label(("m", "frontier", ())) == "m on frontier" and _key_label("free text") == "free text"


def test_numbers_in_cells():
    from report.whatif import fmt, fmt_range

    assert fmt(None) == "–" and fmt(None, "unknown") == "unknown"
    assert fmt(float("nan")) == "–" and fmt(float("inf")) == "–"
    assert fmt(1234567.8) == "1,234,568" and fmt(0.1234) == "0.123" and fmt(12) == "12"
    assert fmt_range(10.0, 9.0, 12.0) == "10 (9–12)" and fmt_range(10.0, float("nan"), 12.0) == "10"
    assert fmt_range(None, None, None, "unknown") == "unknown"


@pytest.mark.skipif(importlib.util.find_spec("cli.whatif") is None, reason="exaplan whatif not built yet")
def test_through_the_real_engine(tmp_path, capsys):
    """A small real sweep: `exaplan whatif ... --report` gives a report that parses, with the
    command, every machine, and non-empty PNGs."""
    from cli.main import main

    path = tmp_path / "r.html"
    rc = main(["whatif", "--model", "protein-3.5b", "--machine", "frontier,dgx-h100", "--nodes", "16:64",
               "--tokens", "1e12", "--deadline-days", "30", "--vary", "machine.nic_gbit_s=x1,x2",
               "--report", str(path), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    html = path.read_text(encoding="utf-8")
    doc = parse(html)
    text = "".join(doc.text)
    assert data["command"] in text and "frontier" in text and "dgx-h100" in text
    for kind in data["device_status"]:
        assert kind in text
    assert text.count("machine.nic_gbit_s=x2") >= 6  # a row per varied point
    pngs = images(doc)
    assert len(pngs) >= 2 and all(p.startswith(PNG) and len(p) > 1000 for p in pngs)
    assert "script" not in doc.tags
