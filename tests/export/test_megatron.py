"""The megatron and megatron-deepspeed targets, checked by Megatron's own code: megatron-core
0.19.2's parse_args, validate_args, num-microbatches calculator, tokenizer and TransformerConfig
(unpacked by `python -m export.fetch_megatron`), the Megatron-DeepSpeed fork's parse_args and
validate_args (`--fork GIT_DIR`), DeepSpeed's DeepSpeedConfig on the ds_config.json, and
megatron.core.parallel_state on two gloo CPU ranks. Every plan the targets run exports and
is derived back with the plan's degrees and batch; what they cannot express is refused naming
the plan's field."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from export import export_plan, write_export
from export import check_megatron
from export.base import Derived
from export.check import check_export
from export.megatron import FORK_COMMIT, ZERO_STAGE, export, padded_vocab, train_iters
from machine_models import load_framework, load_machine
from planner.cost.step import evaluate
from planner.emit import build_plan
from planner.inputs import load_model, make_job
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, Recompute, write_plan
from planner.search.space import enumerate_space
from tests.export.export_plans import ROOT, committed_plans, generated_plans

CORE_MISSING = check_megatron.missing("megatron")
FORK_MISSING = check_megatron.missing("megatron-deepspeed")
needs_core = pytest.mark.skipif(CORE_MISSING is not None, reason=f"Megatron's own code is not here: {CORE_MISSING}")
needs_fork = pytest.mark.skipif(FORK_MISSING is not None,
                                reason=f"Megatron-DeepSpeed's own code is not here: {FORK_MISSING}")


def _deepspeed_missing() -> str | None:
    try:
        from export import check_deepspeed
    except ImportError:
        return "export/check_deepspeed.py"
    return check_deepspeed.missing()


DS_MISSING = _deepspeed_missing()
needs_deepspeed = pytest.mark.skipif(DS_MISSING is not None, reason=f"DeepSpeed's own code is not here: {DS_MISSING}")

COMMITTED = committed_plans()
TARGETS = ("megatron", "megatron-deepspeed")
PLAN_FIELDS = ("mesh.", "sharding.", "recompute", "pipeline.", "job.", "sequence_parallel", "machine.")
PLAN = ROOT / "plans/frameworks/protein-7b_dgx-h100_16n_megatron.yaml"
PIPELINED = ROOT / "plans/protein-70b_frontier_64n.yaml"  # pp 16 x 5 virtual stages, zero1, rccl


def _names_a_field(err: PlanError) -> bool:
    return err.field is not None and (err.field != "plan" or any(f in str(err) for f in PLAN_FIELDS))


def _tokens(text: str) -> list[str]:
    return [t for line in text.splitlines() for t in shlex.split(line)]


def _value(tokens: list[str], name: str) -> str:
    return tokens[tokens.index(name) + 1]


def assert_exported(plan: Plan, target: str) -> Derived | None:
    """Export; where the target runs the plan, the framework's own code derives the plan's
    degrees and batch (None where the target refuses it, naming the field)."""
    try:
        exported = export_plan(plan, target)
    except PlanError as err:
        assert _names_a_field(err), str(err)
        return None
    assert exported.derived == Derived.of(plan)
    tokens = _tokens(exported.files["args.txt"])
    assert (int(_value(tokens, "--tensor-model-parallel-size")), int(_value(tokens, "--pipeline-model-parallel-size")),
            int(_value(tokens, "--micro-batch-size")), int(_value(tokens, "--global-batch-size"))) == (
        plan.mesh.tp, plan.mesh.pp, plan.micro_batch_size, plan.job.global_batch)
    if target == "megatron":
        derived = check_export(exported, plan)
    else:
        derived = check_megatron.check(exported, plan)
    assert derived == exported.derived == Derived.of(plan)
    return derived


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


@pytest.fixture(scope="module")
def pipelined() -> Plan:
    from planner.schema.plan import load_plan

    return load_plan(PIPELINED)


def test_arguments_of_a_pipelined_plan(pipelined):
    """Interleaved 1F1B, zero1, full recompute and GQA in Megatron's names."""
    plan = pipelined.model_copy(update={"recompute": Recompute.full})
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


def _fork_plan() -> Plan | None:
    for _, plan in COMMITTED:
        if plan.job.workload.value == "dpo" and plan.job.framework.name == "deepspeed":
            return plan
    return None


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


def _with(exported, name: str, text: str):
    from dataclasses import replace

    return replace(exported, files={**exported.files, name: text})


# --- refusals --------------------------------------------------------------------------------------


def _variant(plan: Plan, **changes) -> Plan:
    """The plan with dotted fields changed, validated again as a plan."""
    data = plan.model_dump(mode="json")
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for key in path:
            node = node[key]
        node[last] = value
    return Plan.model_validate(data)


def _even_stages(plan: Plan, sizes: list[int]) -> list[dict]:
    out, layer, pp = [], 0, plan.mesh.pp
    for i, n in enumerate(sizes):
        out.append({"pp_rank": i % pp, "virtual_index": i // pp, "first_layer": layer, "last_layer": layer + n,
                    "embedding": i == 0, "head": i == len(sizes) - 1})
        layer += n
    return out


@pytest.fixture(scope="module")
def refused_plans(pipelined) -> dict[str, Plan]:
    """Plans each target cannot express, by the field that says so."""
    from planner.schema.plan import load_plan

    p, pp, layers = pipelined, pipelined.mesh.pp, pipelined.model.layers
    flat = load_plan(PLAN)
    sizes = [layers // pp] * pp
    uneven = [sizes[0] - 1] + sizes[1:-1] + [sizes[-1] + 1]
    return {
        "pipeline.schedule": _variant(p, pipeline__schedule="gpipe", pipeline__virtual_stages=1,
                                      pipeline__stages=_even_stages(p, sizes)),
        "pipeline.stages": _variant(p, pipeline__schedule="1f1b", pipeline__virtual_stages=1,
                                    pipeline__stages=_even_stages(p, uneven)),
        "sharding.kind": _variant(flat, sharding__kind="fsdp"),
        "recompute": _variant(flat, recompute="selective-op"),
    }


@pytest.mark.parametrize("field", ["pipeline.schedule", "pipeline.stages", "sharding.kind", "recompute"])
def test_refused_naming_the_field(refused_plans, field):
    plan = refused_plans[field]
    # megatron-deepspeed runs fsdp as ZeRO-3 (without a pipeline)
    targets = ("megatron",) if field == "sharding.kind" else TARGETS
    for target in targets:
        with pytest.raises(PlanError) as err:
            export_plan(plan, target)
        assert field in str(err.value), str(err.value)
        with pytest.raises(PlanError) as err:  # the exporter's own refusal, whatever the profile
            export(plan, target)
        assert err.value.field == field, str(err.value)


def test_megatron_refuses_dpo_and_oneccl():
    from planner.schema.plan import load_plan

    dpo = load_plan(ROOT / "plans/protein-3.5b_leonardo_1500n_dpo.yaml")  # megatron runs its layout
    with pytest.raises(PlanError) as err:
        export(dpo, "megatron")
    assert err.value.field == "job.workload"
    aurora = next(p for _, p in COMMITTED if p.machine.collective_library.value == "oneccl")
    with pytest.raises(PlanError) as err:
        export(aurora, "megatron")
    assert err.value.field == "machine.collective_library"


def test_fork_refuses_what_dpo_training_cannot_run(pipelined):
    """The MProt-DPO trainer: no pipeline engine, no precomputed reference, no ZeRO-3."""
    dpo = _fork_plan()
    if dpo is None:
        pytest.skip("no committed deepspeed dpo plan")
    export(dpo, "megatron-deepspeed")  # runs as it is
    with pytest.raises(PlanError) as err:
        export(_variant(dpo, job__reference="precomputed"), "megatron-deepspeed")
    assert err.value.field == "job.reference"
    with pytest.raises(PlanError) as err:
        export(_variant(dpo, sharding__kind="fsdp"), "megatron-deepspeed")
    assert err.value.field == "sharding.kind"
    with pytest.raises(PlanError) as err:
        export(_variant(pipelined, mesh__cp=2, mesh__dp_shard=pipelined.mesh.dp_shard // 2,
                        sharding__shard_group_size=pipelined.mesh.dp_shard // 2,
                        grad_accumulation_steps=2 * pipelined.grad_accumulation_steps), "megatron-deepspeed")
    assert err.value.field in ("mesh.cp", "pipeline.schedule")


@pytest.mark.parametrize("target", TARGETS)
def test_cli_refusal_exits_2_and_writes_nothing(tmp_path, refused_plans, target):
    path = tmp_path / "gpipe.yaml"
    write_plan(refused_plans["pipeline.schedule"], path)
    out = tmp_path / "out"
    exaplan = Path(sys.executable).parent / "exaplan"
    run = subprocess.run([str(exaplan), "export", str(path), "--to", target, "-o", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2, run.stderr
    assert "pipeline.schedule" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_export_folder_with_other_files_is_refused(tmp_path, pipelined):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(PlanError) as err:
        write_export(export_plan(pipelined, "megatron"), out)
    assert err.value.field == "output"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    write_export(export_plan(pipelined, "megatron"), tmp_path / "fresh")
    write_export(export_plan(pipelined, "megatron"), tmp_path / "fresh")  # an earlier export of the target: replaced
    assert {"args.txt", "args.sh", "env.sh", "exaplan-export.json"} <= {p.name for p in (tmp_path / "fresh").iterdir()}


# --- fetch -----------------------------------------------------------------------------------------


@needs_core
def test_fetch_is_idempotent():
    from export import fetch_megatron

    assert "already unpacked" in fetch_megatron.fetch_core()
    assert fetch_megatron.core_ready()


# --- two gloo ranks: megatron.core.parallel_state on the exported degrees --------------------------

RANK_WORKER = r"""
import json, os, sys
sys.path.insert(0, os.environ["EXAPLAN_ROOT"])
import torch
import torch.distributed as dist
from export.check_megatron import load_core
margs = load_core()
margs.get_device_arch_version = lambda: 9
from megatron.core import parallel_state as ps
import contextlib, io
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
out = []
for argv in json.load(open(sys.argv[1])):
    sys.argv = ["pretrain_gpt.py"] + argv
    with contextlib.redirect_stdout(io.StringIO()):
        args = margs.parse_args()
        margs.validate_args(args)
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                                 virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
                                 context_parallel_size=args.context_parallel_size)
    out.append({"tp": [ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()],
                "pp": [ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()],
                "cp": [ps.get_context_parallel_rank(), ps.get_context_parallel_world_size()],
                "dp": [ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()]})
    ps.destroy_model_parallel()
dist.destroy_process_group()
print(json.dumps(out))
"""


def two_rank_plans() -> list[Plan]:
    """Plans of protein-tiny on one node of two GPUs that megatron runs, one for each of tp, pp,
    cp and dp at 2."""
    profile = load_framework("megatron")
    model = load_model("protein-tiny")
    machine = profile.applied_to(load_machine("dgx-a100-40gb").model_copy(update={"devices_per_node": 2}))
    job = make_job(model, machine, 2, 8, 128, "bf16", None, "pretrain", "in-step", profile)
    space = enumerate_space(model, job, 2)
    allowed = space.allowed_by(profile, model.layers)
    plans = []
    for axis in ("tp", "pp", "cp", "dp"):
        lay_all = space.layouts(range(len(allowed)))
        degree = lay_all.dp if axis == "dp" else getattr(lay_all, axis)
        rows = [i for i in range(len(allowed)) if allowed[i] and degree[i] == 2]
        assert rows, axis
        lay = space.layouts([rows[0]])
        plans.append(build_plan(model, machine, job, 1, lay, evaluate(model, machine, job, lay), 0, command="tests/export"))
    return plans


@needs_core
@pytest.mark.slow
def test_parallel_state_on_two_gloo_ranks(tmp_path):
    """Each rank parses the exported args.txt with Megatron's parse_args and validate_args and
    builds megatron.core.parallel_state's groups under gloo: the groups' sizes are the plan's
    degrees and every rank's coordinates are the plan's (tp fastest, then cp, dp, pp)."""
    plans = two_rank_plans()
    exported = [export_plan(p, "megatron") for p in plans]
    argv = tmp_path / "argv.json"
    argv.write_text(json.dumps([check_megatron.arguments(e) for e in exported]))
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "EXAPLAN_ROOT": str(ROOT), "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", RANK_WORKER, str(argv)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    for i, plan in enumerate(plans):
        mesh = plan.mesh
        for rank in range(2):
            got = results[rank][i]
            c = plan.coordinates(rank)
            dp_rank = c["dp_replicate"] * mesh.dp_shard + c["dp_shard"]
            assert got == {"tp": [c["tp"], mesh.tp], "pp": [c["pp"], mesh.pp], "cp": [c["cp"], mesh.cp],
                           "dp": [dp_rank, mesh.dp]}, (i, rank, got)
    assert time.monotonic() - t0 < 300


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
