"""planner/whatif: the sweep engine against a direct search, the questions (deadline, cheapest,
knee, fastest), energy and node-hours arithmetic, the global-batch rule and its warning, and
the parsing of what-if options."""

import math

import pytest

from machine_models import load_framework, load_machine
from planner.inputs import make_job
from planner.presets import get_model
from planner.report import layout_label
from planner.schema.errors import PlanError
from planner.search.search import search
from planner.whatif import WhatifPoint, run_whatif
from planner.whatif import batch as batch_rule
from planner.whatif import questions
from planner.whatif.parse import parse_nodes, parse_vary

SMALL = dict(model="protein-7b", machine="dgx-h100", tokens=1e11, workers=1)


@pytest.fixture(scope="module")
def sweep():
    return run_whatif(nodes="2:16", global_batch=1024, deadline_days=3, fastest=True, **SMALL)


def test_a_point_is_what_a_direct_search_gives(sweep):
    model, fw = get_model("protein-7b"), load_framework("exaplan")
    machine = fw.applied_to(load_machine("dgx-h100"))
    for p in sweep.points:
        job = make_job(model, machine, p.ranks, 1024, None, None, 1e11, framework=fw)
        r = search(model, machine, job, p.nodes, top_k=1)
        assert p.fits and p.layout == layout_label(r.layouts, 0)
        assert p.step_time_s == pytest.approx(float(r.evaluation.step_time_s[0]), rel=1e-12)
        assert p.tokens_per_s == pytest.approx(float(r.evaluation.tokens_per_s[0]), rel=1e-12)
        assert p.days == pytest.approx(float(r.evaluation.time_to_train_days[0]), rel=1e-12)
        assert p.mfu == pytest.approx(float(r.evaluation.mfu[0]), rel=1e-12)


def test_node_hours_energy_and_intervals(sweep):
    node_w = load_machine("dgx-h100").power.node_w
    for p in sweep.points:
        assert p.node_hours == pytest.approx(p.nodes * p.days * 24)
        assert p.energy_kwh == pytest.approx(node_w / 1000 * p.nodes * p.days * 24)
        assert p.days_lo < p.days < p.days_hi and p.energy_kwh_lo < p.energy_kwh < p.energy_kwh_hi
        assert p.energy_kwh_hi / p.energy_kwh == pytest.approx(p.days_hi / p.days)
        assert p.tokens_per_s_lo < p.tokens_per_s < p.tokens_per_s_hi
        assert p.global_batch_seqs == 1024 and p.global_batch_tokens == 1024 * 512


def test_deadline_fewest_cheapest_and_efficiency(sweep):
    (d,) = sweep.deadline
    meet = [p for p in sweep.points if p.days <= 3]
    assert d["met"] and d["fewest"].nodes == min(p.nodes for p in meet)
    assert d["cheapest"].node_hours == min(p.node_hours for p in meet)
    assert sweep.points[0].scaling_efficiency == 1.0
    # Never much above linear, but a little can be: at 8 nodes each rank needs no accumulation
    # (fsdp-grad-op, one micro-batch of 16) where 2 nodes take 4 under hsdp, and FSDP gathers the
    # weights every micro-batch, part of which shows even under compute (the contention form of
    # planner/cost/step.py): 1.0067 at 8 nodes.
    assert all(p.scaling_efficiency <= 1.02 for p in sweep.points)
    def accumulation(p):  # "dp64 fsdp-grad-op | mbs16 x 1"
        return int(p.layout.split(" x ")[1].split()[0])

    assert all(p.scaling_efficiency <= 1.0 + 1e-9 or accumulation(p) < accumulation(sweep.points[0])
               for p in sweep.points)
    assert sweep.fastest[0]["by_node_hours"][0]["machine"] == "dgx-h100"


def _pt(nodes, days, tps, machine="m", energy=None):
    return WhatifPoint(model="x", machine=machine, nodes=nodes, varied={}, fits=True, reason="", layout="l",
                       tokens_per_s=tps, days=days, days_lo=days * 0.9, days_hi=days * 1.1,
                       node_hours=nodes * days * 24, energy_kwh=energy, ranks=nodes * 4, devices_per_node=4)


def test_questions_on_a_made_up_curve():
    # per-device rate 100%, 90%, 70%, 50%: the knee at 0.8 is the third point
    pts = questions.with_efficiency([_pt(1, 10.0, 100.0), _pt(2, 5.6, 180.0), _pt(4, 3.6, 280.0),
                                     _pt(8, 2.5, 400.0, energy=1.0)])
    assert [round(p.scaling_efficiency, 2) for p in pts] == [1.0, 0.9, 0.7, 0.5]
    (k,) = questions.knees(pts, 0.8)
    assert k["knee_nodes"] == 4 and k["last_efficient_nodes"] == 2
    # just under the threshold: never "falls to 80% (below 80%)"
    near = questions.with_efficiency([_pt(1, 10.0, 100.0), _pt(2, 6.3, 159.2)])
    (k,) = questions.knees(near, 0.8)
    assert k["knee_nodes"] == 2 and "falls to 79.6%" in k["sentence"]
    (d,) = questions.deadline(pts, 6.0, "node-hours")
    assert d["fewest"].nodes == 2 and d["cheapest"].nodes == 2  # 269 node-hours against 346 and 480
    (d,) = questions.deadline(pts, 1.0, "node-hours")
    assert not d["met"] and d["best"].nodes == 8 and "best achievable is 2.50 days" in d["sentence"]
    (d,) = questions.deadline(pts, 3.0, "energy")
    assert d["cheapest"].nodes == 8 and d["minimise"] == "energy"


def test_one_global_batch_by_default_and_the_critical_batch():
    model = get_model("protein-3.5b")
    b = batch_rule.critical_batch_tokens(model, 512, 1e12)
    c = batch_rule.flops_per_token(model, 512) * 1e12
    assert b == pytest.approx(0.2920 * c**0.3271)
    assert 5e6 < b < 7e6  # tokens
    assert batch_rule.odd_part_of_lcm([12, 8, 4]) == 3 and batch_rule.odd_part_of_lcm([8, 4]) == 1
    seqs = batch_rule.default_global_batch(model, 512, 1e12, [12, 8])
    assert seqs * 512 <= b < 2 * seqs * 512 and seqs % 3 == 0 and (seqs // 3) & (seqs // 3 - 1) == 0
    r = run_whatif(model="protein-small", machine="dgx-h100,aurora", nodes="1,2", tokens=1e9, workers=1)
    assert len({p.global_batch_seqs for p in r.points}) == 1
    assert not any("critical-batch" in w for w in r.warnings)


def test_a_batch_past_the_critical_batch_is_warned_about():
    r = run_whatif(model="protein-small", machine="dgx-h100", nodes="1,2", tokens=1e9, batch_per_rank=512, workers=1)
    assert any("exceeds the critical-batch estimate" in w and "DeepSeek" in w for w in r.warnings)
    assert r.points[1].global_batch_seqs == 2 * r.points[0].global_batch_seqs


def test_a_varied_nic_bandwidth_reaches_the_machine_and_never_slows_the_best_layout():
    r = run_whatif(model="protein-7b", machine="dgx-h100", nodes="4,16", global_batch=512, tokens=1e11,
                   vary=["machine.nic_gbit_s=x0.25,x1,x4"], workers=1)
    by = {(p.varied["machine.nic_gbit_s"], p.nodes): p for p in r.points}
    for n in (4, 16):
        s = [by[(v, n)].step_time_s for v in ("x0.25", "x1", "x4")]
        assert s[0] >= s[1] >= s[2]
    assert by[("x0.25", 16)].step_time_s > by[("x4", 16)].step_time_s  # it did reach the machine
    assert len(r.knees) == 3 and all(p.energy_kwh is not None for p in r.points)  # power: kept when varied


def test_power_can_be_varied_and_workers_give_the_same_points():
    one = run_whatif(model="protein-small", machine="dgx-h100", nodes="1:8", tokens=1e9, workers=1,
                     vary=["machine.power.node_w=5000,10000"])
    two = run_whatif(model="protein-small", machine="dgx-h100", nodes="1:8", tokens=1e9, workers=2,
                     vary=["machine.power.node_w=5000,10000"])
    assert one.points == two.points
    a, b = one.points[0], one.points[4]
    assert a.nodes == b.nodes and b.energy_kwh == pytest.approx(2 * a.energy_kwh)


def test_the_callers_work_runs_while_the_workers_search_and_the_points_keep_their_order():
    """while_sweeping runs once, in this process, with worker processes only; the points come
    back in the sweep's order (case by case, node count by node count) though the largest worlds
    are searched first."""
    import os

    calls = []
    kw = dict(model="protein-small", machine=["dgx-h100", "frontier"], nodes="1:8", tokens=1e9)
    two = run_whatif(**kw, workers=2, while_sweeping=lambda: calls.append(os.getpid()))
    assert calls == [os.getpid()]
    one = run_whatif(**kw, workers=1, while_sweeping=lambda: calls.append("serial"))
    assert calls == [os.getpid()] and one.points == two.points
    assert [(p.machine, p.nodes) for p in two.points] == [(m, n) for m in ("dgx-h100", "frontier") for n in (1, 2, 4, 8)]


def test_an_unset_inter_node_efficiency_varies_from_the_network_efficiency():
    """Frontier leaves inter_node_efficiency unset (its NICs run at network_efficiency, 0.85):
    x1 is that figure, the same points as giving 0.85; x0.5 slows the steps that cross nodes."""
    r = run_whatif(model="protein-3.5b", machine="frontier", nodes="64,512", tokens=1e10, workers=1,
                   vary=["machine.inter_node_efficiency=x0.5,x1,0.85"])
    by = {(p.varied["machine.inter_node_efficiency"], p.nodes): p.step_time_s for p in r.points}
    assert load_machine("frontier").inter_node_efficiency is None
    for n in (64, 512):
        assert by[("x1", n)] == by[("0.85", n)]
        assert by[("x0.5", n)] > 1.02 * by[("x1", n)]


def test_points_beyond_the_machine_say_so():
    r = run_whatif(model="protein-small", machine="pdx", nodes="256,512", tokens=1e9, workers=1, deadline_days=1e-9)
    assert r.points[1].fits is False and "400 nodes" in r.points[1].reason and math.isnan(r.points[1].days)
    assert "no node count tried meets" in r.deadline[0]["sentence"]


def test_parse_nodes_and_vary():
    assert parse_nodes("16:2048") == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert parse_nodes("3:12") == [3, 6, 12] and parse_nodes("8,2,8") == [2, 8]
    for bad in ("4:2", "0:4", "a:b", "1:2:3", "", "0,1", "x"):
        with pytest.raises(PlanError) as e:
            parse_nodes(bad)
        assert e.value.field == "nodes"
    v = parse_vary("machine.nic_gbit_s=x0.5,400")
    assert v.value_for("x0.5", 200.0) == 100.0 and v.value_for("400", 200.0) == 400
    for bad in ("machine.nic_gbit_s", "nic_gbit_s=1", "machine.nic_gbit_s=xq", "machine.nic_gbit_s=x-1",
                "machine.nic_gbit_s=inf", "machine.nic_gbit_s=1,1", "machine.nic_gbit_s=1,"):
        with pytest.raises(PlanError) as e:
            parse_vary(bad)
        assert e.value.field == "vary"
    for bare, meant in (("nic_gbit_s", "machine.nic_gbit_s"), ("layers", "model.layers")):
        with pytest.raises(PlanError, match=f"did you mean '{meant}'"):
            parse_vary(f"{bare}=x2")
    with pytest.raises(PlanError) as e:
        parse_vary("nic_gbs=x2")
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("kwargs, field", [
    (dict(tokens=float("inf")), "tokens"), (dict(tokens=float("nan")), "tokens"), (dict(tokens=-1.0), "tokens"),
    (dict(deadline_days=0.0), "deadline-days"), (dict(global_batch=8, batch_per_rank=2), "global-batch"),
    (dict(machine="frontierr"), "machine"), (dict(model="protein-smal"), "model"),
    (dict(vary=["machine.nic_gbs=x2"]), "machine.nic_gbs"), (dict(knee=1.5), "knee"),
])
def test_bad_input_names_the_option(kwargs, field):
    args = dict(model="protein-small", machine="dgx-h100", nodes="1:2", workers=1)
    args.update(kwargs)
    with pytest.raises(PlanError) as e:
        run_whatif(**args)
    assert e.value.field == field
