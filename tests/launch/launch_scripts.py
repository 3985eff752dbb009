"""Helpers of the launch tests (imported by their conftest and test modules under this unique
name: tests/slurm has a conftest of its own): the plan and machine figures, the exaplan CLI in a
subprocess, a machine file for this computer with a launch: section, a scheduler's job
environment around the fake cluster commands (tests/launch/fake_scheduler.py), running a
generated script, the losses of a run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAPLAN = [sys.executable, "-m", "cli"]
FAKES = ("srun", "mpiexec", "sbcast", "scontrol", "qsub")
TINY = ["--model", "protein-tiny", "--nodes", "1", "--seq-len", "32", "--global-batch", "8", "--dp", "2", "--mbs", "2",
        "--shard", "none"]
RUN_ARGS = "--steps 6 --lr 3e-3 --warmup 1 --val-every 0 --val-batches 1 --log-every 1"


def exaplan(*args: str, check: bool = True, cwd=ROOT) -> subprocess.CompletedProcess:
    p = subprocess.run([*EXAPLAN, *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"exaplan {' '.join(args)} -> {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_testbox(path: Path, **launch) -> Path:
    """This computer as a 2-rank machine (the detected local model) with a launch: section."""
    from machine_models import detect_local_machine

    data = detect_local_machine(2).model_dump(mode="json")
    data["name"] = path.stem
    ncpu = os.cpu_count() or 1
    data["launch"] = {"schedulers": ["slurm", "pbs", "torchrun"], "default_scheduler": "slurm", "ranks_per_node": 2,
                      "cpu_sets": ["0", "1"] if ncpu >= 2 else ["0", "0"], "local_scratch": str(path.parent / "local"),
                      "signal_grace_s": 120, **launch}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def job_env(kind: str, fakebin: Path, tmp: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "PALS_", "PMI_", "RANK",
                                                                     "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(PATH=f"{fakebin}:{env['PATH']}", MASTER_PORT=str(free_port()), FAKE_LOG=str(tmp / "fake.log"))
    if kind == "slurm":
        env.update(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost")
    elif kind == "pbs":
        nodefile = tmp / "nodefile"
        nodefile.write_text("localhost\n")
        env.update(PBS_JOBID="4242.pbs", PBS_NODEFILE=str(nodefile), PBS_O_WORKDIR=str(tmp))
    return {**env, **extra}


def run_script(script: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=script.parent,
                          timeout=timeout)


def losses(out: Path) -> dict[int, float]:
    found = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind", "train") == "train" and "loss" in r:
            found[r["step"]] = r["loss"]
    return found
