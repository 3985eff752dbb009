"""A plan's layout as a jax.sharding.Mesh and one table of logical-axis rules.

The mesh has the plan's data and tensor axes, in the plan's rank order (tp fastest):
("dp_replicate", "dp_shard", "tp"). The model (jaxrt/model.py) names the axes of every
parameter and activation logically; `rules_for(plan)` maps each logical axis to mesh axes.
A sharding strategy *is* one such table:

    logical axis          none   zero1/2   fsdp / fsdp-grad-op / hsdp    tp        tp + sp
    batch                 dp     dp        dp                            -         -
    heads, kv_heads, mlp  -      -         -                             tp        tp
    vocab (embedding,     -      -         -                             tp        tp
      head)
    embed, norm (params)  -      -         dp_shard                      -         -
    embed, norm (AdamW    -      dp_shard  dp_shard                      -         -
      moments, zero2's
      gradients)
    act_heads, act_mlp    -      -         -                             tp        tp
    act_seq (residual     -      -         -                             -         tp
      stream)

(dp = ("dp_replicate", "dp_shard"); hsdp shards over dp_shard and replicates over
dp_replicate.) A mesh axis of one device is dropped, and so is one that does not divide
the dimension it would split (the protein vocabulary of 31 over tp = 2): that dimension is
replicated, which is always correct. XLA's SPMD partitioner then inserts the collectives:
all-reduces of replicated gradients, reduce-scatters where gradients are sharded, all-
gathers of sharded parameters at their use, tensor-parallel all-reduces (all-gathers and
reduce-scatters onto the sequence under sequence parallelism).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from planner.schema.errors import PlanError
from planner.schema.plan import Plan
from planner.schema.specs import Sharding

MESH_AXES = ("dp_replicate", "dp_shard", "tp")
DATA = ("dp_replicate", "dp_shard")
SHARDED_PARAMS = (Sharding.fsdp, Sharding.fsdp_grad_op, Sharding.hsdp)
SHARDED_OPTIMIZER = (Sharding.zero1, Sharding.zero2, *SHARDED_PARAMS)

Rules = dict[str, tuple[str, ...]]


def rules_for(plan: Plan, what: str = "params") -> Rules:
    """The logical -> mesh axes table of the plan's strategy (module doc). `what`: "params"
    (parameters and activations) or "optimizer" (AdamW's moments; zero2's gradients)."""
    kind = plan.sharding.kind
    tp = ("tp",)
    rules: Rules = {
        "batch": DATA,
        "heads": tp, "kv_heads": tp, "mlp": tp, "vocab": tp,
        "act_heads": tp, "act_kv_heads": tp, "act_mlp": tp, "act_vocab": tp,
    }
    if plan.sequence_parallel:
        rules["act_seq"] = tp
    shard_data = kind in SHARDED_PARAMS or (what == "optimizer" and kind in SHARDED_OPTIMIZER)
    if shard_data:
        rules["embed"] = ("dp_shard",)
        rules["norm"] = ("dp_shard",)
    return rules


def build_mesh(plan: Plan, devices=None) -> Mesh:
    """The plan's mesh over `devices` (default: every device of the job, in process order:
    rank r is device r, so tp ranks are neighbours as the plan places them)."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) != plan.world_size:
        raise PlanError(f"the plan needs {plan.world_size} devices; JAX sees {len(devices)} "
                        f"({devices[0].platform})", field="world size")
    shape = (plan.mesh.dp_replicate, plan.mesh.dp_shard, plan.mesh.tp)
    return Mesh(np.array(devices, dtype=object).reshape(shape), MESH_AXES)


def spec_for(names: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh, rules: Rules) -> PartitionSpec:
    """The PartitionSpec of an array with logical axis `names`: each name's mesh axes, minus
    axes of one device, axes already used by an earlier dimension, and axes that do not
    divide the dimension (replicated instead: always correct)."""
    used: set[str] = set()
    out = []
    for name, size in zip(names, shape):
        axes = []
        for axis in rules.get(name, ()) if name else ():
            n = mesh.shape[axis]
            if n == 1 or axis in used:
                continue
            if size % (math.prod(mesh.shape[a] for a in axes) * n):
                continue
            axes.append(axis)
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*out)


def tree_shardings(logical_specs, shapes, mesh: Mesh, rules: Rules):
    """NamedShardings for a tree of logical PartitionSpecs (flax's get_partition_spec) and
    the matching tree of shapes."""
    return jax.tree.map(lambda names, s: NamedSharding(mesh, spec_for(tuple(names), tuple(s.shape), mesh, rules)),
                        logical_specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))


# ---------------------------------------------------------------------- activation constraints

_ACTIVE: list[tuple[Mesh, Rules] | None] = []


@contextlib.contextmanager
def activate(mesh: Mesh | None, rules: Rules | None) -> Iterator[None]:
    """While tracing under this context, `constrain` pins activations to the rules' layout
    (mesh None: `constrain` does nothing, as inside a shard_map over the data axes)."""
    _ACTIVE.append(None if mesh is None else (mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.pop()


def constrain(x, names: tuple[str | None, ...]):
    """x with its layout pinned to the logical `names` (a no-op outside `activate`: one
    device, or FLOP counting)."""
    if not _ACTIVE or _ACTIVE[-1] is None:
        return x
    mesh, rules = _ACTIVE[-1]
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec_for(names, x.shape, mesh, rules)))
