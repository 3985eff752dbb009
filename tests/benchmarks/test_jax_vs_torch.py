"""benchmarks/jax_vs_torch.py: answers --help at once, runs exaplan only through its command
line, plans the demo's job with the Makefile demo's options, parses metrics files and adds
up its statistics, and (slow) a --quick comparison runs end to end."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "benchmarks" / "jax_vs_torch.py"
OURS = ("planner", "runtime", "calibration", "machine_models", "cli", "launch", "report", "jaxrt")

if str(ROOT) not in sys.path:  # `benchmarks` is not an installed package: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import jax_vs_torch as bench  # noqa: E402


def test_help_answers_without_torch_jax_or_exaplan_code():
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "benchmarks.jax_vs_torch", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    for opt in ("--rounds", "--steps", "--quick", "--out", "--layouts", "--extra-rounds"):
        assert opt in res.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    heavy = {m for m in imported if m.split(".")[0] in ("torch", "jax", "jaxlib", *OURS)}
    assert not heavy, f"--help imported {sorted(heavy)}"


def test_the_driver_uses_exaplan_through_its_command_line_only():
    names = set()
    for node in ast.walk(ast.parse(DRIVER.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module)
    assert not {n for n in names if n.split(".")[0] in OURS}


def test_the_demo_plan_is_planned_as_the_makefile_demo_plans_it():
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile[makefile.index("\ndemo:"):].split("\n\n")[0]
    line = next(x for x in demo.splitlines() if "exaplan plan" in x)
    options = line.split("exaplan plan", 1)[1].split()
    options = options[:options.index("-o")]  # the output path is the driver's
    # The same job; the machine differs: the demo plans on the figures its arrival calibration
    # (the recipe's line before) fitted, the bench on `local` (it cannot assume that folder).
    machine = options.index("--machine") + 1
    calib = next(x for x in demo.splitlines() if "calibrate --arrival" in x).split("--out", 1)[1].split()[0]
    assert options[machine] == f"{calib}/fitted.yaml"
    assert bench.DEMO_PLAN_OPTIONS[machine] == "local"
    assert options[:machine] + options[machine + 1:] == bench.DEMO_PLAN_OPTIONS[:machine] + bench.DEMO_PLAN_OPTIONS[machine + 1:]
    assert bench.PLANS["demo"][0] == []


def test_make_bench_runs_bench_jax_after_bench_runtime():
    makefile = (ROOT / "Makefile").read_text()
    bench_recipe = makefile[makefile.index("\nbench:"):].split("\n\n")[0]
    assert bench_recipe.index("$(MAKE) bench-runtime") < bench_recipe.index("$(MAKE) bench-jax")
    assert re.search(r"\nbench-jax:.*\n\t\$\(RECORD\) jax --out docs/results/bench-jax\.json --figures "
                     r"runs/bench-jax/results\.json -- \\\n\t\t\$\(BIN\)/python -m benchmarks\.jax_vs_torch --out runs/bench-jax\n",
                     makefile)


def _write_run(run_dir: Path, times: list[float], t_first_end: float, measured: float | None = 0.5) -> None:
    run_dir.mkdir(parents=True)
    lines = [json.dumps({"kind": "train", "step": i, "loss": 3.0 - i / 10, "step_time_s": t,
                         "time": t_first_end + sum(times[1:i + 1])}) for i, t in enumerate(times)]
    lines = lines[::-1]  # out of order: parsed by step
    lines.insert(1, json.dumps({"kind": "validation", "step": 1, "val_loss": 2.0, "time": 0.0}))
    lines.append("{not json")
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if measured is not None:
        (run_dir / "summary.json").write_text(json.dumps({"measured_step_time_s": measured}))


def test_parse_run_reads_step_times_and_start_up(tmp_path):
    _write_run(tmp_path / "r", [9.0, 1.0, 2.0, 3.0], t_first_end=110.0)
    rec = bench.parse_run(tmp_path / "r", t_launch=100.0)
    assert rec["step_times_s"] == [9.0, 1.0, 2.0, 3.0]
    assert rec["losses"] == [3.0, 2.9, 2.8, 2.7]
    assert rec["startup_to_first_step_s"] == 10.0 and rec["first_step"] == 0
    assert rec["summary_measured_step_time_s"] == 0.5
    assert bench.step_stats(rec["step_times_s"], warmup=1) == {"median_s": 2.0, "min_s": 1.0}
    assert bench.step_stats(rec["step_times_s"], warmup=4) == {"median_s": None, "min_s": None}


def test_parse_run_without_step_records_fails(tmp_path):
    (tmp_path / "r").mkdir()
    with pytest.raises(bench.RunFailed, match="no step records"):
        bench.parse_run(tmp_path / "r", t_launch=0.0)
    _write_run(tmp_path / "s", [1.0], t_first_end=5.0, measured=None)
    assert bench.parse_run(tmp_path / "s", t_launch=0.0)["summary_measured_step_time_s"] is None


def _run(times, startup):
    return {"step_times_s": times, "startup_to_first_step_s": startup, "wall_s": 1.0}


PLANS = {"demo": {"path": "d.yaml", "layout": "pp2 | mbs2 x 2 | 1f1b", "options": ""},
         "jax": {"path": "j.yaml", "layout": "dp2 zero2 | mbs2 x 1", "options": "--backend jax"}}


def test_the_statistics_and_ratios_are_jax_over_torch():
    runs = {"torch": [_run([9.0, 2.0, 4.0, 4.0], 5.0), _run([9.0, 4.0, 4.0, 4.0], 6.0)],
            "jax": [_run([30.0, 1.0, 2.0, 3.0], 10.0), _run([30.0, 2.0, 2.0, 2.0], 12.0)]}
    r = bench.layout_result("demo", PLANS, runs, warmup=1)
    assert r["plans"] == {"torch": "d.yaml", "jax": "j.yaml"}
    assert r["jax"]["steps_measured"] == 6 and r["jax"]["min_step_s"] == 1.0 and r["torch"]["min_step_s"] == 2.0
    assert r["fastest_step_ratio"] == 0.5 and r["median_step_ratio"] == 0.5
    assert r["round_median_ratios"] == [0.5, 0.5]
    assert r["jax"]["round_medians_s"] == [2.0, 2.0] and r["torch"]["round_medians_s"] == [4.0, 4.0]
    assert r["startup_ratio"] == 11.0 / 5.5
    results = {"config": {"model": "m", "global_batch": 4, "seq_len": 128, "cores": 2, "rounds": 2, "extra_rounds": 1,
                          "steps": 4, "warmup": 1, "started": "now", "elapsed_s": 1.0},
               "plans": PLANS, "layouts": {"demo": r}, "failures": []}
    md = bench.markdown(results)
    assert "| demo | pp2 \\| mbs2 x 2 \\| 1f1b / dp2 zero2 \\| mbs2 x 1 | 2000.0 / 1000.0 | 0.500 |" in md
    assert "| 4000.0, 4000.0 | 2000.0, 2000.0 |" in md


def test_the_schedule_alternates_which_backend_goes_first():
    args = SimpleNamespace(layouts=["demo", "fsdp"], rounds=3, extra_rounds=1)
    order = bench.schedule(args)
    assert [(la, r, b) for la, r, b, first in order if first] == [
        ("demo", 1, "torch"), ("demo", 2, "jax"), ("demo", 3, "torch"), ("fsdp", 1, "jax")]
    assert len(order) == 8 and all({b for la, r, b, _ in order if (la, r) == key} == {"torch", "jax"}
                                   for key in {(la, r) for la, r, _, _ in order})


def test_quick_and_the_options():
    args = bench.parse_args(["--quick"])
    assert (args.layouts, args.rounds, args.steps, args.warmup) == (["demo"], 2, 8, 5)
    args = bench.parse_args([])
    assert args.layouts == list(bench.LAYOUTS) and (args.rounds, args.extra_rounds, args.steps) == (3, 1, 30)
    with pytest.raises(SystemExit):
        bench.parse_args(["--layouts", "pp4"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "5", "--warmup", "5"])


def test_describe_and_check_a_plan():
    demo = {"mesh": {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1}, "sharding": {"kind": "none"},
            "micro_batch_size": 2, "grad_accumulation_steps": 2, "sequence_parallel": False, "recompute": "none",
            "pipeline": {"schedule": "interleaved-1f1b", "virtual_stages": 4}}
    assert bench.describe(demo) == "pp2 | mbs2 x 2 | interleaved-1f1b v4"
    tp = {"mesh": {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 2}, "sharding": {"kind": "none"},
          "micro_batch_size": 4, "grad_accumulation_steps": 1, "sequence_parallel": True, "recompute": "selective",
          "pipeline": {"schedule": None, "virtual_stages": 1}}
    assert bench.describe(tp) == "tp2 sp | mbs4 x 1 | recompute selective"
    assert bench.check_plan(tp, bench.PLANS["tp2"][1]) == []
    assert bench.check_plan(demo, bench.PLANS["jax"][1]) == ["pp 2 (want 1)"]
    assert bench.check_plan(tp, bench.PLANS["fsdp"][1]) == ["sharding none (want fsdp)"]


@pytest.mark.slow
def test_quick_comparison_end_to_end(tmp_path):
    """The driver end to end: 2 rounds x 8 steps of both backends on the demo's job."""
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "benchmarks.jax_vs_torch", "--quick", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == [] and list(results["layouts"]) == ["demo"]
    demo = results["layouts"]["demo"]
    assert demo["plan_layouts"]["torch"].startswith("pp2")  # the demo's plan, which JAX does not run
    assert demo["plan_layouts"]["jax"].split()[0] != "pp2"
    for key in ("fastest_step_ratio", "median_step_ratio", "startup_ratio"):
        assert demo[key] > 0, key
    for backend in ("torch", "jax"):
        stats = demo[backend]
        assert stats["steps_measured"] == 6  # 2 rounds x (8 steps - 5 warm-up)
        assert 0 < stats["min_step_s"] <= stats["median_step_s"]
        assert len(stats["round_medians_s"]) == 2 and all(m > 0 for m in stats["round_medians_s"])
        assert stats["startup_to_first_step_s"] > 0
        assert [r["round"] for r in demo["runs"][backend]] == [1, 2]
        assert all(t > 0 for run in demo["runs"][backend] for t in run["step_times_s"])
    assert sum(r["first_in_round"] for b in ("torch", "jax") for r in demo["runs"][b]) == 2
    assert (out / "results.md").read_text().count("| demo |") == 1
