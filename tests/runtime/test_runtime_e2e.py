"""`exaplan run` end to end: 2 CPU ranks through torchrun, real data, checkpoints, resumption
after a SIGKILL, resumption under another layout, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAPLAN = [sys.executable, "-m", "cli"]
TINY = ["--model", "protein-tiny", "--machine", "local", "--nodes", "1", "--seq-len", "32", "--global-batch", "8"]


def sh(*args, env=None, check=True) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run([*EXAPLAN, *args], capture_output=True, text=True, env=full_env, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"exaplan {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def make_plan(tmp: Path, name: str, *layout: str) -> Path:
    path = tmp / f"{name}.yaml"
    sh("estimate", *TINY, *layout, "-o", str(path))
    return path


def steps_of(out: Path) -> tuple[dict[int, float], dict[int, list[int]]]:
    """Loss and samples of every step; a step run twice (before a crash and after the resume)
    keeps its last record."""
    losses, samples = {}, {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "samples":
            samples[r["step"]] = r["samples"]
        elif r.get("kind", "train") == "train" and "loss" in r:
            losses[r["step"]] = r["loss"]
    return losses, samples


RUN = ["--steps", "8", "--ckpt-every", "2", "--log-samples", "--val-every", "0", "--val-batches", "1", "--log-every", "1"]


@pytest.mark.timeout(600)
def test_killed_rank_resumes_to_the_same_losses_and_samples(tmp_path):
    plan = make_plan(tmp_path, "fsdp", "--dp", "2", "--mbs", "2", "--shard", "fsdp")
    straight = tmp_path / "straight"
    sh("run", str(plan), "--out", str(straight), *RUN)
    crashed = tmp_path / "crashed"
    p = sh("run", str(plan), "--out", str(crashed), *RUN, env={"EXAPLAN_FAULT_KILL": "1:4"}, check=False)
    assert p.returncode != 0  # rank 1 was SIGKILLed after step 4
    assert (crashed / "checkpoints" / "step-00000004").is_dir()
    sh("run", str(plan), "--out", str(crashed), *RUN, "--resume")
    ref_loss, ref_samples = steps_of(straight)
    loss, samples = steps_of(crashed)
    assert sorted(loss) == list(range(8))
    for step in range(8):
        assert loss[step] == pytest.approx(ref_loss[step], rel=1e-6), step  # same math, same order: fp32 reproducible
        assert samples[step] == ref_samples[step], step
    # none lost, none repeated: 8 steps x 8 sequences, each global sample once
    flat = [i for step in range(8) for i in samples[step]]
    assert sorted(flat) == list(range(64))
    summary = json.loads((crashed / "summary.json").read_text())
    for key in ("steps", "first_loss", "final_loss", "val_loss", "tokens_per_s", "measured_step_time_s",
                "predicted_step_time_s", "peak_memory_gib", "predicted_memory_gib"):
        assert key in summary


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_under_another_layout(tmp_path):
    """Saved under FSDP over 2 ranks, resumed under tensor parallelism (tp 2): the checkpoint
    reshards and training continues on the same losses (to fp32 reduction-order noise)."""
    fsdp = make_plan(tmp_path, "fsdp", "--dp", "2", "--mbs", "2", "--shard", "fsdp")
    tp = make_plan(tmp_path, "tp", "--dp", "1", "--tp", "2", "--mbs", "4", "--shard", "none")
    straight = tmp_path / "straight"
    sh("run", str(fsdp), "--out", str(straight), *RUN)
    moved = tmp_path / "moved"
    sh("run", str(fsdp), "--out", str(moved), *RUN[:1], "4", *RUN[2:])
    sh("run", str(tp), "--out", str(moved), *RUN, "--resume")
    ref, _ = steps_of(straight)
    got, samples = steps_of(moved)
    for step in range(8):
        assert got[step] == pytest.approx(ref[step], rel=1e-4), step
    assert sorted(i for s in range(8) for i in samples[s]) == list(range(64))


@pytest.mark.timeout(300)
def test_io_modes_run(tmp_path):
    """`--io-mode io-only` reads and batches without training (the synthetic mode is run by
    test_compiled_blocks_train_like_eager)."""
    plan = make_plan(tmp_path, "ddp", "--dp", "2", "--mbs", "4", "--shard", "none")
    p = sh("run", str(plan), "--out", str(tmp_path / "io"), "--steps", "3", "--io-mode", "io-only")
    assert "samples_per_s" in p.stdout


@pytest.mark.timeout(300)
def test_bad_run_input_is_exit_2_and_writes_nothing(tmp_path):
    plan = make_plan(tmp_path, "ddp", "--dp", "2", "--mbs", "4", "--shard", "none")
    cases = []
    bad_fasta = tmp_path / "bad.fasta"
    bad_fasta.write_text("MKV\n>x\n")  # sequence before any header
    cases.append((["--data", str(bad_fasta)], "data"))
    cases.append((["--resume"], "--resume"))
    two_nodes = tmp_path / "two.yaml"
    sh("estimate", "--model", "protein-tiny", "--machine", "local", "--nodes", "1", "--seq-len", "32",
       "--global-batch", "8", "--dp", "2", "--mbs", "4", "-o", str(two_nodes))
    text = two_nodes.read_text().replace("content_hash: ", "content_hash: 0")
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(text)
    for extra, needle in cases:
        out = tmp_path / f"out-{needle.strip('-')}"
        p = sh("run", str(plan), "--out", str(out), "--steps", "2", *extra, check=False)
        assert p.returncode == 2, p.stderr
        assert needle in p.stderr and "Traceback" not in p.stderr
        assert not out.exists()  # nothing left behind, the tokenised data included
    p = sh("run", str(tampered), "--out", str(tmp_path / "t"), "--steps", "2", check=False)
    assert p.returncode == 2 and "content hash" in p.stderr
    p = sh("run", str(tmp_path / "missing.yaml"), check=False)
    assert p.returncode == 2 and "cannot read plan file" in p.stderr


@pytest.mark.timeout(600)
def test_compiled_blocks_train_like_eager(tmp_path):
    """`exaplan run --compile` (torch.compile of each block; on a GPU it fuses the elementwise
    kernels the prediction counts as fused) gives the eager run's losses, step by step.

    The plan runs at twice protein-tiny's 128-token context (`--seq-len 256`): the rotary tables
    cover the job's sequences (before, the first forward failed on a shape mismatch). Both runs
    use synthetic data and `--no-final-checkpoint`, which leaves no checkpoint behind."""
    plan = tmp_path / "long.yaml"
    sh("estimate", "--model", "protein-tiny", "--machine", "local", "--nodes", "1", "--set", "machine.devices_per_node=1",
       "--seq-len", "256", "--global-batch", "8", "--dp", "1", "--mbs", "4", "--shard", "none", "-o", str(plan))
    losses = {}
    for mode in ("eager", "compile"):
        out = tmp_path / mode
        sh("run", str(plan), "--out", str(out), "--steps", "3", "--io-mode", "synthetic", "--val-every", "0",
           "--val-batches", "1", "--log-every", "1", "--no-final-checkpoint", *(["--compile"] if mode == "compile" else []))
        losses[mode] = steps_of(out)[0]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["compiled_blocks"] == (6 if mode == "compile" else 0)  # protein-tiny's 6 blocks
        assert summary["steps"] == 3 and summary["tokens_per_step"] == 8 * 256
        assert not list(out.glob("checkpoints/step-*"))  # a run without the flag ends with step-00000003
    assert sorted(losses["eager"]) == sorted(losses["compile"]) == [0, 1, 2]
    for step, loss in losses["eager"].items():
        assert losses["compile"][step] == pytest.approx(loss, rel=1e-4), step
