"""exaplan's own job scripts under a real Slurm (Debian's 22.05, started privately for the session:
tests/slurm/cluster.py), submitted with sbatch, for the `local` machine: protein-tiny on 2 ranks
trains and logs; the staged environment is what the ranks run; a signal checkpoints, the script
requeues and the requeued job ends on the losses of an uninterrupted run; a second job into a
busy --out is refused; scancel leaves no process; the calibrate-on-arrival job runs; two nodes
(srun across them, and the torchrun script's c10d rendezvous started by srun on each node).

Run with `make test-slurm` (EXAPLAN_SLURM=1); skipped otherwise."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from slurm_jobs import (exaplan, job_env, job_output, launch, processes_of, train_losses,
                      wait_for_step)

pytestmark = pytest.mark.slurm
STEPS = 80  # about 0.1 s a step here: long enough to be signalled mid-run after the ~10 s start-up


@pytest.fixture(scope="module")
def reference(slurm, tiny_plan, tmp_path_factory):
    """An uninterrupted run under sbatch (the losses the requeued run must reproduce)."""
    tmp = tmp_path_factory.mktemp("reference")
    script, out = launch(tiny_plan, tmp, "reference", "--stage-env", "off", steps=STEPS)
    job = slurm.sbatch(script, env=job_env(slurm))
    return dict(script=script, out=out, job=job, info=slurm.wait(job, timeout=300))


@pytest.mark.timeout(400)
def test_a_run_trains_and_writes_its_metrics_rank_logs_and_job_output(slurm, reference):
    out, job, info = reference["out"], reference["job"], reference["info"]
    text = job_output(out, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text}\n{slurm.logs()}"
    loss = train_losses(out)
    assert sorted(loss) == list(range(STEPS)) and loss[STEPS - 1] < loss[0] - 0.3, loss
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == 2
    for rank in (0, 1):
        head = (out / "logs" / f"rank-{rank}.out").read_text()
        assert f"exaplan launch: rank {rank} (local {rank})" in head, head[:500]
        assert (out / "logs" / f"rank-{rank}.log").is_file()
    # the job's own output, where #SBATCH --output put it: in OUT/logs, made by exaplan launch
    assert "exaplan: starting 2 ranks; rendezvous 127.0.0.1:" in text, text
    assert "exaplan: ranks finished with exit code 0" in text, text
    assert info["NodeList"] in slurm.node_names and info["NumTasks"] == "2"
    assert _lock_is_free(out)  # rank 0 held --out's lock under srun, and let it go


@pytest.mark.timeout(900)
def test_b_the_ranks_run_the_environment_staged_by_sbcast(slurm, tiny_plan, tmp_path):
    """--stage-env auto: the venv and the code packed once, sbcast to node-local storage, unpacked
    there by srun on every node; each rank's interpreter and code come from that copy."""
    local = tmp_path / "node-local"
    local.mkdir()
    script, out = launch(tiny_plan, tmp_path, "staged", "--stage-env", "auto", steps=4)
    job = slurm.sbatch(script, env=job_env(slurm, EXAPLAN_LOCAL_SCRATCH=str(local)))
    try:
        info = slurm.wait(job, timeout=840)
        text = job_output(out, job)
        assert info["JobState"] == "COMPLETED", f"{info}\n{text}"
        staged = local / f"exaplan-{job}"
        assert f"exaplan: staged on every node: {staged}" in text, text
        assert (local / f"exaplan-{job}.tar").is_file()  # sbcast's node-local copy
        for rank in (0, 1):
            head = (out / "logs" / f"rank-{rank}.out").read_text()
            assert f"sys.prefix={staged}/.venv " in head and f"code={staged} " in head, head[:500]
        assert sorted(train_losses(out)) == list(range(4))
    finally:  # 3-4 GiB each: the packed tarball, sbcast's copy, the unpacked tree
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(out / "stage", ignore_errors=True)


@pytest.mark.timeout(600)
def test_c_a_signal_checkpoints_the_script_requeues_and_the_run_ends_as_an_uninterrupted_one(
        slurm, tiny_plan, reference, tmp_path):
    """`scancel --signal=USR1` signals the job's steps, as `#SBATCH --signal=USR1@grace` does before
    the walltime: the ranks save and exit 85, the script runs `scontrol requeue`, and the job
    Slurm starts again resumes from the checkpoint."""
    script, out = launch(tiny_plan, tmp_path, "signalled", "--stage-env", "off", steps=STEPS)
    job = slurm.sbatch(script, env=job_env(slurm))
    wait_for_step(slurm, job, out, 5)
    slurm.cmd("scancel", "--signal=USR1", job)
    info = slurm.wait(job, timeout=400)
    text = job_output(out, job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", f"{info}\n{text}"
    assert "ranks finished with exit code 85" in text and "requeue 1 of" in text, text
    assert text.count("exaplan: starting 2 ranks") == 2 and text.rstrip().count("exit code 0") >= 1, text
    ref = train_losses(reference["out"])
    got = train_losses(out)  # each step once (train_losses refuses a step twice)
    assert sorted(got) == list(range(STEPS)), sorted(got)
    for step, loss in got.items():
        assert loss == pytest.approx(ref[step], abs=1e-5), step
    kinds = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("stop") == 1 and kinds.count("resume") == 1


@pytest.fixture(scope="module")
def busy(slurm, tiny_plan, tmp_path_factory):
    """A long run (job `first`); a second job into its --out (`second`), run to its end; then a plain
    `scancel` of the first: its processes before, and what is left of them and of the job after."""
    tmp = tmp_path_factory.mktemp("busy")
    script, out = launch(tiny_plan, tmp, "busy", "--stage-env", "off", steps=100_000)
    first = slurm.sbatch(script, env=job_env(slurm))
    try:
        wait_for_step(slurm, first, out, 2)
        second = slurm.sbatch(script, env=job_env(slurm))  # the same --out, on the other node
        r = dict(out=out, first=first, second=second, second_info=slurm.wait(second, timeout=240),
                 second_text=job_output(out, second), first_state=slurm.job(first).get("JobState"))
        before = max(train_losses(out))
        time.sleep(3)
        r["first_went_on"] = max(train_losses(out)) > before
        r["pids"] = pids = {line.split(":")[0] for line in processes_of(str(out))}
        slurm.cmd("scancel", first)
        end, left = time.monotonic() + 60, pids
        while left and time.monotonic() < end:
            time.sleep(1)
            left = pids & {line.split(":")[0] for line in processes_of(str(out))}
        r["left"] = [line for line in processes_of(str(out)) if line.split(":")[0] in left]
        time.sleep(15)  # a requeue (none is due) would have happened by now: cred_expire=10
        r["after_scancel"] = slurm.job(first)
        r["first_text"] = job_output(out, first)
        return r
    finally:  # whatever the script did on the scancel: nothing of it left for the next tests
        slurm.end_job(first)


@pytest.mark.timeout(600)
def test_e_a_second_job_into_a_busy_out_is_refused(busy):
    info, text = busy["second_info"], busy["second_text"]
    assert info["JobState"] == "FAILED", f"{info}\n{text}"
    # rank 0 refused (exit 2); rank 1, blocked in the rendezvous, ended by srun --wait
    assert re.search(r"ranks finished with exit code [1-9]", text) and "srun: error" in text, text
    assert "is in use by another exaplan run" in (busy["out"] / "logs" / "rank-0.out").read_text()
    assert busy["first_state"] == "RUNNING" and busy["first_went_on"]  # the first run undisturbed


@pytest.mark.timeout(600)
def test_d_scancel_leaves_no_process_behind(busy):
    assert busy["pids"], "no process of the running job found"
    assert busy["left"] == [], "\n".join(busy["left"])  # no srun, rank (python) or launcher of the job left


@pytest.mark.timeout(600)
def test_d_a_cancelled_job_stays_cancelled(busy):
    """scancel's SIGTERM makes the ranks checkpoint and exit 85 as the walltime signal does; the script
    knows it from its own SIGTERM and does not requeue."""
    info = busy["after_scancel"]
    assert info.get("JobState") == "CANCELLED" and info.get("Restarts") == "0", f"{info}\n{busy['first_text']}"


def _lock_is_free(out: Path) -> bool:
    import fcntl
    import os

    fd = os.open(out / ".exaplan-run.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.timeout(900)
def test_f_the_calibrate_on_arrival_job_runs(slurm, tmp_path):
    script, out = tmp_path / "calibrate.sh", tmp_path / "calib"
    exaplan("launch", "--calibrate", "--machine", "local", "--nodes", "1", "--layouts", "2", "--scheduler", "slurm",
            "--stage-env", "off", "--out", str(out), "-o", str(script))
    job = slurm.sbatch(script, env=job_env(slurm))
    info = slurm.wait(job, timeout=840)
    text = job_output(out, job)
    assert info["JobState"] == "COMPLETED", f"{info}\n{text}"
    assert "calibrate on arrival over 2 ranks through: srun --nodes=1 --ntasks-per-node=2" in text, text
    assert "calibrate on arrival finished with exit code 0" in text, text
    assert (out / "fitted.yaml").is_file()


def _two_nodes(slurm):
    if len(slurm.node_names) < 2:
        pytest.skip("one slurmd only")


@pytest.mark.timeout(400)
def test_two_nodes_srun_starts_a_rank_on_each(slurm, two_node_plan, tmp_path):
    _two_nodes(slurm)
    script, out = launch(two_node_plan, tmp_path, "two", "--stage-env", "off", steps=6)
    job = slurm.sbatch(script, env=job_env(slurm))
    info = slurm.wait(job, timeout=300)
    text = job_output(out, job)
    assert info["JobState"] == "COMPLETED" and info["NumNodes"] == "2", f"{info}\n{text}"
    assert sorted(train_losses(out)) == list(range(6))
    for node in slurm.node_names:  # the ranks' step (StepId=JOB.0) launched by each node's slurmd
        assert f"launch task StepId={job}.0 " in slurm.node_log(node), slurm.logs()


@pytest.mark.timeout(400)
def test_two_nodes_the_torchrun_script_meets_by_c10d_on_the_first_node(slurm, two_node_plan, tmp_path):
    """The generic torchrun script, run on each node of a Slurm job by srun (as a site without a
    Slurm preset would): both torchrun agents meet at the first node (c10d), no NODE_RANK given."""
    _two_nodes(slurm)
    script, out = tmp_path / "torchrun.sh", tmp_path / "out-torchrun"
    exaplan("launch", str(two_node_plan), "--scheduler", "torchrun", "--stage-env", "off", "--out", str(out), "-o",
            str(script), "--run-args=--steps 6 --log-every 1 --val-every 0 --val-batches 1")
    batch = tmp_path / "batch.sh"
    batch.write_text(f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --output={tmp_path}/batch-%j.out\n"
                     f"srun --nodes=2 --ntasks-per-node=1 bash {script}\n")
    job = slurm.sbatch(batch, env=job_env(slurm))
    info = slurm.wait(job, timeout=300)
    text = (tmp_path / f"batch-{job}.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and info["NumNodes"] == "2", f"{info}\n{text}"
    assert text.count("rendezvous 127.0.0.1:") == 2, text  # both nodes took the first node's address
    assert sorted(train_losses(out)) == list(range(6))
    for rank in (0, 1):
        assert f"exaplan launch: rank {rank} (local 0)" in (out / "logs" / f"rank-{rank}.out").read_text()
