"""Framework profiles (machine_models/frameworks.yaml): what a training framework achieves and
offers, applied by the cost model and recorded in the plan."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from machine_models import list_frameworks, load_framework, load_machine
from planner.cost.layout import Layouts, framework_problems
from planner.cost.step import evaluate
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.errors import PlanError
from planner.schema.plan import load_plan
from planner.schema.specs import FrameworkProfile, Sharding


def test_the_profiles_and_the_default():
    assert list_frameworks()[:3] == ["exaplan", "megatron", "deepspeed"]
    exaplan = load_framework("exaplan")
    assert exaplan.model_copy(update={"description": ""}) == FrameworkProfile(), \
        "frameworks.yaml's exaplan entry is the schema's default profile"
    assert load_framework().name == "exaplan"
    megatron = load_framework("megatron")
    assert set(megatron.shardings) == {Sharding.none, Sharding.zero1} and megatron.pp_sends_split_over_tp


def test_unknown_framework_names_the_closest():
    with pytest.raises(PlanError) as err:
        load_framework("megatorn")
    assert err.value.field == "framework" and "did you mean 'megatron'" in str(err.value)


def test_profile_figures_override_the_machine_and_none_keeps_it():
    h100 = load_machine("dgx-h100")
    assert FrameworkProfile().applied_to(h100) is h100  # exaplan: the device kind's figures
    megatron = load_framework("megatron")
    m = megatron.applied_to(h100)
    assert m.overlap.dp == megatron.overlap_dp and m.step_overhead_s == megatron.step_overhead_s
    assert m.matmul_efficiency == h100.matmul_efficiency
    assert megatron.applied_to(m) == m, "idempotent"
    no_flash = FrameworkProfile(flash_attention=False)
    assert not no_flash.applied_to(h100).flash_attention
    cpu = load_machine("local")
    assert FrameworkProfile().applied_to(cpu).flash_attention == cpu.flash_attention  # never turned on


def _job(framework: FrameworkProfile, world: int = 64):
    model, machine = get_model("protein-7b"), load_machine("dgx-h100")
    return model, machine, make_job(model, machine, world, 512, None, None, None, framework=framework)


def test_pipeline_sends_split_over_tp_ranks():
    """Megatron scatters p2p messages over the TP ranks; exaplan's runtime sends them whole
    without sequence parallelism."""
    lay = Layouts.one(dp=4, mbs=1, gas=128, tp=4, pp=4, sp=False)
    base = FrameworkProfile()
    split = base.model_copy(update={"pp_sends_split_over_tp": True})
    model, machine, job = _job(base)
    whole = evaluate(model, machine, job, lay).pp_s[0]
    model, machine, job = _job(split)
    assert evaluate(model, machine, job, lay).pp_s[0] < whole


@pytest.mark.parametrize("sp, mbs, recompute, rs, ag", [
    (True, 2, "none", 4, 4), (True, 1, "none", 4, 0), (False, 2, "none", 0, 0),
    (True, 2, "full", 5, 6),  # the replay stops before the down projection's reduce-scatter
    (True, 2, "selective-op", 4, 6),  # the reduce-scatters' outputs kept, the all-gathers replayed
])
def test_sequence_parallel_over_dim_1_copies_around_its_collectives(sp, mbs, recompute, rs, ag):
    """torch DTensor shards the sequence on dim 1 (batch first) and the libraries gather and
    scatter dim 0: each sequence-parallel reduce-scatter cats its input's chunks first, each
    all-gather of more than one sequence cats its output's (of one, a view), a read and a write
    of the whole activation at a copy's bandwidth per block and collective. Megatron's
    sequence-first layout needs neither, nor does plain TP (its allreduce reorders nothing)."""
    from planner.cost.compute import EAGER_BANDWIDTH_FRACTION
    from planner.schema.specs import bytes_per_element

    gas = 64 // mbs  # 64 ranks, 512 sequences
    lay = Layouts.one(dp=8, mbs=mbs, gas=gas, tp=8, sp=sp, recompute=recompute)
    copies, none = FrameworkProfile(), FrameworkProfile(sp_collective_copies=False)
    assert copies.sp_collective_copies and not load_framework("megatron").sp_collective_copies
    model, machine, job = _job(copies)
    with_copies = evaluate(model, machine, job, lay).tp_s[0]
    without = evaluate(*_job(none), lay).tp_s[0]
    m_act = mbs * job.seq_len * model.hidden * bytes_per_element(job.precision)
    per_copy = 2 * m_act / (machine.memory_bandwidth_gbyte_s * 1e9 * EAGER_BANDWIDTH_FRACTION)
    assert with_copies - without == pytest.approx(gas * model.layers * (rs + ag) * per_copy, rel=1e-9, abs=1e-12)


def test_bf16_gradient_reduction_halves_the_traffic():
    lay = Layouts.one(dp=64, mbs=1, gas=8)
    fp32 = FrameworkProfile(overlap_dp=0.0)
    bf16 = fp32.model_copy(update={"grad_reduce_dtype": "bf16"})
    model, machine, job32 = _job(fp32)
    _, _, job16 = _job(bf16)
    t32, t16 = evaluate(model, machine, job32, lay).dp_s[0], evaluate(model, machine, job16, lay).dp_s[0]
    assert t16 < 0.6 * t32


@pytest.mark.parametrize("name, bytes_by_precision", [
    ("megatron", {"bf16": 4, "fp16": 2, "fp32": 4}),  # fp32 forced only under --bf16
    ("deepspeed", {"bf16": 2, "fp16": 2, "fp32": 4}),  # communication_data_type: the training dtype
    ("exaplan", {"bf16": 4, "fp16": 4, "fp32": 4}),  # MixedPrecisionPolicy(reduce_dtype=fp32)
])
def test_gradient_reduction_bytes_follow_the_frameworks_rule_for_each_precision(name, bytes_by_precision):
    """Megatron reduces fp32 gradients under --bf16 but fp16 ones under --fp16; the cost model
    charges the data-parallel traffic by that rule: a Megatron plan in fp16 moves half the
    gradient bytes of the same plan in bf16."""
    profile = load_framework(name)
    assert {p: profile.grad_reduce_bytes(p) for p in bytes_by_precision} == bytes_by_precision
    if name != "megatron":
        return
    lay = Layouts.one(dp=64, mbs=1, gas=8, sharding="zero1")
    model, machine = get_model("protein-7b"), load_machine("dgx-h100")
    exposed = {}
    for precision in ("bf16", "fp16"):
        job = make_job(model, machine, 64, 512, None, precision, None,
                       framework=profile.model_copy(update={"overlap_dp": 0.0}))
        exposed[precision] = float(evaluate(model, machine, job, lay).dp_s[0])
    assert 0.5 < exposed["fp16"] / exposed["bf16"] < 0.85, exposed  # the all-gather stays 16-bit in both


@pytest.mark.parametrize("name, pp, hides", [("deepspeed", 4, False), ("deepspeed", 1, True), ("megatron", 4, True)])
def test_deepspeeds_pipeline_reduces_gradients_after_the_flush(name, pp, hides):
    """DeepSpeed's pipeline engine allreduces the gradients after the last backward
    (ReduceGrads): no overlap figure hides them there; without a pipeline, or under
    Megatron's, the overlap figure does."""
    lay = Layouts.one(dp=64 // (4 * pp), mbs=8, gas=4, tp=4, pp=pp, sharding="zero1")
    exposed = []
    for overlap in (0.0, 1.0):
        profile = load_framework(name).model_copy(update={"overlap_dp": overlap})
        model, machine, job = _job(profile)
        exposed.append(float(evaluate(model, machine, job, lay).dp_s[0]))
    assert (exposed[1] < 0.9 * exposed[0]) == hides, exposed


def test_a_framework_refuses_what_it_does_not_run():
    megatron = load_framework("megatron")
    assert framework_problems(megatron, Layouts.one(dp=8, mbs=1, sharding="zero1")) == []
    assert "megatron runs none, zero1" in framework_problems(megatron, Layouts.one(dp=8, mbs=1, sharding="fsdp"))[0]
    no_sp = FrameworkProfile(sequence_parallel=False)
    assert framework_problems(no_sp, Layouts.one(dp=2, mbs=1, tp=4))[0].startswith("sequence_parallel:")


def test_estimate_and_plan_take_the_framework(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["estimate", "--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "2", "--dp", "16",
                 "--mbs", "1", "--global-batch", "64", "--shard", "zero1", "--framework", "megatron",
                 "-o", str(out)]) == 0
    plan = load_plan(out)
    assert plan.job.framework.name == "megatron" and plan.machine.overlap.dp == load_framework("megatron").overlap_dp
    capsys.readouterr()
    # explain names the gradients' reduction dtype: Megatron's fp32 under bf16, fp16 under fp16
    for precision, dtype in (("bf16", "fp32"), ("fp16", "fp16")):
        assert main(["estimate", "--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "2", "--dp", "16",
                     "--mbs", "1", "--global-batch", "64", "--shard", "zero1", "--framework", "megatron",
                     "--precision", precision, "-o", str(out), "--force"]) == 0
        capsys.readouterr()
        assert main(["explain", str(out)]) == 0
        assert f"gradients reduced in {dtype}" in capsys.readouterr().out
    assert main(["estimate", "--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "2", "--dp", "16",
                 "--mbs", "1", "--shard", "fsdp", "--framework", "megatron", "-o", str(tmp_path / "no.yaml")]) == 2
    assert "sharding.kind: megatron runs" in capsys.readouterr().err and not (tmp_path / "no.yaml").exists()
    assert main(["plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--framework", "nope", "--no-write"]) == 2
    assert "unknown framework 'nope'" in capsys.readouterr().err
    # selective-op recompute is torch's per-op policy: exaplan's runtime offers it, Megatron does not
    for cmd in ("estimate", "plan"):
        assert main([cmd, "--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "2", "--dp", "16",
                     "--mbs", "1", "--global-batch", "64", "--shard", "zero1", "--recompute", "selective-op",
                     "--framework", "megatron", "-o", str(tmp_path / "no.yaml")]) == 2
        err = capsys.readouterr().err
        assert "recompute" in err and "megatron offers none, selective, full" in err and "Traceback" not in err
    assert not (tmp_path / "no.yaml").exists()
    assert main(["estimate", "--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "2", "--dp", "16",
                 "--mbs", "1", "--global-batch", "64", "--shard", "zero1", "--recompute", "selective-op",
                 "-o", str(out), "--force"]) == 0
    assert load_plan(out).recompute.value == "selective-op"


def test_the_search_keeps_to_what_the_framework_runs():
    from planner.search.search import search
    from planner.cost.layout import RECOMPUTES, SHARDINGS

    model, machine = get_model("protein-7b"), load_machine("dgx-h100")
    for name in ("megatron", "exaplan"):
        framework = load_framework(name)
        job = make_job(model, machine, 128, 1024, None, None, None, framework=framework)
        res = search(model, framework.applied_to(machine), job, 16, top_k=20)
        kinds = {SHARDINGS[k] for k in res.layouts.sharding}
        assert kinds <= set(framework.shardings), name
        assert {RECOMPUTES[r] for r in res.finalists.recompute} <= set(framework.recompute_levels), name
    no_sp = FrameworkProfile(sequence_parallel=False)
    res = search(model, machine, make_job(model, machine, 128, 1024, None, None, None, framework=no_sp), 16, top_k=50)
    assert not res.layouts.sp.any()


def test_compile_plans_compiled_blocks(tmp_path, capsys):
    """`--compile`: the plan says `compile: true` and predicts the blocks compiled, faster than
    the eager plan of the same layout on a GPU; for a fused framework it is refused (exit 2,
    nothing written); on a CPU it changes no prediction."""
    common = ["estimate", "--model", "protein-3.5b", "--machine", "dgx-h100", "--set", "machine.devices_per_node=1",
              "--nodes", "1", "--dp", "1", "--mbs", "8", "--global-batch", "32", "--shard", "none"]
    assert main([*common, "-o", str(tmp_path / "eager.yaml")]) == 0
    assert main([*common, "--compile", "-o", str(tmp_path / "compiled.yaml")]) == 0
    eager, compiled = load_plan(tmp_path / "eager.yaml"), load_plan(tmp_path / "compiled.yaml")
    assert not eager.compile and compiled.compile and compiled.job.framework.compiled
    assert 0.65 < compiled.prediction.step_time_s / eager.prediction.step_time_s < 0.85
    capsys.readouterr()
    assert main([*common, "--framework", "megatron", "--compile", "-o", str(tmp_path / "no.yaml")]) == 2
    assert "compile: applies to exaplan's torch runtime" in capsys.readouterr().err
    assert not (tmp_path / "no.yaml").exists()
    cpu = ["estimate", "--model", "protein-tiny", "--machine", "local", "--nodes", "1", "--dp", "2", "--mbs", "2",
           "--global-batch", "8", "--shard", "none", "--precision", "fp32", "--json"]
    steps = []
    for extra in ([], ["--compile"]):
        assert main([*cpu, *extra]) == 0
        steps.append(json.loads(capsys.readouterr().out))
    assert steps[0]["step_time_s"] == steps[1]["step_time_s"]
    # `plan` says what compiling the chosen layout would give, when it is eager on a GPU.
    plan = ["plan", "--model", "protein-3.5b", "--machine", "dgx-h100", "--set", "machine.devices_per_node=1",
            "--global-batch", "32", "--draws", "0", "--no-write"]
    assert main(plan) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("blocks eager"))
    assert "compiled (--compile) this layout would take" in line and "(-2" in line  # 20-29% less
    assert main([*plan, "--compile"]) == 0
    assert "blocks eager" not in capsys.readouterr().out
