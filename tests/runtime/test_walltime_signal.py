"""The walltime signal (runtime/walltime.py): SIGUSR1 to `exaplan run` mid-run stops every rank
after its step with a complete checkpoint and exit 85; `--resume` continues to the losses of an
uninterrupted run, and metrics.jsonl holds each step once. Also the start-up precautions
(runtime/startup.py) and the metrics truncation on resume, without ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from runtime import metrics, startup, walltime  # noqa: E402
from runtime.options import EXIT_REQUEUE  # noqa: E402

EXAPLAN = [sys.executable, "-m", "cli"]
ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "protein-tiny", "--machine", "local", "--nodes", "1", "--seq-len", "32", "--global-batch", "8"]
RUN = ["--steps", "12", "--val-every", "0", "--val-batches", "1", "--log-every", "1", "--seed", "3"]


def sh(*args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([*EXAPLAN, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"exaplan {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def train_records(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def wait_for_step(out: Path, step: int, proc, timeout_s: float = 120.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, "the run ended before it was signalled"
        path = out / "metrics.jsonl"
        if path.exists() and any(r["step"] >= step for r in train_records(out)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no step {step} in {timeout_s} s")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigusr1_saves_exits_85_and_resume_matches_an_uninterrupted_run(tmp_path):
    plan = tmp_path / "fsdp.yaml"
    sh("estimate", *TINY, "--dp", "2", "--mbs", "2", "--shard", "fsdp", "-o", str(plan))
    straight = tmp_path / "straight"
    sh("run", str(plan), "--out", str(straight), *RUN)
    ref = {r["step"]: r["loss"] for r in train_records(straight)}

    out = tmp_path / "signalled"
    proc = subprocess.Popen([*EXAPLAN, "run", str(plan), "--out", str(out), *RUN], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_step(out, 3, proc)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(0.3)
    proc.send_signal(signal.SIGUSR1)  # a second signal, while the ranks finish the step or save
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_REQUEUE, log[-3000:]
    assert "ChildFailedError" not in log and "Traceback" not in log, log[-3000:]  # one clean line, no launcher trace

    from runtime import checkpoint

    stopped = json.loads((out / walltime.STOPPED_FILE).read_text())
    latest = checkpoint.latest(out / "checkpoints")
    assert latest is not None and checkpoint.is_complete(latest)
    assert checkpoint.checkpoint_step(latest) == stopped["resume_step"] < 12
    assert stopped["reason"] == "SIGUSR1" and stopped["exit_code"] == EXIT_REQUEUE
    assert json.loads((out / "summary.json").read_text())["stopped"]["resume_step"] == stopped["resume_step"]
    assert not any(p.name.endswith(".tmp") for p in (out / "checkpoints").iterdir())
    for rank in (0, 1):
        assert (out / "logs" / f"rank-{rank}.log").exists()
    assert "stopped by SIGUSR1" in (out / "logs" / "rank-0.log").read_text()

    p = sh("run", str(plan), "--out", str(out), *RUN, "--resume")
    assert f"step {stopped['resume_step']}, sample {stopped['resume_step'] * 8}" in p.stdout
    records = train_records(out)
    steps = [r["step"] for r in records]
    assert sorted(steps) == list(range(12)), steps  # each step once
    for r in records:
        assert r["loss"] == pytest.approx(ref[r["step"]], abs=1e-5), r["step"]
    kinds = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("stop") == 1 and kinds.count("resume") == 1


def test_exit_code_is_documented():
    p = sh("run", "--help")
    assert str(EXIT_REQUEUE) in p.stdout and "SIGUSR1" in p.stdout


def test_stop_signal_only_records(tmp_path):
    old = {s: signal.getsignal(s) for s in walltime.STOP_SIGNALS}
    try:
        stop = walltime.StopSignal(rank=1).install()
        assert stop.flag == 0
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: still the first reason, nothing raised
        assert stop.flag == 1 and stop.requested == "SIGUSR1" and stop.count == 2
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    rec = walltime.write_stopped(tmp_path, "SIGUSR1", 6, tmp_path / "ckpt", EXIT_REQUEUE)
    assert json.loads((tmp_path / walltime.STOPPED_FILE).read_text()) == rec and rec["resume_step"] == 7


def test_child_pids_finds_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in walltime.child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_truncate_after_drops_the_steps_a_resume_repeats(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "step": s} for s in range(6)] + [{"kind": "validation", "step": 3},
                                                               {"kind": "samples", "step": 5}, {"kind": "stop", "step": 5}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "train", "st')  # a line cut by a crash
    assert metrics.truncate_after(path, 4) == 4
    left = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in left] == [("train", 0), ("train", 1), ("train", 2), ("train", 3),
                                                      ("validation", 3), ("stop", 5)]
    assert metrics.truncate_after(tmp_path / "missing.jsonl", 0) == 0


def test_start_up_limits(tmp_path):
    import resource

    startup.raise_nofile_limit()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard or hard == resource.RLIM_INFINITY
    backlog = tmp_path / "somaxconn"
    backlog.write_text("128\n")
    msg = startup.somaxconn_warning(4096, backlog)
    assert msg and "128" in msg and "4096" in msg
    assert startup.somaxconn_warning(64, backlog) is None
    assert startup.somaxconn_warning(64, tmp_path / "absent") is None


def test_rank_log_tees_stdout_and_stderr(tmp_path):
    code = ("import os, sys; from runtime.startup import tee_rank_log; "
            f"tee_rank_log({str(tmp_path)!r}, 3); print('to stdout'); print('to stderr', file=sys.stderr); "
            "os.write(1, b'from C\\n')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "to stdout" in p.stdout and "to stderr" in p.stderr
    for _ in range(50):  # tee may still be writing when the process has gone
        text = (tmp_path / "logs" / "rank-3.log").read_text()
        if all(s in text for s in ("to stdout", "to stderr", "from C")):
            break
        time.sleep(0.1)
    assert all(s in text for s in ("to stdout", "to stderr", "from C")), text


def test_a_rank_that_skips_destroy_process_group_has_its_group_torn_down_at_exit(tmp_path):
    """runtime.startup.destroy_group_at_exit: the group is gone before the interpreter finalises
    (atexit runs handlers last-in first-out: the probe registered first sees the state after)."""
    code = ("import atexit, torch.distributed as dist\n"
            "from runtime.startup import destroy_group_at_exit\n"
            "atexit.register(lambda: print('at exit, initialized:', dist.is_initialized(), flush=True))\n"
            f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
            "destroy_group_at_exit(); destroy_group_at_exit()\n"
            "print('initialized:', dist.is_initialized(), flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["initialized: True", "at exit, initialized: False"], p.stdout


def test_a_finished_rank_exits_with_its_code_its_output_and_atexit_but_no_finalisation(tmp_path):
    """runtime.startup.exit_rank: the code comes back, buffered stdout (a pipe: not line-buffered)
    and the atexit handlers are not lost, and the interpreter's finalisation is skipped (an
    object's __del__ at module teardown never runs: what would destroy gloo's threads there)."""
    code = ("import atexit, sys\n"
            "from runtime.startup import exit_rank\n"
            "class Late:\n"
            "    def __del__(self): print('finalised', flush=True)\n"
            "late = Late()\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            "sys.stdout.write('buffered ')\n"
            "exit_rank(3)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 3, p.stderr
    assert p.stdout == "buffered atexit ran\n", p.stdout
