"""`exaplan launch PLAN --framework F --entry E`: the same job script around a framework's entry
point. Run for real under the fake scheduler: every rank starts E with the exported arguments
and torch.distributed's variables taken from the launcher's; no exaplan requeue; bad input
refused naming the option, nothing written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from launch_scripts import exaplan, job_env, run_script
from launch.rank import torch_env

ENTRY = """import json, os, sys
rank = os.environ["RANK"]
with open(os.path.join(os.environ["RECORD_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in
               ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")},
               "prefix": sys.prefix}, f)
"""


def test_torch_env_comes_from_each_launcher():
    assert torch_env({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)"}) == {
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert torch_env({"PALS_RANKID": "13", "PALS_LOCAL_RANKID": "1", "PALS_SIZE": "24", "PALS_LOCAL_SIZE": "12"}) == {
        "RANK": "13", "LOCAL_RANK": "1", "WORLD_SIZE": "24", "LOCAL_WORLD_SIZE": "12"}
    # torchrun's own variables stay as they are
    assert torch_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}) == {}
    assert torch_env({}) == {}


def test_the_rank_wrapper_runs_a_script_or_a_module(tmp_path):
    script = tmp_path / "entry.py"
    script.write_text(ENTRY)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_SIZE="2",
               OMPI_COMM_WORLD_LOCAL_SIZE="2", RECORD_DIR=str(tmp_path), PYTHONPATH=str(tmp_path))
    for entry in (str(script), "entry"):
        p = subprocess.run([sys.executable, "-m", "launch.rank", "--entry", entry, "--", "--tp", "2", "a b"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        got = json.loads((tmp_path / "rank-1.json").read_text())
        assert got["argv"] == ["--tp", "2", "a b"]
        assert got["env"]["RANK"] == "1" and got["env"]["WORLD_SIZE"] == "2" and got["env"]["LOCAL_WORLD_SIZE"] == "2"
        (tmp_path / "rank-1.json").unlink()


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("export.deepspeed") is None, reason="the deepspeed exporter is not here")
def test_a_framework_job_starts_the_entry_on_every_rank(tmp_path, testbox, tiny_plan, fakebin):
    entry = tmp_path / "train.py"
    entry.write_text(ENTRY)
    script = tmp_path / "job.sh"
    out = exaplan("launch", str(tiny_plan), "--machine", str(testbox), "--scheduler", "slurm", "--stage-env", "off",
                  "--framework", "deepspeed", "--entry", str(entry), "--out", str(tmp_path / "out"), "-o", str(script),
                  "--run-args=--extra 1")
    folder = tmp_path / "job-deepspeed"
    assert (folder / "ds_config.json").is_file() and f"wrote {folder}/" in out.stdout
    text = script.read_text()
    assert "--entry" in text and "--resume" not in text and "requeue" not in text.lower()  # the framework resumes itself
    p = run_script(script, job_env("slurm", fakebin, tmp_path, RECORD_DIR=str(tmp_path)))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for r, got in enumerate(ranks):
        assert got["env"]["RANK"] == str(r) and got["env"]["WORLD_SIZE"] == "2" and got["env"]["MASTER_PORT"]
        assert got["argv"][-2:] == ["--extra", "1"]
        assert any(str(folder / "ds_config.json") in w for w in got["argv"]), got["argv"]


def test_framework_launch_refuses_bad_input(tmp_path, testbox, tiny_plan):
    script = tmp_path / "job.sh"
    p = exaplan("launch", str(tiny_plan), "--machine", str(testbox), "--entry", "x.py", "-o", str(script), check=False)
    assert p.returncode == 2 and "--entry" in p.stderr and "Traceback" not in p.stderr
    p = exaplan("launch", str(tiny_plan), "--machine", str(testbox), "--framework", "nemo", "--entry", "x.py",
                "-o", str(script), check=False)
    assert p.returncode == 2 and "--framework: unknown framework 'nemo'" in p.stderr
    assert not script.exists() and not (tmp_path / "job-nemo").exists()
