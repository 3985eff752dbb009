"""Every layout the planner can emit for a small job on 2 ranks runs in the runtime, and all of
them train to the same losses (the single-process numbers, within fp32 noise).

The planner's legal space for a 4-layer model on 2 CPU ranks (global batch 4, sequence 32):
every sharding, pipeline schedule, tensor/sequence/context parallelism, recompute level and
micro-batch split. The fast set takes one layout of each kind; the slow set takes them all.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from machine_models import load_machine  # noqa: E402
from planner.cost.layout import RECOMPUTES, SCHEDULES, SHARDINGS  # noqa: E402
from planner.cost.step import evaluate  # noqa: E402
from planner.emit import build_plan  # noqa: E402
from planner.inputs import make_job  # noqa: E402
from planner.search.space import enumerate_space  # noqa: E402
from planner.schema.specs import ModelSpec  # noqa: E402
from dist_helpers import run_on_ranks  # noqa: E402

SPEC = ModelSpec(name="tiny4", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab_size=32, seq_len=32)
GLOBAL_BATCH, SEQ, STEPS = 4, 32, 2


def all_plans() -> list:
    machine = load_machine("local", ranks=2)
    job = make_job(SPEC, machine, 2, GLOBAL_BATCH, SEQ, "fp32", None)
    lay = enumerate_space(SPEC, job, 2).layouts()
    ev = evaluate(SPEC, machine, job, lay)
    return [build_plan(SPEC, machine, job, 1, lay, ev, i, command="test") for i in range(len(lay))]


def kind_of(plan) -> tuple:
    m = plan.mesh
    return (plan.sharding.kind.value, m.pp > 1, plan.pipeline.virtual_stages > 1, m.tp > 1, plan.sequence_parallel,
            m.cp > 1, plan.recompute.value, plan.grad_accumulation_steps > 1)


def one_of_each_kind(plans) -> list:
    seen, out = set(), []
    for p in plans:
        if kind_of(p) not in seen:
            seen.add(kind_of(p))
            out.append(p)
    return out


def _train(rank: int, world_size: int, plan_json_list: list[str]) -> list[list[float]]:
    """On each rank: build every plan's model and train STEPS steps on the same fixed batch."""
    import torch.distributed as dist

    from planner.schema.plan import Plan
    from runtime.mesh import build_mesh
    from runtime.model import loss_fn
    from runtime.parallel import clip_grad_norm_
    from runtime.parallel.context import shard_sequence
    from runtime.build import build_model

    tokens = torch.randint(5, 31, (GLOBAL_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    results = []
    for text in plan_json_list:
        plan = Plan.model_validate_json(text)
        mesh = build_mesh(plan, "cpu")
        parts, handles = build_model(plan, mesh, torch.device("cpu"), seed=0)
        opts = [h.build_optimizer(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0) for h in handles]
        dp_rank, mbs, gas = mesh["dp"].get_local_rank(), plan.micro_batch_size, plan.grad_accumulation_steps
        rows = tokens[dp_rank * mbs * gas:(dp_rank + 1) * mbs * gas]
        cp_rank, cp = mesh["cp"].get_local_rank(), mesh["cp"].size()
        runner = None
        if plan.mesh.pp > 1:
            from runtime.parallel.pipeline import build_schedule

            runner = build_schedule(parts, plan, mesh["pp"], torch.device("cpu"), gas, loss_fn, (mbs, SEQ // cp))
        losses = []
        for _ in range(STEPS):
            if runner is not None:
                x, y = shard_sequence(rows, cp_rank, cp)
                loss = float(runner.step(x, y))
            else:
                loss = 0.0
                for i in range(gas):
                    x, y = shard_sequence(rows[i * mbs:(i + 1) * mbs], cp_rank, cp)
                    ctx = handles[0].no_sync() if i < gas - 1 else _Null()
                    with ctx:
                        part_loss = loss_fn(handles[0].forward(x), y) / gas
                        part_loss.backward()
                    loss += float(part_loss.detach())
            clip_grad_norm_(handles, 1.0)
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)
            t = torch.tensor([loss])
            dist.all_reduce(t, group=mesh["dp_cp"].get_group())
            losses.append(float(t) / mesh["dp_cp"].size())
        results.append(losses)
        del parts, handles, opts, runner
    return results


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _reference() -> list[float]:
    """The same STEPS steps in one process, no parallelism."""
    from runtime.model import ProteinLM, init_weights, loss_fn

    torch.manual_seed(0)
    tokens = torch.randint(5, 31, (GLOBAL_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    model = ProteinLM(SPEC)
    init_weights(model, SPEC, 0)
    model.setup_rope()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0, foreach=False)
    out = []
    for _ in range(STEPS):
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(float(loss.detach()))
    return out


def _check(plans):
    ref = _reference()
    got = run_on_ranks(_train, 2, [p.model_dump_json() for p in plans], timeout_s=900)[0]
    for plan, losses in zip(plans, got):
        label = (f"pp{plan.mesh.pp} dpr{plan.mesh.dp_replicate} dps{plan.mesh.dp_shard} cp{plan.mesh.cp} tp{plan.mesh.tp} "
                 f"sp{int(plan.sequence_parallel)} {plan.sharding.kind.value} {plan.pipeline.schedule} v{plan.pipeline.virtual_stages} "
                 f"mbs{plan.micro_batch_size} gas{plan.grad_accumulation_steps} rc {plan.recompute.value}")
        assert all(math.isfinite(x) for x in losses), label
        # fp32 everywhere; micro-batch splits and reduction orders change the sums: 1e-4.
        assert losses == pytest.approx(ref, rel=1e-4), label


def test_space_covers_every_kind():
    plans = all_plans()
    kinds = {kind_of(p) for p in plans}
    shardings = {k[0] for k in kinds}
    assert shardings == {s.value for s in SHARDINGS} - {"hsdp"}  # hsdp needs dp >= 4
    assert any(k[1] for k in kinds) and any(k[2] for k in kinds) and any(k[3] for k in kinds)
    assert any(k[4] for k in kinds) and any(k[5] for k in kinds)
    assert {p.pipeline.schedule for p in plans} == set(SCHEDULES)
    assert {k[6] for k in kinds} == {r.value for r in RECOMPUTES}


@pytest.mark.timeout(900)
def test_one_layout_of_each_kind_runs_and_matches_one_process():
    plans = one_of_each_kind(all_plans())
    _check(plans[::3])  # a third of the kinds (the slow test runs them all)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_layout_runs_and_matches_one_process():
    _check(all_plans())
