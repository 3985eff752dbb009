"""The device mesh of a plan: one named axis per plan axis, plus the flattened axes that
data parallelism and context parallelism reduce over.

Axes (outermost first): pp, dp_replicate, dp_shard, cp, tp, as in the plan; a rank's mesh
coordinates are row-major over them, exactly as planner.schema.plan.Plan.coordinates says.
Flattened: "dp" = dp_replicate x dp_shard (data loading), "dp_shard_cp" = dp_shard x cp
(what FSDP and ZeRO shard over), "dp_cp" = dp_replicate x dp_shard x cp (where gradients
are reduced).
"""

from __future__ import annotations

import warnings

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from planner.schema.plan import MESH_AXES, Plan


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """The world mesh; checks the plan's degrees against the running world size."""
    import torch.distributed as dist

    world = dist.get_world_size()
    if plan.mesh.world_size != world:
        raise RuntimeError(f"the plan's mesh has {plan.mesh.world_size} ranks but {world} are running")
    # torch 2.13 announces that slicing flattened axes from the root mesh (mesh["dp_cp"])
    # will change in a later release; the runtime slices them that way throughout, so the
    # notice is silenced here rather than printed by every rank at every slice.
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    mesh = init_device_mesh(device_type, plan.mesh.degrees, mesh_dim_names=MESH_AXES)
    mesh["dp_replicate", "dp_shard"]._flatten("dp")
    mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    return mesh
