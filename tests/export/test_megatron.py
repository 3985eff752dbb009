"""The megatron and megatron-deepspeed targets, checked by Megatron's own code: megatron-core
0.19.2's parse_args, validate_args, num-microbatches calculator, tokenizer and TransformerConfig
(unpacked by `python -m export.fetch_megatron`), the Megatron-DeepSpeed fork's parse_args and
validate_args (`--fork GIT_DIR`), DeepSpeed's DeepSpeedConfig on the ds_config.json, and
megatron.core.parallel_state on two gloo CPU ranks. Every plan the targets run exports and
is derived back with the plan's degrees and batch; what they cannot express is refused naming
the plan's field."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from export import export_plan
from export import check_megatron
from export.base import Derived
from export.check import check_export
from export.megatron import ZERO_STAGE, export, padded_vocab, train_iters
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Recompute
from tests.export.export_plans import generated_plans

from tests.export.megatron_common import (  # noqa: F401 - pipelined is a fixture
    needs_core, needs_fork, needs_deepspeed, COMMITTED, TARGETS, _names_a_field, _tokens, _value, assert_exported, pipelined, _with, _fork_plan, as_zero1)


# --- committed plans ----------------------------------------------------------------------------


@needs_core
@pytest.mark.parametrize("name,plan", COMMITTED, ids=[n for n, _ in COMMITTED])
def test_committed_plans_megatron(name, plan):
    assert_exported(plan, "megatron")


@needs_fork
@needs_deepspeed
@pytest.mark.parametrize("name,plan", COMMITTED, ids=[n for n, _ in COMMITTED])
def test_committed_plans_megatron_deepspeed(name, plan):
    assert_exported(plan, "megatron-deepspeed")


def test_committed_plans_some_run_some_refused():
    """Both targets run some committed plans and refuse others (without any framework here)."""
    for target in TARGETS:
        ran, refused = [], []
        for name, plan in COMMITTED:
            try:
                export_plan(plan, target)
                ran.append(name)
            except PlanError as err:
                assert _names_a_field(err), str(err)
                refused.append(name)
        assert ran and refused, target


# --- drawn plans ----------------------------------------------------------------------------------


def _drawn(plan: Plan | None, target: str) -> None:
    if plan is not None:
        assert_exported(plan, target)


FAST = settings(max_examples=20, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@needs_core
@FAST
@given(generated_plans("megatron"))
def test_drawn_plans_megatron(plan):
    _drawn(plan, "megatron")


@needs_core
@pytest.mark.slow
@SLOW
@given(generated_plans("megatron"))
def test_drawn_plans_megatron_many(plan):
    _drawn(plan, "megatron")


@needs_fork
@needs_deepspeed
@FAST
@given(generated_plans("deepspeed"))
def test_drawn_plans_megatron_deepspeed(plan):
    _drawn(plan, "megatron-deepspeed")


@needs_fork
@needs_deepspeed
@pytest.mark.slow
@SLOW
@given(generated_plans("deepspeed"))
def test_drawn_plans_megatron_deepspeed_many(plan):
    _drawn(plan, "megatron-deepspeed")


@needs_deepspeed
@FAST
@given(generated_plans("deepspeed"))
def test_drawn_plans_megatron_deepspeed_ds_config(plan):
    """Without the fork: DeepSpeed's own config code derives, from ds_config.json and the data-
    parallel group the fork's arguments give it (world / (tp x pp)), the batch split and ZeRO
    stage that args.txt states."""
    from export import check_deepspeed

    if plan is None:
        return
    try:
        exported = export_plan(plan, "megatron-deepspeed")
    except PlanError as err:
        assert _names_a_field(err), str(err)
        return
    tokens = _tokens(exported.files["args.txt"])
    tp, pp = int(_value(tokens, "--tensor-model-parallel-size")), int(_value(tokens, "--pipeline-model-parallel-size"))
    dp = plan.world_size // (tp * pp)
    d = check_deepspeed.check_config(check_deepspeed.parse(exported.files["ds_config.json"]), dp=dp, mp=tp * pp)
    mbs, gb = int(_value(tokens, "--micro-batch-size")), int(_value(tokens, "--global-batch-size"))
    assert (d.dp, d.micro_batch, d.train_batch_size, d.accumulation) == (plan.mesh.dp, mbs, gb, gb // (mbs * dp))
    assert Derived(tp=tp, pp=pp, vpp=1, cp=1, dp=d.dp, micro_batch=d.micro_batch, accumulation=d.accumulation,
                   global_batch=d.train_batch_size) == exported.derived
    assert d.zero_stage == int(_value(tokens, "--zero-stage")) == ZERO_STAGE[plan.sharding.kind]
    assert (d.bf16, d.fp16) == ("--bf16" in tokens, "--fp16" in tokens)
    assert ("--no-pipeline-parallel" in tokens) == (pp == 1)


# --- what the files say ---------------------------------------------------------------------------


def test_arguments_of_a_pipelined_plan(pipelined):
    """Interleaved 1F1B, zero1, full recompute and GQA in Megatron's names."""
    plan = as_zero1(pipelined).model_copy(update={"recompute": Recompute.full})
    tokens = _tokens(export(plan, "megatron").files["args.txt"])
    chunk = plan.model.layers // (plan.mesh.pp * plan.pipeline.virtual_stages)
    assert _value(tokens, "--num-layers-per-virtual-pipeline-stage") == str(chunk)
    assert "--use-distributed-optimizer" in tokens and "--overlap-param-gather" in tokens
    assert [_value(tokens, f) for f in ("--recompute-granularity", "--recompute-method", "--recompute-num-layers")] == \
        ["full", "uniform", "1"]
    assert ("--sequence-parallel" in tokens) == plan.sequence_parallel
    assert _value(tokens, "--train-iters") == str(train_iters(plan))
    if plan.model.kv_heads != plan.model.heads:
        assert "--group-query-attention" in tokens and _value(tokens, "--num-query-groups") == str(plan.model.kv_heads)


def test_args_sh_is_the_same_argument_list(tmp_path, pipelined):
    """bash sources args.sh into the array that args.txt lists, token for token."""
    for target, plan in (("megatron", pipelined), ("megatron-deepspeed", None)):
        if plan is None:
            plan = _fork_plan()
            if plan is None:
                continue
        exported = export(plan, target)
        (tmp_path / "args.sh").write_text(exported.files["args.sh"])
        out = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\n" "${MEGATRON_ARGS[@]}"', "_",
                              str(tmp_path / "args.sh")], capture_output=True, text=True, check=True).stdout
        ds = str(tmp_path.resolve() / "ds_config.json")
        assert [w.replace(ds, "ds_config.json") for w in out.splitlines()] == _tokens(exported.files["args.txt"])
        assert exported.argv_in(tmp_path) == out.splitlines()
        shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
        if shellcheck:
            for name in ("args.sh", "env.sh"):
                (tmp_path / name).write_text(exported.files[name])
                run = subprocess.run([shellcheck, "-s", "bash", str(tmp_path / name)], capture_output=True, text=True)
                assert run.returncode == 0, run.stdout


def test_env_sh_sets_one_connection_with_tensor_parallelism(pipelined):
    text = export(pipelined, "megatron").files["env.sh"]
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in text) == (pipelined.mesh.tp > 1 or pipelined.mesh.cp > 1)
    for k, v in pipelined.collectives.env.items():
        assert f"export {k}=" in text


def test_vocabulary_padding():
    assert [padded_vocab(32, tp) for tp in (1, 2, 8, 32)] == [32, 32, 32, 32]
    assert padded_vocab(32, 3) == 33 and padded_vocab(31, 2) == 32


# --- the framework's own code refuses tampered files ------------------------------------------------


@needs_core
def test_megatron_refuses_tampered_files(pipelined):
    """Megatron's own code fails the files it should fail: without env.sh's one connection
    (validate_args), with a batch its dp does not divide, with an unknown argument (parse_args)."""
    pipelined = as_zero1(pipelined)
    exported = export_plan(pipelined, "megatron")
    assert check_export(exported, pipelined) == exported.derived
    if pipelined.mesh.tp > 1:
        bad = _with(exported, "env.sh", exported.files["env.sh"].replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", ""))
        with pytest.raises(PlanError, match="CUDA_DEVICE_MAX_CONNECTIONS"):
            check_export(bad, pipelined)
    gb = pipelined.job.global_batch
    bad = _with(exported, "args.txt", exported.files["args.txt"].replace(f"--global-batch-size {gb}\n",
                                                                         f"--global-batch-size {gb + 1}\n"))
    with pytest.raises(PlanError, match="megatron-core"):
        check_export(bad, pipelined)
    bad = _with(exported, "args.txt", exported.files["args.txt"] + "--pipeline-schedule gpipe\n")
    with pytest.raises(PlanError, match="parse_args"):
        check_export(bad, pipelined)
    # Megatron reads these files fine, but not as the plan says: refused by the comparison.
    bad = _with(exported, "args.txt", exported.files["args.txt"].replace("--use-distributed-optimizer\n", ""))
    with pytest.raises(PlanError, match="overlap-param-gather only supported with distributed optimizer"):
        check_export(bad, pipelined)  # validate_args
    bad = _with(bad, "args.txt", bad.files["args.txt"].replace("--overlap-param-gather\n", ""))
    with pytest.raises(PlanError, match="use_distributed_optimizer"):
        check_export(bad, pipelined)


@needs_fork
@needs_deepspeed
def test_fork_refuses_tampered_files():
    plan = _fork_plan()
    if plan is None:
        pytest.skip("no committed deepspeed dpo plan")
    exported = export_plan(plan, "megatron-deepspeed")
    assert check_megatron.check(exported, plan) == exported.derived
    bad = _with(exported, "args.txt", exported.files["args.txt"].replace("--zero-stage 1\n", "--zero-stage 2\n"))
    with pytest.raises(PlanError, match="zero"):
        check_megatron.check(bad, plan)
    bad = _with(exported, "args.txt", exported.files["args.txt"] + "--no-such-argument 3\n")
    with pytest.raises(PlanError, match="parse_args"):
        check_megatron.check(bad, plan)
    text = exported.files["args.txt"].replace("--tensor-model-parallel-size 1\n", "--tensor-model-parallel-size 2\n")
    text = text.replace("--no-pipeline-parallel\n", "--no-pipeline-parallel\n--sequence-parallel\n")
    with pytest.raises(PlanError, match="CUDA_DEVICE_MAX_CONNECTIONS"):  # the fork's validate_args
        check_megatron.check(_with(exported, "args.txt", text), plan)
