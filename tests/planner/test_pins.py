"""Pinned axes (planner/search/pins.py, `exaplan plan --tp ... --pp ...`): every layout keeps
the pins, the pinned space is the full space filtered, conflicts are refused naming the field
(through the command line: exit 2, one line, nothing written), and an empty result says why."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli.main import main
from machine_models import load_machine
from planner.cost.layout import RECOMPUTES, SCHEDULES, SHARDINGS
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.errors import PlanError
from planner.schema.specs import TrainingJob
from planner.search.pins import Pins
from planner.search.search import FINALISTS, search
from planner.search.space import enumerate_space


def satisfies(lay, pins: Pins) -> np.ndarray:
    """Rows of explicit layouts that keep every pin, written out field by field."""
    ok = np.ones(len(lay), dtype=bool)
    expect = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "mbs": lay.mbs, "vpp": lay.vpp, "sp": lay.sp,
              "shard_group": lay.dp_shard, "shard": lay.sharding, "schedule": lay.schedule, "recompute": lay.recompute}
    codes = {"shard": SHARDINGS, "schedule": SCHEDULES, "recompute": RECOMPUTES}
    for name, value in pins.given().items():
        value = codes[name].index(value) if name in codes else int(value)
        ok &= expect[name] == value
    return ok


def as_rows(lay) -> list[tuple]:
    cols = [lay.pp, lay.dp_replicate, lay.dp_shard, lay.cp, lay.tp, lay.mbs, lay.gas, lay.vpp, lay.schedule,
            lay.sharding, lay.recompute, lay.sp]
    return sorted(tuple(int(x) for x in row) for row in zip(*cols))


@pytest.fixture(scope="module")
def case_3_5b():
    model, machine = get_model("protein-3.5b"), load_machine("dgx-h100")
    return model, machine, make_job(model, machine, 32, None, None, None, None)


PINS = [
    Pins(tp=2, pp=4),
    Pins(pp=4, vpp=3),
    Pins(dp=8, mbs=1),
    Pins(shard="hsdp", shard_group=2),
    Pins(cp=2, recompute="full", sp=True),
    Pins(pp=2, schedule="gpipe"),
    Pins(tp=4, sp=False, shard="zero2"),
]


@pytest.mark.parametrize("pins", PINS, ids=lambda p: p.label())
def test_pinned_space_is_the_full_space_filtered(case_3_5b, pins):
    model, _, job = case_3_5b
    full = enumerate_space(model, job, 32).layouts()
    pinned = enumerate_space(model, job, 32, pins=pins)
    assert len(pinned) > 0
    assert as_rows(pinned.layouts()) == as_rows(full.take(satisfies(full, pins)))


@pytest.mark.parametrize("pins", PINS, ids=lambda p: p.label())
def test_every_layout_of_a_pinned_search_keeps_the_pins(case_3_5b, pins):
    model, machine, job = case_3_5b
    res = search(model, machine, job, 4, top_k=FINALISTS, pins=pins)
    assert res.pins == pins
    assert satisfies(res.layouts, pins).all()
    # The best pinned layout is the best of the pinned rows of the whole space (same scores).
    free = search(model, machine, job, 4, top_k=FINALISTS)
    assert res.evaluation.step_time_s[0] >= free.evaluation.step_time_s[0] * (1 - 1e-12)


def test_no_pins_changes_nothing(case_3_5b):
    model, machine, job = case_3_5b
    space = enumerate_space(model, job, 32)
    assert Pins().restrict(space) is space
    assert not Pins() and Pins().given() == {}
    a = search(model, machine, job, 4)
    b = search(model, machine, job, 4, pins=Pins())
    np.testing.assert_array_equal(a.evaluation.step_time_s, b.evaluation.step_time_s)
    assert as_rows(a.layouts) == as_rows(b.layouts) and a.total_layouts == b.total_layouts


# (pins, world, field, text the message contains); protein-3.5b: 32 heads, 16 layers, seq 512.
CONFLICTS = [
    (dict(tp=3), 24, "tp", "3 does not divide model.heads (32)"),
    (dict(tp=8, pp=16), 96, "pp", "tp x pp = 8 x 16 = 128 does not divide the world (96 ranks)"),
    (dict(tp=2, cp=2, pp=2, dp=2), 32, "dp", "tp x cp x pp x dp = 2 x 2 x 2 x 2 = 16, but the world is 32 ranks"),
    (dict(dp=3), 24, "dp", "3 data-parallel ranks do not divide global batch 32"),
    (dict(mbs=64), 32, "mbs", "micro-batch 64 does not divide global batch 32"),
    (dict(pp=32), 32, "pp", "32 stages for 16 layers"),
    (dict(cp=3), 24, "cp", "2 x cp = 6 does not divide the sequence length 512"),
    (dict(shard_group=4), 32, "shard_group", "only hsdp takes a shard group"),
    (dict(shard="zero1", shard_group=4), 32, "shard_group", "only hsdp takes a shard group"),
    (dict(shard="hsdp", shard_group=4, dp=4), 32, "shard_group", "divides dp (4) into at least 2 replicas; got 4"),
    (dict(shard="hsdp", dp=2), 32, "shard", "hsdp needs dp >= 4"),
    (dict(pp=1, vpp=2), 32, "vpp", "2 virtual stages need pp > 1"),
    (dict(pp=4, vpp=5), 32, "vpp", "pp x vpp = 4 x 5 = 20 chunks for 16 layers"),
    (dict(vpp=2, schedule="1f1b"), 32, "vpp", "need the interleaved-1f1b schedule"),
    (dict(vpp=1, schedule="interleaved-1f1b"), 32, "schedule", "interleaved-1f1b needs vpp >= 2"),
    (dict(pp=1, schedule="gpipe"), 32, "schedule", "needs pp > 1"),
    (dict(tp=1, sp=True), 32, "sp", "sequence parallelism needs tp > 1"),
    (dict(tp=0), 32, "tp", "must be a positive integer"),
    (dict(shard="zero9"), 32, "shard", "'zero9' is not one of"),
]


@pytest.mark.parametrize("given,world,field,text", CONFLICTS, ids=[str(c[0]) for c in CONFLICTS])
def test_conflicting_pins_are_refused_naming_the_field(given, world, field, text):
    model = get_model("protein-3.5b")
    job = TrainingJob(global_batch=32, seq_len=512)
    with pytest.raises(PlanError) as err:
        Pins(**given).check(model, job, world)
    assert err.value.field == field
    assert text in str(err.value)


def test_pins_that_leave_no_layout_say_which_and_why():
    """protein-3.5b on 2 DGX H100 nodes (16 ranks), global batch 20: tp 4 x pp 4 leaves dp 1,
    so 20 sequences per step; micro-batches of 10 give 2 < 4 stages."""
    model, machine = get_model("protein-3.5b"), load_machine("dgx-h100")
    job = TrainingJob(global_batch=20, seq_len=512)
    with pytest.raises(PlanError) as err:
        search(model, machine, job, 2, pins=Pins(tp=4, pp=4, mbs=10))
    msg = str(err.value)
    assert msg.startswith("no layout of 16 ranks with tp=4, pp=4, mbs=10 keeps global batch 20")
    assert "pp=4 with dp=1: at most 2" in msg
    assert "without pp=4 or mbs=10 there are layouts" in msg
    # Degrees whose data-parallel degree divides no batch: named with the degree.
    job = TrainingJob(global_batch=6, seq_len=512)
    with pytest.raises(PlanError, match="makes the data-parallel degree 16, and none divides the global batch"):
        search(model, machine, job, 2, pins=Pins(tp=1, pp=1, cp=1))


def test_fits_nowhere_names_the_pins():
    model, machine = get_model("protein-70b"), load_machine("dgx-h100")
    job = make_job(model, machine, 8, None, None, None, None)
    with pytest.raises(PlanError, match="fits nowhere on 1 x dgx-h100 with tp=8") as err:
        search(model, machine, job, 1, pins=Pins(tp=8))
    assert err.value.field == "memory"


def test_capacity_sweep_unchanged_without_pins():
    from planner.capacity import sweep  # noqa: F401  (imports and calls search without pins)

    model, machine = get_model("protein-tiny"), load_machine("dgx-h100")
    job = make_job(model, machine, 8, None, None, None, None)
    assert search(model, machine, job, 1, top_k=1).pins == Pins()


# --- the command line ---------------------------------------------------------------------------

PLAN = ("plan", "--model", "protein-3.5b", "--machine", "dgx-h100", "--nodes", "4")


def test_cli_pins_are_kept_and_reported(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out_file = tmp_path / "p.yaml"
    rc = main([*PLAN, "--tp", "2", "--pp", "4", "--shard", "zero1", "--no-sp", "--top", "8", "--json", "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert data["pins"] == {"tp": 2, "pp": 4, "shard": "zero1", "sp": False}
    for t in data["top"]:
        assert t["layout"].startswith("pp4 ") and " zero1" in t["layout"] and " tp2 |" in t["layout"], t["layout"]
    mesh = data["plan"]["mesh"]
    assert (mesh["tp"], mesh["pp"], data["plan"]["sharding"]["kind"], data["plan"]["sequence_parallel"]) == (2, 4, "zero1", False)
    assert out_file.exists()
    # Unpinned: no "pins" key (the key set stays as before).
    assert main([*PLAN, "--json", "--no-write"]) == 0
    assert "pins" not in json.loads(capsys.readouterr().out)


def test_virtual_stages_past_the_search_range_when_pinned(capsys, tmp_path, monkeypatch):
    """NeMo runs 12 virtual stages; the unpinned search tries up to MAX_VIRTUAL_STAGES (8), a pin
    or estimate takes any count the layers allow: protein-70b's 80 layers on pp 2 x vpp 10."""
    from planner.search.axes import MAX_VIRTUAL_STAGES

    monkeypatch.chdir(tmp_path)
    model = get_model("protein-70b")
    job = TrainingJob(global_batch=64, seq_len=2048)
    assert enumerate_space(model, job, 64).units.vpp.max() == MAX_VIRTUAL_STAGES
    Pins(pp=2, vpp=10).check(model, job, 64)
    pinned = enumerate_space(model, job, 64, Pins(pp=2, vpp=10))
    assert len(pinned) and set(pinned.units.vpp[pinned.unit].tolist()) == {10}
    res = search(model, load_machine("dgx-h100"), job, nodes=8, pins=Pins(pp=2, vpp=10), top_k=2)
    assert res.layouts.vpp.tolist() == [10, 10] and res.layouts.pp.tolist() == [2, 2]
    argv = ["estimate", "--model", "protein-70b", "--machine", "dgx-h100", "--nodes", "8", "--tp", "8", "--pp", "2",
            "--vpp", "10", "--dp", "4", "--mbs", "1", "--global-batch", "64", "--shard", "zero1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert "v10" in out["layout"] and out["step_time_s"] > 0
    # more chunks than layers is still refused, naming the field
    argv[argv.index("--vpp") + 1] = "41"
    assert main(argv) == 2
    assert "2 stages with 41 virtual stages" in capsys.readouterr().err


def test_cli_table_says_what_is_pinned(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*PLAN, "--pp", "2", "--vpp", "3", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "pinned: pp=2, vpp=3" in out


@pytest.mark.parametrize("argv,needle", [
    (("--tp", "8", "--pp", "16", "--nodes", "12"), "exaplan plan: error: pp: tp x pp = 8 x 16 = 128 does not divide the world (96 ranks)"),
    (("--tp", "3"), "exaplan plan: error: tp: 3 does not divide model.heads (32)"),
    (("--shard-group", "4"), "exaplan plan: error: shard_group: only hsdp takes a shard group"),
    (("--pp", "1", "--vpp", "2"), "exaplan plan: error: vpp: 2 virtual stages need pp > 1"),
    (("--tp", "2", "--pp", "2", "--cp", "1", "--dp", "4"), "exaplan plan: error: dp: tp x cp x pp x dp = 2 x 1 x 2 x 4 = 16, but the world is 32 ranks"),
    (("--mbs", "0",), "exaplan plan: error: mbs: must be a positive integer"),
    (("--tp", "4", "--pp", "4", "--mbs", "10", "--nodes", "2", "--global-batch", "20"),
     "exaplan plan: error: no layout of 16 ranks with tp=4, pp=4, mbs=10 keeps global batch 20"),
])
def test_cli_conflicts_exit_2_one_line_nothing_written(capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    out_file = tmp_path / "out.yaml"
    rc = main([*PLAN, *argv, "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(needle), err
    assert "Traceback" not in out + err
    assert not out_file.exists() and not (tmp_path / "plan.yaml").exists()
