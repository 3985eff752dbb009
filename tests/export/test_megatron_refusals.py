"""The megatron and megatron-deepspeed targets refuse what they cannot express, naming the
plan's field (CLI exit 2, nothing written); the fetch of Megatron's sources is idempotent;
megatron.core.parallel_state initialises on two gloo CPU ranks with the exported degrees."""


import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from export import export_plan, write_export
from export import check_megatron
from export.megatron import export
from machine_models import load_framework, load_machine
from planner.cost.step import evaluate
from planner.emit import build_plan
from planner.inputs import load_model, make_job
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, write_plan
from planner.search.space import enumerate_space
from tests.export.export_plans import ROOT

from tests.export.megatron_common import (  # noqa: F401 - pipelined is a fixture
    needs_core, COMMITTED, TARGETS, PLAN, pipelined, _fork_plan, as_zero1)


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
    pipelined = as_zero1(pipelined)
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
    with pytest.raises(PlanError, match="give --force"):  # an earlier export of the target: replaced only when forced
        write_export(export_plan(pipelined, "megatron"), tmp_path / "fresh")
    write_export(export_plan(pipelined, "megatron"), tmp_path / "fresh", force=True)
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
