"""benchmarks/: the hand-written torch baselines stay plain torch (no exaplan code but the model
and the preset catalogue), answer --help at once, the driver's pinned plans hold their
layouts, its statistics add up, and (slow) a --quick comparison on ddp runs end to end."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(BENCH.glob("torch_*.py"))
OURS = ("planner", "runtime", "calibration", "machine_models", "cli", "launch", "report")
# What the torch baselines may take from exaplan: the model and the model presets, nothing else.
ALLOWED = {"runtime.model", "planner.presets"}
FORBIDDEN = ("runtime.parallel", "runtime.trainer", "planner.cost")

if str(ROOT) not in sys.path:  # `benchmarks` is not an installed package: import it from the checkout
    sys.path.insert(0, str(ROOT))


def _imports(path: Path) -> set[str]:
    """The modules a file imports (`from a.b import c` counts as a.b), lazy imports included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module)
    return names


def test_the_five_layout_scripts_and_the_one_gpu_loop_exist():
    assert [p.stem for p in SCRIPTS] == ["torch_ddp", "torch_fsdp", "torch_one_gpu", "torch_pp_1f1b", "torch_tp_sp",
                                         "torch_zero1"]


@pytest.mark.parametrize("path", [*SCRIPTS, BENCH / "common.py"], ids=lambda p: p.name)
def test_baselines_import_only_the_model_and_the_presets_from_exaplan(path):
    names = _imports(path)
    ours = {n for n in names if n.split(".")[0] in OURS}
    assert not [n for n in ours if n.startswith(FORBIDDEN)], f"{path.name} imports exaplan's parallel/trainer/cost code"
    assert ours <= ALLOWED, f"{path.name} imports {sorted(ours - ALLOWED)}: the baselines must stay plain torch"


@pytest.mark.parametrize("path", [BENCH / "runtime_vs_torch.py", BENCH / "summary.py"], ids=lambda p: p.name)
def test_the_driver_uses_exaplan_through_its_command_line_only(path):
    assert not {n for n in _imports(path) if n.split(".")[0] in OURS}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_each_script_answers_help_without_torch_or_exaplan_code(path):
    """`--help` parses before anything heavy is imported (-X importtime lists every import)."""
    res = subprocess.run([sys.executable, "-X", "importtime", str(path), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "--steps" in res.stdout and "--out" in res.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    heavy = {m for m in imported if m.split(".")[0] in ("torch", *OURS)}
    assert not heavy, f"--help imported {sorted(heavy)}"


def test_the_pinned_plans_hold_their_layouts(tmp_path):
    from benchmarks import runtime_vs_torch as bench

    env = bench.run_env()
    for layout in bench.LAYOUTS:
        bench.check_plan(bench.make_plan(layout, tmp_path, env), layout)  # RunFailed if not


def test_the_statistics_and_ratios():
    from benchmarks import summary

    def run(times, startup):
        return {"step_times_s": times, "startup_to_first_step_s": startup, "wall_s": 1.0}

    runs = {"plan": "p.yaml",
            "exaplan": [run([9.0, 1.0, 2.0, 3.0], 10.0), run([9.0, 2.0, 2.0, 2.0], 12.0)],
            "torch": [run([9.0, 2.0, 4.0, 4.0], 5.0), run([9.0, 4.0, 4.0, 4.0], 6.0)]}
    r = summary.layout_result(runs, warmup=1)
    assert r["exaplan"]["steps_measured"] == 6 and r["exaplan"]["min_step_s"] == 1.0
    assert r["fastest_step_ratio"] == 0.5 and r["median_step_ratio"] == 0.5
    assert r["startup_ratio"] == 11.0 / 5.5
    assert r["exaplan"]["round_spread"] == 1.0 and r["torch"]["round_spread"] == 1.0
    results = {"config": {"model": "m", "global_batch": 4, "seq_len": 128, "ranks": 2, "cores": 2, "rounds": 2,
                          "steps": 4, "warmup": 1, "started": "now"}, "layouts": {"ddp": r}, "failures": []}
    assert "| ddp | 1000.0 / 2000.0 | 0.500 |" in summary.markdown(results)


@pytest.mark.slow
def test_quick_comparison_on_ddp(tmp_path):
    """The driver end to end: 1 round of 6 steps of `exaplan run` and of torch_ddp.py."""
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "benchmarks.runtime_vs_torch", "--quick", "--layouts", "ddp",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["failures"] == []
    ddp = results["layouts"]["ddp"]
    for key in ("fastest_step_ratio", "median_step_ratio", "startup_ratio"):
        assert ddp[key] > 0, key
    for side in ("exaplan", "torch"):
        stats = ddp[side]
        assert stats["steps_measured"] == 5  # 6 steps, 1 warm-up
        assert 0 < stats["min_step_s"] <= stats["median_step_s"]
        assert stats["startup_to_first_step_s"] > 0
        assert all(t > 0 for run in ddp["runs"][side] for t in run["step_times_s"])
    assert (out / "results.md").read_text().count("| ddp |") == 1
