"""`exaplan run PLAN --backend jax` end to end: what it writes, kill and resume, bad input,
two processes through a launcher's environment."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAPLAN = [sys.executable, "-m", "cli"]
STEPS = 6


def exaplan(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("XLA_FLAGS", None)  # the run sets its own device count
    return subprocess.run([*EXAPLAN, *args], cwd=ROOT, capture_output=True, text=True, env=full_env, timeout=timeout)


def train_records(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """protein-tiny on this machine's 2 ranks, FSDP, at sequence 64, planned for the JAX backend."""
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    r = exaplan("plan", "--model", "protein-tiny", "--machine", "local", "--global-batch", "4", "--seq-len", "64",
                "--shard", "fsdp", "--backend", "jax", "-o", str(path))
    assert r.returncode == 0, r.stderr
    assert "backend: jax" in path.read_text()
    return path


@pytest.fixture(scope="module")
def reference(plan_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    # No --backend: the plan names it.
    r = exaplan("run", str(plan_file), "--steps", str(STEPS), "--out", str(out), "--val-every", "3", "--log-every", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_run_writes_what_the_torch_runtime_writes(reference):
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["backend"] == "jax"
    assert summary["steps"] == STEPS and summary["world_size"] == 2
    assert summary["measured_step_time_s"] > 0 and summary["predicted_step_time_s"] > 0
    assert summary["val_loss"] is not None
    rows = train_records(reference)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(r["grad_norm"] > 0 and r["lr"] > 0 for r in rows)
    kinds = [json.loads(line)["kind"] for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("validation") == 1  # at step 3 (the last one goes to the summary)
    assert (reference / "plan.yaml").is_file()
    assert (reference / "checkpoints" / f"step_{STEPS:08d}").is_dir()


def test_kill_and_resume_gives_identical_losses(plan_file, reference, tmp_path):
    out = tmp_path / "run"
    common = ["run", str(plan_file), "--backend", "jax", "--steps", str(STEPS), "--out", str(out), "--val-every", "3"]
    killed = exaplan(*common, "--ckpt-every", "3", env={"EXAPLAN_FAULT_KILL": "0:4"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / "checkpoints" / "step_00000003").is_dir()
    again = exaplan(*common, "--ckpt-every", "3")
    assert again.returncode == 2 and "--resume" in again.stderr  # checkpoints there: not without --resume
    resumed = exaplan(*common, "--ckpt-every", "3", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    want = [r["loss"] for r in train_records(reference)]
    got = [r["loss"] for r in train_records(out)]
    assert [r["step"] for r in train_records(out)] == list(range(STEPS))
    assert got == pytest.approx(want, abs=1e-6)


def test_a_sigterm_saves_and_exits_85(plan_file, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([*EXAPLAN, "run", str(plan_file), "--backend", "jax", "--steps", "10000", "--out",
                             str(out), "--log-every", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    for line in proc.stdout:
        if line.startswith("step     2"):
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 85, rest
    stopped = json.loads((out / "stopped.json").read_text())
    assert stopped["reason"] == "SIGTERM"
    assert (out / "checkpoints" / f"step_{stopped['resume_step']:08d}").is_dir()


@pytest.mark.parametrize("extra, field", [
    (["plans/protein-70b_frontier_64n.yaml"], "pipeline parallelism"),
    (["plans/protein-3.5b_aurora_3200n_dpo.yaml"], "dpo"),
])
def test_layouts_it_does_not_run_are_refused(extra, field, tmp_path):
    out = tmp_path / "never"
    r = exaplan("run", *extra, "--backend", "jax", "--out", str(out))
    assert r.returncode == 2
    assert field in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_an_unknown_attention_kernel_is_refused(plan_file, tmp_path):
    r = exaplan("run", str(plan_file), "--out", str(tmp_path / "x"), env={"EXAPLAN_JAX_ATTENTION": "flash"})
    assert r.returncode == 2 and "EXAPLAN_JAX_ATTENTION" in r.stderr and "xla or cudnn" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x").exists()


def test_an_unknown_backend_is_refused(plan_file, tmp_path):
    r = exaplan("run", str(plan_file), "--backend", "tensorflow", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--backend" in r.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # two processes (multi-rank), about 20 s
def test_two_processes_through_the_launcher_environment(plan_file, tmp_path):
    """torchrun-style variables, as `exaplan launch` scripts and srun wrappers set them: two
    processes of one device each join one JAX job and train."""
    out = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [subprocess.Popen([*EXAPLAN, "run", str(plan_file), "--backend", "jax", "--steps", "4", "--out", str(out),
                               "--val-every", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**env, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                                              "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                              "MASTER_PORT": str(port)})
             for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    rows = train_records(out)
    assert len(rows) == 4 and rows[-1]["loss"] < rows[0]["loss"]
    assert json.loads((out / "summary.json").read_text())["backend"] == "jax"


@pytest.mark.slow  # three runs, two of them torchrun with 2 ranks, about 30 s
def test_the_torch_runtimes_weights_give_the_torch_runtimes_losses(plan_file, tmp_path):
    """A user moving between backends: both backends start from one torch checkpoint's
    weights (--init) and train on the same samples: the same losses step by step."""
    torch_run = tmp_path / "torch"
    r = exaplan("run", str(plan_file), "--backend", "torch", "--steps", "1", "--out", str(torch_run), "--val-every", "0")
    assert r.returncode == 0, r.stderr
    runs = {}
    for backend in ("torch", "jax"):
        out = tmp_path / f"{backend}-init"
        r = exaplan("run", str(plan_file), "--backend", backend, "--steps", "3", "--out", str(out), "--init",
                    str(torch_run), "--val-every", "0")
        assert r.returncode == 0, r.stderr
        runs[backend] = [row["loss"] for row in train_records(out)]
    assert runs["jax"] == pytest.approx(runs["torch"], abs=2e-4)


@pytest.mark.parametrize("io_mode", ["real", "synthetic"])
def test_the_jax_backend_runs_without_torch(plan_file, tmp_path, io_mode):
    """A JAX user's install has no torch: with `import torch` failing, a run still trains and
    writes its summary (TensorBoard is skipped with one warning: its writer is torch's)."""
    out = tmp_path / "run"
    code = ("import sys; sys.modules['torch'] = None; from cli.main import main; "
            f"sys.exit(main(['run', {str(plan_file)!r}, '--steps', '3', '--out', {str(out)!r}, '--val-every', '0', "
            f"'--io-mode', {io_mode!r}]))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "jax" and summary["steps"] == 3
