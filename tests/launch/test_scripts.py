"""Job scripts for every preset machine and each scheduler it allows: `bash -n` and shellcheck
pass, the header, binding and environment are those of the machine file; the allow-list; bad
input (one message naming the field, exit 2, nothing written)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main as cli_main
from launch.schedulers import cpu_mask
from machine_models import load_machine
from planner.schema.launch import env_name_problem
from planner.schema.plan import load_plan, write_plan

PRESETS = ["aurora", "alps", "frontier", "leonardo", "pdx", "dgx-a100-80gb", "dgx-a100-40gb", "dgx-h100", "lumi"]
SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")


def _plan(tmp: Path, machine: str, nodes: int = 2) -> Path:
    r = load_machine(machine).devices_per_node
    path = tmp / f"{machine}.yaml"
    assert cli_main(["estimate", "--model", "protein-tiny", "--machine", machine, "--nodes", str(nodes), "--tp", "1",
                     "--pp", "1", "--dp", str(nodes * r), "--mbs", "1", "--global-batch", str(nodes * r), "--shard",
                     "none", "--recompute", "none", "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[tuple[str, str], Path]:
    tmp = tmp_path_factory.mktemp("scripts")
    out = {}
    for machine in PRESETS:
        plan = _plan(tmp, machine)
        for kind in load_machine(machine).launch.schedulers:
            script = tmp / f"{machine}-{kind.value}.sh"
            assert cli_main(["launch", str(plan), "--scheduler", kind.value, "--account", "PRJ123", "--out",
                             str(tmp / f"out-{machine}"), "-o", str(script)]) == 0
            out[(machine, kind.value)] = script
    return out


@pytest.fixture(scope="module")
def calib_scripts(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """`exaplan launch --calibrate` for every preset x scheduler: 2 nodes (torchrun: 1, its limit)."""
    tmp = tmp_path_factory.mktemp("calib")
    out = {}
    for machine in PRESETS:
        for kind in load_machine(machine).launch.schedulers:
            script = tmp / f"calib-{machine}-{kind.value}.sh"
            nodes = "1" if kind.value == "torchrun" else "2"
            assert cli_main(["launch", "--calibrate", "--machine", machine, "--nodes", nodes, "--scheduler",
                             kind.value, "--account", "PRJ123", "--out", str(tmp / f"calib {machine}"),
                             "-o", str(script)]) == 0
            out[(machine, kind.value)] = script
    return out


def _joined(script: Path) -> list[str]:
    """The script's lines, continued lines joined, comments left out."""
    text = script.read_text().replace(" \\\n    ", " ")
    return [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def _launcher_line(script: Path, py: str, env: dict[str, str]) -> list[str]:
    """What --launcher receives at run time (the script's LAUNCHER array and LAUNCHER_LINE run by bash), split as
    calibrate --arrival splits it."""
    lines = _joined(script)
    start = next(i for i, line in enumerate(lines) if line.startswith("LAUNCHER=("))
    snippet = "\n".join(["set -euo pipefail", *lines[start:start + 2], 'printf %s "${LAUNCHER_LINE}"'])
    p = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, check=True,
                       env={**env, "PY": py, "JOB_ID": "77", "PATH": os.environ["PATH"]})
    return shlex.split(p.stdout)


def test_every_script_passes_bash_n_and_shellcheck(scripts):
    for script in scripts.values():
        subprocess.run(["bash", "-n", str(script)], check=True)
    p = subprocess.run([SHELLCHECK, "--severity=style", *map(str, scripts.values())], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:]
    assert {m for m, _ in scripts} == set(PRESETS)


def test_every_calibrate_script_passes_bash_n_and_shellcheck(calib_scripts):
    for script in calib_scripts.values():
        subprocess.run(["bash", "-n", str(script)], check=True)
    p = subprocess.run([SHELLCHECK, "--severity=style", *map(str, calib_scripts.values())], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout[-4000:]
    assert {m for m, _ in calib_scripts} == set(PRESETS)


@pytest.mark.parametrize("machine", PRESETS)
def test_calibrate_runs_arrival_once_through_the_schedulers_launcher(calib_scripts, machine, tmp_path):
    """calibrate --arrival once, in the batch script's shell (not under srun / mpiexec: it starts the ranks
    itself), with the start-up work of a plan job and --launcher holding the scheduler's launch command."""
    s = load_machine(machine).launch
    weird = tmp_path / "st age $(touch PWNED) 'q\"" / "bin"  # the staged interpreter's path, as odd as it gets
    weird.mkdir(parents=True)
    (weird / "python").symlink_to(sys.executable)
    for kind in s.schedulers:
        script = calib_scripts[(machine, kind.value)]
        lines = _joined(script)
        text = "\n".join(lines)
        for name in s.env:
            assert f"export {name}=" in text, (machine, name)
        assert "ulimit -n" in text and "somaxconn" in text and "STAGE_TAR" in text
        calls = [line for line in lines if "calibrate --arrival" in line]
        assert len(calls) == 1, calls
        nodes, r = (1 if kind.value == "torchrun" else 2), s.ranks_per_node
        assert calls[0].startswith('"${PY}" -m cli calibrate --arrival --out '), calls[0]
        assert f"--ranks {r} --nodes {nodes} --layouts 4 --base {machine}" in calls[0]
        assert calls[0].endswith('--launcher "${LAUNCHER_LINE}" &')
        assert not any(line.startswith(("srun", "mpiexec")) and "-m cli" in line for line in lines)
        words = _launcher_line(script, str(weird / "python"), {"USER": "u $(touch PWNED2)"})
        assert not list(tmp_path.rglob("PWNED*"))
        head = " ".join(words[:8])
        if kind.value == "slurm":
            assert head.startswith(f"srun --nodes=2 --ntasks-per-node={r}"), words
            if s.cpu_sets:
                assert "--cpu-bind=mask_cpu:" + ",".join(cpu_mask(c) for c in s.cpu_sets) in words
        elif kind.value == "pbs":
            assert head.startswith(f"mpiexec --envall -n {2 * r} --ppn {r}"), words
            if s.cpu_sets:
                assert words[words.index("--cpu-bind") + 1] == "list:" + ":".join(s.cpu_sets)
        else:
            assert words[1:4] == ["-m", "torch.distributed.run", "--standalone"] and "--no-python" in words
            assert f"--nproc-per-node={r}" in words and words[0] == str(weird / "python")
        i = words.index("launch.rank") - 2
        assert words[i:i + 3] == [str(weird / "python"), "-m", "launch.rank"], words
        assert words[-2:] == ["--command", "--"]  # arrival appends `PYTHON -m cli ...`
        if s.miopen_cache_dir:
            assert words[words.index("--miopen-cache") + 1].count("u $(touch PWNED2)") == 1


def test_calibrate_over_several_nodes_refuses_torchrun(tmp_path, capsys):
    err = _launch_fails(capsys, ["--calibrate", "--machine", "dgx-h100", "--nodes", "2", "--scheduler", "torchrun"],
                        tmp_path / "c.sh", "--scheduler")
    assert "--nodes 1" in err


@pytest.mark.parametrize("machine", PRESETS)
def test_header_binding_and_environment_follow_the_machine_file(scripts, machine):
    s = load_machine(machine).launch
    for kind in s.schedulers:
        text = scripts[(machine, kind.value)].read_text().replace(" \\\n    ", " ")  # continued lines joined
        for name, value in s.env.items():
            assert f"export {name}=" in text, (machine, name)
        for module in s.modules:
            assert f"module load {module}" in text
        assert "ulimit -n" in text and "somaxconn" in text and "launch.rank" in text
        if kind.value == "slurm":
            assert f"#SBATCH --ntasks-per-node={s.ranks_per_node}" in text and "#SBATCH --nodes=2" in text
            assert f"#SBATCH --signal=USR1@{s.signal_grace_s}" in text and "#SBATCH --requeue" in text
            assert "#SBATCH --account=PRJ123" in text and "sbcast" in text and "scontrol requeue" in text
            if s.cpu_sets:
                assert "--cpu-bind=mask_cpu:" + ",".join(cpu_mask(c) for c in s.cpu_sets) in text
        elif kind.value == "pbs":
            assert "#PBS -l select=2" in text and "#PBS -A PRJ123" in text and "qsub" in text
            assert f"--ppn {s.ranks_per_node}" in text and "sleep" in text  # the walltime watchdog
            if s.cpu_sets:
                assert "--cpu-bind list:" + ":".join(s.cpu_sets) in text
            for k, v in s.pbs_resources.items():
                assert f"#PBS -l {k}={v}" in text
        else:
            assert f"--nproc-per-node={s.ranks_per_node}" in text and "#SBATCH" not in text


def test_lumi_and_frontier_masks_are_the_documented_ones():
    documented = "fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000"
    for machine in ("lumi", "frontier"):
        masks = [cpu_mask(c)[2:] for c in load_machine(machine).launch.cpu_sets]
        assert ",".join(masks) == documented


def test_aurora_binds_twelve_tiles_as_alcf_documents():
    s = load_machine("aurora").launch
    assert s.default_scheduler.value == "pbs" and s.ranks_per_node == 12
    assert ":".join(s.cpu_sets) == "1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"


def test_allow_list():
    for ok in ("NCCL_ALGO", "CCL_ALLREDUCE", "FI_CXI_RX_MATCH_MODE", "ZE_FLAT_DEVICE_HIERARCHY", "MIOPEN_USER_DB_PATH"):
        assert env_name_problem(ok) is None
    for bad in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "PYTHONSTARTUP", "HOME", "nccl_algo",
                "NCCL_X;rm", "BASH_ENV"):
        assert env_name_problem(bad), bad


def _launch_fails(capsys, args: list[str], output: Path, field: str) -> str:
    rc = cli_main(["launch", *args, "-o", str(output)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert field in err and "Traceback" not in err
    assert not output.exists()
    return err


def test_bad_input_is_refused_naming_the_field(tmp_path, capsys, testbox, tiny_plan):
    job = tmp_path / "job.sh"
    frontier = _plan(tmp_path, "frontier", nodes=1)
    _launch_fails(capsys, [str(frontier), "--scheduler", "lsf", "--account", "A"], job, "--scheduler")
    _launch_fails(capsys, [str(frontier), "--scheduler", "pbs", "--account", "A"], job, "--scheduler")
    _launch_fails(capsys, [str(tiny_plan), "--machine", "frontier", "--account", "A"], job, "ranks_per_node")
    _launch_fails(capsys, [str(frontier), "--account", "A", "--walltime", "2h"], job, "--walltime")
    _launch_fails(capsys, [str(frontier), "--account", "A", "--walltime", "01:75:00"], job, "--walltime")
    _launch_fails(capsys, [str(frontier)], job, "--account")
    _launch_fails(capsys, [str(frontier), "--account", "A;rm -rf /"], job, "--account")
    _launch_fails(capsys, [str(frontier), "--account", "A", "--container", str(tmp_path / "no.sif")], job,
                  "--container")
    _launch_fails(capsys, ["--calibrate", "--machine", "frontier", "--account", "A"], job, "--nodes")


def test_a_plan_environment_outside_the_allow_list_is_refused(tmp_path, capsys, testbox, tiny_plan):
    for name in ("LD_PRELOAD", "PYTHONPATH", "PATH", "MY_VAR"):
        plan = load_plan(tiny_plan)
        plan.collectives.env[name] = "/tmp/evil.so"
        path = tmp_path / f"{name}.yaml"
        write_plan(plan, path)
        err = _launch_fails(capsys, [str(path), "--machine", str(testbox)], tmp_path / "job.sh", "collectives.env")  # refused when the plan is loaded
        assert name in err
