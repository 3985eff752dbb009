"""benchmarks/gpu_check.py, the one-GPU check (issue 14, item 5): its comparison of measured
against predicted, its table, the plans it runs by default, and (slow) the driver end to end on
the CPU with a tiny one-rank plan (the GPU-only parts skipped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu_check  # noqa: E402


def _plan(flops: float = 4e14, step: float = 0.5) -> dict:
    return {"job": {"precision": "bf16"}, "machine": {"peak_tflops": {"bf16": 1000.0}},
            "prediction": {"step_time_s": step, "mfu": flops / step / 1e15, "model_flops_per_step": flops}}


def test_measured_against_predicted():
    runs = {"exaplan": [{"median_s": 1.0, "min_s": 0.9, "startup_s": 5.0}, {"median_s": 0.8, "min_s": 0.7, "startup_s": 6.0}],
            "torch": [{"median_s": 1.0, "min_s": 1.0, "startup_s": 4.0}]}
    c = gpu_check.compare(_plan(), runs)
    assert c["best"]["exaplan"] == {"median_s": 0.8, "min_s": 0.7, "startup_s": 5.0}  # best of the rounds
    assert c["ratio_median"] == pytest.approx(0.8) and c["ratio_min"] == pytest.approx(0.7)
    assert c["mfu_exaplan"] == pytest.approx(4e14 / 0.8 / 1e15) and c["mfu_torch"] == pytest.approx(0.4)
    assert c["step_error"] == pytest.approx(0.8 / 0.5 - 1)
    text = gpu_check.table({"plans": {"p": {**c, "runs": runs}}})
    assert "| p | 800.0 / 700.0 | 1000.0 / 1000.0 | 0.800 / 0.700 | 5.0 / 4.0 | 50.0% / 40.0% | 500.0, 80.0% | +60.0% |" in text


def test_with_compile_an_eager_plan_is_compared_with_its_compiled_prediction():
    """--compile on the (eager) 3.5b plan: the layout re-predicted with compiled blocks, faster
    by the eager surplus; without --compile, the plan's own prediction."""
    path = gpu_check.PLANS / "protein-3.5b_1xh100.yaml"
    plan = yaml.safe_load(path.read_text())
    assert not plan["compile"]
    eager = gpu_check.predicted_step_s(path, compiled=False)
    compiled = gpu_check.predicted_step_s(path, compiled=True)
    assert eager == plan["prediction"]["step_time_s"]
    assert 0.6 < compiled / eager < 0.9
    c = gpu_check.compare(_plan(step=0.5), {"exaplan": [{"median_s": 0.4, "min_s": 0.4, "startup_s": 1.0}],
                                             "torch": [{"median_s": 0.4, "min_s": 0.4, "startup_s": 1.0}]}, 0.4)
    assert c["predicted_step_s"] == 0.4 and c["predicted_mfu"] == pytest.approx(4e14 / 0.4 / 1e15)
    assert c["step_error"] == pytest.approx(0.0)


def test_the_default_plans_exist_and_are_one_gpu_plans():
    """Without CUDA the default is the 80 GB card's plan; both 3.5b plans and the demo's exist,
    each one rank, the 3.5b ones bf16."""
    names = [p.name for p in gpu_check.default_plans()]
    assert names == ["demo_1gpu.yaml", "protein-3.5b_1xh100.yaml"]
    for name in ("demo_1gpu.yaml", "protein-3.5b_1xh100.yaml", "protein-3.5b_1xh200.yaml"):
        plan = yaml.safe_load((gpu_check.PLANS / name).read_text())
        assert plan["nodes"] == 1 and plan["ranks_per_node"] == 1
        assert plan["job"]["precision"] == ("fp32" if name.startswith("demo") else "bf16")
        assert plan["prediction"]["fits"]


def test_without_a_gpu_the_default_plans_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    res = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path / "gc")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no CUDA device" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "gc" / "gpu_check.json").exists()


@pytest.mark.slow
def test_the_driver_on_the_cpu(tmp_path):
    plan = tmp_path / "tiny.yaml"
    subprocess.run([sys.executable, "-m", "cli", "plan", "--model", "protein-tiny", "--machine", "local", "--set",
                    "machine.devices_per_node=1", "--seq-len", "32", "--global-batch", "4", "--mbs", "2",
                    "--precision", "fp32", "--draws", "0", "-o", str(plan)], cwd=ROOT, check=True, capture_output=True)
    out = tmp_path / "gc"
    res = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out), "--plans", str(plan),
                          "--quick", "--skip-device"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r = json.loads((out / "gpu_check.json").read_text())
    c = r["plans"]["tiny"]
    for side in ("exaplan", "torch"):
        (run,) = c["runs"][side]
        assert len(run["step_times_s"]) == 4 and 0 < run["min_s"] <= run["median_s"] and run["startup_s"] > 0
    assert c["ratio_median"] > 0 and 0 < c["mfu_exaplan"] < 1
    assert "| tiny |" in (out / "gpu_check.md").read_text()


def test_make_bench_gpu_jax_runs_the_jax_plans():
    """`make bench-gpu-jax`'s plans are the committed JAX twins (cli/examples.py), each a one-GPU
    jax plan."""
    from cli.examples import JAX_TWINS

    res = subprocess.run(["make", "-n", "bench-gpu-jax"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    plans = res.stdout.split("--plans ", 1)[1].split()[0].split(",")
    assert sorted(plans) == sorted(f"plans/{name}" for name in JAX_TWINS) and "--exaplan-only" in res.stdout
    for name in plans:
        plan = yaml.safe_load((ROOT / name).read_text())
        assert plan["backend"] == "jax" and plan["nodes"] == 1 and plan["ranks_per_node"] == 1, name


@pytest.mark.slow
def test_the_driver_runs_a_jax_plan_on_the_cpu(tmp_path):
    """A plan made with --backend jax goes through the JAX backend (`exaplan run` reads the plan)."""
    pytest.importorskip("jax")
    plan = tmp_path / "tinyjax.yaml"
    subprocess.run([sys.executable, "-m", "cli", "plan", "--model", "protein-tiny", "--machine", "local", "--set",
                    "machine.devices_per_node=1", "--seq-len", "32", "--global-batch", "4", "--mbs", "2",
                    "--precision", "fp32", "--draws", "0", "--backend", "jax", "-o", str(plan)], cwd=ROOT, check=True,
                   capture_output=True)
    out = tmp_path / "gc"
    res = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out), "--plans", str(plan),
                          "--quick", "--skip-device", "--exaplan-only"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = json.loads((out / "gpu_check.json").read_text())["plans"]["tinyjax"]["runs"]["exaplan"]
    assert len(run["step_times_s"]) == 4 and run["peak_memory_gib"] > 0
    log = (out / "logs" / "tinyjax-r1-exaplan.log").read_text()
    assert "jax " in log and "attention xla" in log
