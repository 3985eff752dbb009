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


def _section(script: Path, start: str, end: str | None = None) -> str:
    text = script.read_text()
    body = text[text.index(start):]
    return body[:body.index(end) + len(end)] if end else body


@pytest.fixture(scope="module")
def slurm_script(plan, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("requeue")
    exaplan("launch", str(plan), "--scheduler", "slurm", "--stage-env", "off", "--out", str(tmp / "out"), "-o",
            str(tmp / "job.sh"), "--set", "machine.launch.max_requeues=3")
    return tmp / "job.sh"


@pytest.mark.parametrize("signal, cancelled", [("USR1", 0), ("TERM", 1)])
def test_the_walltime_signal_and_a_cancel_reach_the_ranks_and_only_a_cancel_is_remembered(
        slurm_script, tmp_path, signal, cancelled):
    """The script's traps, around a stand-in launcher that exits 85 on SIGTERM (as the ranks do
    after their checkpoint): USR1 (Slurm's --signal) and TERM (scancel, qdel) both reach it;
    only TERM marks the job cancelled, so that it is not requeued."""
    traps = _section(slurm_script, "CANCELLED=0", "|| true' TERM")
    loop = _section(slurm_script, 'while :; do wait "${LAUNCHER_PID}"', "rc=${last}; fi; fi")
    # The stand-in sets its own trap before it says it is armed, and the script says ready only
    # then: a TERM that reached it before its trap would end it with 143, not 85.
    armed = tmp_path / "armed"
    body = (f"( trap 'kill \"${{nap}}\"; exit 85' TERM; sleep 30 >/dev/null 2>&1 & nap=$!; : > '{armed}'; wait ) &\n"
            "LAUNCHER_PID=$!\n" + traps + f"\nwhile [ ! -e '{armed}' ]; do sleep 0.01; done\necho ready\n"
            + loop + '\necho "rc=${rc} cancelled=${CANCELLED}"\n')
    p = subprocess.Popen(["bash", "-c", body], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"  # the traps are set
    os.kill(p.pid, getattr(__import__("signal"), f"SIG{signal}"))
    out, _ = p.communicate(timeout=20)
    assert out.strip() == f"rc=85 cancelled={cancelled}"


@pytest.mark.parametrize("rc, cancelled, count, requeued, left", [
    (85, 0, None, True, "1"),   # the walltime signal: requeue 1
    (85, 0, "2", True, "3"),    # the chain goes on
    (85, 0, "3", False, None),  # max_requeues (3) done: no requeue, and a resubmission starts afresh
    (85, 1, "1", False, None),  # cancelled (scancel): checkpoint kept, not requeued
    (0, 0, "2", False, None),   # finished
    (1, 0, "2", False, None),   # failed
])
def test_requeue_only_after_the_walltime_signal_and_a_fresh_count_otherwise(
        slurm_script, tmp_path, rc, cancelled, count, requeued, left):
    after = _section(slurm_script, "# 6. Requeue")
    (tmp_path / "bin").mkdir()
    shim = tmp_path / "bin" / "scontrol"
    shim.write_text(f'#!/bin/sh\necho "scontrol $*" >> {tmp_path}/calls\n')
    shim.chmod(0o755)
    (tmp_path / "out" / "logs").mkdir(parents=True)
    counter = tmp_path / "out" / "logs" / "requeues"
    if count is not None:
        counter.write_text(count + "\n")
    assert "requeue ${requeues} of 3" in after  # --set machine.launch.max_requeues=3
    body = f'rc={rc}\nCANCELLED={cancelled}\nOUT={tmp_path}/out\nJOB_ID=4242\n' + after
    p = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=20,
                       env={**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"})
    assert p.returncode == rc
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    assert calls == ("scontrol requeue 4242\n" if requeued else ""), p.stdout + p.stderr
    assert (counter.read_text().strip() if counter.exists() else None) == left
    if cancelled and rc == 85:
        assert "cancelled: the checkpoint is saved, the job is not requeued" in p.stderr
