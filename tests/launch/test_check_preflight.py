"""`exaplan plan --check` and `exaplan launch --check`: the full-size check (runtime/check.py)
before a plan or a job script is written; a layout that fails gives way to the next, and a
failed pre-flight writes nothing."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from cli.main import main  # noqa: E402
from planner.schema.plan import load_plan  # noqa: E402
from launch_scripts import RUN_ARGS, TINY  # noqa: E402

# exaplan check refuses to start inside a process group an earlier test left (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_process_group_left")


SMALL = ["--model", "protein-small", "--machine", "dgx-h100", "--nodes", "2", "--global-batch", "64", "--seq-len", "256",
         "--top", "3", "--draws", "0"]


def test_plan_check_writes_the_best_layout_that_passes(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    # pinned to fsdp: layouts the check steps (a DDP one is built and counted only)
    assert main(["plan", *SMALL, "--shard", "fsdp", "--check", "--json", "-o", str(out)]) == 0
    got = json.loads(capsys.readouterr().out)
    check = got["check"]
    chosen = check["chosen"]
    # every layout tried before the chosen one failed; the chosen one passed and was written
    assert [t["passed"] for t in check["layouts"]] == [False] * chosen + [True]
    assert check["layouts"][chosen]["layout"] == got["top"][chosen]["layout"]
    ranks = check["layouts"][chosen]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 15] and all(r["stepped"] and r["fits"] and r["agrees"] for r in ranks)
    assert load_plan(out).mesh.model_dump() == got["plan"]["mesh"]


def test_plan_check_falls_back_to_the_next_layout_and_refuses_when_none_passes(tmp_path, monkeypatch, capsys):
    import cli.check as check

    real, calls = check.check_plan, []

    def first_fails(plan, ranks, step=True, out=None):
        calls.append(plan.mesh.model_dump())
        if len(calls) == 1:
            return [], [(ranks[0], "RuntimeError: an injected failure")]
        return real(plan, ranks, step=step, out=out)

    monkeypatch.setattr(check, "check_plan", first_fails)
    out = tmp_path / "plan.yaml"
    assert main(["plan", *SMALL, "--check", "--json", "-o", str(out)]) == 0
    got = json.loads(capsys.readouterr().out)
    tried = got["check"]["layouts"]
    assert got["check"]["chosen"] >= 1 and not tried[0]["passed"] and tried[-1]["passed"]
    assert load_plan(out).mesh.model_dump() == calls[-1] and len(calls) == len(tried)

    monkeypatch.setattr(check, "check_plan", lambda plan, ranks, step=True, out=None: ([], [(0, "RuntimeError: no")]))
    refused = tmp_path / "refused.yaml"
    assert main(["plan", *SMALL, "--check", "-o", str(refused)]) == 1
    assert not refused.exists() and "no plan written" in capsys.readouterr().out


def test_plan_check_refuses_another_framework(tmp_path, capsys):
    assert main(["plan", *SMALL, "--framework", "megatron", "--check", "-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "check" in err and "Traceback" not in err and not (tmp_path / "p.yaml").exists()


def test_launch_check_is_a_preflight(testbox, tmp_path, monkeypatch, capsys):
    tiny_plan = tmp_path / "tiny-fsdp.yaml"  # the launch tests' tiny job, sharded (a DDP plan is not stepped)
    assert main(["estimate", *[("fsdp" if a == "none" else a) for a in TINY], "--machine", str(testbox),
                 "-o", str(tiny_plan)]) == 0
    capsys.readouterr()
    script = tmp_path / "job.sh"
    args = ["launch", str(tiny_plan), "--machine", str(testbox), "--scheduler", "slurm", "--run-args", RUN_ARGS,
            "--out", str(tmp_path / "run"), "--check", "-o", str(script)]
    assert main(args) == 0 and script.is_file()
    printed = capsys.readouterr().out
    assert "fits" in printed and "fake process group" in printed

    import runtime.check as rc

    monkeypatch.setattr(rc, "MEMORY_TOLERANCE", -1.0)  # every rank now disagrees with the planner
    script2 = tmp_path / "job2.sh"
    assert main([*args[:-1], str(script2)]) == 1
    assert not script2.exists() and "pre-flight check failed" in capsys.readouterr().out


def test_launch_check_refuses_a_calibrate_job(testbox, tmp_path, capsys):
    assert main(["launch", "--calibrate", "--machine", str(testbox), "--nodes", "1", "--check",
                 "-o", str(tmp_path / "c.sh")]) == 2
    assert "--check" in capsys.readouterr().err

