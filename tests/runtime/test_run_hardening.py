"""Issue 13 on the run side, without ranks (fast): every option of `exaplan run` checked before
anything starts (exit 2, the option named, no --out left behind), a plan that does not fit this
machine refused before data is tokenised, `exaplan run` without torch, the --out lock (busy,
stale), the parent's signals and exit codes, the orphan watchdog, TensorBoard after a resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cli.main import main  # noqa: E402
from planner.schema.errors import PlanError  # noqa: E402
from runtime import preflight, runlock, walltime  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "protein-tiny", "--machine", "local", "--nodes", "1", "--seq-len", "32", "--global-batch", "8"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "ddp.yaml"
    assert main(["estimate", *TINY, "--dp", "2", "--mbs", "4", "--shard", "none", "-o", str(path)]) == 0
    return path


@pytest.fixture
def no_data_prep(monkeypatch):
    """Fails the test if anything prepares data (it must not happen before a refusal)."""
    from runtime.dataprep import cache

    def boom(*a, **k):
        raise AssertionError("data was prepared before the refusal")

    monkeypatch.setattr(cache, "ensure_prepared", boom)


BAD_OPTIONS = [
    (["--lr", "nan"], "--lr"), (["--lr", "inf"], "--lr"), (["--lr=-1e-3"], "--lr"), (["--lr", "0"], "--lr"),
    (["--steps", "0"], "--steps"), (["--steps", "-5"], "--steps"), (["--steps", str(10**30)], "--steps"),
    (["--warmup", "-1"], "--warmup"), (["--seed", "-1"], "--seed"), (["--seed", str(2**64)], "--seed"),
    (["--val-every", "-1"], "--val-every"), (["--val-batches", "0"], "--val-batches"),
    (["--ckpt-every", "-2"], "--ckpt-every"), (["--log-every", "0"], "--log-every"),
    (["--val-pairs", "-1"], "--val-pairs"), (["--beta", "nan"], "--beta"), (["--beta", "-1"], "--beta"),
    (["--label-smoothing", "inf"], "--label-smoothing"), (["--label-smoothing", "0.5"], "--label-smoothing"),
    (["--data", "/no/such.fasta"], "--data"), (["--data", ","], "--data"), (["--pairs", "/no/such"], "--pairs"),
    (["--init", "/no/such"], "--init"), (["--reference", "/no/such"], "--reference"),
    (["--data", "x" * 5000], "--data"),
]


@pytest.mark.parametrize("extra,flag", BAD_OPTIONS, ids=[" ".join(e)[:40] for e, _ in BAD_OPTIONS])
def test_every_bad_option_is_refused_before_anything_starts(plan, tmp_path, capsys, no_data_prep, extra, flag):
    out = tmp_path / "out"
    assert main(["run", str(plan), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert not out.exists()


def test_out_that_is_a_file_or_unwritable_is_refused(plan, tmp_path, capsys, no_data_prep):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["run", str(plan), "--out", str(f)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["run", str(plan), "--out", str(f / "sub")]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_plan_that_does_not_fit_this_machine_is_refused_before_the_data(tmp_path, capsys, no_data_prep):
    """Failure 7: a 64-node plan (and one node of 12 GPU ranks whose memory this host lacks)."""
    big = tmp_path / "big.yaml"
    assert main(["estimate", "--model", "protein-3.5b", "--machine", "aurora", "--nodes", "64", "--dp", "768",
                 "--mbs", "1", "--global-batch", "768", "--shard", "fsdp", "-o", str(big)]) == 0
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["run", str(big), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "nodes" in err and "64 nodes" in err
    assert not out.exists()


def test_fit_checks_ranks_gpus_and_memory():
    class P:  # the fields the check reads
        nodes, ranks_per_node, world_size = 1, 4, 4

        class prediction:
            memory_gib_per_device = 1e6

    with pytest.raises(PlanError, match="2 GPUs"):
        preflight.check_fits_this_machine(P(), gpus=2)
    preflight.check_fits_this_machine(type("Q", (P,), {"prediction": type("p", (), {"memory_gib_per_device": 1})})(),
                                      gpus=4)
    with pytest.raises(PlanError, match="GiB"):
        preflight.check_fits_this_machine(P(), gpus=0)
    P.ranks_per_node = 10_000
    with pytest.raises(PlanError, match="per core"):
        preflight.check_fits_this_machine(P(), gpus=0)


def test_gpus_are_counted_before_torch_is_imported(monkeypatch):
    """`exaplan run` checks the plan before torch is imported: the GPUs come from the NVIDIA
    device files (narrowed by CUDA_VISIBLE_DEVICES), so that a GPU plan's device memory is
    not held against the host's RAM on a one-GPU workstation."""
    import glob

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    files = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps"]
    monkeypatch.setattr(glob, "glob", lambda pattern: [f for f in files if f.startswith(pattern.rstrip("*"))])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert preflight._visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert preflight._visible_gpus() == 1
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    assert preflight._visible_gpus() == 0


def test_run_without_torch_says_how_to_install(plan, tmp_path):
    """Item 6: torch made unimportable (sys.modules['torch'] = None): exit 2, the install line."""
    out = tmp_path / "out"
    code = ("import sys; sys.modules['torch'] = None; from cli.main import main; "
            f"sys.exit(main(['run', {str(plan)!r}, '--out', {str(out)!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and ".[runtime]" in p.stderr and "torch==2.13.0" in p.stderr
    assert not out.exists()


def test_the_launcher_does_not_import_torch(plan, tmp_path):
    """`exaplan run` checks the plan, takes the --out lock and prepares the data without
    importing torch: torchrun and every rank import it anyway, and a third import in the
    launcher added about 2 s to each run (the data cache's rank-0 broadcast had imported
    torch.distributed only to find no process group)."""
    out = tmp_path / "out"
    code = ("import sys; from runtime import launch; seen = []; "
            "launch.spawn_local = lambda *a, **k: seen.append('torch' in sys.modules) or 0; "
            f"from cli.main import main; main(['run', {str(plan)!r}, '--out', {str(out)!r}, '--steps', '1']); "
            "print('torch imported before the ranks started:', seen)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "torch imported before the ranks started: [False]" in p.stdout, p.stdout + p.stderr
    assert (out / "data").is_dir()  # the data was prepared in the launcher, as before


def test_a_busy_out_is_refused_naming_its_owner(plan, tmp_path, capsys, no_data_prep):
    out = tmp_path / "out"
    with runlock.RunLock(out, ["exaplan", "run", "first"]):
        assert main(["run", str(plan), "--out", str(out), "--steps", "2"]) == 2
        err = capsys.readouterr().err
        assert "in use by another exaplan run" in err and f"pid {os.getpid()}" in err
        assert out.exists()  # the owner's folder stays
    assert runlock.RunLock(out).acquire().taken_over is None  # released: free, not stale


def test_a_stale_lock_is_detected_said_and_taken_over(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    import json
    import socket

    (out / runlock.LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": 1.0}))
    lock = runlock.RunLock(out).acquire()
    try:
        assert lock.taken_over["pid"] == dead.pid
        err = capsys.readouterr().err
        assert "stale lock" in err and f"pid {dead.pid}" in err and "is gone" in err
        assert json.loads((out / runlock.LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_parent_exit_codes():
    f = walltime.Forwarder()
    assert f.exit_code(1, True, 85) == 85
    assert f.exit_code(0, False, 85) == 0
    f.received = "SIGINT"
    assert f.exit_code(1, True, 85) == 130
    f.received = "SIGHUP"
    assert f.exit_code(1, True, 85) == 129


def test_an_orphaned_rank_stops_on_its_own(tmp_path):
    """Item 4: a process under the watchdog whose parent is SIGKILLed gets SIGTERM (its stop
    signal) and, if it ignores it, SIGKILL after the grace period."""
    marker = tmp_path / "got-sigterm"
    child = (f"import signal, time, sys; sys.path.insert(0, {str(ROOT)!r}); from runtime.walltime import ParentWatchdog; "
             f"signal.signal(signal.SIGTERM, lambda *a: open({str(marker)!r}, 'w').write('x')); "
             "ParentWatchdog(poll_s=0.05, grace_s=1).start(); print('ready', flush=True); time.sleep(60)")
    middle = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
              "print(p.pid, flush=True); time.sleep(60)")
    mid = subprocess.Popen([sys.executable, "-c", middle], stdout=subprocess.PIPE, text=True)
    pid = int(mid.stdout.readline())
    time.sleep(1.5)  # the child is up and watching
    mid.kill()
    mid.wait()
    end = time.monotonic() + 10
    while time.monotonic() < end and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the orphan outlived its grace period"
    assert marker.exists(), "the orphan was not asked to stop first"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_tensorboard_has_no_duplicate_steps_after_resume(tmp_path):
    """Item 5: the resumed writer purges the steps from the checkpoint on (purge_step)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from runtime.metrics import MetricsWriter

    class Plan:
        world_size = 1

        class prediction:
            model_flops_per_step, step_time_s, tokens_per_s = 1e9, 1.0, 1.0

        class job:
            tokens_per_step, precision = 100, "fp32"

        class machine:
            @staticmethod
            def peak_flops(p):
                return 1e12

    first = MetricsWriter(tmp_path, Plan())
    for step in range(6):
        first.log_step(step, 3.0, 100, 0.1, 0)
    first.close()
    time.sleep(1.1)  # event files are named by the second
    second = MetricsWriter(tmp_path, Plan(), purge_step=3)
    for step in range(3, 8):
        second.log_step(step, 2.0, 100, 0.1, 0)
    second.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("train/loss")
    steps = [e.step for e in events]
    assert steps == list(range(8))
    assert [e.value for e in events][3:] == [2.0] * 5


# --- issue 51: nothing lost at the end, nothing replaced ----------------------------------------


def test_an_empty_out_is_refused_before_anything_starts(plan, tmp_path, capsys, no_data_prep, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Path("") is the current directory: it would be written over
    assert main(["run", str(plan), "--out", ""]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "empty path" in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []


def test_an_out_with_an_earlier_runs_results_is_refused(plan, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"measured": 1}\n')
    assert main(["run", str(plan), "--out", str(out), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "earlier run's results (summary.json)" in err and "Traceback" not in err
    assert sorted(os.listdir(out)) == ["summary.json"]  # no lock, no data left behind
    assert (out / "summary.json").read_text() == '{"measured": 1}\n'


def _finished_run(out: Path, step: int) -> dict:
    """An --out as a finished run leaves it: its last checkpoint (complete) and its results."""
    from runtime.checkpoint.paths import COMPLETE, META, step_dir_name

    ckpt = out / "checkpoints" / step_dir_name(step)
    ckpt.mkdir(parents=True)
    (ckpt / COMPLETE).write_text("")
    (ckpt / META).write_text("{}")
    (out / "summary.json").write_text('{"measured": 1}\n')
    (out / "metrics.jsonl").write_text('{"kind": "train", "step": 0}\n')
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_resuming_a_finished_run_is_refused_and_its_results_kept(plan, tmp_path, capsys, no_data_prep):
    """A resubmitted job script passes --resume whenever a checkpoint exists: a run already at
    --steps would only rewrite summary.json. Refused, naming --steps; a run with steps left is not."""
    out = tmp_path / "out"
    before = _finished_run(out, 5)
    assert main(["run", str(plan), "--out", str(out), "--steps", "5", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--steps" in err and "holds a finished run" in err and "step-00000005 is at step 5" in err, err
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    from runtime.options import check_out_of_a_new_segment
    from runtime.options import parse_run_args

    check_out_of_a_new_segment(parse_run_args([str(plan), "--out", str(out), "--steps", "6", "--resume"]))


@pytest.mark.parametrize("launcher", [{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
                                      {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}])
def test_rank_0_under_a_scheduler_refuses_an_out_with_results_before_it_writes(plan, tmp_path, launcher,
                                                                               monkeypatch):
    """Under srun, mpiexec or a job's torchrun, no `exaplan run` parent checks --out: rank 0 does,
    holding the lock, before it writes anything (no rank log, no metrics)."""
    from runtime import trainer
    from runtime.options import parse_run_args

    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(runlock.OWNER_ENV, raising=False)
    monkeypatch.setattr(walltime.ParentWatchdog, "start", lambda self: None)
    out = tmp_path / "out"
    before = _finished_run(out, 5)
    for argv, field in ([["--steps", "5"], "--out"], [["--steps", "5", "--resume"], "--steps"]):
        with pytest.raises(PlanError) as e:
            trainer.run_rank(parse_run_args([str(plan), "--out", str(out), *argv]))
        assert e.value.field == field, e.value
        files = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        assert files.pop(Path(runlock.LOCK_FILE)) == b""  # released
        assert files == before


@pytest.mark.slow
def test_a_fasta_too_small_for_a_validation_split_trains_and_keeps_its_work(plan, tmp_path):
    """The old end: every step trained, then the final validation over 0 sequences raised (a
    torchrun traceback, no summary.json, no checkpoint)."""
    import json

    fasta = tmp_path / "three.fasta"
    fasta.write_text("".join(f">s{i}\n{'MKTAYIAKQRQISFVKSHFSRQ' * 2}\n" for i in range(3)))
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "cli", "run", str(plan), "--out", str(out), "--data", str(fasta),
                        "--steps", "2", "--val-every", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "validation split is empty" in p.stdout + p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["val_loss"] is None
    from runtime import checkpoint

    assert checkpoint.checkpoint_step(checkpoint.latest(out / "checkpoints")) == 2


def test_a_hand_edited_plan_that_no_longer_fits_is_refused_before_any_rank(plan, tmp_path, capsys, no_data_prep):
    """A larger sequence written into the file, its hash recomputed: the plan still says it
    fits; its layout predicted again does not (the old code started ranks that then crashed)."""
    from planner.schema.plan import load_plan, seal, write_plan

    good = load_plan(plan)
    job = good.job.model_copy(update={"seq_len": 1 << 16})
    edited = tmp_path / "edited.yaml"
    write_plan(seal(good.model_copy(update={"job": job})), edited)
    assert load_plan(edited).prediction.fits
    out = tmp_path / "out"
    assert main(["run", str(edited), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "prediction.fits" in err and "make the plan again" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["launch", str(edited), "-o", str(tmp_path / "job.sh")]) == 2
    assert "make the plan again" in capsys.readouterr().err and not (tmp_path / "job.sh").exists()
