"""Alps: CSCS's Container Engine (`--container EDF` -> `srun --environment=EDF`, the ranks run the container's
python3, staging off) and uenv (`--uenv IMAGE [--uenv-view VIEW]` -> `#SBATCH --uenv/--view` and `srun
--uenv/--view`); both pass bash -n and shellcheck; bad input exits 2 with one message and writes nothing; the
Alps-style EDF script runs end to end with a fake srun that ignores --environment."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main as cli_main
from launch_scripts import RUN_ARGS, exaplan, job_env, losses, run_script, write_testbox
from test_scripts import SHELLCHECK, _joined, _launch_fails, _plan


@pytest.fixture(scope="module")
def alps_plan(tmp_path_factory) -> Path:
    return _plan(tmp_path_factory.mktemp("alps"), "alps")


def _edf(folder: Path, name: str = "my env's.toml") -> Path:
    edf = folder / name
    edf.write_text('image = "nvcr.io#nvidia/pytorch:24.01-py3"\nmounts = ["/capstor", "/iopsstor", "/users"]\n'
                   'workdir = "/workspace"\n\n[annotations]\ncom.hooks.aws_ofi_nccl.enabled = "true"\n'
                   'com.hooks.aws_ofi_nccl.variant = "cuda12"\n')
    return edf


def _srun(script: Path) -> list[str]:
    """The words of the srun line that starts the ranks (`--ntasks-per-node=4`), as bash would split them."""
    line = next(x for x in _joined(script) if x.startswith("srun ") and "launch.rank" in x)
    return shlex.split(line.removesuffix(" &"))


def _checked(*scripts: Path) -> None:
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
    p = subprocess.run([SHELLCHECK, "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:]


def test_alps_edf_container_goes_to_srun_environment(alps_plan, tmp_path):
    edf = _edf(tmp_path)
    job, calib = tmp_path / "job.sh", tmp_path / "calib.sh"
    assert cli_main(["launch", str(alps_plan), "--account", "a-g34", "--container", str(edf), "-o", str(job)]) == 0
    assert cli_main(["launch", "--calibrate", "--machine", "alps", "--nodes", "2", "--account", "a-g34",
                     "--container", str(edf), "-o", str(calib)]) == 0
    _checked(job, calib)
    words = _srun(job)
    assert f"--environment={edf}" in words
    i = words.index("launch.rank")
    assert words[i - 4:i] == ["env", '--chdir=${CODE}', "python3", "-m"], words  # the container's python3
    text = job.read_text()
    assert "#SBATCH --environment" not in text and "--uenv" not in text
    assert "staging: off inside a container (edf)" in text and "STAGE_TAR" not in text
    assert "--environment=" in "\n".join(_joined(calib))
    # by name, from the EDF search path
    named = tmp_path / "named.sh"
    assert cli_main(["launch", str(alps_plan), "--account", "a-g34", "--container", "pytorch-24.01", "-o",
                     str(named)]) == 0
    assert "--environment=pytorch-24.01" in _srun(named)
    _checked(named)


def test_alps_uenv_goes_to_sbatch_and_srun(alps_plan, tmp_path):
    job, viewed = tmp_path / "job.sh", tmp_path / "viewed.sh"
    assert cli_main(["launch", str(alps_plan), "--account", "a-g34", "--uenv", "pytorch/v2.6.0:v1", "-o",
                     str(job)]) == 0
    assert cli_main(["launch", str(alps_plan), "--account", "a-g34", "--uenv", "prgenv-gnu/24.7:v3", "--uenv-view",
                     "modules", "--stage-env", "off", "-o", str(viewed)]) == 0
    _checked(job, viewed)
    text = job.read_text()
    assert "#SBATCH --uenv=pytorch/v2.6.0:v1\n#SBATCH --view=default\n" in text  # launch.uenv.default_view
    words = _srun(job)
    assert "--uenv=pytorch/v2.6.0:v1" in words and "--view=default" in words and "--environment" not in text
    assert words[words.index("launch.rank") - 2] == "${PY}"  # the (staged) venv, with the uenv mounted
    assert "--uenv=prgenv-gnu/24.7:v3" in _srun(viewed) and "--view=modules" in _srun(viewed)


def test_bad_container_and_uenv_input(alps_plan, tmp_path, capsys):
    job = tmp_path / "job.sh"
    edf = _edf(tmp_path, "ok.toml")
    base = [str(alps_plan), "--account", "a-g34"]
    err = _launch_fails(capsys, [*base, "--container", str(tmp_path / "missing.toml")], job, "--container")
    assert err.count("error") == 1
    _launch_fails(capsys, [*base, "--container", "./missing.toml"], job, "--container")
    _launch_fails(capsys, [*base, "--container", "bad name;rm"], job, "--container")
    err = _launch_fails(capsys, [*base, "--container", str(edf), "--uenv", "pytorch/v2.6.0:v1"], job, "--uenv")
    assert "--container" in err and err.count("error") == 1
    _launch_fails(capsys, [*base, "--scheduler", "torchrun", "--container", str(edf)], job, "--container")
    _launch_fails(capsys, [*base, "--scheduler", "torchrun", "--uenv", "pytorch/v2.6.0:v1"], job, "--uenv")
    _launch_fails(capsys, [*base, "--uenv", "pytorch $(touch PWNED)"], job, "--uenv")
    _launch_fails(capsys, [*base, "--uenv-view", "default"], job, "--uenv-view")
    frontier = _plan(tmp_path, "frontier", nodes=1)
    err = _launch_fails(capsys, [str(frontier), "--account", "A", "--uenv", "pytorch/v2.6.0:v1"], job, "--uenv")
    assert "launch.uenv" in err and err.count("error") == 1
    assert not list(tmp_path.rglob("PWNED*"))


@pytest.mark.timeout(300)
def test_edf_script_trains_protein_tiny_with_a_fake_srun(tmp_path, tiny_plan, fakebin):
    """An Alps-style machine (runtime edf) on this computer: the fake srun ignores --environment (logging it) and
    `python3` on PATH stands in for the container's interpreter."""
    pytest.importorskip("torch")
    machine = write_testbox(tmp_path / "edfbox.yaml", container={"runtime": "edf"},
                            uenv={"allowed": True, "default_view": "default"})
    container_bin = tmp_path / "container-bin"
    container_bin.mkdir()
    shim = container_bin / "python3"  # (a symlink would lose the venv: its pyvenv.cfg is found beside the link)
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    shim.chmod(0o755)
    edf = _edf(tmp_path, "job env $(touch PWNED) `touch PWNED2`.toml")  # quoted: runs nothing
    script, out = tmp_path / "edf.sh", tmp_path / "out edf"
    exaplan("launch", str(tiny_plan), "--machine", str(machine), "--container", str(edf), "--out", str(out), "-o",
            str(script), f"--run-args={RUN_ARGS}")
    env = job_env("slurm", fakebin, tmp_path)
    env["PATH"] = f"{container_bin}:{env['PATH']}"
    p = run_script(script, env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    loss = losses(out)
    assert sorted(loss) == list(range(6)) and loss[5] < loss[0] - 0.1, loss
    assert f"srun --environment={edf}" in (tmp_path / "fake.log").read_text()
    assert (out / "logs" / "rank-1.out").is_file()
    assert not list(tmp_path.rglob("PWNED*"))
