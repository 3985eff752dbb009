"""Large worlds without hardware: protein-3.5b parallelised on the meta device under torch's
fake process group, as rank 3 of 512 (tp 8 x fsdp 64) and of 64 (pp 4 x hsdp 2x4 x tp 2).
Checks the mesh, the sharding of each weight and the parameters a rank holds against the
planner's accounting."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from machine_models import load_machine  # noqa: E402
from planner.cost.flops import layer_params  # noqa: E402
from planner.cost.layout import Layouts  # noqa: E402
from planner.cost.memory import stage_params  # noqa: E402
from planner.cost.step import evaluate  # noqa: E402
from planner.emit import build_plan  # noqa: E402
from planner.inputs import make_job  # noqa: E402
from planner.presets import get_model  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model import ProteinLM  # noqa: E402
from runtime.parallel import apply_data_parallel, apply_recompute, apply_tp  # noqa: E402
from runtime.parallel.pipeline import split_model  # noqa: E402

CASES = {
    "tp8-fsdp64": dict(nodes=64, global_batch=1024, lay=dict(pp=1, dp_replicate=1, dp_shard=64, cp=1, tp=8, mbs=2, gas=8,
                                                            vpp=1, schedule=0, sharding=3, recompute=1, sp=1)),
    "pp4-hsdp2x4-tp2": dict(nodes=8, global_batch=256, lay=dict(pp=4, dp_replicate=2, dp_shard=4, cp=1, tp=2, mbs=2, gas=16,
                                                               vpp=1, schedule=2, sharding=5, recompute=2, sp=0)),
}


@pytest.fixture
def fake_world():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(CASES))
def test_large_world_on_meta(name, fake_world):
    case = CASES[name]
    model, machine = get_model("protein-3.5b"), load_machine("dgx-h100")
    world = case["nodes"] * machine.devices_per_node
    job = make_job(model, machine, world, case["global_batch"], None, "bf16", None)
    lay = Layouts(**case["lay"])
    plan = build_plan(model, machine, job, case["nodes"], lay, evaluate(model, machine, job, lay), 0, command="test")
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=world)
    mesh = build_mesh(plan, "cpu")
    assert mesh.shape == plan.mesh.degrees
    assert mesh["dp_shard_cp"].size() == plan.mesh.dp_shard * plan.mesh.cp
    with torch.device("meta"):
        full = ProteinLM(model)
    parts = split_model(full, plan, mesh["pp"].get_local_rank()) if plan.mesh.pp > 1 else [full]
    for part in parts:
        apply_tp(part, mesh["tp"], plan.sequence_parallel)
        apply_recompute(part, plan.recompute)
        apply_data_parallel(part, mesh, plan)
    held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for part in parts for p in part.parameters())
    # The planner: this stage's parameters / (tp x shard group); the runtime pads uneven shards
    # and keeps norms replicated, so allow 3%.
    expected = float(stage_params(model, lay)[0]) / plan.mesh.tp / (plan.mesh.dp_shard * plan.mesh.cp)
    if plan.mesh.pp > 1:  # rank 3 sits on pp rank 0: its blocks and the embedding, not the head
        stage = plan.pipeline.stages[mesh["pp"].get_local_rank()]
        blocks = stage.last_layer - stage.first_layer
        expected = (blocks * layer_params(model) + model.vocab_size * model.hidden) / plan.mesh.tp / plan.mesh.dp_shard
    assert held == pytest.approx(expected, rel=0.03)
    wq = parts[0].layers[str(plan.pipeline.stages[0].first_layer) if plan.pipeline.stages else "0"].attention.wq.weight
    assert isinstance(wq, DTensor) and wq.device.type == "meta"
    assert tuple(wq.shape) == (model.hidden, model.hidden)  # global shape kept
    assert wq.to_local().numel() == pytest.approx(model.hidden * model.hidden / plan.mesh.tp / plan.mesh.dp_shard, rel=0.01)
