"""The deepspeed target and its ds_config.json, checked by DeepSpeed 0.19.8's own code: its
config class on every plan the target runs (committed and drawn), and its engine training a
tiny model on two gloo CPU ranks under an exported file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from export import export_plan
from export.base import Derived
from export.deepspeed import STAGES, block_params, ds_config
from export import check_deepspeed
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Precision, Sharding, load_plan
from tests.export.export_plans import ROOT, SCENARIOS, _space, committed_plans, generated_plans

needs_deepspeed = pytest.mark.skipif(check_deepspeed.missing() is not None,
                                     reason=f"DeepSpeed's own code is not installed ({check_deepspeed.missing()}): "
                                            "pip install -e '.[frameworks]' -c constraints.txt")
COMMITTED = committed_plans()
PLAN_FIELDS = ("mesh.", "sharding.", "recompute", "pipeline.", "job.", "sequence_parallel")


def _refusal_names_a_field(err: PlanError) -> bool:
    return err.field is not None and (err.field != "plan" or any(f in str(err) for f in PLAN_FIELDS))


def _runs(plan: Plan) -> bool:
    try:
        export_plan(plan, "deepspeed")
    except PlanError:
        return False
    return True


def _reduce(plan: Plan) -> str:
    fw, p = plan.job.framework, plan.job.precision
    return "fp32" if p == Precision.fp32 else fw.fp16_grad_reduce_dtype if p == Precision.fp16 else fw.grad_reduce_dtype


def assert_deepspeed_takes(plan: Plan) -> None:
    """Export, then DeepSpeed's config code derives the plan's batch split and ZeRO stage."""
    from export.check import check_export

    exported = export_plan(plan, "deepspeed")
    assert exported.derived == Derived.of(plan)
    assert check_export(exported, plan) == exported.derived
    config = check_deepspeed.parse(exported.files["ds_config.json"])
    d = check_deepspeed.check_config(config, dp=plan.mesh.dp)
    assert (d.train_batch_size, d.micro_batch, d.accumulation, d.dp) == (
        plan.job.global_batch, plan.micro_batch_size, plan.grad_accumulation_steps, plan.mesh.dp)
    assert (d.derived_accumulation, d.derived_micro_batch) == (plan.grad_accumulation_steps, plan.micro_batch_size)
    assert d.zero_stage == STAGES[plan.sharding.kind]
    assert (d.bf16, d.fp16) == (plan.job.precision == Precision.bf16, plan.job.precision == Precision.fp16)
    assert d.communication_dtype == _reduce(plan)
    fw = plan.job.framework
    if d.zero_stage in (1, 2):
        assert d.zero["reduce_bucket_size"] == int(max(fw.zero_bucket_params, fw.zero_bucket_params_per_rank * plan.mesh.dp))
        assert d.zero["overlap_comm"] and d.zero["contiguous_gradients"] and d.zero["use_multi_rank_bucket_allreduce"]
    if d.zero_stage == 3:
        block = block_params(plan)
        assert (d.zero["prefetch_bucket_size"], d.zero["max_live_parameters"], d.zero["reduce_bucket_size"],
                d.zero["max_reuse_distance"]) == (block, 2 * block, block, 0)
    if plan.recompute.value == "none":
        assert "activation_checkpointing" not in config
    else:
        assert d.checkpointing["number_checkpoints"] == plan.model.layers
        assert not d.checkpointing["partition_activations"]


# --- committed plans --------------------------------------------------------------------------


@needs_deepspeed
@pytest.mark.parametrize("name,plan", [(n, p) for n, p in COMMITTED if _runs(p)], ids=lambda x: x if isinstance(x, str) else "")
def test_committed_plans_deepspeed_runs_pass_its_config_code(name, plan):
    assert_deepspeed_takes(plan)


@pytest.mark.parametrize("name,plan", [(n, p) for n, p in COMMITTED if not _runs(p)], ids=lambda x: x if isinstance(x, str) else "")
def test_committed_plans_deepspeed_cannot_run_are_refused_naming_a_field(name, plan):
    with pytest.raises(PlanError) as e:
        export_plan(plan, "deepspeed")
    assert _refusal_names_a_field(e.value), str(e.value)


def test_some_committed_plans_run_and_some_are_refused():
    runs = [n for n, p in COMMITTED if _runs(p)]
    assert runs and len(runs) < len(COMMITTED)


# --- drawn plans ------------------------------------------------------------------------------


def _data_parallel_rows(scenario: int):
    """The rows of the deepspeed profile's space that the deepspeed target runs: tp = pp = cp = 1."""
    found = _space("deepspeed", scenario)
    if found is None:
        return None
    *_, space, allowed = found
    lay = space.layouts(allowed)
    rows = allowed[(lay.tp == 1) & (lay.pp == 1) & (lay.cp == 1)]
    return rows if len(rows) else None


def _plan_of_row(scenario: int, pick: int) -> Plan:
    from planner.cost.step import evaluate
    from planner.emit import build_plan

    model, machine, job, nodes, space, _ = _space("deepspeed", scenario)
    rows = _data_parallel_rows(scenario)
    lay = space.layouts(rows[[pick % len(rows)]])
    return build_plan(model, machine, job, nodes, lay, evaluate(model, machine, job, lay), 0, command="tests/export")


def data_parallel_plans():
    """Plans of the layouts the deepspeed target runs, drawn from the deepspeed profile's space
    (too few of generated_plans("deepspeed") have tp = pp = cp = 1 to filter for them)."""
    usable = [i for i in range(len(SCENARIOS)) if _data_parallel_rows(i) is not None]
    return st.builds(_plan_of_row, st.sampled_from(usable), st.integers(0, 2**31 - 1))


@needs_deepspeed
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data_parallel_plans())
def test_drawn_data_parallel_plans_pass_deepspeeds_config_code(plan):
    assert_deepspeed_takes(plan)


@pytest.mark.slow
@needs_deepspeed
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data_parallel_plans())
def test_drawn_data_parallel_plans_pass_deepspeeds_config_code_200(plan):
    assert_deepspeed_takes(plan)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(generated_plans("deepspeed"))
def test_profile_plans_run_or_are_refused_naming_the_model_parallel_axis(plan):
    """Every layout of the deepspeed profile: the deepspeed target takes it (data parallelism)
    or refuses it naming mesh.tp / mesh.pp (Megatron-DeepSpeed's model code runs those)."""
    if plan.mesh.tp == plan.mesh.pp == plan.mesh.cp == 1:
        export_plan(plan, "deepspeed")
        ds_config(plan)
        return
    with pytest.raises(PlanError) as e:
        export_plan(plan, "deepspeed")
    # the deepspeed-zero profile refuses the degree first (field "plan", naming mesh.*), with the way out
    assert e.value.field == "plan" and any(f"mesh.{a}:" in str(e.value) for a in ("tp", "pp", "cp")), e.value
    assert "megatron-deepspeed" in str(e.value)
    ds_config(plan)  # the megatron-deepspeed target's ds_config: complete for the same plan


# --- refusals ---------------------------------------------------------------------------------


def _committed(name: str) -> Plan:
    return load_plan(ROOT / "plans" / name)


def test_hybrid_and_grad_op_sharding_are_refused_naming_sharding_kind():
    for name in ("protein-3.5b_pdx_400n.yaml", "protein-7b_dgx-h100_16n.yaml"):  # hsdp, fsdp-grad-op
        plan = _committed(name)
        assert plan.sharding.kind in (Sharding.hsdp, Sharding.fsdp_grad_op)
        with pytest.raises(PlanError) as e:
            ds_config(plan)
        assert e.value.field == "sharding.kind"


def test_per_op_recompute_is_refused_naming_recompute():
    plan = _committed("gpu/protein-3.5b_1xh100_op.yaml")
    with pytest.raises(PlanError) as e:
        ds_config(plan)
    assert e.value.field == "recompute"
    with pytest.raises(PlanError) as e:
        export_plan(plan, "deepspeed")
    assert "recompute" in str(e.value)


def test_pipeline_and_tensor_parallel_plans_are_refused_naming_the_axis():
    from export.deepspeed import export

    plan = _committed("protein-3.5b_aurora_3200n.yaml")  # pp 16, 1f1b, DDP: the profile runs it
    with pytest.raises(PlanError) as e:
        export(plan, "deepspeed")
    assert e.value.field == "mesh.pp"
    plan = _committed("protein-3.5b_frontier_2048n_dpo.yaml")
    with pytest.raises(PlanError) as e:
        export(plan.model_copy(update={"sharding": plan.sharding.model_copy(update={"kind": Sharding.zero1})}), "deepspeed")
    assert e.value.field == "mesh.tp"


def test_a_ddp_bucket_deepspeed_cannot_set_is_refused():
    """ZeRO stage 0's allreduce bucket is fixed (5e8 elements): the aurora plan's 400 MB buckets
    over 14 GB of fp32 gradients cannot be had."""
    plan = _committed("protein-3.5b_aurora_3200n.yaml")
    with pytest.raises(PlanError) as e:
        ds_config(plan)
    assert e.value.field == "sharding.ddp_bucket_mb"


def test_dpo_batch_counts_pairs():
    plan = _committed("protein-3.5b_pdx_400n_dpo.yaml")
    plan = plan.model_copy(update={"sharding": plan.sharding.model_copy(update={"kind": Sharding.zero1}),
                                   "mesh": plan.mesh.model_copy(update={"dp_shard": plan.mesh.dp, "dp_replicate": 1})})
    config = ds_config(plan)
    assert config["train_batch_size"] == plan.job.global_batch  # pairs
    assert config["train_micro_batch_size_per_gpu"] == plan.micro_batch_size


@needs_deepspeed
def test_deepspeed_check_refuses_what_deepspeed_ignores_or_rejects():
    plan = next(p for _, p in COMMITTED if _runs(p))
    config = ds_config(plan)
    bad = [
        dict(config, zero_optimisation={"stage": 1}),  # a misspelt top-level key DeepSpeed ignores
        dict(config, activation_checkpointing={"partition_activation": False}),  # ignored by DeepSpeed too
        dict(config, zero_optimization={"stage": 2, "reduce_bucket_sise": 10}),  # DeepSpeed's pydantic refuses
        dict(config, train_batch_size=config["train_batch_size"] + 1),  # DeepSpeed's batch assertion
        dict(config, fp16={"enabled": True}, bf16={"enabled": True}),
        dict(config, zero_optimization={"stage": 4}),
    ]
    for c in bad:
        with pytest.raises(PlanError) as e:
            check_deepspeed.check_config(c, dp=plan.mesh.dp)
        assert e.value.field == "ds_config.json"
    with pytest.raises(PlanError):
        check_deepspeed.parse('{"train_batch_size": 1, "train_batch_size": 2}')  # DeepSpeed's duplicate-key hook


def test_cli_refusal_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([str(ROOT / ".venv/bin/exaplan"), "export", str(ROOT / "plans/protein-3.5b_aurora_3200n.yaml"),
                        "--to", "deepspeed", "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "mesh.pp" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.iterdir())


# --- two CPU ranks of DeepSpeed's engine ------------------------------------------------------


def _two_rank_plan(tmp_path: Path, shard: str, precision: str, recompute: str = "none") -> Path:
    path = tmp_path / f"plan-{shard}-{precision}-{recompute}.yaml"
    subprocess.run([str(ROOT / ".venv/bin/exaplan"), "estimate", "--model", "protein-tiny", "--machine", "local",
                    "--nodes", "1", "--framework", "deepspeed", "--dp", "2", "--mbs", "2", "--global-batch", "8",
                    "--shard", shard, "--precision", precision, "--recompute", recompute, "-o", str(path)],
                   check=True, capture_output=True, cwd=ROOT)
    return path


def _train(tmp_path: Path, shard: str, precision: str, recompute: str = "none", steps: int = 10) -> tuple[dict, str, Plan]:
    plan_path = _two_rank_plan(tmp_path, shard, precision, recompute)
    out = tmp_path / f"export-{shard}-{precision}-{recompute}"
    from cli.export import write

    write(load_plan(plan_path), "deepspeed", str(out), str(plan_path), check=True)  # `exaplan export --check`
    result = tmp_path / "result.json"
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "export.deepspeed_smoke", "--config", str(out / "ds_config.json"), "--steps", str(steps),
                        "--out", str(result)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(result.read_text()), r.stdout + r.stderr, load_plan(plan_path)


def _assert_trained(res: dict, log: str, plan: Plan, tmp_path: Path, steps: int = 10) -> None:
    from calibration.comms_log import parse
    from calibration.framework_logs import compare, read_log

    assert (res["micro_batch"], res["accumulation"], res["train_batch_size"], res["dp"]) == (
        plan.micro_batch_size, plan.grad_accumulation_steps, plan.job.global_batch, plan.mesh.dp)
    assert res["zero_stage"] == STAGES[plan.sharding.kind]
    assert res["bf16"] == (plan.job.precision == Precision.bf16)
    assert res["global_steps"] == steps
    losses = res["losses"]
    assert losses[-1] < 0.5 * losses[0], losses
    assert res["checkpointing"] == (plan.recompute.value != "none")
    # What launch.txt tells the user to read back: the comms logger's lines (which exaplan's
    # calibration parses) and the throughput line at steps_per_print.
    ops = {op for op, _, _ in parse(log)}
    assert "all_reduce" in ops or "reduce_scatter" in ops, sorted(ops)
    assert "CurrSamplesPerSec=" in log and "MaxMemAllocated=" in log
    # `exaplan calibrate --from-log`: the batch, micro-batch, accumulation and data-parallel
    # world that DeepSpeed's engine printed equal the plan's (a mismatch raises PlanError).
    path = tmp_path / "rank0.log"
    path.write_text(log)
    result = compare(read_log(path, "deepspeed"), plan)
    assert {c["what"] for c in result["checked"]} >= {"global_batch", "micro_batch", "grad_accumulation", "dp"}
    assert result["steps_measured"] >= 3


@needs_deepspeed
def test_deepspeed_engine_trains_two_cpu_ranks_under_the_exported_config(tmp_path):
    res, log, plan = _train(tmp_path, "zero2", "fp32")
    assert res["optimizer"] == "DeepSpeedZeroOptimizer"
    _assert_trained(res, log, plan, tmp_path)


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("shard,precision,recompute", [("none", "fp32", "none"), ("zero1", "bf16", "none"),
                                                       ("fsdp", "fp32", "full"), ("zero2", "bf16", "selective")])
def test_deepspeed_engine_trains_every_stage(tmp_path, shard, precision, recompute):
    res, log, plan = _train(tmp_path, shard, precision, recompute)
    _assert_trained(res, log, plan, tmp_path)
