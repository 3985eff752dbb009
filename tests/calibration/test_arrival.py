"""Calibrate on arrival (`exaplan calibrate --arrival`, calibration/arrival.py): the options
refused before anything is written, the layouts of the sweep, and one run end to end on 2 local
ranks whose fitted machine `exaplan plan` accepts."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from calibration import arrival

EXAPLAN = [sys.executable, "-m", "cli"]
ROOT = Path(__file__).resolve().parents[2]


def sh(*args, check=True, env=None) -> subprocess.CompletedProcess:
    import os

    p = subprocess.run([*EXAPLAN, *args], capture_output=True, text=True, timeout=900, cwd=ROOT,
                       env={**os.environ, **(env or {})})
    if check and p.returncode != 0:
        raise AssertionError(f"exaplan {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


@pytest.mark.parametrize("extra, field", [
    ([], "--out"),
    (["--out", "OUT", "--layouts", "0"], "--layouts"),
    (["--out", "OUT", "--layouts", "13"], "--layouts"),
    (["--out", "OUT", "--steps", "2"], "--steps"),
    (["--out", "OUT", "--nodes", "0"], "--nodes"),
    (["--out", "OUT", "--nodes", "2"], "--launcher"),
    (["--out", "OUT", "--ranks", "3"], "--ranks"),
    (["--out", "OUT", "--launcher", "srun 'x"], "--launcher"),
    (["--out", "OUT", "--model", "protein-nope"], "model"),
    (["--out", "OUT", "--from-runs", "x"], "--from-runs"),
    (["--out", "OUT", "-o", "x.yaml"], "--output"),
])
def test_bad_arrival_options_exit_2_and_write_nothing(tmp_path, extra, field):
    out = tmp_path / "calib"
    args = [str(out) if a == "OUT" else a for a in extra]
    p = sh("calibrate", "--arrival", *args, check=False)
    assert p.returncode == 2, p.stderr
    assert field in p.stderr and "Traceback" not in p.stderr
    assert not out.exists() and not (ROOT / "x.yaml").exists()


@pytest.mark.parametrize("flag, value", [("--layouts", "2"), ("--steps", "3"), ("--nodes", "1"), ("--launcher", "srun")])
def test_arrival_options_need_arrival(flag, value):
    p = sh("calibrate", flag, value, check=False)
    assert p.returncode == 2 and flag in p.stderr and "only with --arrival" in p.stderr


def test_an_existing_calibration_is_not_overwritten(tmp_path):
    (tmp_path / "fitted.yaml").write_text("name: x\n")
    p = sh("calibrate", "--arrival", "--out", str(tmp_path), check=False)
    assert p.returncode == 2 and "--out" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fitted.yaml"]


def test_the_sweep_takes_different_kinds_first():
    names = [lay.name for lay in arrival.pick_layouts(2, 5, 32)]
    assert names == ["ddp-b25", "fsdp", "zero1", "tp2", "pp2-1f1b"]
    assert len(arrival.pick_layouts(4, 100, 32)) == 13  # hsdp joins at 4 ranks


def test_launcher_from_the_environment(monkeypatch):
    monkeypatch.setenv(arrival.LAUNCHER_ENV, "srun --ntasks-per-node 4 --cpu-bind 'map_cpu:0,1'")
    assert arrival.launcher_from(None) == ["srun", "--ntasks-per-node", "4", "--cpu-bind", "map_cpu:0,1"]
    assert arrival.launcher_from("") == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_arrival_end_to_end_leaves_a_machine_that_plans(tmp_path):
    out = tmp_path / "calib"
    p = sh("calibrate", "--arrival", "--out", str(out), "--layouts", "2", "--steps", "3", "--quick",
           "--model", "protein-tiny", env={"EXAPLAN_LAUNCHER": ""})
    assert "fitted.yaml" in p.stdout
    for name in ("fitted.yaml", "measured.yaml", "validation.csv", "validation.json", "README.md"):
        assert (out / name).exists(), name
    rows = list(csv.DictReader(open(out / "validation.csv")))
    assert [r["name"] for r in rows] == ["ddp-b25", "fsdp"] and all(r["status"] == "ok" for r in rows)
    readme = (out / "README.md").read_text()
    assert "ddp-b25" in readme and "fitted.yaml" in readme
    for lay in ("ddp-b25", "fsdp"):
        assert (out / "runs" / lay / "summary.json").exists()
        assert (out / "runs" / lay / "logs" / "rank-1.log").exists()
    plan = sh("plan", "--machine", str(out / "fitted.yaml"), "--model", "protein-tiny", "--nodes", "1",
              "-o", str(tmp_path / "plan.yaml"))
    assert (tmp_path / "plan.yaml").exists(), plan.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_arrival_through_a_launcher(tmp_path):
    """What a multi-node job does (once per job, the measurement and every run started through
    the launcher), with torchrun standing in for srun/mpiexec on 2 local ranks."""
    from runtime.launch import free_port

    launcher = (f"{sys.executable} -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d "
                f"--rdzv-endpoint 127.0.0.1:{free_port()} --no-python")
    out = tmp_path / "calib"
    sh("calibrate", "--arrival", "--out", str(out), "--layouts", "2", "--steps", "3", "--quick", "--model",
       "protein-tiny", "--launcher", launcher)
    assert "torch.distributed.run" in (out / "logs" / "measure.log").read_text().splitlines()[0]
    assert "torch.distributed.run" in (out / "runs" / "fsdp" / "run.log").read_text().splitlines()[0]
    sh("plan", "--machine", str(out / "fitted.yaml"), "--model", "protein-tiny", "--nodes", "1",
       "-o", str(tmp_path / "plan.yaml"))
