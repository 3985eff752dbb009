"""`exaplan check`: ranks of committed plans built at their full size on torch's fake process
group by the runtime's own parallelisation and stepped under fake tensors: the parameters they
hold, their peak memory by category (torch's MemTracker) and the collectives of a step, against
the planner's figures for the same rank."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from cli.main import main  # noqa: E402
from planner.cost.memory import rank_parameters  # noqa: E402
from planner.cost.rank import rank_memory  # noqa: E402
from planner.schema.plan import load_plan  # noqa: E402
from planner.schema.plan import Communicator  # noqa: E402
from runtime.check import CATEGORIES, check_rank, ranks_of  # noqa: E402
from tests.export.export_plans import ROOT  # noqa: E402

# exaplan check refuses to start inside a process group an earlier test left (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_process_group_left")


AURORA = ROOT / "plans/protein-3.5b_aurora_3200n.yaml"  # 38,400 ranks, pipelined (pp 16, DDP 2400)
PIPELINED = ROOT / "plans/protein-3.5b_alps_2060n.yaml"  # pp 4 x hsdp 412 x 5
FSDP = ROOT / "plans/protein-7b_dgx-h100_16n.yaml"  # fsdp-grad-op over 128 ranks, 8 sequences a rank


def test_the_seed_machine_plan_steps_at_full_size(capsys):
    """Both ends of the Aurora pipeline step at 38,400 ranks: the JSON the issue names, the
    parameters exact, the pipeline's sends and the gradient all-reduce as the plan's table
    says, and the exit code that of the verdicts."""
    plan = load_plan(AURORA)
    rc = main(["check", str(AURORA), "--ranks", "first,last", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [0, plan.world_size - 1]
    assert rc == (0 if all(r["agrees"] and r["fits"] for r in rows) else 1)
    table = {k.value: c.bytes_per_step for k, c in plan.collectives.communicators.items()}
    for r in rows:
        assert r["stepped"] and abs(r["parameter_error"]) <= 0.03 and r["parameters"] > 0
        assert r["torch_peak_memory_gib"] > 0 and r["predicted_total_gib"] > r["predicted_memory_gib"] > 0
        assert set(r["torch_memory_gib"]) == set(CATEGORIES) <= set(r["predicted_gib"])
        assert sum(r["torch_memory_gib"].values()) == pytest.approx(r["torch_peak_memory_gib"], rel=1e-9)
        sent = sum(c["total_bytes"] for c in r["collectives"] if c["mesh_dim"] == "pp" and c["op"] in ("send", "recv"))
        reduced = sum(c["total_bytes"] for c in r["collectives"] if c["mesh_dim"] == "dp_cp" and c["op"] == "all_reduce")
        assert sent == pytest.approx(table["pp"], rel=0.05) and reduced == pytest.approx(table["dp"], rel=0.05)
        # model states: the fp32 master and the bf16 copy the replicate policy gathers, AdamW's moments
        held = r["torch_memory_gib"]
        assert held["parameters"] + held["buffers"] == pytest.approx(r["predicted_gib"]["parameters"], rel=0.01)
        assert held["optimizer"] == pytest.approx(r["predicted_gib"]["optimizer"], rel=0.01)
    assert all(abs(r["memory_error"]) <= 0.10 for r in rows)  # issue 50's target on a committed plan
    assert rc == 0


def test_a_sharded_plans_memory_and_traffic_are_predicted():
    """fsdp-grad-op at 128 ranks: the planner's tensor memory within 10% of torch's at the
    peak on both ends of the world, the gathers and reduce-scatters as the table says."""
    plan = load_plan(FSDP)
    for rank in ranks_of(plan, "first,last"):
        seen = check_rank(plan, rank, rank_parameters, rank_memory)
        assert seen.passed and seen.fits and seen.planner_fits
        assert abs(seen.memory_error) <= 0.10, seen.memory_error
        moved = sum(c.total_bytes for c in seen.collectives if c.mesh_dim == "dp_shard")
        assert moved == pytest.approx(plan.collectives.communicators[Communicator.dp].bytes_per_step, rel=0.05)
        assert {c.op for c in seen.collectives if c.total_bytes > 1e6} == {"all_gather", "reduce_scatter"}


def test_every_stage_holds_what_the_planner_counts():
    plan = load_plan(PIPELINED)
    ranks = ranks_of(plan, "stages")
    assert len(ranks) == plan.mesh.pp
    seen = [check_rank(plan, r, rank_parameters, step=False) for r in ranks]
    assert [c.pp_rank for c in seen] == list(range(plan.mesh.pp))
    assert all(c.agrees for c in seen), [(c.rank, c.parameter_error) for c in seen]
    # the first stage holds the embedding, the last the head: different counts, each matched
    assert plan.mesh.pp > 1 and seen[0].parameters != seen[1].parameters


def test_a_disagreement_exits_1(monkeypatch, capsys):
    monkeypatch.setattr("planner.cost.memory.rank_parameters", lambda plan, pp_rank: 1)
    assert main(["check", str(AURORA), "--ranks", "0", "--no-step"]) == 1
    assert "DISAGREES" in capsys.readouterr().out


@pytest.mark.parametrize("ranks, words", [("38400", "outside the plan's world"), ("middle", "is not a rank")])
def test_bad_ranks_exit_2(ranks, words, capsys):
    assert main(["check", str(AURORA), "--ranks", ranks]) == 2
    err = capsys.readouterr().err
    assert "ranks" in err and words in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted((ROOT / "plans").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT / "plans")))
def test_every_committed_plan_steps_first_and_last_rank(path, request):
    """Both ends of every committed plan build and step at full size, their parameters within 3%
    and their tensor memory within 10% of torch's (issue 50's target). Where the planner is known
    not to reach it yet (python -m calibration.check_sweep, docs/results/check-sweep.json), the
    test is an expected failure with the measured error: the 70B Frontier plan (+15%, replicate
    pipeline: the planner adds fp32 and 16-bit gradients, 11.8 GiB, to the activations, where
    torch's peak holds 0.8 GiB of gradients; the phases are not yet modelled apart)."""
    from cli.check import check_plan

    known = {"protein-70b_frontier_64n.yaml": "+15%"}
    if path.name in known:
        request.applymarker(pytest.mark.xfail(reason=f"planner off by {known[path.name]} (docs: check-at-full-size)",
                                              strict=True))
    plan = load_plan(path)
    results, failed = check_plan(plan, ranks_of(plan, "first,last"))
    assert not failed, failed
    for seen in results:
        assert abs(seen.parameter_error) <= 0.03, (seen.rank, seen.parameter_error)
        if seen.stepped:
            assert abs(seen.memory_error) <= 0.10, (seen.rank, seen.memory_error)


def test_a_tampered_plan_is_refused_and_nothing_is_built(tmp_path, capsys):
    text = AURORA.read_text().replace("dp_replicate: 2400", "dp_replicate: 2399")
    assert "dp_replicate: 2399" in text
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(text)
    assert main(["check", str(tampered)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "mesh: degrees multiply to" in err
