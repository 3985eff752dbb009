"""Memory and traffic at full size: `python -m calibration.check_sweep` runs `exaplan check`
over plans and writes docs/results/check-sweep.json; docs/gen/check_page.py renders it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.docs import gen_pages  # noqa: F401,E402  (docs/gen on the path)

import check_page  # noqa: E402
from benchmarks import record  # noqa: E402
from calibration import check_sweep  # noqa: E402


def test_the_sweep_covers_every_kind_the_issue_names():
    cases = check_sweep.sweep_cases()
    assert len(cases) >= 60
    plans = [check_sweep.sweep_plan(c) for c in cases[:: max(1, len(cases) // 12)]]  # a spread of them, planned
    kinds = {check_sweep.layout_kind(p) for p in plans}
    assert kinds and all(p.world_size == p.nodes * p.ranks_per_node for p in plans)
    layouts = [c[-1] for c in cases]
    for key, values in {"sharding": {"none", "zero1", "zero2", "fsdp", "fsdp-grad-op", "hsdp"},
                        "schedule": {"gpipe", "1f1b", "interleaved-1f1b"},
                        "recompute": {"selective", "full", "selective-op"}}.items():
        assert values <= {lay.get(key) for lay in layouts}, key
    assert any(lay.get("vpp", 1) > 1 for lay in layouts) and any(lay.get("cp", 1) > 1 for lay in layouts)
    assert any(lay.get("tp", 1) > 1 and lay.get("sp") is False for lay in layouts)
    assert any(lay.get("gas", 1) > 1 for lay in layouts)
    assert {c[4] for c in cases} == {"bf16", "fp32"} and {c[5] for c in cases} == {"pretrain", "dpo"}


def test_a_recorded_sweep_renders(tmp_path):
    out = tmp_path / "check-sweep.json"
    assert check_sweep.main(["--only", "sweep", "--match", "dp fsdp", "--limit", "1", "--workers", "1",
                             "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert len(rows) == 2 and data["machine"]["cores"] >= 1
    stepped = [r for r in rows if r.get("stepped")]
    assert stepped and all(r["torch_peak_memory_gib"] > 0 and "dp" in r["communicators"] for r in stepped)
    page = check_page.render(out)
    s = check_page.summary(rows)
    assert f"{s['ranks']} ranks checked, {s['stepped']} stepped" in page
    assert "## By memory category" in page and "| parameters |" in page
    assert rows[0]["name"] in page and data["command"] in page


def test_a_sweep_of_nothing_is_refused(tmp_path, capsys):
    assert check_sweep.main(["--match", "no such plan", "--out", str(tmp_path / "x.json")]) == 2
    assert "no plan to check" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_no_sweep_says_how_to_record_one(tmp_path):
    assert "run `python -m calibration.check_sweep`" in check_page.render(tmp_path / "none.json")


def test_the_check_benchmark_record_tables_each_rank():
    figures = [{"rank": 0, "pp_rank": 0, "seconds": 12.5, "torch_peak_memory_gib": 5.66, "predicted_memory_gib": 5.57,
                "memory_error": -0.016, "fits": True}, {"rank": 7, "error": "RuntimeError: boom"}]
    rec = record.make_record("check", ["exaplan", "check", "p.yaml", "--json"], figures, wall_s=13.0, exit_code=1)
    table = rec["tables"][0]
    assert table["rows"] == [["0", "0", "12.5", "60", "5.66", "5.57", "-1.6%", "fits"]]
    assert rec["notes"] == ["rank 7 failed: RuntimeError: boom"]
