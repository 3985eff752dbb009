"""Check a torchtitan export with torchtitan 0.3.0's own code, on the CPU, without a GPU.

What runs, in order (`inspect`):
  1. `torchtitan.config.ConfigManager().parse_args(overrides.txt)`: imports the exported config
     module by --module/--config, builds Trainer.Config through tyro (which runs its
     __post_init__: the pipeline microbatch split, CUDA graphs under pipelining, ...). A parse
     error (tyro's SystemExit, exit 2) or a config error is a PlanError.
  2. `ParallelDims.from_config(parallelism, world_size=plan's world)`: torchtitan's degree
     validation (the degrees must multiply to the world; dp_shard -1 would be inferred).
  3. Under torch's fake process group (one process, no GPU): `ParallelDims.build_mesh()`, then
     the 5-D mesh torchtitan shards over ("pp", "dp_replicate", "dp_shard", "cp", "tp"): every
     sampled rank sits at the plan's coordinates (Plan.coordinates), and the data-parallel
     degree is the size of torchtitan's "batch" mesh. Skipped (mesh_checked False) where this
     process already has a process group.
  4. The model config: `update_from_config(config=...)` (tp divides heads and kv_heads, no tied
     weights under pipelining, the RoPE length, the sequence-parallel sharding), then
     `build()` on the meta device and torchtitan's own `get_nparams_and_flops`.
  5. Pipelines: the schedule class torch's `get_schedule_class` gives for the name (single-stage
     schedules need one stage a rank), torchtitan's stage-to-rank map
     (`_get_pp_rank_to_stage_indices_mapping`) for every pp rank, every exported module name
     looked up in the built model, and torchtitan's `_split_module` on a skeleton with the
     model's module names, which gives each stage's layers, embedding and head.

The batch split is torchtitan's (trainer.py, Trainer.__init__, which needs a GPU to run):
    gradient_accumulation_steps = global_batch_size / (local_batch_size x batch degree)
    pipeline microbatches = local_batch_size / pipeline_parallel_microbatch_size (pp > 1; else 1)
exaplan's micro-batch is torchtitan's pipeline microbatch under pp > 1 (else its local batch),
and exaplan's accumulation is torchtitan's accumulation steps x its pipeline microbatches: the
micro-batches one optimizer step runs on a rank.
"""

from __future__ import annotations

import importlib
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from export.base import Derived, Export
from export.torchtitan import MODULE, VERSION
from planner.schema.errors import PlanError
from planner.schema.plan import Plan

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
SAMPLED_RANKS = 512  # ranks whose torchtitan mesh coordinates are compared with the plan's


def missing() -> str | None:
    try:
        from importlib.metadata import version

        import torchtitan  # noqa: F401
        import triton  # noqa: F401  (torchtitan's models import it unconditionally)
    except ImportError as e:
        return f"torchtitan {VERSION} with triton ({e})"
    found = version("torchtitan")
    return None if found == VERSION else f"torchtitan {VERSION} (found {found})"


@dataclass
class Inspection:
    """What torchtitan's own code makes of an export."""

    derived: Derived
    config: object  # torchtitan's Trainer.Config
    params: int  # parameters of the model torchtitan builds (meta device)
    flops_per_token: int  # torchtitan's own MFU numerator per token
    layers: int
    # Per stage index, in model order: (pp rank, index on that rank, first layer, last layer
    # (exclusive), embedding, head) as torchtitan's pipeline code places and splits them.
    stages: list[tuple[int, int, int, int, bool, bool]] = field(default_factory=list)
    recompute: str = "none"  # the activation checkpointing torchtitan parsed, in exaplan's names
    mesh_checked: bool = False


def check(exported: Export, plan: Plan) -> Derived:
    return inspect(exported, plan).derived


def arguments(exported: Export) -> list[str]:
    """The words of overrides.txt, in order."""
    return [w for line in exported.files["overrides.txt"].splitlines() for w in shlex.split(line, comments=True)]


def parse(exported: Export):
    """torchtitan's Trainer.Config from the exported files (the config module imported from a
    temporary folder, as train.sh's PYTHONPATH imports it)."""
    from torchtitan.config import ConfigManager

    with tempfile.TemporaryDirectory(prefix="exaplan-titan-") as tmp:
        for name, text in exported.files.items():
            (Path(tmp) / name).write_text(text)
        sys.modules.pop(MODULE, None)
        sys.path.insert(0, tmp)
        importlib.invalidate_caches()
        try:
            return ConfigManager().parse_args(arguments(exported))
        except SystemExit as e:
            raise PlanError(f"torchtitan {VERSION}'s ConfigManager refuses the overrides (exit {e.code})", field="to") from e
        except (ValueError, TypeError, AssertionError, ImportError, NotImplementedError) as e:
            raise PlanError(f"torchtitan {VERSION}'s config refuses the overrides: {e}", field="to") from e
        finally:
            sys.path.remove(tmp)
            sys.modules.pop(MODULE, None)


def inspect(exported: Export, plan: Plan) -> Inspection:
    import torch
    from torchtitan.distributed.parallel_dims import ParallelDims

    config = parse(exported)
    par, training = config.parallelism, config.training
    try:
        dims = ParallelDims.from_config(par, plan.world_size)
    except AssertionError as e:
        raise PlanError(f"torchtitan's ParallelDims refuses the degrees: {e}", field="mesh") from e
    batch_degree, mesh_checked = _mesh(dims, plan)
    if batch_degree is None:
        batch_degree = dims.dp_replicate * dims.dp_shard  # the size torchtitan gives its "batch" mesh

    model_config = config.model_spec.model
    try:
        model_config.update_from_config(config=config)
    except (ValueError, NotImplementedError, AssertionError) as e:
        raise PlanError(f"torchtitan's model config refuses the plan: {e}", field="model") from e
    with torch.device("meta"):
        model = model_config.build()
    params, flops = model_config.get_nparams_and_flops(model, training.seq_len)

    stages, vpp = [], 1
    if dims.pp > 1:
        stages, vpp = _pipeline(par, dims.pp, model)
    # torchtitan's batch split (trainer.py)
    global_batch = training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * batch_degree
    if global_batch % (training.local_batch_size * batch_degree):
        raise PlanError(f"torchtitan needs the global batch ({global_batch}) to be a multiple of local_batch_size x "
                        f"dp ({training.local_batch_size} x {batch_degree})", field="job.global_batch")
    accumulation = global_batch // (training.local_batch_size * batch_degree)
    microbatches = training.local_batch_size // par.pipeline_parallel_microbatch_size if dims.pp > 1 else 1
    micro = par.pipeline_parallel_microbatch_size if dims.pp > 1 else training.local_batch_size
    derived = Derived(tp=dims.tp, pp=dims.pp, vpp=vpp, cp=dims.cp, dp=batch_degree, micro_batch=micro,
                      accumulation=accumulation * microbatches, global_batch=global_batch)
    return Inspection(derived=derived, config=config, params=params, flops_per_token=flops, layers=len(model.layers),
                      stages=stages, recompute=_recompute(config.activation_checkpoint), mesh_checked=mesh_checked)


def _recompute(policy) -> str:
    """exaplan's name of torchtitan's activation-checkpointing policy."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if policy is None:
        return "none"
    for cls, name in ((FullAC, "full"), (SelectiveAC, "selective-op")):
        if type(policy) is cls.Config:
            return name
    raise PlanError(f"torchtitan would checkpoint activations with {type(policy).__qualname__}, which no plan "
                    "chooses", field="recompute")


def _mesh(dims, plan: Plan) -> tuple[int | None, bool]:
    """torchtitan's device mesh under torch's fake process group: its data-parallel (batch)
    degree, after checking that sampled ranks sit at the plan's coordinates. (None, False)
    where this process already has a process group."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return None, False
    dist.init_process_group("fake", rank=0, world_size=plan.world_size)
    try:
        dims.build_mesh()
        dense = dims.get_optional_mesh(list(MESH_DIMS), include_singleton_axes=True)
        grid = dense.mesh
        if tuple(grid.shape) != plan.mesh.degrees or tuple(dense.mesh_dim_names) != MESH_DIMS:
            raise PlanError(f"torchtitan's mesh is {dict(zip(dense.mesh_dim_names, grid.shape))}, the plan's "
                            f"{dict(zip(MESH_DIMS, plan.mesh.degrees))}", field="mesh")
        where = torch.argsort(grid.flatten())  # flat position of each rank
        world = plan.world_size
        sample = sorted({round(i * (world - 1) / max(SAMPLED_RANKS - 1, 1)) for i in range(min(SAMPLED_RANKS, world))})
        for rank in sample:
            theirs = dict(zip(MESH_DIMS, (int(c) for c in torch.unravel_index(where[rank], grid.shape))))
            if theirs != plan.coordinates(rank):
                raise PlanError(f"rank {rank} sits at {theirs} in torchtitan's mesh, at {plan.coordinates(rank)} in the "
                                "plan", field="mesh")
        batch = dims.get_optional_mesh("batch")
        return (batch.size() if batch is not None else 1), True
    finally:
        dist.destroy_process_group()


def _pipeline(par, pp: int, model) -> tuple[list[tuple[int, int, int, int, bool, bool]], int]:
    """Each stage as torchtitan's pipeline code places and splits it, and the stages a rank holds."""
    import torch.nn as nn
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping, _split_module

    try:
        schedule = get_schedule_class(par.pipeline_parallel_schedule)
    except ValueError as e:
        raise PlanError(str(e), field="pipeline.schedule") from e
    parts = par.module_fqns_per_model_part
    if not parts:
        raise PlanError("the overrides name no module_fqns_per_model_part", field="pipeline.stages")
    for names in parts:
        for name in names:
            try:
                model.get_submodule(name)
            except AttributeError as e:
                raise PlanError(f"torchtitan's model has no module {name!r}", field="pipeline.stages") from e
    if len(parts) % pp:
        raise PlanError(f"{len(parts)} model parts over pp {pp}", field="pipeline.stages")
    vpp = len(parts) // pp
    if issubclass(schedule, PipelineScheduleSingle) and vpp != 1:
        raise PlanError(f"{par.pipeline_parallel_schedule} runs one stage a rank, the overrides give {vpp}",
                        field="pipeline.virtual_stages")
    placed = {}
    for rank in range(pp):
        for index, stage in enumerate(_get_pp_rank_to_stage_indices_mapping(rank, pp, par.pipeline_parallel_schedule,
                                                                             len(parts))):
            placed[stage] = (rank, index)
    # The split is by module name only: a skeleton with the model's names splits as the model.
    skeleton = nn.Module()
    for name, child in model.named_children():
        if name == "layers":
            skeleton.layers = nn.ModuleDict({key: nn.Identity() for key in child.keys()})
        else:
            skeleton.add_module(name, nn.Identity() if child is not None else None)
    stages = []
    for i, names in enumerate(parts):
        chunk = _split_module(skeleton, names)
        layers = sorted(int(k) for k in chunk.layers.keys())
        if layers and layers != list(range(layers[0], layers[-1] + 1)):
            raise PlanError(f"stage {i} holds layers {layers}, not a contiguous range", field=f"pipeline.stages[{i}]")
        first, last = (layers[0], layers[-1] + 1) if layers else (None, None)
        stages.append((*placed[i], first, last, chunk.tok_embeddings is not None,
                       chunk.lm_head is not None and chunk.norm is not None))
    return stages, vpp
