"""Helpers of the real-Slurm tests: exaplan's own commands, its Slurm job scripts for the `local`
machine, the submitting environment, and what a run leaves (losses, job output, processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cluster import SlurmCluster, free_ports

ROOT = Path(__file__).resolve().parents[2]
EXAPLAN = [sys.executable, "-m", "cli"]
TINY = ["--model", "protein-tiny", "--machine", "local", "--nodes", "1", "--seq-len", "32", "--global-batch", "8",
        "--dp", "2", "--mbs", "2", "--shard", "none"]
RUN = "--lr 3e-3 --warmup 1 --val-every 0 --val-batches 1 --log-every 1 --seed 3"


def exaplan(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([*EXAPLAN, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"exaplan {' '.join(args)} -> {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def launch(plan: Path, tmp: Path, name: str, *extra: str, steps: int = 8, out: Path | None = None,
           run: str = RUN) -> tuple[Path, Path]:
    """`exaplan launch PLAN --scheduler slurm` for the local machine: (script, out)."""
    script, out = tmp / f"{name}.sh", out or tmp / f"out-{name}"
    exaplan("launch", str(plan), "--scheduler", "slurm", "--out", str(out), "-o", str(script),
            f"--run-args=--steps {steps} {run}", *extra)
    return script, out


def job_env(slurm: SlurmCluster, **extra: str) -> dict[str, str]:
    """The submitting shell's environment (sbatch exports it to the job): its own rendezvous port,
    no launcher variables of the test runner's own."""
    env = {k: v for k, v in slurm.env.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_",
                                                                     "PYTEST_", "EXAPLAN_RUN_LOCK"))}
    return {**env, "MASTER_PORT": str(free_ports(1)[0]), **extra}


def train_losses(out: Path) -> dict[int, float]:
    found = {}
    path = out / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        r = json.loads(line)
        if r.get("kind") == "train" and "loss" in r:
            assert r["step"] not in found, f"step {r['step']} twice in {path}"
            found[r["step"]] = r["loss"]
    return found


def job_output(out: Path, job_id: str) -> str:
    path = out / "logs" / f"job-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else f"(no {path})"


def wait_for_step(slurm: SlurmCluster, job_id: str, out: Path, step: int, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(s >= step for s in train_losses(out)):
            return
        state = slurm.job(job_id).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job_id} {state} before step {step}:\n" \
                                                                 f"{job_output(out, job_id)}"
        time.sleep(0.5)
    raise TimeoutError(f"no step {step} in {out} after {timeout} s:\n{job_output(out, job_id)}")


def processes_of(marker: str) -> list[str]:
    """Processes (pid and command line) whose command line names `marker` (a run's --out)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((ln for ln in (proc / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if marker in cmd and "Z (zombie)" not in state:
            found.append(f"{proc.name}: {cmd.strip()}")
    return found
