"""The DistributedDataParallel path of sharding kind none (issue 14): what the handle wraps,
how (bucket, static graph only without accumulation), bf16 under autocast with fp32 weights
and gradients, and a forward that bypasses DDP refused instead of silently skipping the
gradient all-reduce. (Losses equal to one process: test_parallel.py, test_every_layout.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dist_helpers import run_on_ranks  # noqa: E402
from test_parallel import layout, make_plan  # noqa: E402


def _probe(rank: int, world: int, lay: dict, precision: str) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from runtime.mesh import build_mesh
    from runtime.model import loss_fn
    from runtime.build import build_model

    plan = make_plan(lay)
    plan = plan.model_copy(update={"job": plan.job.model_copy(update={"precision": precision})})
    mesh = build_mesh(plan, "cpu")
    parts, handles = build_model(plan, mesh, torch.device("cpu"), seed=0)
    h = handles[0]
    h.build_optimizer(lr=1e-3)
    out = {"ddp": isinstance(h.ddp, DistributedDataParallel), "static": bool(h.ddp and h.ddp.static_graph),
           "bucket_mb": h.bucket_mb}
    x = torch.randint(5, 31, (2, plan.job.seq_len + 1), generator=torch.Generator().manual_seed(rank))
    logits = h.forward(x[:, :-1])
    out["logits_dtype"] = str(logits.dtype)
    loss_fn(logits, x[:, 1:]).backward()
    from torch.distributed.tensor import DTensor

    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in parts[0].parameters()]
    grads = torch.cat([g.reshape(-1).float() for g in local])
    everyone = [torch.zeros_like(grads) for _ in range(world)]
    dist.all_gather(everyone, grads)
    out["grads_equal"] = all(torch.equal(everyone[0], g) for g in everyone)  # averaged by the all-reduce
    out["param_dtypes"] = sorted({str(p.dtype) for p in parts[0].parameters()})
    out["grad_dtypes"] = sorted({str(p.grad.dtype) for p in parts[0].parameters()})
    try:
        loss_fn(parts[0](x[:, :-1]), x[:, 1:])
        out["bypass"] = "allowed"
    except RuntimeError as e:
        out["bypass"] = str(e)
    with torch.no_grad():
        parts[0](x[:, :-1])  # evaluation without gradients may bypass it
    return out


def test_ddp_wraps_plain_replication_in_fp32_and_refuses_a_bypass():
    lay = layout("ddp", 2, "none", dp_replicate=2, bucket_mb=1.0)
    r = run_on_ranks(_probe, 2, lay, "fp32", timeout_s=100)
    for o in r:
        assert o["ddp"] and o["static"] and o["bucket_mb"] == 1.0
        assert o["logits_dtype"] == "torch.float32" and o["grads_equal"]
        assert "handle.forward" in o["bypass"]


def test_ddp_with_accumulation_has_no_static_graph_and_bf16_runs_under_autocast():
    lay = layout("ddp-gas2", 2, "none", dp_replicate=2, gas=2)
    r = run_on_ranks(_probe, 2, lay, "bf16", timeout_s=100)
    for o in r:
        assert o["ddp"] and not o["static"]
        assert o["logits_dtype"] == "torch.bfloat16"  # computed in bf16 ...
        assert o["param_dtypes"] == ["torch.float32"] == o["grad_dtypes"]  # ... on fp32 weights and gradients
        assert o["grads_equal"]


def test_replicate_is_kept_where_the_plan_says_so():
    lay = layout("replicate", 2, "none", dp_replicate=2, ddp_impl="replicate")
    r = run_on_ranks(_probe, 2, lay, "fp32", timeout_s=100)
    for o in r:
        assert not o["ddp"] and o["grads_equal"] and o["bypass"] == "allowed"


@pytest.mark.parametrize("lay", [layout("one-rank", 1, "none"), layout("zero1", 2, "zero1")], ids=lambda d: d["name"])
def test_bf16_plans_without_a_precision_policy_compute_under_autocast(lay):
    """A dp size of 1 (one GPU) and ZeRO apply no mixed-precision policy: a bf16 plan must still
    compute in bf16 (autocast in handle.forward), on fp32 weights and gradients; it ran in fp32
    before."""
    r = run_on_ranks(_probe, lay["world"], lay, "bf16", timeout_s=100)
    for o in r:
        assert not o["ddp"]
        assert o["logits_dtype"] == "torch.bfloat16"
        assert o["param_dtypes"] == ["torch.float32"] == o["grad_dtypes"]  # (ZeRO reduces the gradients at the step)
