"""The command line: JSON outputs, overrides that move the estimate, explain and schema, and
bad input (exit code 2, one line on stderr naming the field, no traceback, nothing written).

Most runs go through cli.main.main in-process (capsys); a few run the installed entry
point as a subprocess, as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from planner.schema.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
EXAPLAN = Path(sys.executable).parent / "exaplan"

ESTIMATE_KEYS = {"step_time_s", "tokens_per_s", "model_tflops_per_device", "hardware_tflops_per_device", "mfu",
                 "memory_gib_per_device", "fits", "breakdown"}


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Run every command in an empty directory, so that a default `plan.yaml` lands there."""
    monkeypatch.chdir(tmp_path)


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv) -> dict:
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


SMALL_PLAN = ("plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "1")
EST_3_5B = ("estimate", "--model", "protein-3.5b", "--machine", "dgx-h100", "--nodes", "2", "--dp", "16", "--mbs", "1",
            "--global-batch", "32")


# --- outputs -------------------------------------------------------------------------------------


def test_plan_json_and_the_plan_file(capsys, tmp_path):
    out_file = tmp_path / "best.yaml"
    data = run_json(capsys, *SMALL_PLAN, "--top", "3", "-o", str(out_file))
    assert set(data) == {"search", "world_size", "global_batch", "top", "why", "plan_file", "plan", "uncertainty",
                         "robustness"}
    assert set(data["search"]) == {"legal_layouts", "layouts_scored", "fitting", "search_seconds", "layouts_per_second",
                                   "robustness_seconds"}
    u = data["uncertainty"]
    assert 0 < u["step_time"] < 1 and 0 < u["memory"] < 1 and u["basis"]
    top = data["top"][0]
    lo, hi = top["intervals"]["step_time_s"]
    assert lo < top["step_time_s"] < hi and lo == pytest.approx(top["step_time_s"] * (1 - u["step_time"]))
    lo, hi = top["intervals"]["tokens_per_s"]
    assert lo < top["tokens_per_s"] < hi
    assert data["plan"]["prediction"]["uncertainty"]["step_time"] == pytest.approx(u["step_time"])
    r = data["robustness"]
    assert r["draws"] == 200 and 0 <= r["stays_first"] <= 1 and sum(r["winners"].values()) == pytest.approx(1.0)
    assert data["world_size"] == 8 and data["global_batch"] == 64  # default: 8 sequences per rank
    assert len(data["top"]) == 3
    assert ESTIMATE_KEYS | {"layout", "time_to_train_days"} <= set(data["top"][0])
    steps = [t["step_time_s"] for t in data["top"]]
    assert steps == sorted(steps)
    assert data["plan_file"] == str(out_file)
    plan = load_plan(out_file)
    assert plan.model_dump(mode="json") == data["plan"]
    assert plan.prediction.step_time_s == pytest.approx(steps[0], rel=1e-12)


def test_plan_no_write_writes_nothing(capsys, tmp_path):
    data = run_json(capsys, *SMALL_PLAN, "--no-write")
    assert data["plan_file"] is None
    assert list(tmp_path.iterdir()) == []


def test_plan_table_output(capsys, tmp_path):
    rc, out, err = run(capsys, *SMALL_PLAN, "-o", "p.yaml")
    assert rc == 0, err
    assert "protein-tiny" in out and "Top 5 layouts" in out and "wrote p.yaml" in out
    assert (tmp_path / "p.yaml").exists()


def test_plan_table_prints_every_figure_whole(capsys):
    """Long layout labels (a pipeline, cp, tp, recompute) wrap inside their column; the figures
    beside them are never cut short ("1,419,9…" had been printed for 1,419,979 tokens/s)."""
    argv = ("plan", "--model", "protein-3.5b", "--machine", "frontier", "--nodes", "64", "--global-batch", "1024",
            "--no-write")
    top = run_json(capsys, *argv)["top"]
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    table = out[out.index("Top 5 layouts"):out.index("Step time")]
    assert "…" not in table and "TFLOP/s/dev" in table and "mem/dev GiB" in table
    assert any(len(r["layout"]) > 70 for r in top)  # the case that used to squeeze the figures
    for r in top:
        assert f"{r['tokens_per_s']:,.0f}" in table and f"{r['mfu']:.1%}" in table


def test_estimate_json_keys(capsys):
    data = run_json(capsys, *EST_3_5B)
    assert ESTIMATE_KEYS <= set(data)
    assert data["layout"].startswith("dp16 ddp")
    b = data["breakdown"]
    assert {"compute_s", "bubble_s", "optimizer_s", "exposed_dp_s", "exposed_tp_s", "exposed_pp_s", "exposed_cp_s"} <= set(b)
    assert data["step_time_s"] == pytest.approx(
        b["compute_s"] + b["bubble_s"] + b["optimizer_s"] + b["exposed_dp_s"] + b["exposed_tp_s"] + b["exposed_pp_s"]
        + b["exposed_cp_s"], rel=1e-9)
    # 32 x 512 tokens per step.
    assert data["tokens_per_s"] == pytest.approx(32 * 512 / data["step_time_s"], rel=1e-12)
    assert 0 < data["mfu"] < 1 and data["fits"] is True


def test_set_model_layers_changes_the_estimate(capsys):
    base = run_json(capsys, *EST_3_5B, "--shard", "fsdp")
    deep = run_json(capsys, *EST_3_5B, "--shard", "fsdp", "--set", "model.layers=96")
    # 6x the blocks: compute grows about 6x (the head and optimizer do not scale with depth).
    ratio = deep["breakdown"]["compute_s"] / base["breakdown"]["compute_s"]
    assert 5.5 < ratio < 6.0
    # The fixed per-step overhead (in optimizer_s) does not grow with depth; the rest does.
    variable = lambda r: r["step_time_s"] - r["breakdown"]["optimizer_s"]  # noqa: E731
    assert variable(deep) > 4 * variable(base)
    assert deep["memory_gib_per_device"] > base["memory_gib_per_device"]


def test_set_nic_bandwidth_changes_comm_time(capsys):
    fast = run_json(capsys, *EST_3_5B)
    slow = run_json(capsys, *EST_3_5B, "--set", "machine.nic_gbit_s=10")
    assert slow["breakdown"]["exposed_dp_s"] > 10 * fast["breakdown"]["exposed_dp_s"]
    assert slow["breakdown"]["compute_s"] == fast["breakdown"]["compute_s"]
    assert slow["step_time_s"] > fast["step_time_s"]


def test_estimate_writes_a_loadable_plan(capsys, tmp_path):
    rc, out, err = run(capsys, *EST_3_5B, "--json", "-o", "e.json")
    assert rc == 0, err
    plan = load_plan(tmp_path / "e.json")
    assert plan.prediction.step_time_s == pytest.approx(json.loads(out)["step_time_s"], rel=1e-12)


def test_explain_a_written_plan(capsys, tmp_path):
    rc, _, err = run(capsys, *SMALL_PLAN, "--json", "-o", "p.yaml")
    assert rc == 0, err
    rc, out, err = run(capsys, "explain", "p.yaml")
    assert rc == 0, err
    for text in ("protein-tiny", "dgx-h100", "Mesh", "Collectives", "Prediction", "content hash", "(checked)",
                 "blocks eager"):
        assert text in out
    data = run_json(capsys, "explain", "p.yaml")
    assert data == load_plan(tmp_path / "p.yaml").model_dump(mode="json")
    rc, _, err = run(capsys, *SMALL_PLAN, "--compile", "-o", "c.yaml")
    assert rc == 0, err
    assert "blocks compiled" in run(capsys, "explain", "c.yaml")[1]


@pytest.mark.parametrize("which", ["all", "plan", "model", "machine", "job"])
def test_schema_prints_valid_json(capsys, which):
    rc, out, err = run(capsys, "schema", which)
    assert rc == 0, err
    schema = json.loads(out)
    if which == "all":
        assert set(schema) == {"model", "machine", "job", "plan"}
    else:
        assert schema["type"] == "object" and "properties" in schema
    if which == "model":
        assert schema["additionalProperties"] is False  # extra="forbid"
        assert all("description" in p for p in schema["properties"].values())


def test_list_json(capsys):
    data = run_json(capsys, "list")
    assert "protein-3.5b" in data["models"] and "aurora" in data["machines"] and "local" in data["machines"]


def test_list_shows_each_machines_shape_and_network(capsys):
    """A line per machine preset with its nodes, devices, peak and network; LUMI's NICs at the
    efficiency its comms logs measured, the others at the network efficiency."""
    assert main(["list"]) == 0
    lines = {ln.split()[1]: ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("machine ")}
    assert "2,978 x 8 AMD MI250X GCD" in lines["lumi"] and "4 x 200 Gb/s NICs at 0.39 (measured)" in lines["lumi"]
    assert "9,856 x 8 AMD MI250X GCD" in lines["frontier"] and "NICs at 0.85;" in lines["frontier"]
    assert "989 TFLOP/s bf16" in lines["dgx-h100"] and "rccl" in lines["frontier"]


# --- bad input -----------------------------------------------------------------------------------


def _bad_machine(tmp_path: Path) -> str:
    p = tmp_path / "broken.yaml"
    p.write_text("name: broken\ndevices_per_node: [4,\n")
    return str(p)


def _tampered_plan(tmp_path: Path) -> str:
    assert main([*SMALL_PLAN, "--json", "-o", "good.yaml"]) == 0
    text = (tmp_path / "good.yaml").read_text()
    p = tmp_path / "tampered.yaml"
    p.write_text(text.replace("token_budget: 1000000000.0", "token_budget: 2000000000.0"))
    assert p.read_text() != text
    return str(p)


TINY = ("--model", "protein-tiny", "--machine", "dgx-h100")
EST = ("estimate", "--model", "protein-3.5b", "--machine", "dgx-h100", "--nodes", "1", "--mbs", "1")

# (id, argv builder taking tmp_path, text the one-line error must contain)
BAD = [
    ("unknown-model", lambda t: ("plan", "--model", "protein-9b", "--machine", "dgx-h100"), "model: unknown model 'protein-9b'"),
    ("misspelt-set", lambda t: ("plan", *TINY, "--set", "model.layer=96"), "model.layer: unknown field (did you mean 'layers'?)"),
    ("misspelt-nested-set", lambda t: ("plan", *TINY, "--set", "machine.overlap.dpp=0.5"), "machine.overlap.dpp: unknown field"),
    ("set-renamed-field", lambda t: ("plan", *TINY, "--set", "machine.memory_bandwidth_gbps=100"),
     "machine.memory_bandwidth_gbps: renamed to 'memory_bandwidth_gbyte_s'"),
    ("set-bad-prefix", lambda t: ("plan", *TINY, "--set", "nodes=3"), "nodes: --set fields start with"),
    ("set-bad-value", lambda t: ("plan", *TINY, "--set", "machine.nic_gbit_s=-1"), "machine.nic_gbit_s"),
    ("zero-nodes", lambda t: ("plan", *TINY, "--nodes", "0"), "nodes: must be a positive"),
    ("negative-nodes", lambda t: ("plan", *TINY, "--nodes", "-4"), "nodes: must be a positive"),
    ("too-many-nodes", lambda t: ("plan", *TINY, "--nodes", "100000"), "nodes: 100,000 nodes asked for"),
    ("zero-nodes-estimate", lambda t: ("estimate", *TINY, "--nodes", "0", "--dp", "8", "--mbs", "1"), "nodes"),
    ("degrees-not-world", lambda t: (*EST, "--tp", "2", "--dp", "2"), "degrees: pp x dp x cp x tp = 1 x 2 x 1 x 2 = 4, but the world is 8"),
    ("tp-not-dividing-heads", lambda t: ("estimate", "--model", "protein-3.5b", "--machine", "dgx-h100", "--nodes", "3",
                                         "--tp", "3", "--dp", "8", "--mbs", "1"), "tp: 3 does not divide model.heads (32)"),
    ("batch-not-divisible", lambda t: (*EST, "--dp", "8", "--mbs", "2", "--global-batch", "20"), "mbs:"),
    ("malformed-machine-yaml", lambda t: ("plan", "--model", "protein-tiny", "--machine", _bad_machine(t)), "broken.yaml: malformed YAML at line 3"),
    ("unknown-machine", lambda t: ("plan", "--model", "protein-tiny", "--machine", "summit"), "machine: unknown machine 'summit'"),
    ("no-fit", lambda t: ("plan", "--model", "protein-70b", "--machine", "dgx-h100"), "memory: protein-70b fits nowhere"),
    ("no-layout-for-batch", lambda t: ("plan", "--model", "protein-3.5b", "--machine", "dgx-h100", "--set", "model.layers=1",
                                       "--set", "model.heads=1", "--set", "model.kv_heads=1", "--seq-len", "511",
                                       "--global-batch", "12"), "global_batch: no layout of 8 ranks keeps global batch 12"),
    ("tampered-plan", lambda t: ("explain", _tampered_plan(t)), "content hash does not match"),
    ("missing-plan", lambda t: ("explain", str(t / "nope.yaml")), "cannot read plan file"),
    ("zero-top", lambda t: ("plan", *TINY, "--top", "0"), "top: must be at least 1"),
]


@pytest.mark.parametrize("argv,needle", [pytest.param(b, n, id=i) for i, b, n in BAD])
def test_bad_input_exit_2_one_line_nothing_written(capsys, tmp_path, argv, needle):
    args = list(argv(tmp_path))
    capsys.readouterr()  # drop output of any setup run
    out_file = tmp_path / "out.yaml"
    if args[0] in ("plan", "estimate"):
        args += ["-o", str(out_file)]
    rc, out, err = run(capsys, *args)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"exaplan {args[0]}: error: ")
    assert needle in lines[0]
    assert "Traceback" not in err + out
    assert not out_file.exists()
    assert not (tmp_path / "plan.yaml").exists()


def test_zero_micro_batch_names_mbs(capsys):
    rc, _, err = run(capsys, *EST, "--dp", "8", "--mbs", "0")
    assert rc == 2
    assert "mbs: must be a positive integer" in err


def test_output_into_a_missing_directory_is_a_clear_error(capsys, tmp_path):
    target = tmp_path / "no-such-dir" / "plan.yaml"
    rc, _, err = run(capsys, *SMALL_PLAN, "-o", str(target))
    assert rc == 2
    assert err.strip().splitlines() == [f"exaplan plan: error: {target}: cannot write the plan: no directory "
                                        f"{target.parent} (create it first)"]
    assert not target.parent.exists()


def test_hsdp_default_shard_group_is_legal(capsys):
    """Default group: the data-parallel ranks of one node, but leaving at least 2 replicas."""
    data = run_json(capsys, "estimate", *TINY, "--nodes", "1", "--dp", "4", "--tp", "2", "--mbs", "1", "--shard", "hsdp")
    assert "dp4 hsdp(g2)" in data["layout"]
    data = run_json(capsys, "estimate", *TINY, "--nodes", "4", "--dp", "32", "--mbs", "1", "--shard", "hsdp")
    assert "dp32 hsdp(g8)" in data["layout"]  # 8 GPUs per node
    rc, _, err = run(capsys, "estimate", *TINY, "--nodes", "1", "--dp", "2", "--tp", "4", "--mbs", "1", "--shard", "hsdp")
    assert rc == 2 and "dp" in err and len(err.strip().splitlines()) == 1


# --- as a user runs it ---------------------------------------------------------------------------


def test_entry_point_as_subprocess(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "cli", *SMALL_PLAN, "--json", "--no-write"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["world_size"] == 8
    exe = [str(EXAPLAN)] if EXAPLAN.exists() else [sys.executable, "-m", "cli"]
    bad = subprocess.run([*exe, "plan", *TINY, "--set", "model.layer=96", "-o", "x.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["exaplan plan: error: model.layer: unknown field (did you mean 'layers'?)"]
    assert bad.stdout == ""
    assert not (tmp_path / "x.yaml").exists()


def test_planner_never_imports_torch():
    code = ("import cli.main, planner.search.search, planner.cost.step, planner.emit, planner.schema.plan, planner.report, "
            "machine_models; cli.main.build_parser(); import sys; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    # And a whole plan run, end to end.
    code = ("import sys; from cli.main import main; rc = main(['plan', '--model', 'protein-tiny', '--machine', "
            "'dgx-h100', '--json', '--no-write']); assert rc == 0; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_help_imports_no_schema():
    """`exaplan --help` and every subcommand's parser build without pydantic (the schema) or
    numpy: the limits and choices they name live in plain modules (planner/schema/limits.py,
    choices.py, export/targets.py, planner/whatif/parse.py)."""
    code = ("import sys, contextlib, io; from cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try: main(['--help'])\n"
            "    except SystemExit as e: assert e.code == 0\n"
            "assert 'COMMAND' in out.getvalue()\n"
            "heavy = [m for m in ('pydantic', 'numpy', 'rich', 'networkx') if m in sys.modules]\n"
            "assert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_bench_reports_each_case(capsys, monkeypatch):
    from planner import bench

    monkeypatch.setattr(bench, "CASES", (bench.Case("protein-tiny", "dgx-h100", 2, 4),))
    assert bench.main(["--json", "--repeats", "2"]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["ranks"] == 16 and r["global_batch"] == 64 and r["repeats"] == 2
    assert r["legal_layouts"] > 0 and r["layouts_scored"] >= r["legal_layouts"]
    assert r["layouts_scored_per_s"] == pytest.approx(r["layouts_scored"] / r["best_s"], rel=1e-12)
    assert r["chosen_layout"] and r["step_time_s"] > 0
    assert bench.main([]) == 0
    assert "protein-tiny on 2 x dgx-h100 (16 ranks)" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["data", "--help"], ["data", "prepare", "--help"],
                                  ["data", "info", "--help"], ["data", "pairs", "--help"], ["plan", "--help"],
                                  ["calibrate", "--help"], ["validate", "--help"], ["capacity", "--help"]])
def test_every_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as ex:
        main(argv)
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: exaplan") and len(out.splitlines()) > 3


def test_run_help_lists_the_trainer_options(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for option in ("--steps", "--resume", "--io-mode", "--pairs", "--precompute-reference", "plan"):
        assert option in out


@pytest.mark.parametrize("argv", [["list", "--json"], ["data", "sample", "--json"], ["schema", "job"]])
def test_json_output_parses(argv, capsys):
    assert main(argv) == 0
    json.loads(capsys.readouterr().out)


def test_a_cpus_flop_rate_is_shown_not_rounded_to_zero(capsys):
    """A CPU rank runs at tens of GFLOP/s: tables and the estimate give three significant
    digits below 1 TFLOP/s (0.0357, not 0.0), one decimal above."""
    from planner.report import fmt_rate

    assert (fmt_rate(0.035749), fmt_rate(0.5), fmt_rate(1.0), fmt_rate(378.44)) == ("0.0357", "0.5", "1.0", "378.4")
    assert main(["estimate", "--model", "protein-small", "--machine", "local", "--nodes", "1", "--dp", "2", "--mbs", "2",
                 "--global-batch", "4", "--seq-len", "128"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "model TFLOP/s per device" in ln)
    rate = float(line.split(" model TFLOP/s")[0].split(", ")[-1])
    assert 0.001 < rate < 1, line
