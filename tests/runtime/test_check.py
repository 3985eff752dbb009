"""`exaplan check`: ranks of committed plans built at their full size on torch's fake process
group by the runtime's own parallelisation, the parameters they hold against the planner's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from cli.main import main  # noqa: E402
from planner.cost.memory import rank_parameters  # noqa: E402
from planner.schema.plan import load_plan  # noqa: E402
from runtime.check import check_rank, ranks_of  # noqa: E402
from tests.export.export_plans import ROOT  # noqa: E402

AURORA = ROOT / "plans/protein-3.5b_aurora_3200n.yaml"  # 38,400 ranks, pipelined
PIPELINED = ROOT / "plans/protein-3.5b_alps_2060n.yaml"  # pp 4 x hsdp 412 x 5


def test_the_seed_machine_plan_builds_at_full_size(capsys):
    plan = load_plan(AURORA)
    assert main(["check", str(AURORA), "--ranks", "first,last", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [0, plan.world_size - 1]
    for r in rows:
        assert r["agrees"] and abs(r["parameter_error"]) <= 0.03 and r["parameters"] > 0


def test_every_stage_holds_what_the_planner_counts():
    plan = load_plan(PIPELINED)
    ranks = ranks_of(plan, "stages")
    assert len(ranks) == plan.mesh.pp
    seen = [check_rank(plan, r, rank_parameters) for r in ranks]
    assert [c.pp_rank for c in seen] == list(range(plan.mesh.pp))
    assert all(c.agrees for c in seen), [(c.rank, c.parameter_error) for c in seen]
    # the first stage holds the embedding, the last the head: different counts, each matched
    assert plan.mesh.pp > 1 and seen[0].parameters != seen[1].parameters


def test_a_disagreement_exits_1(monkeypatch, capsys):
    monkeypatch.setattr("planner.cost.memory.rank_parameters", lambda plan, pp_rank: 1)
    assert main(["check", str(AURORA), "--ranks", "0"]) == 1
    assert "DISAGREES" in capsys.readouterr().out


@pytest.mark.parametrize("ranks, words", [("38400", "outside the plan's world"), ("middle", "is not a rank")])
def test_bad_ranks_exit_2(ranks, words, capsys):
    assert main(["check", str(AURORA), "--ranks", ranks]) == 2
    err = capsys.readouterr().err
    assert "ranks" in err and words in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted((ROOT / "plans").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT / "plans")))
def test_every_committed_plan_builds_first_and_last_rank(path):
    plan = load_plan(path)
    for rank in ranks_of(plan, "first,last"):
        seen = check_rank(plan, rank, rank_parameters)
        assert seen.agrees, (rank, seen.parameter_error)


def test_a_tampered_plan_is_refused_and_nothing_is_built(tmp_path, capsys):
    text = AURORA.read_text().replace("dp_replicate: 2400", "dp_replicate: 2399")
    assert "dp_replicate: 2399" in text
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(text)
    assert main(["check", str(tampered)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "mesh: degrees multiply to" in err
