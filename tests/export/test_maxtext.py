"""`exaplan export --to maxtext`: every plan MaxText 0.2.5 can run is written as a config file
that MaxText's own loader (pyconfig: omegaconf over base.yml, types.MaxTextConfig's pydantic
validation) accepts, whose every key is one of base.yml's, whose ici degrees multiply to the
devices of a node and dcn degrees to the nodes, whose mesh, built by MaxText's
create_device_mesh on the plan's machine, holds every rank at the plan's coordinates, and from
which MaxText derives the plan's degrees and batch split. Plans it cannot run are refused naming
the field, for a reason the plan really has. MaxText's model code needs Python 3.12 (PEP 695
`type` statements), so nothing here builds or trains its model (docs/frameworks/maxtext.md)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from cli.main import main
from export import check_maxtext as cm
from export import export_plan, write_export
from export import maxtext as mt
from export.fetch_maxtext import DEST, ready
from planner.schema.errors import PlanError
from planner.schema.plan import Precision, Recompute, Schedule, Sharding
from export_plans import ROOT, committed_plans, generated_plans

needs_maxtext = pytest.mark.skipif(cm.missing() is not None, reason=f"MaxText's config code is not here: {cm.missing()}")
needs_base_yml = pytest.mark.skipif(not ready(), reason="MaxText 0.2.5 is not unpacked (python -m export.fetch_maxtext)")

AXIS_OF = {"pp": "pipeline", "dp_replicate": "data", "dp_shard": "fsdp", "cp": "context", "tp": "tensor_sequence"}
PROFILE_FIELDS = ("sharding.kind:", "recompute:", "job.precision:", "pipeline.schedule:", "mesh.cp:", "mesh.pp:",
                  "sequence_parallel:", "pipeline.stages:", "job.workload:", "job.reference:", "model.tied_embeddings:",
                  "grad_accumulation_steps:", "mesh.tp:", "mesh.dp_shard:", "mesh.dp_replicate:")


@functools.cache
def base_keys() -> frozenset[str]:
    return frozenset(yaml.safe_load((DEST / "maxtext/configs/base.yml").read_text()))


def config_of(exported) -> dict:
    return yaml.safe_load(exported.files[mt.CONFIG])


def node_cut(plan) -> str | None:
    """The plan's axis that the node boundary cuts unevenly (ranks fill nodes, tp fastest)."""
    left = plan.ranks_per_node
    for name in ("tp", "cp", "dp_shard", "dp_replicate", "pp"):
        d = getattr(plan.mesh, name)
        if left % d and d % left:
            return name
        left //= min(d, left) if left % d else d
    return None


def gaps(plan) -> set[str]:
    """Fields of layouts the maxtext profile allows that MaxText 0.2.5 cannot express (the
    profile constraints docs/frameworks/maxtext.md asks for)."""
    out = set()
    if plan.mesh.tp > 1 and not plan.sequence_parallel:
        out.add("sequence_parallel")
    if plan.recompute == Recompute.none and plan.mesh.pp == 1:
        out.add("recompute")
    if plan.recompute == Recompute.selective_op and not mt.nvidia(plan):
        out.add("recompute")
    if plan.mesh.pp > 1 and plan.grad_accumulation_steps % plan.mesh.pp:
        out.add("grad_accumulation_steps")
    cut = node_cut(plan)
    if cut:
        out.add(f"mesh.{cut}")
    return out


def assert_refusal_is_real(plan, err: PlanError) -> None:
    assert err.field, err
    if err.field == "plan":
        assert any(name in str(err) for name in PROFILE_FIELDS), err
        return
    real = gaps(plan) | {f for f, has in (
        ("job.precision", plan.job.precision == Precision.fp16),
        ("mesh.cp", plan.mesh.cp > 1 and not mt.nvidia(plan)),
        ("sharding.kind", plan.sharding.kind in (Sharding.zero2, Sharding.fsdp_grad_op)
         or (plan.mesh.cp > 1 and plan.sharding.kind in (Sharding.none, Sharding.zero1))),
        ("recompute", plan.recompute == Recompute.selective),
        ("model.norm", plan.model.norm != "rmsnorm"), ("model.position", plan.model.position != "rope"),
        ("job.reference", plan.job.workload.value == "dpo" and plan.job.reference.value != "in-step"),
        ("pipeline.schedule", plan.mesh.pp > 1 and plan.pipeline.schedule != Schedule.gpipe),
        ("pipeline.virtual_stages", plan.mesh.pp > 1 and plan.pipeline.virtual_stages > 1)) if has}
    assert err.field in real, (err, real)


def assert_exported(plan, exported) -> None:
    """What the files say without MaxText: the mesh split, the batch keys, base.yml's keys."""
    cfg = config_of(exported)
    ici = {k: cfg[f"ici_{k}_parallelism"] for k in mt.MESH_KEYS}
    dcn = {k: cfg[f"dcn_{k}_parallelism"] for k in mt.MESH_KEYS}
    prod = lambda d: functools.reduce(lambda a, b: a * b, d.values(), 1)  # noqa: E731
    assert prod(ici) == plan.ranks_per_node and prod(dcn) == plan.nodes == cfg["num_slices"]
    degrees = {a: ici[k] * dcn[k] for a, k in AXIS_OF.items()}
    if plan.sharding.kind == Sharding.zero1:
        degrees["dp_shard"], degrees["dp_replicate"] = ici["data"] * dcn["data"], ici["fsdp"] * dcn["fsdp"]
        assert cfg["shard_optimizer_over_data"] is True
    assert degrees == {a: getattr(plan.mesh, a) for a in AXIS_OF}
    assert ici["tensor"] == dcn["tensor"] == 1
    if ready():
        unknown = set(cfg) - base_keys() - {"base_config"}
        assert not unknown, f"keys not in MaxText 0.2.5's base.yml: {sorted(unknown)}"
    sequences = int(plan.world_size * cfg["per_device_batch_size"])  # types.py calculate_global_batch_sizes
    assert sequences * cfg["gradient_accumulation_steps"] == plan.job.global_batch
    assert cfg["max_target_length"] == plan.job.seq_len and cfg["base_num_decoder_layers"] == plan.model.layers
    run = exported.files["run.sh"]
    module = mt.DPO_MODULE if plan.job.workload.value == "dpo" else mt.PRETRAIN_MODULE
    assert f"exec python3 -m {module} " in run and f'"$here/{mt.CONFIG}"' in run


def export_and_check(plan, check: bool):
    """Export (and check with MaxText's own code) a plan of a layout the profile allows: the
    profile holds every MaxText constraint, so nothing it allows is refused."""
    assert not gaps(plan), f"the maxtext profile allowed a layout MaxText cannot run: {gaps(plan)}"
    exported = export_plan(plan, "maxtext")
    assert_exported(plan, exported)
    if check:
        assert cm.check(exported, plan) == exported.derived
    return exported


def test_committed_plans():
    """Every committed plan MaxText can run exports; the others are refused for a real reason."""
    done = 0
    for name, plan in committed_plans():
        try:
            exported = export_plan(plan, "maxtext")
        except PlanError as err:
            assert_refusal_is_real(plan, err)
            continue
        assert_exported(plan, exported)
        done += 1
    assert done >= 3


@needs_maxtext
def test_committed_plans_checked_by_maxtext():
    checked = 0
    for name, plan in committed_plans():
        try:
            exported = export_plan(plan, "maxtext")
        except PlanError:
            continue
        assert cm.check(exported, plan) == exported.derived, name
        checked += 1
    assert checked >= 3


@needs_maxtext
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_plans("maxtext"))
def test_generated_plans_fast(plan):
    export_and_check(plan, check=True)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_plans("maxtext"))
def test_generated_plans(plan):
    export_and_check(plan, check=cm.missing() is None)


def first_plan(pred, scenarios=range(6), picks=range(400)):
    """The first generated plan (of a maxtext layout) that exports and satisfies `pred`."""
    from export_plans import plan_of

    for s in scenarios:
        for k in picks:
            plan = plan_of("maxtext", s, k)
            if plan is None:
                break
            if pred(plan) and not gaps(plan):
                try:
                    export_plan(plan, "maxtext")
                except PlanError:
                    continue
                return plan
    pytest.skip("no such plan among the generated ones")


def test_pipeline_keys():
    """pp > 1: one GPipe flush of the plan's micro-batches, layers / pp a stage, no repeats."""
    plan = first_plan(lambda p: p.mesh.pp > 1)
    cfg = config_of(mt.export(plan))
    assert cfg["num_pipeline_microbatches"] == plan.grad_accumulation_steps and cfg["gradient_accumulation_steps"] == 1
    assert cfg["num_layers_per_pipeline_stage"] * plan.mesh.pp == plan.model.layers and cfg["num_pipeline_repeats"] == 1


def test_recompute_policies():
    plan = first_plan(lambda p: p.recompute == Recompute.selective_op)
    cfg = config_of(mt.export(plan))
    assert cfg["remat_policy"] == "custom"
    assert {k for k, v in cfg.items() if v == "device"} == {"decoder_layer_input", *mt.OP_KEPT["swiglu"]}
    full = plan.model_copy(update={"recompute": Recompute.full})
    assert config_of(mt.export(full))["remat_policy"] == "full"
    # recompute none runs only pipelined (the profile, one list of levels, leaves it out)
    piped = first_plan(lambda p: p.mesh.pp > 1)
    piped = piped.model_copy(update={"recompute": Recompute.none})
    cfg = config_of(mt.export(piped))
    assert cfg["remat_policy"] == "none" and cfg["set_remat_policy_on_pipeline_iterations"] is False


def test_zero1_is_shard_optimizer_over_data():
    """zero1 (the profile does not list it yet): the data axis at dp_shard's degree, ZeRO-1 on."""
    plan = first_plan(lambda p: p.sharding.kind == Sharding.fsdp and p.mesh.pp == 1)
    z1 = plan.model_copy(update={"sharding": plan.sharding.model_copy(update={"kind": Sharding.zero1})})
    exported = mt.export(z1)
    assert_exported(z1, exported)
    if cm.missing() is None:
        assert cm.check(exported, z1) == exported.derived


def test_context_parallel_is_ring_attention():
    """cp (the profile does not list it yet): ring attention load-balanced over 2 x cp chunks, the
    weights sharded over fsdp x context as exaplan shards them over dp_shard x cp."""
    plan = first_plan(lambda p: p.mesh.pp == 1 and p.sharding.kind == Sharding.fsdp and p.mesh.dp_shard % 2 == 0
                      and p.recompute == Recompute.full and mt.nvidia(p))
    cp = changed(plan, {"mesh.cp": 2, "mesh.dp_shard": plan.mesh.dp_shard // 2, "micro_batch_size": plan.micro_batch_size * 2})
    exported = mt.export(cp)
    cfg = config_of(exported)
    assert (cfg["context_parallel_strategy"], cfg["context_parallel_reorder_strategy"], cfg["attention"]) == (
        "ring", "dual_chunk_swap", "cudnn_flash_te")
    assert_exported(cp, exported)
    if cm.missing() is None:
        assert cm.check(exported, cp) == exported.derived
    replicated = changed(cp, {"sharding.kind": Sharding.none, "mesh.dp_replicate": cp.mesh.dp_shard, "mesh.dp_shard": 1})
    with pytest.raises(PlanError) as err:
        mt.export(replicated)
    assert err.value.field == "sharding.kind"


def test_xla_bucket_flag():
    plan = first_plan(lambda p: p.sharding.kind == Sharding.none and p.mesh.dp > 1)
    assert "XLA_FLAGS" not in mt.export(plan).files["env.sh"]  # the profile's 31.5 MB is XLA's default
    big = plan.model_copy(update={"sharding": plan.sharding.model_copy(update={"ddp_bucket_mb": 100.0})})
    assert "--xla_gpu_all_reduce_combine_threshold_bytes=100000000" in mt.export(big).files["env.sh"]


@pytest.mark.parametrize("update, field", [
    ({"job.precision": Precision.fp16}, "job.precision"),
    ({"sharding.kind": Sharding.zero2}, "sharding.kind"),
    ({"sharding.kind": Sharding.fsdp_grad_op}, "sharding.kind"),
    ({"recompute": Recompute.selective}, "recompute"),
    ({"recompute": Recompute.none}, "recompute"),
    ({"model.norm": "layernorm"}, "model.norm"),
    ({"model.position": "learned"}, "model.position"),
    ({"sequence_parallel": False, "mesh.tp": 2}, "sequence_parallel"),
    ({"mesh.tp": 3, "ranks_per_node": 4, "sequence_parallel": True}, "mesh.tp"),
])
def test_refusals_name_the_field(update, field):
    plan = first_plan(lambda p: p.mesh.pp == 1 and p.mesh.tp == 1 and p.recompute == Recompute.full)
    with pytest.raises(PlanError) as err:
        mt.export(changed(plan, update))
    assert err.value.field == field, err.value


def changed(plan, update: dict):
    """The plan with dotted fields replaced (unvalidated: the exporter's own refusals)."""
    parts: dict = {}
    for key, value in update.items():
        top, _, sub = key.partition(".")
        parts[top] = parts.get(top, getattr(plan, top)).model_copy(update={sub: value}) if sub else value
    return plan.model_copy(update=parts)


def test_pipeline_refusals():
    plan = first_plan(lambda p: p.mesh.pp > 1)
    pipe = plan.pipeline
    for update, field in (({"schedule": Schedule.one_f_one_b}, "pipeline.schedule"),
                          ({"virtual_stages": 2}, "pipeline.virtual_stages")):
        with pytest.raises(PlanError) as err:
            mt.export(plan.model_copy(update={"pipeline": pipe.model_copy(update=update)}))
        assert err.value.field == field
    odd = plan.model_copy(update={"grad_accumulation_steps": plan.mesh.pp + 1})
    with pytest.raises(PlanError) as err:
        mt.export(odd)
    assert err.value.field == "grad_accumulation_steps"


def test_cli_refusal_exit_2_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    refused = ROOT / "plans/protein-7b_dgx-h100_16n.yaml"  # fsdp-grad-op
    assert main(["export", str(refused), "--to", "maxtext", "-o", str(out)]) == 2
    assert "sharding.kind" in capsys.readouterr().err
    assert not out.exists()


def test_cli_writes_the_files(tmp_path):
    plan_path = ROOT / "plans/gpu/protein-3.5b_1xh100_full.yaml"
    out = tmp_path / "out"
    assert main(["export", str(plan_path), "--to", "maxtext", "-o", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {mt.CONFIG, "run.sh", "env.sh", "exaplan-export.json"}
    shellcheck = shutil.which("shellcheck") or (str(ROOT / ".venv/bin/shellcheck") if (ROOT / ".venv/bin/shellcheck").exists() else None)
    if shellcheck:
        subprocess.run([shellcheck, "--shell=bash", str(out / "run.sh"), str(out / "env.sh")], check=True)


@needs_maxtext
def test_maxtext_refuses_what_it_cannot_read():
    """MaxText's own loader, not the exporter, rejects an unknown key and a microbatch count
    that the stages do not divide."""
    name, plan = next((n, p) for n, p in committed_plans() if n.endswith("protein-3.5b_1xh100_full.yaml"))
    exported = export_plan(plan, "maxtext")
    exported.files[mt.CONFIG] += "not_a_maxtext_key: 1\n"
    with pytest.raises(PlanError, match="not_a_maxtext_key"):
        cm.check(exported, plan)
    piped = first_plan(lambda p: p.mesh.pp > 1)
    exported = export_plan(piped, "maxtext")
    text = exported.files[mt.CONFIG].replace(f"num_pipeline_microbatches: {piped.grad_accumulation_steps}\n",
                                             f"num_pipeline_microbatches: {piped.mesh.pp + 1}\n")
    assert text != exported.files[mt.CONFIG]
    exported.files[mt.CONFIG] = text
    with pytest.raises(PlanError, match="microbatches"):
        cm.check(exported, piped)


@needs_base_yml
def test_fetch_is_idempotent():
    from export.fetch_maxtext import fetch

    assert "already unpacked" in fetch()
    assert (Path(DEST) / "maxtext/configs/base.yml").is_file()
