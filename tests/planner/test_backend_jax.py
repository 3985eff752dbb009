"""`exaplan plan --backend jax`: the jax framework profile (machine_models/frameworks.yaml),
the search kept to the layouts the JAX backend runs (pp = cp = 1, bf16 or fp32, pretrain),
the plan's `backend` field, and the plans made before it (their files and hashes unchanged)."""

from __future__ import annotations

import pytest

from cli.examples import EXAMPLES, JAX_TWINS, PLANS_DIR
from cli.main import main
from machine_models import list_frameworks, load_framework, load_machine
from planner.cost.layout import Layouts, framework_problems
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.errors import PlanError
from planner.schema.plan import Plan, content_hash, dumps_plan, load_plan
from planner.schema.specs import FrameworkProfile, Precision, Sharding
from planner.search.pins import Pins
from planner.search.search import search

# protein-7b on 16 DGX H100 nodes (the torch search's plan: plans/protein-7b_dgx-h100_16n.yaml).
H100 = ("--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "16", "--global-batch", "1024", "--draws", "0")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _plan(capsys, *argv) -> tuple[int, str]:
    rc = main(["plan", *argv])
    return rc, capsys.readouterr().err


# --- the profile ---------------------------------------------------------------------------------


def test_the_jax_profile_loads():
    assert "jax" in list_frameworks()
    jax = load_framework("jax")
    assert not jax.pipeline_parallel and not jax.context_parallel
    assert jax.precisions == [Precision.bf16, Precision.fp32]
    assert set(jax.shardings) == set(Sharding) and jax.sequence_parallel and jax.flash_attention
    assert jax.overlap_dp is None and jax.step_overhead_s is None, "unfitted: the machine's own figures"
    assert "jaxrt/" in jax.description
    h100 = load_machine("dgx-h100")
    assert jax.applied_to(h100).overlap.dp == h100.overlap.dp


def test_the_other_profiles_offer_everything_as_before():
    """Pipeline parallelism and every precision; context parallelism but in Megatron-DeepSpeed,
    whose sequence parallelism across ranks is Ulysses, not ring attention (frameworks.yaml)."""
    for name in ("exaplan", "megatron", "deepspeed"):
        fw = load_framework(name)
        assert fw.pipeline_parallel and fw.context_parallel == (name != "deepspeed") and fw.precisions == list(Precision), name


def test_a_profile_needs_a_precision():
    with pytest.raises(ValueError, match="precisions"):
        FrameworkProfile(precisions=[])


def test_the_precision_must_be_the_frameworks():
    model, machine = get_model("protein-7b"), load_machine("dgx-h100")
    with pytest.raises(PlanError) as err:
        make_job(model, machine, 8, 64, None, "fp16", None, framework=load_framework("jax"))
    assert err.value.field == "precision" and "bf16, fp32" in str(err.value)
    fp32_only = FrameworkProfile(name="fp32-only", precisions=[Precision.fp32])
    assert make_job(model, machine, 8, 64, None, None, None, framework=fp32_only).precision == Precision.fp32, \
        "the default precision is one the framework trains in"
    assert make_job(model, machine, 8, 64, None, None, None).precision == Precision.bf16  # unchanged without one


# --- the search ----------------------------------------------------------------------------------


def test_the_search_keeps_to_pp_and_cp_1():
    model, machine = get_model("protein-7b"), load_machine("dgx-h100")
    results = {}
    for name in ("exaplan", "jax"):
        fw = load_framework(name)
        job = make_job(model, machine, 128, 1024, None, None, None, framework=fw)
        results[name] = search(model, fw.applied_to(machine), job, 16, top_k=64)
    torch = results["exaplan"].finalists
    assert (torch.pp > 1).any() and (torch.cp > 1).any(), "the torch search lists pipelines and context parallelism"
    jax = results["jax"].finalists
    assert (jax.pp == 1).all() and (jax.cp == 1).all()
    assert results["jax"].total_layouts < results["exaplan"].total_layouts


def test_a_framework_without_pipelines_refuses_a_pinned_one():
    fw = load_framework("jax")
    model, machine = get_model("protein-7b"), load_machine("dgx-h100")
    job = make_job(model, machine, 128, 1024, None, None, None, framework=fw)
    for pins, field in ((Pins(pp=2), "pp"), (Pins(cp=2), "cp"), (Pins(vpp=2), "vpp"), (Pins(schedule="1f1b"), "schedule")):
        with pytest.raises(PlanError) as err:
            search(model, machine, job, 16, pins=pins)
        assert err.value.field == field and "jax has no" in str(err.value)
    assert framework_problems(fw, Layouts.one(dp=4, mbs=1, pp=2))[0].startswith("mesh.pp: jax has no pipeline")
    assert framework_problems(fw, Layouts.one(dp=4, mbs=1, cp=2))[0].startswith("mesh.cp: jax has no context")
    assert framework_problems(fw, Layouts.one(dp=4, mbs=1, tp=2, sp=True)) == []


# --- exaplan plan --backend ----------------------------------------------------------------------


def test_plan_backend_jax_writes_a_jax_plan_that_round_trips(capsys, tmp_path):
    for out in ("jax.yaml", "jax.json"):
        rc, err = _plan(capsys, *H100, "--backend", "jax", "-o", out)
        assert rc == 0, err
        plan = load_plan(tmp_path / out)
        assert plan.backend == "jax" and plan.job.framework.name == "jax"
        assert plan.mesh.pp == 1 and plan.mesh.cp == 1 and plan.pipeline.schedule is None
        assert plan.job.precision == Precision.bf16
        assert Plan.model_validate(plan.model_dump(mode="json")) == plan
    assert "\nbackend: jax\n" in (tmp_path / "jax.yaml").read_text()
    assert load_plan(tmp_path / "jax.yaml").model_dump() == load_plan(tmp_path / "jax.json").model_dump()
    rc, err = _plan(capsys, *H100, "--backend", "jax", "--framework", "jax", "--precision", "fp32", "-o", "fp32.yaml")
    assert rc == 0, err
    assert load_plan(tmp_path / "fp32.yaml").job.precision == Precision.fp32


@pytest.mark.parametrize("extra,field", [
    (("--pp", "2"), "pp"),
    (("--cp", "2"), "cp"),
    (("--precision", "fp16"), "precision"),
    (("--framework", "megatron"), "framework"),
    (("--framework", "exaplan"), "framework"),
    (("--workload", "dpo"), "workload"),
])
def test_plan_backend_jax_refuses_what_it_cannot_run(capsys, tmp_path, extra, field):
    rc, err = _plan(capsys, *H100, "--backend", "jax", *extra, "-o", "no.yaml")
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"exaplan plan: error: {field}: "), err
    assert "Traceback" not in err and not (tmp_path / "no.yaml").exists()
    if field == "framework":
        assert "--framework" in err and repr(extra[1]) in err


def test_the_torch_backend_is_unchanged(capsys, tmp_path):
    small = ("--model", "protein-tiny", "--machine", "dgx-h100", "--draws", "0")
    assert _plan(capsys, *small, "-o", "none.yaml")[0] == 0
    assert _plan(capsys, *small, "--backend", "torch", "-o", "torch.yaml")[0] == 0
    none, torch = load_plan(tmp_path / "none.yaml"), load_plan(tmp_path / "torch.yaml")
    assert none.backend is None and "\nbackend:" not in (tmp_path / "none.yaml").read_text()
    assert torch.backend == "torch" and torch.job.framework.name == "exaplan"
    assert torch.model_copy(update={"backend": None, "provenance": none.provenance}) == none
    text = (tmp_path / "none.yaml").read_text()
    assert "pipeline_parallel" not in text and "precisions" not in text, "default profile fields stay out of the file"
    # Another framework with the torch backend, as before.
    assert _plan(capsys, *small, "--backend", "torch", "--framework", "megatron", "-o", "meg.yaml")[0] == 0


# --- the plan file -------------------------------------------------------------------------------


def _body(name: str) -> dict:
    return load_plan(PLANS_DIR / name).model_dump(mode="json")


def test_a_jax_plan_refuses_pipelines_context_parallelism_and_dpo():
    body = _body("protein-3.5b_aurora_3200n_dpo.yaml")  # pp 16, cp 2, dpo: every refusal named at once
    assert body["mesh"]["pp"] > 1 and body["mesh"]["cp"] > 1
    Plan.model_validate({**body, "backend": "torch"})
    with pytest.raises(ValueError) as err:
        Plan.model_validate({**body, "backend": "jax"})
    for refusal in ("mesh.pp: backend jax", "mesh.cp: backend jax", "job.workload: backend jax runs pretrain only"):
        assert refusal in str(err.value)
    dpo = _body("protein-3.5b_frontier_2048n_dpo.yaml")
    assert dpo["mesh"]["pp"] == 1 and dpo["mesh"]["cp"] == 1
    with pytest.raises(ValueError, match="job.workload: backend jax runs pretrain only"):
        Plan.model_validate({**dpo, "backend": "jax"})
    with pytest.raises(ValueError, match="backend"):
        Plan.model_validate({**body, "backend": "tensorflow"})


def test_a_jax_plan_refuses_fp16(capsys, tmp_path):
    assert _plan(capsys, *H100, "--backend", "jax", "-o", "jax.yaml")[0] == 0
    body = load_plan(tmp_path / "jax.yaml").model_dump(mode="json")
    body["job"]["precision"] = "fp16"
    body["job"]["framework"]["precisions"] = ["bf16", "fp16", "fp32"]  # past the profile's own check
    with pytest.raises(ValueError, match="job.precision: backend jax trains in bf16 or fp32"):
        Plan.model_validate(body)


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - set(JAX_TWINS)))
def test_the_committed_plans_keep_their_hash_and_their_text(name):
    """Plans made before `backend` and the profiles' pipeline_parallel, context_parallel and
    precisions: they load, their hash is the one they carry, and dumping them again gives
    their file byte for byte (the new fields, at their earlier values, stay out)."""
    path = PLANS_DIR / name
    plan = load_plan(path)
    assert plan.backend is None and plan.job.framework.pipeline_parallel
    assert content_hash(plan) == plan.provenance.content_hash
    assert dumps_plan(plan) == path.read_text()


@pytest.mark.parametrize("name", sorted(JAX_TWINS))
def test_the_jax_twins_are_their_torch_plans_job_for_the_jax_backend(name):
    """cli/examples.py's JAX twins: the torch plan's model, machine and job, backend jax, the
    jax profile; their hash is the one they carry and they dump to their file."""
    path, twin = PLANS_DIR / name, load_plan(PLANS_DIR / JAX_TWINS[name][0])
    plan = load_plan(path)
    assert plan.backend == "jax" and plan.job.framework.name == "jax" and plan.mesh.pp == 1
    assert plan.model == twin.model and plan.machine == twin.machine
    assert (plan.job.global_batch, plan.job.seq_len, plan.job.precision) == (twin.job.global_batch, twin.job.seq_len,
                                                                              twin.job.precision)
    assert content_hash(plan) == plan.provenance.content_hash and dumps_plan(plan) == path.read_text()


def test_explain_says_a_jax_step_is_one_xla_graph(capsys):
    """`exaplan explain` of a JAX plan: not "blocks eager" (the plan's compile flag is torch's)."""
    assert main(["explain", str(PLANS_DIR / "gpu/protein-3.5b_1xh100_jax.yaml")]) == 0
    batch = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("batch:"))
    assert "the whole step one XLA graph" in batch and "eager" not in batch
    assert main(["explain", str(PLANS_DIR / "gpu/protein-3.5b_1xh100.yaml")]) == 0
    assert "blocks eager" in capsys.readouterr().out
