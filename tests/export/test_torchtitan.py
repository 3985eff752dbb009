"""`exaplan export --to torchtitan`: every plan torchtitan 0.3.0 can run is written as overrides
that torchtitan's own ConfigManager parses, whose ParallelDims validates the degrees at the plan's
world size, whose device mesh puts every sampled rank at the plan's coordinates, whose model
config builds the plan's model (the same parameter count) and whose pipeline code places and
splits the plan's stages; the batch split torchtitan derives equals the plan's. Plans it cannot
run are refused naming the field, for a reason the plan really has. torchtitan's trainer does not
run on a CPU, so nothing here trains (docs/frameworks/torchtitan.md)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings

from cli.main import main
from export import Derived, export_plan, write_export
from export import check_torchtitan as ct
from export import torchtitan as tt
from export.base import Export
from planner.cost.flops import total_params
from planner.schema.errors import PlanError
from planner.schema.job import Workload
from planner.schema.plan import Precision, Recompute, Sharding, dumps_plan, load_plan, seal
from export_plans import ROOT, committed_plans, generated_plans

needs_torchtitan = pytest.mark.skipif(ct.missing() is not None, reason=f"torchtitan is not installed: {ct.missing()}")

# The fields a torchtitan refusal may name: the profile's (export_plan's field "plan", the
# message naming the plan's field) and the exporter's own.
OWN_FIELDS = {"job.workload", "job.precision", "job.framework.grad_reduce_dtype", "recompute", "sharding.kind",
              "sharding.ddp_bucket_mb", "model.activation", "model.norm", "model.position", "model.tied_embeddings",
              "pipeline.schedule"}
PROFILE_FIELDS = ("sharding.kind:", "recompute:", "job.precision:", "pipeline.schedule:", "mesh.cp:", "mesh.pp:",
                  "sequence_parallel:", "pipeline.stages:", "job.workload:", "job.reference:", "model.tied_embeddings:",
                  "grad_accumulation_steps:", "mesh.tp:", "mesh.dp_shard:", "mesh.dp_replicate:")


def stages_of(plan):
    return [(s.pp_rank, s.virtual_index, s.first_layer, s.last_layer, s.embedding, s.head) for s in plan.pipeline.stages]


def assert_refusal_is_real(plan, err: PlanError) -> None:
    """A refusal names a field and the plan really holds what it says torchtitan lacks."""
    assert err.field, err
    if err.field == "plan":  # the profile's, listing the plan's fields
        assert any(name in str(err) for name in PROFILE_FIELDS), err
        return
    assert err.field in OWN_FIELDS or err.field.startswith("pipeline.stages["), err
    kind, mesh = plan.sharding.kind, plan.mesh
    real = {
        "job.workload": plan.job.workload.value != "pretrain",
        "job.precision": plan.job.precision == Precision.fp16,
        "job.framework.grad_reduce_dtype": plan.job.framework.grad_reduce_dtype != "fp32",
        "recompute": plan.recompute == Recompute.selective,
        "sharding.kind": kind in (Sharding.zero1, Sharding.zero2) or (kind == Sharding.none and mesh.cp > 1),
        "sharding.ddp_bucket_mb": kind == Sharding.none and plan.sharding.ddp_bucket_mb > tt.block_gradient_mib(plan),
        "model.activation": plan.model.activation != "swiglu",
        "model.norm": plan.model.norm != "rmsnorm",
        "model.position": plan.model.position != "rope",
        "model.tied_embeddings": plan.model.tied_embeddings and mesh.pp > 1,
    }
    assert real.get(err.field, True), f"{err} but the plan does not hold it"


def assert_torchtitan_reads_the_plan(plan) -> None:
    """Export, then torchtitan's own code: equal degrees, batch split, model and stages."""
    exported = export_plan(plan, "torchtitan")
    assert exported.derived == Derived.of(plan)
    mesh_free = not dist.is_initialized()
    seen = ct.inspect(exported, plan)
    assert seen.derived == exported.derived, (seen.derived, exported.derived)
    assert ct.check(exported, plan) == Derived.of(plan)
    assert seen.mesh_checked or not mesh_free
    assert seen.params == total_params(plan.model)
    assert seen.layers == plan.model.layers
    assert seen.stages == stages_of(plan)
    assert seen.recompute == plan.recompute.value
    # The rest of the layout, as torchtitan parsed it
    par, training = seen.config.parallelism, seen.config.training
    if plan.mesh.tp > 1:
        assert par.enable_sequence_parallel == plan.sequence_parallel
    assert par.fsdp_reshard_after_forward == (
        "always" if plan.sharding.kind in (Sharding.fsdp, Sharding.hsdp) and plan.sharding.reshard_after_forward else "never")
    assert training.mixed_precision_param == {"bf16": "bfloat16", "fp32": "float32"}[plan.job.precision.value]
    assert training.dtype == "float32" and training.mixed_precision_reduce == "float32"
    assert training.seq_len == plan.job.seq_len
    assert seen.config.compile.enable == plan.compile
    if plan.mesh.pp > 1:
        assert par.pipeline_parallel_schedule == tt.SCHEDULES[plan.pipeline.schedule]
    model = seen.config.model_spec.model
    attention = model.layers[0].attention
    assert (model.dim, model.vocab_size, attention.n_heads, attention.n_kv_heads) == (
        plan.model.hidden, plan.model.vocab_size, plan.model.heads, plan.model.kv_heads)
    assert model.enable_weight_tying == plan.model.tied_embeddings


# --------------------------------------------------------------------------------------------
# torchtitan's own code on the exports
# --------------------------------------------------------------------------------------------


@needs_torchtitan
def test_every_committed_plan_torchtitan_runs_passes_its_own_code():
    exported = 0
    for name, plan in committed_plans():
        try:
            export_plan(plan, "torchtitan")
        except PlanError as err:
            assert_refusal_is_real(plan, err)
            continue
        assert_torchtitan_reads_the_plan(plan)
        exported += 1
    assert exported >= 10  # single-GPU plans, FSDP, HSDP with an uneven interleaved pipeline


@needs_torchtitan
def test_an_uneven_interleaved_pipeline_keeps_the_plans_stages():
    plan = load_plan(ROOT / "plans/protein-3.5b_alps_2060n.yaml")  # pp 4 x 3 chunks: 2,2,2,2 then 1 layer each
    seen = ct.inspect(export_plan(plan, "torchtitan"), plan)
    assert [b - a for _, _, a, b, _, _ in seen.stages] == [2, 2, 2, 2] + [1] * 8
    assert seen.derived.vpp == 3 and seen.derived.accumulation == plan.grad_accumulation_steps
    # one pipeline flush of the plan's micro-batches: torchtitan's own accumulation is 1
    training, par = seen.config.training, seen.config.parallelism
    assert training.local_batch_size == plan.micro_batch_size * plan.grad_accumulation_steps
    assert training.global_batch_size == plan.job.global_batch
    assert par.pipeline_parallel_microbatch_size == plan.micro_batch_size


# Every layout the torchtitan profile allows exports and passes torchtitan's own code: the
# search (which keeps to the profile) never proposes what torchtitan cannot run.
@needs_torchtitan
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_plans("torchtitan"))
def test_generated_plans_export_fast(plan):
    assert_torchtitan_reads_the_plan(plan)


@pytest.mark.slow
@needs_torchtitan
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_plans("torchtitan"))
def test_generated_plans_export(plan):
    assert_torchtitan_reads_the_plan(plan)


@needs_torchtitan
def test_torchtitan_refuses_edited_overrides():
    plan = load_plan(ROOT / "plans/protein-3.5b_alps_2060n.yaml")
    exported = export_plan(plan, "torchtitan")

    def edited(old: str, new: str) -> Export:
        text = exported.files["overrides.txt"]
        assert old in text
        return Export(target="torchtitan", files={**exported.files, "overrides.txt": text.replace(old, new)},
                      derived=exported.derived)

    with pytest.raises(PlanError) as e:  # degrees that do not multiply to the world: ParallelDims
        ct.check(edited("--parallelism.data_parallel_shard_degree 5", "--parallelism.data_parallel_shard_degree 4"), plan)
    assert e.value.field == "mesh"
    with pytest.raises(PlanError) as e:  # a misspelt option: tyro's exit 2
        ct.check(edited("--training.local_batch_size", "--training.local_batch_sise"), plan)
    assert e.value.field == "to" and "exit 2" in str(e.value)
    with pytest.raises(PlanError) as e:  # a module the model lacks
        ct.check(edited("layers.15,norm", "layers.16,norm"), plan)
    assert e.value.field == "pipeline.stages"
    with pytest.raises(PlanError) as e:  # a local batch the pipeline microbatch does not divide: Trainer.Config
        ct.check(edited("--training.local_batch_size 32", "--training.local_batch_size 36"), plan)
    assert e.value.field == "to"
    # a batch split torchtitan derives differently is caught by the comparison
    other = ct.check(edited("--parallelism.pipeline_parallel_microbatch_size 8",
                            "--parallelism.pipeline_parallel_microbatch_size 4"), plan)
    assert other != exported.derived and other.micro_batch == 4 and other.accumulation == 8


# --------------------------------------------------------------------------------------------
# Refusals (no torchtitan needed)
# --------------------------------------------------------------------------------------------


def _plan(**changes):
    """The 7B FSDP plan with parts replaced (not re-validated: what a tampered or future plan holds)."""
    plan = load_plan(ROOT / "plans/protein-7b_dgx-h100_16n.yaml")
    parts = {}
    for dotted, value in changes.items():
        head, _, rest = dotted.partition(".")
        if rest:
            sub = parts.get(head, getattr(plan, head))
            inner, _, leaf = rest.partition(".")
            if leaf:
                sub = sub.model_copy(update={inner: getattr(sub, inner).model_copy(update={leaf: value})})
            else:
                sub = sub.model_copy(update={inner: value})
            parts[head] = sub
        else:
            parts[head] = value
    return plan.model_copy(update=parts)


@pytest.mark.parametrize("changes, field", [
    ({"job.workload": Workload.dpo}, "job.workload"),
    ({"job.framework.grad_reduce_dtype": "bf16"}, "job.framework.grad_reduce_dtype"),
    ({"recompute": Recompute.selective}, "recompute"),
    ({"sharding.kind": Sharding.zero2}, "sharding.kind"),
    ({"model.activation": "gelu"}, "model.activation"),
    ({"model.norm": "layernorm"}, "model.norm"),
    ({"model.position": "learned"}, "model.position"),
])
def test_what_torchtitan_lacks_is_refused_naming_the_field(changes, field):
    plan = _plan(**changes)
    for call in (lambda: tt.export(plan, "torchtitan"), lambda: export_plan(plan, "torchtitan")):
        with pytest.raises(PlanError) as e:
            call()
        assert e.value.field in (field, "plan") and field in str(e.value)


def test_fp16_is_refused():
    plan = _plan(**{"job.precision": Precision.fp16})
    with pytest.raises(PlanError) as e:
        tt.export(plan)
    assert e.value.field == "job.precision" and "bfloat16 or float32" in str(e.value)


def test_replication_over_context_parallel_ranks_is_refused():
    """torchtitan shards over dp_shard x cp whenever cp > 1: a plan that replicates there cannot run."""
    plan = _plan(**{"mesh.dp_shard": 64, "mesh.cp": 2, "sharding.kind": Sharding.none, "sharding.shard_group_size": 1})
    with pytest.raises(PlanError) as e:
        tt.export(plan)
    assert e.value.field == "sharding.kind" and "cp" in str(e.value)


def test_ddp_buckets_larger_than_a_block_are_refused():
    """torchtitan reduces replicated gradients block by block: a plan bucket over one block's is refused."""
    base = {"mesh.dp_shard": 1, "mesh.dp_replicate": 128, "sharding.kind": Sharding.none,
            "sharding.shard_group_size": 1}
    block = tt.block_gradient_mib(_plan(**base))
    assert 400 < block < 1000  # protein-7b: one block's fp32 gradients, 772 MiB
    tt.export(_plan(**base, **{"sharding.ddp_bucket_mb": 400.0}))
    with pytest.raises(PlanError) as e:
        tt.export(_plan(**base, **{"sharding.ddp_bucket_mb": 1000.0}))
    assert e.value.field == "sharding.ddp_bucket_mb"


def test_tied_embeddings_only_without_a_pipeline():
    plan = load_plan(ROOT / "plans/protein-3.5b_alps_2060n.yaml")
    tied = plan.model_copy(update={"model": plan.model.model_copy(update={"tied_embeddings": True})})
    with pytest.raises(PlanError) as e:
        tt.export(tied)
    assert e.value.field == "model.tied_embeddings"
    flat = load_plan(ROOT / "plans/protein-7b_dgx-h100_16n.yaml")
    tt.export(flat.model_copy(update={"model": flat.model.model_copy(update={"tied_embeddings": True})}))


# --------------------------------------------------------------------------------------------
# The files and the command line
# --------------------------------------------------------------------------------------------


def test_train_sh_holds_the_overrides_as_a_bash_array(tmp_path):
    plan = load_plan(ROOT / "plans/protein-3.5b_alps_2060n.yaml")
    exported = export_plan(plan, "torchtitan")
    write_export(exported, tmp_path / "titan")
    words = [w for line in exported.files["overrides.txt"].splitlines() for w in shlex.split(line, comments=True)]
    assert words == exported.argv
    out = subprocess.run(["bash", "-c", 'source "$1" && printf "%s\\n" "${TITAN_ARGS[@]}" && echo "PP=$PYTHONPATH"',
                          "bash", str(tmp_path / "titan/train.sh")], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PROTEIN_DATA": "/data/uniref50"}).stdout.splitlines()
    assert out[:len(words)] == words
    assert out[len(words):len(words) + 4] == ["--hf_assets_path", "./assets/protein-tokenizer",
                                              "--dataloader.dataset_path", "/data/uniref50"]
    assert out[-1] == f"PP={(tmp_path / 'titan').resolve()}"
    script = exported.files["train.sh"]
    assert f"torchrun --nnodes {plan.nodes} --nproc_per_node {plan.ranks_per_node}" in script
    assert "-m torchtitan.train" in script
    assert exported.files["env.sh"].count("export ") == len(plan.collectives.env)


def test_the_cli_writes_checked_files(tmp_path, capsys):
    if ct.missing():
        pytest.skip(f"torchtitan is not installed: {ct.missing()}")
    out = tmp_path / "titan"
    assert main(["export", str(ROOT / "plans/protein-7b_dgx-h100_16n.yaml"), "--to", "torchtitan", "-o", str(out),
                 "--check"]) == 0
    printed = capsys.readouterr().out
    assert "checked by its own code" in printed and "dp 128" in printed
    meta = json.loads((out / "exaplan-export.json").read_text())
    assert sorted(meta["files"]) == ["env.sh", "exaplan_protein.py", "overrides.txt", "train.sh"]
    assert meta["versions"] == {"torchtitan": "0.3.0"}


def test_the_cli_refuses_naming_the_field_and_writes_nothing(tmp_path, capsys):
    plan = load_plan(ROOT / "plans/protein-3.5b_pdx_400n_dpo.yaml")
    path = tmp_path / "dpo.yaml"
    path.write_text(dumps_plan(seal(plan)))
    out = tmp_path / "titan"
    assert main(["export", str(path), "--to", "torchtitan", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "job.workload" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert main(["export", str(path), "--to", "torchtitn", "-o", str(out)]) == 2
    assert "did you mean 'torchtitan'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
@needs_torchtitan
def test_the_config_module_runs_as_torchtitans_entry_point(tmp_path):
    """`python exaplan_protein.py ARGS` (exaplan launch --entry) is torchtitan.train, with the export
    folder importable: its main() parses the plan's overrides, then (in torchtitan's local_tensor
    mode, the one that needs no GPU) stops before building the trainer; a bad override exits 2."""
    plan = load_plan(ROOT / "plans/protein-7b_dgx-h100_16n.yaml")
    exported = export_plan(plan, "torchtitan")
    write_export(exported, tmp_path / "titan")
    script = str(tmp_path / "titan" / f"{tt.MODULE}.py")
    p = subprocess.run([sys.executable, script, *exported.argv, "--comm.mode", "local_tensor"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "torchtitan version: 0.3.0" in p.stderr + p.stdout and "skipping training execution" in p.stderr + p.stdout
    p = subprocess.run([sys.executable, script, *exported.argv, "--parallelism.tensor_parallel_degre", "2"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 2
