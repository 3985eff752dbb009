"""Issue 51's outputs and launch refusals: no file replaced without --force, nothing written
through a symlink or over a device, and `exaplan launch` refusing scripts of jobs that would
fail (run options, memory, node counts). Each case failed before: an existing file was
replaced, a link written through, a script written with exit 0."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cli.main import main
from planner.schema.plan import load_plan

EST = ("estimate", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "1", "--tp", "1", "--pp", "1",
       "--dp", "8", "--mbs", "1", "--global-batch", "8", "--shard", "none", "--recompute", "none")
PLAN = ("plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "1", "--draws", "0")


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"exaplan {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def plan_file(tmp_path, capsys) -> Path:
    path = tmp_path / "plan.yaml"
    assert run(capsys, *EST, "-o", path)[0] == 0
    return path


@pytest.mark.parametrize("argv", [PLAN, EST], ids=["plan", "estimate"])
def test_an_existing_plan_file_is_replaced_only_with_force(argv, tmp_path, capsys):
    target = tmp_path / "p.yaml"
    target.write_text("mine\n")
    rc, _, err = run(capsys, *argv, "-o", target)
    assert rc == 2 and "exists: give --force" in one_error(err, argv[0])
    assert target.read_text() == "mine\n"
    assert sorted(os.listdir(tmp_path)) == ["p.yaml"]  # no temporary left behind
    assert run(capsys, *argv, "-o", target, "--force")[0] == 0
    assert load_plan(target).model.name == "protein-tiny"


def test_a_symlink_is_never_written_through(tmp_path, capsys, plan_file):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(victim)
    for argv in ((*PLAN, "-o", link, "--force"), ("launch", plan_file, "-o", link, "--force")):
        rc, _, err = run(capsys, *argv)
        assert rc == 2 and "symbolic link" in one_error(err, argv[0])
        assert link.is_symlink() and victim.read_text() == "precious\n"


def test_a_fifo_or_a_directory_is_refused_even_with_force(tmp_path, capsys):
    """(As root the old code replaced a device node such as /dev/full with a regular file; a
    FIFO stands in for it here, so that a regression cannot damage the machine.)"""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, words in ((fifo, "a FIFO"), (tmp_path, "a directory")):
        rc, _, err = run(capsys, *PLAN, "-o", target, "--force")
        assert rc == 2 and words in one_error(err, "plan")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_an_existing_job_script_is_kept_without_force(tmp_path, capsys, plan_file):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho mine\n")
    rc, _, err = run(capsys, "launch", plan_file, "-o", script)
    assert rc == 2 and "exists: give --force" in one_error(err, "launch")
    assert script.read_text() == "#!/bin/bash\necho mine\n"
    assert run(capsys, "launch", plan_file, "-o", script, "--force")[0] == 0
    assert "exaplan" in script.read_text() and os.access(script, os.X_OK)


def test_an_earlier_export_is_replaced_only_with_force(tmp_path, capsys, plan_file):
    out = tmp_path / "megatron"
    assert run(capsys, "export", plan_file, "--to", "megatron", "-o", out)[0] == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    rc, _, err = run(capsys, "export", plan_file, "--to", "megatron", "-o", out)
    assert rc == 2 and "--force" in one_error(err, "export")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert run(capsys, "export", plan_file, "--to", "megatron", "-o", out, "--force")[0] == 0


@pytest.mark.parametrize("run_args, words", [
    ("--bogus 1", "unrecognized arguments: --bogus"),
    ("--steps -1", "--steps must be an integer from 1"),
    ("--steps x", "invalid int value"),
    ("--out elsewhere", "launch's own --out"),
    ("--lr nan", "--lr must be a finite number"),
])
def test_run_options_are_checked_by_runs_own_parser(run_args, words, tmp_path, capsys, plan_file):
    script = tmp_path / "job.sh"
    rc, _, err = run(capsys, "launch", plan_file, "-o", script, f"--run-args={run_args}")
    assert rc == 2 and words in one_error(err, "launch") and "--run-args" in err
    assert not script.exists()
    assert run(capsys, "launch", plan_file, "-o", script, "--run-args=--steps 5 --ckpt-every 2")[0] == 0


def test_a_plan_that_does_not_fit_is_refused_unless_asked(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    argv = ("estimate", "--model", "protein-70b", "--machine", "dgx-h100", "--nodes", "1", "--tp", "1", "--pp", "1",
            "--dp", "8", "--mbs", "1", "--global-batch", "8", "--shard", "none", "--recompute", "none")
    assert run(capsys, *argv, "-o", big)[0] == 0
    assert not load_plan(big).prediction.fits
    script = tmp_path / "job.sh"
    rc, _, err = run(capsys, "launch", big, "-o", script)
    assert rc == 2 and "run out of memory" in one_error(err, "launch") and not script.exists()
    rc, _, err = run(capsys, "launch", big, "-o", script, "--ignore-memory")
    assert rc == 0 and "warning:" in err and script.exists()


def test_node_counts_are_checked_against_the_plan_and_the_machine(tmp_path, capsys, plan_file):
    script = tmp_path / "job.sh"
    rc, _, err = run(capsys, "launch", plan_file, "--nodes", "5", "-o", script)
    assert rc == 2 and "runs on 1 nodes" in one_error(err, "launch")
    rc, _, err = run(capsys, "launch", "--calibrate", "--machine", "frontier", "--nodes", "99999999", "--account", "X",
                     "-o", script)
    assert rc == 2 and "frontier has 9,856" in one_error(err, "launch")
    rc, _, err = run(capsys, "estimate", "--model", "protein-tiny", "--machine", "local", "--nodes", "4096", "--dp",
                     "4096", "--mbs", "1", "-o", tmp_path / "p.yaml")
    assert rc == 2 and "local has 1" in one_error(err, "estimate")
    assert not script.exists() and not (tmp_path / "p.yaml").exists()


def test_a_plan_remembers_its_machine_file_for_launch(tmp_path, capsys):
    machine = tmp_path / "my-cluster.yaml"
    assert run(capsys, "machine", "new", "--like", "dgx-h100", "--set", "devices_per_node=4", "--set",
               "nics_per_node=4", "--set", "nic_gbit_s=200", "--set", "nodes=32", "-o", machine)[0] == 0
    plan = tmp_path / "plan.yaml"
    assert run(capsys, "plan", "--model", "protein-tiny", "--machine", machine, "--nodes", "2", "--draws", "0",
               "-o", plan)[0] == 0
    assert load_plan(plan).provenance.machine_file == str(machine.resolve())
    script = tmp_path / "job.sh"
    rc, out, err = run(capsys, "launch", plan, "-o", script)  # no --machine: the plan names its file
    assert rc == 0, err
    assert "2 node(s) x 4 ranks" in out
    machine.unlink()
    rc, _, err = run(capsys, "launch", plan, "-o", script, "--force")
    assert rc == 2 and "no longer there: give --machine" in one_error(err, "launch")


def test_set_reaches_the_launch_section(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"  # the shortcut: a preset with fewer devices per node
    assert run(capsys, "plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "2", "--draws", "0",
               "--set", "machine.devices_per_node=4", "-o", plan)[0] == 0
    script = tmp_path / "job.sh"
    rc, _, err = run(capsys, "launch", plan, "-o", script)
    assert rc == 2 and "launch.ranks_per_node" in one_error(err, "launch")
    rc, _, err = run(capsys, "launch", plan, "-o", script, "--set", "machine.launch.ranks_per_node=4",
                     "--set", "machine.launch.gpus_per_node=4")
    assert rc == 2 and "cpu_sets: 8 sets for 4 ranks per node" in one_error(err, "launch")  # the binding too
    rc, _, err = run(capsys, "launch", plan, "-o", script, "--set", "machine.launch.ranks_per_node=4",
                     "--set", "machine.launch.gpus_per_node=4", "--set", "machine.launch.cpu_sets=[0-13,14-27,56-69,70-83]")
    assert rc == 0, err
    assert "--gpus-per-node=4" in script.read_text() and "mask_cpu:0x3fff," in script.read_text()
    rc, _, err = run(capsys, "launch", plan, "-o", script, "--force", "--set", "machine.launch.rank_per_node=4")
    assert rc == 2 and "unknown field" in one_error(err, "launch")


def test_piped_tables_follow_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    from cli.common import console

    assert console().width == 220
    monkeypatch.setenv("COLUMNS", "junk")
    assert console().width == 140  # not a terminal: the default


@pytest.mark.parametrize("launcher, words", [("srun; touch /tmp/owned", "without a shell"),
                                             ("no-such-launcher -N 2", "not a program on PATH")])
def test_an_arrival_launcher_is_checked_before_anything_is_made(launcher, words, tmp_path, capsys):
    out = tmp_path / "calib"
    rc, _, err = run(capsys, "calibrate", "--arrival", "--out", out, "--nodes", "2", "--launcher", launcher)
    assert rc == 2 and words in one_error(err, "calibrate")
    assert not out.exists()


def test_calibrate_keeps_an_existing_output(tmp_path, capsys):
    target = tmp_path / "fitted.yaml"
    target.write_text("mine\n")
    rc, _, err = run(capsys, "calibrate", "--quick", "-o", target)
    assert rc == 2 and "exists: give --force" in one_error(err, "calibrate")
    assert target.read_text() == "mine\n"


def test_whatif_outputs_are_refused_before_the_sweep(tmp_path, capsys):
    report = tmp_path / "r.html"
    report.write_text("mine\n")
    rc, _, err = run(capsys, "whatif", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "1:2",
                     "--report", report)
    assert rc == 2 and "exists: give --force" in one_error(err, "whatif")
    assert report.read_text() == "mine\n"


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:
    WORDS = st.sampled_from(["--steps", "--lr", "--out", "--bogus", "--resume", "--ckpt-every", "-1", "0", "5",
                             "nan", "1e-3", "x", "--data", "--seed", "--", "--help", "'", "--val-every=2"])

    @settings(max_examples=int(os.environ.get("EXAPLAN_FUZZ_EXAMPLES", "25")), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(words=st.lists(WORDS, max_size=5))
    def test_fuzz_launch_run_args(words, tmp_path_factory, capsys):
        """Whatever --run-args hold: a script (exit 0) or one message (exit 2) and no script."""
        tmp = tmp_path_factory.mktemp("fuzz")
        plan = tmp / "plan.yaml"
        assert main([*EST, "-o", str(plan)]) == 0
        capsys.readouterr()
        script = tmp / "job.sh"
        rc = main(["launch", str(plan), "-o", str(script), f"--run-args={' '.join(words)}"])
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert (rc == 0 and script.exists()) or (rc == 2 and len(err.strip().splitlines()) == 1 and not script.exists())


def _one_value_options():
    """(subcommand, flag) for every one-value option of every subcommand."""
    import argparse

    from cli.main import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if action.option_strings and action.nargs is None and action.option_strings[-1].startswith("--"):
                yield name, action.option_strings[-1]


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own usage errors (a required option missing) exit 2 too
        return e.code


@pytest.mark.parametrize("command,flag", sorted(set(_one_value_options())))
def test_an_option_given_a_lone_double_dash_is_refused(command, flag, capsys, tmp_path, monkeypatch):
    """`--X=--` for every one-value option: argparse drops the `--` and hands the option an
    empty list. Exit 2 with a message, no traceback, nothing written."""
    monkeypatch.chdir(tmp_path)
    rc = _exit_code([command, f"{flag}=--"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.strip() and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,flag", [
    (["launch", "{plan}", "-o", "{tmp}/job.sh", "--run-args=--"], "--run-args"),
    (["launch", "{plan}", "-o", "{tmp}/job.sh", "--set=--"], "--set"),
    ([*EST, "-o", "{tmp}/plan2.yaml", "--set=--"], "--set"),
    ([*EST, "-o", "{tmp}/plan2.yaml", "--precision=--"], "--precision"),
])
def test_a_lone_double_dash_is_refused_by_name(argv, flag, capsys, tmp_path):
    plan = tmp_path / "plan.yaml"
    assert main([*EST, "-o", str(plan)]) == 0
    capsys.readouterr()
    rc = main([a.format(plan=plan, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines() == [f"exaplan {argv[0]}: error: {flag}: give it a value ('--' alone ends the options)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]
