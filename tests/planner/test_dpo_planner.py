"""`--workload dpo` in the planner: two sequences per pair through the policy, a frozen
reference model's forward passes and parameters, FLOPs reported both ways."""

from __future__ import annotations

import json

import numpy as np
import pytest

from machine_models import load_machine
from cli.main import main
from planner.cost import compute, flops
from planner.cost.layout import RC_FULL, RC_NONE, SC_NONE, SH_FSDP, SH_NONE, SH_ZERO1, Layouts
from planner.cost.memory import GIB
from planner.cost.step import evaluate
from planner.schema.plan import load_plan
from planner.presets import get_model
from planner.search.search import search
from planner.schema.specs import Precision, Reference, TrainingJob, Workload


def lay(**kw) -> Layouts:
    d = dict(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1, mbs=1, gas=1, vpp=1, schedule=SC_NONE, sharding=SH_NONE,
             recompute=RC_NONE, sp=0)
    d.update(kw)
    return Layouts(**d)


def job(gb, workload=Workload.pretrain, reference=Reference.in_step) -> TrainingJob:
    return TrainingJob(global_batch=gb, seq_len=512, precision=Precision.bf16, workload=workload, reference=reference)


MODEL = get_model("protein-3.5b")
MACHINE = load_machine("frontier")


def test_a_pair_is_two_sequences_and_the_reference_adds_a_forward():
    """A dpo micro-batch of 2 pairs costs what a pretraining micro-batch of 4 sequences
    costs, plus the reference's forward: exactly forward / (forward + backward) more without
    recompute (about 1/3: 3 forwards for the GEMMs, 3.5 for the flash attention core); with
    precomputed log-probabilities nothing more."""
    L = lay(dp_shard=8, sharding=SH_FSDP, mbs=2)
    pre = evaluate(MODEL, MACHINE, job(32), lay(dp_shard=8, sharding=SH_FSDP, mbs=4))
    dpo = evaluate(MODEL, MACHINE, job(16, Workload.dpo), L)
    pc = evaluate(MODEL, MACHINE, job(16, Workload.dpo, Reference.precomputed), L)
    f, fb = compute.layer_times(MODEL, MACHINE, job(32), lay(dp_shard=8, sharding=SH_FSDP, mbs=4))
    assert 0.3 < f[0] / fb[0] <= 1 / 3
    assert dpo.compute_s[0] == pytest.approx(pre.compute_s[0] * (1 + f[0] / fb[0]), rel=1e-9)
    assert pc.compute_s[0] == pytest.approx(pre.compute_s[0], rel=1e-9)
    assert dpo.memory.activations[0] == pytest.approx(pre.memory.activations[0], rel=1e-9)
    # The same policy tokens per step.
    assert dpo.tokens_per_s[0] * dpo.step_time_s[0] == pytest.approx(32 * 512)
    # Recompute runs the policy's forward again, never the reference's (to 1e-4: the head's
    # share, counted in block units of forward+backward+recompute, moves a little).
    rc_pre = evaluate(MODEL, MACHINE, job(32), lay(dp_shard=8, sharding=SH_FSDP, mbs=4, recompute=RC_FULL))
    rc_dpo = evaluate(MODEL, MACHINE, job(16, Workload.dpo), lay(dp_shard=8, sharding=SH_FSDP, mbs=2, recompute=RC_FULL))
    assert rc_dpo.compute_s[0] - rc_pre.compute_s[0] == pytest.approx(dpo.compute_s[0] - pre.compute_s[0], rel=1e-4)


def test_reference_memory_is_parameters_only_and_sharded_like_the_policy():
    L = Layouts.concat([lay(dp_replicate=8), lay(dp_shard=8, sharding=SH_ZERO1), lay(dp_shard=8, sharding=SH_FSDP)])
    dpo = evaluate(MODEL, MACHINE, job(16, Workload.dpo), L)
    pre = evaluate(MODEL, MACHINE, job(16), L)
    P = flops.total_params(MODEL)
    ref = np.asarray(dpo.memory.reference)
    # exaplan's replicate and ZeRO keep fp32 weights under autocast, and the reference is built
    # like the policy: 4 bytes a parameter, whole on every rank (ZeRO-1 shards the optimizer,
    # not the weights); FSDP's mixed-precision policy shards 16-bit weights over the 8 ranks.
    assert ref[0] == pytest.approx(P * 4)
    assert ref[1] == pytest.approx(P * 4)
    assert ref[2] == pytest.approx(P * 2 / 8)
    # A framework that keeps 16-bit working weights (DeepSpeed's engine) holds a 16-bit reference.
    from machine_models import load_framework
    ds = job(16, Workload.dpo).model_copy(update={"framework": load_framework("deepspeed")})
    assert np.asarray(evaluate(MODEL, MACHINE, ds, L).memory.reference)[1] == pytest.approx(P * 2)
    # No gradients or optimizer state for it: those match pretraining's (the model states; the
    # gradients reported at the peak are fewer the more activations a one-micro-batch step holds).
    from planner.cost.memory import model_state_bytes
    for part in (1, 2):
        np.testing.assert_allclose(model_state_bytes(MODEL, job(16, Workload.dpo), L)[part], model_state_bytes(MODEL, job(16), L)[part])
    np.testing.assert_allclose(dpo.memory.optimizer, pre.memory.optimizer)
    assert np.all(dpo.memory.gradients <= pre.memory.gradients)
    pc = evaluate(MODEL, MACHINE, job(16, Workload.dpo, Reference.precomputed), L)
    assert np.all(np.asarray(pc.memory.reference) == 0)
    assert np.all(dpo.memory.total > pc.memory.total)


def test_step_flops_both_conventions():
    j = job(16, Workload.dpo)
    f = flops.step_flops(MODEL, j)
    tokens = 16 * 2 * 512
    assert f["tokens"] == tokens
    N = flops.total_params(MODEL) - flops.embedding_params(MODEL)
    assert f["six_n"] == pytest.approx(6 * N * tokens)
    assert f["executed"] == pytest.approx(f["policy"] + f["reference"])
    assert f["reference"] == pytest.approx(f["policy"] / 3)
    assert flops.step_flops(MODEL, job(16, Workload.dpo, Reference.precomputed))["reference"] == 0.0


def test_search_plans_dpo_and_it_needs_more_than_pretraining():
    """The same sequences per step cost more as pairs (the reference's work and memory)."""
    pre = search(MODEL, MACHINE, job(8 * 8 * 16), 16)
    dpo = search(MODEL, MACHINE, job(4 * 8 * 16, Workload.dpo), 16)
    assert dpo.evaluation.step_time_s[0] > pre.evaluation.step_time_s[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_estimate_and_plan_dpo(capsys, in_tmp):
    args = ["--model", "protein-3.5b", "--machine", "frontier", "--nodes", "2", "--global-batch", "32"]
    assert main(["estimate", *args, "--dp", "16", "--shard", "fsdp", "--mbs", "2", "--workload", "dpo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"] == "dpo"
    f = out["flops_per_step"]
    assert f["executed"] > f["six_n"] > 0
    assert main(["estimate", *args, "--dp", "16", "--shard", "fsdp", "--mbs", "2", "--workload", "dpo"]) == 0
    text = capsys.readouterr().out
    assert "as executed" in text and "6·N·tokens" in text and "reference model (dpo)" in text
    assert main(["plan", *args, "--workload", "dpo", "-o", "dpo.yaml"]) == 0
    plan = load_plan(in_tmp / "dpo.yaml")
    assert plan.job.workload == Workload.dpo and plan.job.reference == Reference.in_step
    assert plan.prediction.memory.reference_gib > 0
    assert plan.prediction.model_flops_per_step > plan.prediction.six_n_flops_per_step > 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # argparse refuses an unknown workload, naming the choices
        main(["estimate", *args, "--dp", "16", "--mbs", "1", "--workload", "sft"])
    assert e.value.code == 2
    assert "invalid choice: 'sft'" in capsys.readouterr().err


def test_capacity_sweeps_dpo(capsys):
    argv = ["capacity", "--model", "protein-3.5b", "--machine", "frontier", "--tokens", "1e11", "--nodes", "64,128", "--json"]
    assert main(argv) == 0
    pre = json.loads(capsys.readouterr().out)
    assert main([*argv, "--workload", "dpo"]) == 0
    dpo = json.loads(capsys.readouterr().out)
    # The same 8 sequences per rank, as 4 pairs: slower per token (the reference's forward).
    assert len(pre["rows"]) == len(dpo["rows"]) == 2
    for p, d in zip(pre["rows"], dpo["rows"]):
        assert d["global_batch"] * 2 == p["global_batch"]
        assert d["tokens_per_s"] < p["tokens_per_s"]


def test_run_checks_do_not_prepare_pretraining_data_for_dpo(in_tmp):
    from types import SimpleNamespace

    from runtime.options import check_before_launch as check_run_inputs

    assert main(["plan", "--model", "protein-tiny", "--machine", "local", "--global-batch", "8", "--seq-len", "64",
                 "--workload", "dpo", "-o", "dpo.yaml"]) == 0
    targs = SimpleNamespace(steps=2, out=str(in_tmp / "out"), resume=False, data=None)
    check_run_inputs(targs, load_plan(in_tmp / "dpo.yaml"))
    assert not (in_tmp / "out" / "data").exists()
