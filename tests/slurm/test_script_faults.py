"""Faults the real Slurm found in `exaplan launch`'s scripts (issue 52), checked without a Slurm
(these run in plain `make test`; tests/slurm/test_real_slurm.py runs the scripts for real):

- Slurm opens `#SBATCH --output` (in OUT/logs) before the script runs, so before its own
  `mkdir -p "${OUT}/logs"`: a job whose logs folder is missing fails (JobLaunchFailure).
  `exaplan launch` makes the folder when it writes the script.
- MASTER_ADDR was the first name of SLURM_JOB_NODELIST, which need not resolve (a node whose
  NodeAddr differs from its NodeName): it is the first node's NodeAddr now, else its name; and
  `scontrol show hostnames | head -n 1` ended the script (SIGPIPE under pipefail) when the node
  list outgrew the pipe buffer.
- The torchrun script met by a static rendezvous that needed each node's NODE_RANK: it uses
  torchrun's c10d rendezvous on the first node now, found from the Slurm or PBS allocation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_jobs import TINY, exaplan  # noqa: E402


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "tiny.yaml"
    exaplan("estimate", *TINY, "-o", str(path))
    return path


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_launch_makes_the_logs_folder_the_scheduler_opens_first(plan, tmp_path, kind):
    out = tmp_path / "deep" / "out"
    exaplan("launch", str(plan), "--scheduler", kind, "--stage-env", "off", "--out", str(out), "-o",
            str(tmp_path / "job.sh"))
    text = (tmp_path / "job.sh").read_text()
    assert f"{out}/logs/job" in text
    assert (out / "logs").is_dir()


def _section_one(script: Path) -> str:
    text = script.read_text()
    return text[text.index("# 1. The job"):text.index("export MASTER_ADDR")]


def _run(lines: str, tmp: Path, scontrol: str, **env: str) -> str:
    """Section 1 of a script in bash with a fake scontrol; prints MASTER_ADDR."""
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "scontrol").write_text(f"#!/bin/bash\n{scontrol}\n")
    (bin_ / "scontrol").chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "MASTER_"))}
    p = subprocess.run(["bash", "-c", f"set -euo pipefail\nmkdir() {{ :; }}\n{lines}\necho \"${{MASTER_ADDR}}\""],
                       capture_output=True, text=True, env={**base, "PATH": f"{bin_}:{base['PATH']}", **env},
                       timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


# a long node list (200,001 names, as a large allocation gives), which `head -n 1` would cut short with
# SIGPIPE under `set -o pipefail`
FAKE_SCONTROL = ('if [ "$1 $2" = "show hostnames" ]; then echo node7; seq -f "node%g" 1 200000; '
                 'elif [ "$1 $2 $3 $4" = "show node -o node7" ]; then '
                 'echo "NodeName=node7 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.2.7 NodeHostName=n7 Version=22.05"; '
                 'else exit 1; fi')


def test_the_slurm_rendezvous_is_the_first_nodes_address(plan, tmp_path):
    exaplan("launch", str(plan), "--scheduler", "slurm", "--stage-env", "off", "--out", str(tmp_path / "out"), "-o",
            str(tmp_path / "job.sh"))
    lines = _section_one(tmp_path / "job.sh")
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[7-8]"}
    assert _run(lines, tmp_path, FAKE_SCONTROL, **job) == "10.1.2.7"
    assert _run(lines, tmp_path, 'if [ "$2" = hostnames ]; then echo node7; else exit 1; fi', **job) == "node7"


def test_the_torchrun_script_meets_by_c10d_on_the_first_node_of_the_allocation(two_node_plan, tmp_path):
    script = tmp_path / "job.sh"
    p = exaplan("launch", str(two_node_plan), "--scheduler", "torchrun", "--stage-env", "off", "--out",
                str(tmp_path / "out"), "-o", str(script))
    text = script.read_text()
    assert "--rdzv-backend=c10d" in text and '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"' in text
    assert '--rdzv-id="${JOB_ID}"' in text and "--node-rank" not in text and "NODE_RANK" not in text
    assert "NODE_RANK" not in p.stdout  # the submit hint
    lines = _section_one(script)
    assert _run(lines, tmp_path, FAKE_SCONTROL, SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node[7-8]") == "10.1.2.7"
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1000c0s0b0n0\nx1000c0s0b0n1\n")
    assert _run(lines, tmp_path, "exit 1", PBS_NODEFILE=str(nodefile)) == "x1000c0s0b0n0"
    assert _run(lines, tmp_path, "exit 1", MASTER_ADDR="host0") == "host0"
