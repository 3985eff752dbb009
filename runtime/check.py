"""One rank of a plan at its full size, on this machine: torch's fake process group plays rank R
of the plan's whole world (collectives return without traffic), the plan's real device mesh is
built, and the model is parallelised on the meta device by the runtime's own code in its own
order (runtime/build.py parallel_parts, the steps `exaplan run` takes). What the rank then holds
is compared with what the planner counts for it.

What is checked: the mesh builds at the plan's world size; every apply_* step runs for this
rank's pipeline chunks; the parameters the rank holds (its local shards, DTensor.to_local)
against the planner's count for its stage (planner/cost/memory.py rank_parameters: its blocks,
embedding and head, / tp, / the shard group where the parameters are sharded). What is not
checked yet: a training step under fake tensors and torch's memory accounting by category.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from planner.schema.errors import PlanError
from planner.schema.plan import Plan

GIB = 2**30
# The runtime pads uneven shards (FSDP2 rounds each dim-0 shard up) and keeps some small
# tensors replicated; a rank's count may exceed the planner's by this much and still agree.
PARAMETER_TOLERANCE = 0.03


@dataclass
class RankCheck:
    rank: int
    pp_rank: int
    parameters: int  # elements this rank holds (local shards)
    predicted_parameters: int  # the planner's count for the same rank
    parameter_error: float  # parameters / predicted - 1
    agrees: bool
    seconds: float

    def as_json(self) -> dict:
        return asdict(self)


def ranks_of(plan: Plan, spec: str) -> list[int]:
    """The ranks a --ranks value names: first, last, stages (the first rank of each pipeline
    stage), or integers; PlanError naming --ranks for anything else or a rank outside the world."""
    world = plan.world_size
    per_stage = world // plan.mesh.pp
    out: list[int] = []
    for item in (part.strip() for part in spec.split(",")):
        if item == "first":
            out.append(0)
        elif item == "last":
            out.append(world - 1)
        elif item == "stages":
            out.extend(stage * per_stage for stage in range(plan.mesh.pp))
        else:
            try:
                rank = int(item)
            except ValueError:
                raise PlanError(f"{item!r} is not a rank: give first, last, stages or rank numbers", field="ranks") from None
            if not 0 <= rank < world:
                raise PlanError(f"rank {rank} is outside the plan's world of {world:,} ranks (0-{world - 1})", field="ranks")
            out.append(rank)
    return list(dict.fromkeys(out))


def check_rank(plan: Plan, rank: int, predicted_parameters) -> RankCheck:
    """Build rank `rank` of the plan under a fake process group of its full world size;
    `predicted_parameters(plan, pp_rank)`: the planner's count (planner/cost/memory.py
    rank_parameters; the runtime takes only the schema from the planner)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from runtime.build import parallel_parts
    from runtime.mesh import build_mesh

    if dist.is_initialized():
        raise RuntimeError("a process group is running already: exaplan check starts its own fake one")
    start = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.world_size)
    try:
        mesh = build_mesh(plan, "cpu")
        pp_rank = mesh["pp"].get_local_rank()
        parts, _ = parallel_parts(plan, mesh)
        held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel()
                   for part in parts for p in part.parameters())
    finally:
        dist.destroy_process_group()
    predicted = predicted_parameters(plan, pp_rank)
    error = held / predicted - 1
    return RankCheck(rank=rank, pp_rank=pp_rank, parameters=held, predicted_parameters=predicted,
                     parameter_error=error, agrees=-PARAMETER_TOLERANCE <= error <= PARAMETER_TOLERANCE,
                     seconds=time.perf_counter() - start)
