"""Bounded inputs (issue 51, part 4): what an adversarial pass found, each now one message
naming the field or the file, exit code 2, no traceback and nothing written.

- YAML or JSON nested 900 levels (a RecursionError before): a --model or --machine file of
  `plan`, the plan of `explain`, `launch` and `check`, `validate --kernels`, `validate --local
  --model`, the run folders of `calibrate --from-runs`, and --set / --vary values;
- a binary kernels (or model) file;
- /dev/zero, /dev/urandom (memory grew until killed) and a FIFO (hung) as any of these files,
  run in a child process with a memory limit and a timeout, so that a regression fails fast;
- `plan --draws 100000000` (no bound), `whatif --vary` with 2,000 values and a what-if of 3,584
  points (no cap): refused before any search;
- a 5,000-character machine name in `whatif` ("file name too long");
- `check PLAN --ranks 100000`, a rank outside the plan's world;
- a deadline met at the smallest node count tried says that fewer were not tried.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SMALL_PLAN = ROOT / "plans" / "gpu" / "demo_1gpu.yaml"  # one rank
DEPTH = 900


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys, *argv, needle: str = "") -> str:
    """Run; assert exit 2, one line on stderr naming `needle`, no traceback; return stderr."""
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (rc, out[-400:], err[-400:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    return err


def deep_list(n: int = DEPTH) -> str:
    return "[" * n + "]" * n


def deep_map(n: int = DEPTH) -> str:
    return "{a: " * n + "1" + "}" * n


def deep_json(n: int = DEPTH) -> str:
    return '{"device": ' + '{"a": ' * n + "1" + "}" * n + "}"


@pytest.fixture
def deep(tmp_path):
    """Files nested DEPTH levels: YAML flow lists and maps, and JSON."""
    files = {"list": tmp_path / "deep-list.yaml", "map": tmp_path / "deep-map.yaml", "json": tmp_path / "deep.json"}
    files["list"].write_text(deep_list())
    files["map"].write_text(deep_map())
    files["json"].write_text(deep_json())
    return files


# --- nesting -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["list", "map", "json"])
def test_a_deeply_nested_model_or_machine_file_is_refused(capsys, deep, tmp_path, shape):
    out = tmp_path / "p.yaml"
    err = refused(capsys, "plan", "--model", deep[shape], "--machine", "dgx-h100", "-o", out, needle=str(deep[shape]))
    assert "nested more than 64 levels" in err and not out.exists()
    err = refused(capsys, "plan", "--model", "protein-tiny", "--machine", deep[shape], "-o", out,
                  needle=str(deep[shape]))
    assert "nested more than 64 levels" in err and not out.exists()


@pytest.mark.parametrize("shape", ["list", "map", "json"])
def test_a_deeply_nested_plan_is_refused_by_explain_launch_and_check(capsys, deep, tmp_path, shape):
    script = tmp_path / "job.sh"
    for argv in (["explain", deep[shape]], ["explain", deep[shape], "--json"],
                 ["launch", deep[shape], "--scheduler=torchrun", "-o", script], ["check", deep[shape], "--no-step"]):
        err = refused(capsys, *argv, needle=str(deep[shape]))
        assert "nested more than 64 levels" in err
    assert not script.exists()


def test_a_deeply_nested_kernels_file_is_refused(capsys, deep):
    err = refused(capsys, "validate", "--kernels", deep["json"], needle="--kernels")
    assert str(deep["json"]) in err and "nested more than 64 levels" in err


def test_validate_local_refuses_a_deeply_nested_model_before_running(capsys, deep, tmp_path):
    out = tmp_path / "validate"
    refused(capsys, "validate", "--local", "--model", deep["map"], "--out", out, needle="nested more than 64 levels")
    assert not out.exists()


@pytest.mark.parametrize("which", ["summary.json", "metrics.jsonl", "plan.yaml"])
def test_calibrate_from_runs_refuses_a_deeply_nested_run_file(capsys, tmp_path, which):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"measured_step_time_s": 1.0}))
    (run_dir / "plan.yaml").write_text(SMALL_PLAN.read_text())
    (run_dir / which).write_text(deep_json() if which != "plan.yaml" else deep_map())
    out = tmp_path / "fitted.yaml"
    err = refused(capsys, "calibrate", "--from-runs", run_dir, "-o", out, needle=str(run_dir / which))
    assert "nested more than 64 levels" in err and not out.exists()


def test_deeply_nested_set_and_vary_values_are_refused(capsys, tmp_path):
    out = tmp_path / "p.yaml"
    refused(capsys, "plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--set",
            f"machine.algorithms={deep_list()}", "-o", out, needle="machine.algorithms")
    assert not out.exists()
    refused(capsys, "whatif", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "1", "--vary",
            f"machine.nic_gbit_s={deep_list()}", needle="nested more than 64 levels")


def test_nesting_a_file_needs_still_reads(capsys, tmp_path):
    """64 levels are allowed (the committed files nest at most 6), and brackets inside JSON
    strings do not count."""
    from calibration.json_input import loads
    from planner.schema.errors import PlanError
    from planner.schema.files import load_yaml

    assert load_yaml(deep_list(64), "f") is not None
    assert loads('{"a": "' + "[" * 500 + '"}', "f") == {"a": "[" * 500}
    with pytest.raises(PlanError, match="nested more than 64 levels"):  # "]" in a string closes nothing
        loads('{"a": "' + "]" * 10 + '", "b": ' + deep_list(65) + "}", "f")


# --- binary files --------------------------------------------------------------------------------


def test_a_binary_kernels_file_is_refused(capsys, tmp_path):
    path = tmp_path / "k.json"
    path.write_bytes(bytes(range(256)) * 8)
    err = refused(capsys, "validate", "--kernels", path, needle="--kernels")
    assert str(path) in err and "binary" in err


@pytest.mark.parametrize("data", [b"\xff\xfe\x00\x01" * 64, b"name: x\n\xc3\x28\n"], ids=["binary", "not-utf8"])
def test_a_binary_model_file_or_plan_is_refused(capsys, tmp_path, data):
    path = tmp_path / "m.yaml"
    path.write_bytes(data)
    refused(capsys, "plan", "--model", path, "--machine", "dgx-h100", "--no-write", needle=str(path))
    refused(capsys, "explain", path, needle=str(path))


# --- devices and FIFOs: in a child process with a memory limit and a timeout ---------------------

LIMIT_BYTES = 4 * 2**30


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def child(*argv, timeout=60) -> subprocess.CompletedProcess:
    code = "import sys; from cli.main import main; sys.exit(main(sys.argv[1:]))"
    try:
        return subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, preexec_fn=_limited)
    except subprocess.TimeoutExpired:
        pytest.fail(f"exaplan {' '.join(map(str, argv))} hung for {timeout} s")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo", "directory"])
def test_a_device_fifo_or_directory_is_refused_without_reading_it(tmp_path, fifo, special):
    path = {"fifo": fifo, "directory": tmp_path}.get(special, special)
    kind = {"fifo": "a FIFO", "directory": "a directory"}.get(special, "a character device")
    out = tmp_path / "p.yaml"
    script = "; ".join([
        "import sys",
        "from cli.main import main",
        "argvs = " + repr([
            ["plan", "--model", str(path), "--machine", "dgx-h100", "-o", str(out)],
            ["plan", "--model", "protein-tiny", "--machine", str(path), "-o", str(out)],
            ["explain", str(path)],
            ["launch", str(path), "--scheduler=torchrun", "-o", str(tmp_path / "job.sh")],
            ["validate", "--kernels", str(path)],
            ["check", str(path), "--no-step"],
        ]),
        "sys.exit(max(main(a) for a in argvs))",
    ])
    try:
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                           preexec_fn=_limited)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{special}: a command hung reading it")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(lines) == 6, p.stderr[-2000:]
    assert all(str(path) in line and kind in line for line in lines), p.stderr
    assert not out.exists() and not (tmp_path / "job.sh").exists()


def test_calibrate_from_runs_refuses_a_fifo_summary(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "summary.json")
    (run_dir / "plan.yaml").write_text(SMALL_PLAN.read_text())
    p = child("calibrate", "--from-runs", run_dir, "-o", tmp_path / "fitted.yaml")
    assert p.returncode == 2 and "a FIFO" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


# --- caps on the work asked for -----------------------------------------------------------------


def _no_work(*_, **__):
    raise AssertionError("the work ran: the bound should have refused it first")


def test_plan_draws_are_capped_before_any_work(capsys, tmp_path, monkeypatch):
    from cli.plan import MAX_DRAWS

    monkeypatch.setattr("planner.search.robustness.ranking_robustness", _no_work)
    out = tmp_path / "p.yaml"
    with pytest.raises(SystemExit) as e:  # argparse: usage and the message, exit 2
        main(["plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--draws", "100000000", "-o", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--draws" in err and f"{MAX_DRAWS:,}" in err and "Traceback" not in err
    assert not out.exists()
    for bad in ("-1", "1e9", "9" * 5000):
        with pytest.raises(SystemExit):
            main(["plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--draws", bad, "--no-write"])
    assert f"at most {MAX_DRAWS:,}" in " ".join(_help(capsys, "plan").split())


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def test_whatif_vary_values_are_capped_before_any_search(capsys, monkeypatch):
    from planner.whatif.parse import MAX_VARY_VALUES

    monkeypatch.setattr("planner.whatif.engine.search", _no_work)
    values = ",".join(str(i) for i in range(1, 2001))
    err = refused(capsys, "whatif", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "1",
                  "--vary", f"model.layers={values}", needle="vary")
    assert "2,000 values" in err and f"at most {MAX_VARY_VALUES}" in err
    assert f"at most {MAX_VARY_VALUES} values" in " ".join(_help(capsys, "whatif").split())


def test_whatif_points_are_capped_before_any_search(capsys, monkeypatch):
    from planner.whatif.parse import MAX_POINTS

    monkeypatch.setattr("planner.whatif.engine.search", _no_work)
    layers = ",".join(str(i) for i in range(1, 29))
    nodes = ",".join(str(2 ** i) for i in range(16))
    err = refused(capsys, "whatif", "--model", "protein-tiny,protein-small", "--machine", "dgx-h100,aurora",
                  "--nodes", nodes, "--vary", f"model.layers={layers}", "--vary", "machine.nic_gbit_s=x1,x2",
                  needle="vary")
    assert "3,584 points" in err and f"at most {MAX_POINTS}" in err
    assert "fewer --vary values" in err and "fewer node counts" in err  # how to narrow it
    assert f"at most {MAX_POINTS} points" in " ".join(_help(capsys, "whatif").split())


def test_the_points_cap_is_exact():
    from planner.whatif.parse import MAX_POINTS, check_points, parse_vary
    from planner.schema.errors import PlanError

    vary = parse_vary("machine.nic_gbit_s=" + ",".join(f"x{i}" for i in range(1, 9)))
    assert check_points(1, 2, [vary], MAX_POINTS // 16) == MAX_POINTS
    with pytest.raises(PlanError, match=f"at most {MAX_POINTS}"):
        check_points(1, 2, [vary], MAX_POINTS // 16 + 1)


# --- names and ranks -----------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--machine", "--model"])
def test_whatif_refuses_a_name_too_long_for_a_file_name(capsys, option):
    argv = {"--model": "protein-tiny", "--machine": "dgx-h100"}
    for name, words in (("m" * 5000, "5,000 characters"), ("m" * 300, "unknown")):
        args = {**argv, option: name}
        refused(capsys, "whatif", "--model", args["--model"], "--machine", args["--machine"], "--nodes", "1",
                needle=words)


def test_whatif_refuses_output_paths_too_long_before_the_sweep(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("planner.whatif.engine.search", _no_work)
    for option in ("--csv", "--report", "--plots"):
        refused(capsys, "whatif", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "1", option,
                tmp_path / ("p" * 5000), needle="5,0")


def test_calibrate_from_runs_refuses_a_run_folder_name_too_long(capsys, tmp_path):
    refused(capsys, "calibrate", "--from-runs", tmp_path / ("r" * 300), "-o", tmp_path / "f.yaml", needle="--from-runs")


def test_check_refuses_a_rank_outside_the_world(capsys):
    err = refused(capsys, "check", SMALL_PLAN, "--ranks", "100000", needle="--ranks")
    assert "100,000" in err and "world size of 1 " in err


# --- the deadline's smallest node count ---------------------------------------------------------


def test_a_deadline_met_at_the_smallest_count_tried_says_fewer_were_not_tried(capsys):
    rc, out, err = run(capsys, "whatif", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "2,4",
                       "--deadline-days", "1000", "--json")
    assert rc == 0
    (d,) = json.loads(out)["deadline"]
    assert d["met"] and d["fewest"]["nodes"] == 2 and d["smallest_tried"] == 2 and d["fewer_not_tried"]
    assert "fewer nodes were not tried" in d["sentence"] and "--nodes 1:2" in d["sentence"]
    rc, out, err = run(capsys, "whatif", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "2,4",
                       "--deadline-days", "1000")
    assert rc == 0 and "fewer nodes were not tried" in " ".join(out.split())


def test_a_deadline_met_above_the_smallest_count_tried_says_nothing_more():
    from planner.whatif import questions
    from planner.whatif.types import WhatifPoint

    def pt(nodes, days):
        return WhatifPoint(model="x", machine="m", nodes=nodes, varied={}, fits=True, reason="", layout="l",
                           tokens_per_s=1.0, days=days, days_lo=days, days_hi=days, node_hours=nodes * days * 24,
                           ranks=nodes, devices_per_node=1)

    (d,) = questions.deadline([pt(1, 9.0), pt(2, 5.0)], 6.0, "node-hours")  # 1 node tried, too slow
    assert d["fewest"].nodes == 2 and not d["fewer_not_tried"] and "not tried" not in d["sentence"]
    (d,) = questions.deadline([pt(1, 9.0), pt(2, 5.0)], 10.0, "node-hours")  # 1 node: nothing is fewer
    assert d["fewest"].nodes == 1 and not d["fewer_not_tried"]


def test_the_progress_bar_shows_on_a_long_sweep_at_a_terminal(monkeypatch):
    from cli.whatif import ProgressBar

    bar = ProgressBar(enabled=True)
    monkeypatch.setattr(ProgressBar, "SHOW_AFTER_S", 0.0)
    bar(1, 300, "protein-tiny on 1 x dgx-h100")
    assert bar.progress is not None
    bar.close()
    quiet = ProgressBar(enabled=False)  # stderr not a terminal
    quiet(1, 300, "x")
    assert quiet.progress is None
