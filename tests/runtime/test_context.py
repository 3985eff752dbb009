"""Context parallelism (runtime/parallel/context.py) against one process.

The same recipe, model specs, data, reference and tolerances as tests/runtime/test_parallel.py: from
one seed, a tiny protein LM (2 layers, hidden 64, 4 heads, 2 kv heads, seq 32) trains three
AdamW steps with clipping active; the losses and gradient norms of every step and the final
parameters under each layout must equal those of one process running the whole model on the
whole global batch. Each rank takes its data-parallel rows of the global batch, cuts them into
the layout's micro-batches and keeps its cp slice of every micro-batch (shard_sequence); the
model is built by the trainer's own build_model (apply_tp, apply_cp, apply_recompute,
apply_data_parallel on the meta device, then to_empty, init_weights, setup_rope), then
build_optimizer (and build_schedule with (mbs, seq / cp) under pipeline parallelism).

Fast set: the sequence helpers and the masked attention core (one process), and cp 2 alone
(one spawn of 2 ranks). Slow: the other 2-rank layouts (FSDP sharded over cp, ZeRO-2 with
accumulation, GPT-style learned positions, recompute) and the 4-rank ones (cp x FSDP,
cp x TP with and without sequence parallelism, cp x DDP, pp x cp).
"""

from __future__ import annotations

import contextlib
import traceback

import pytest
import torch
import torch.nn.functional as F

from dist_helpers import run_on_ranks
from planner.schema.plan import Plan
from runtime.model import canonical_name, loss_fn
from runtime.parallel.context import load_balanced_positions, local_causal_attention, shard_sequence
from test_parallel import (BETAS, CLIP, LOSS_RTOL, LR, NORM_RTOL, PARAM_MAX_ATOL, PARAM_RMS_ATOL,
                           SEED, SPECS, WEIGHT_DECAY, global_batches, reference)
from test_parallel import _cases
from test_parallel import make_plan as _parallel_plan

# --------------------------------------------------------------------------------------------
# One process: the sequence split and the attention core
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_shard_sequence_reassembles_the_sequence(cp):
    seq = 32
    batch = torch.randint(5, 31, (3, seq + 1), generator=torch.Generator().manual_seed(0))
    inputs, targets = torch.zeros_like(batch[:, :-1]), torch.zeros_like(batch[:, 1:])
    every = []
    c = seq // (2 * cp)
    for r in range(cp):
        x, y = shard_sequence(batch, r, cp)
        pos = load_balanced_positions(seq, r, cp)
        assert x.shape == y.shape == (3, seq // cp) and pos.shape == (seq // cp,)
        # chunk r, then chunk 2cp-1-r
        assert pos.tolist() == list(range(r * c, (r + 1) * c)) + list(range((2 * cp - 1 - r) * c, (2 * cp - r) * c))
        inputs[:, pos], targets[:, pos] = x, y
        every += pos.tolist()
    assert sorted(every) == list(range(seq))  # each position on exactly one rank
    assert torch.equal(inputs, batch[:, :-1]) and torch.equal(targets, batch[:, 1:])


def test_shard_sequence_balances_causal_work():
    seq, cp = 64, 4
    work = [int((load_balanced_positions(seq, r, cp) + 1).sum()) for r in range(cp)]  # keys seen per query
    assert len(set(work)) == 1


def test_sequence_not_divisible_by_2cp_is_refused():
    with pytest.raises(ValueError, match="must divide"):
        shard_sequence(torch.zeros(1, 31, dtype=torch.long), 0, 4)  # seq 30, 2cp = 8


@pytest.mark.parametrize("repeat_kv", [False, True], ids=["enable_gqa", "repeat_kv"])
@pytest.mark.parametrize("cp", [2, 4])
def test_masked_local_attention_equals_causal_rows(cp, repeat_kv):
    """Local queries against all keys with the explicit mask give the rows of full causal
    attention at those queries' positions (GQA: 4 query heads, 2 kv heads)."""
    g = torch.Generator().manual_seed(1)
    b, hq, hkv, seq, d = 2, 4, 2, 32, 16
    q, k, v = (torch.randn(b, h, seq, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    for r in range(cp):
        pos = load_balanced_positions(seq, r, cp)
        out = local_causal_attention(q[:, :, pos], k, v, pos, repeat_kv=repeat_kv)
        torch.testing.assert_close(out, full[:, :, pos], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Ranks
# --------------------------------------------------------------------------------------------


def layout(name: str, world: int, cp: int = 2, kind: str = "none", tp: int = 1, pp: int = 1, dp_replicate: int = 1,
           gas: int = 1, sp: bool = False, recompute: str = "none", spec: str = "llama",
           schedule: str = "1f1b") -> dict:
    dp = world // (pp * cp * tp)
    return dict(name=name, world=world, cp=cp, kind=kind, tp=tp, pp=pp, dp_replicate=dp_replicate,
                dp_shard=dp // dp_replicate, gas=gas, sp=sp, recompute=recompute, spec=spec, schedule=schedule)


FAST_2 = [layout("cp2", 2)]
SLOW_2 = [
    layout("cp2-fsdp", 2, kind="fsdp"),  # FSDP shards over dp_shard x cp = 2 ranks
    layout("cp2-zero2-gas2", 2, kind="zero2", gas=2),
    layout("cp2-gpt", 2, spec="gpt"),  # learned positions at global positions, multi-head
    layout("cp2-recompute-full", 2, recompute="full"),  # the gather runs again in backward
    layout("cp2-recompute-selective", 2, recompute="selective"),
]
SLOW_4 = [
    [
        layout("cp2-fsdp2", 4, kind="fsdp"),  # dp_shard 2 x cp 2
        layout("cp2-tp2", 4, tp=2),
        layout("cp2-tp2-sp", 4, tp=2, sp=True),
    ],
    [
        layout("cp2-ddp2-gas2", 4, dp_replicate=2, gas=2),
        layout("pp2-cp2", 4, pp=2, gas=2),  # stages pass [mbs, seq / cp, hidden]
    ],
]


def make_plan(lay: dict) -> Plan:
    """test_parallel's plan for the tiny model, with the cp (and pp) degree of `lay`."""
    base = _parallel_plan({**lay, "world": lay["tp"] * lay["dp_replicate"] * lay["dp_shard"], "bucket_mb": 25.0})
    d = base.model_dump(mode="json")
    world, pp = lay["world"], lay["pp"]
    d["machine"] = {**d["machine"], "devices_per_node": world}
    d["ranks_per_node"] = world
    d["mesh"] = {**d["mesh"], "pp": pp, "cp": lay["cp"]}
    if pp > 1 and d["sharding"]["ddp_impl"] == "ddp":  # the planner's choice: pipeline stages replicate
        d["sharding"]["ddp_impl"] = "replicate"
    if pp > 1:
        layers = SPECS[lay["spec"]].layers
        ranges = [(i * layers // pp, (i + 1) * layers // pp) for i in range(pp)]
        d["pipeline"] = {"schedule": lay["schedule"], "virtual_stages": 1, "stages": [
            {"pp_rank": i, "virtual_index": 0, "first_layer": a, "last_layer": b, "embedding": i == 0,
             "head": i == pp - 1} for i, (a, b) in enumerate(ranges)]}
    return Plan.model_validate(d)


def _train(lay: dict) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from runtime.mesh import build_mesh
    from runtime.parallel import clip_grad_norm_
    from runtime.parallel.pipeline import build_schedule
    from runtime.build import build_model

    plan = make_plan(lay)
    spec = plan.model
    mesh = build_mesh(plan, "cpu")
    parts, handles = build_model(plan, mesh, torch.device("cpu"), SEED)  # the trainer's steps 3-6
    opts = [h.build_optimizer(lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY) for h in handles]

    dp_rank, dp = mesh["dp"].get_local_rank(), mesh["dp"].size()
    cp_rank, cp = mesh["cp"].get_local_rank(), mesh["cp"].size()
    gas, mbs, seq = plan.grad_accumulation_steps, plan.micro_batch_size, plan.job.seq_len
    runner = None
    if plan.mesh.pp > 1:
        runner = build_schedule(parts, plan, mesh["pp"], "cpu", gas, loss_fn, (mbs, seq // cp))
    losses, norms = [], []
    for tokens, targets in global_batches(spec):
        batch = torch.cat((tokens, targets[:, -1:]), dim=1)  # [global batch, seq + 1]
        batch = batch[dp_rank * mbs * gas:(dp_rank + 1) * mbs * gas]
        if runner is not None:
            total = float(runner.step(*shard_sequence(batch, cp_rank, cp)))
        else:
            total = 0.0
            for i in range(gas):
                inputs, targets_ = shard_sequence(batch[i * mbs:(i + 1) * mbs], cp_rank, cp)
                ctx = handles[0].no_sync() if i < gas - 1 else contextlib.nullcontext()
                with ctx:
                    loss = loss_fn(handles[0].forward(inputs), targets_) / gas
                    loss.backward()
                total += float(loss.detach())
        norms.append(float(clip_grad_norm_(handles, CLIP)))
        for opt in opts:
            opt.step()
            opt.zero_grad()
        t = torch.tensor([total])
        dist.all_reduce(t, group=mesh["dp_cp"].get_group())
        losses.append(float(t) / mesh["dp_cp"].size())

    params = {}
    for part in parts:
        for name, p in part.named_parameters():
            params[canonical_name(name)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
    return {"losses": losses, "norms": norms, "params": params}


def _run_layouts(rank: int, world: int, layouts: list[dict], refs: dict) -> dict:
    out = {}
    for lay in layouts:
        try:
            r = _train(lay)
            ref = refs[lay["spec"]]["params"]
            params = r.pop("params")
            diffs = [(p - ref[n]).double() for n, p in params.items()]
            r["names"] = sorted(params)
            r["max_err"] = max(float(d.abs().max()) for d in diffs)
            r["rms_err"] = max(float(d.pow(2).mean().sqrt()) for d in diffs)
            out[lay["name"]] = r
        except Exception:  # symmetric failures (the same on every rank) leave the others runnable
            out[lay["name"]] = {"error": traceback.format_exc()}
    return out


def _params_only(ref: dict) -> dict:
    return {"params": ref["params"]}


@pytest.fixture(scope="module")
def refs() -> dict:
    return {k: reference(k) for k in SPECS}


@pytest.fixture(scope="module")
def group_results(refs):
    cache: dict[int, dict] = {}

    def get(group: list[dict]) -> dict:
        if id(group) not in cache:
            per_rank = run_on_ranks(_run_layouts, group[0]["world"], group,
                                    {k: _params_only(refs[k]) for k in {lay["spec"] for lay in group}},
                                    timeout_s=150)
            cache[id(group)] = {lay["name"]: [r[lay["name"]] for r in per_rank] for lay in group}
        return cache[id(group)]

    return get


def _check(results: dict, lay: dict, refs: dict) -> None:
    ref = refs[lay["spec"]]
    for rank, r in enumerate(results[lay["name"]]):
        assert "error" not in r, f"{lay['name']} rank {rank}:\n{r.get('error')}"
    # every parameter, under its single-process name, on some rank (pipeline: split over pp)
    assert set().union(*(r["names"] for r in results[lay["name"]])) == set(ref["params"])
    for rank, r in enumerate(results[lay["name"]]):
        assert r["losses"] == pytest.approx(ref["losses"], rel=LOSS_RTOL), f"{lay['name']} rank {rank}: losses"
        assert r["norms"] == pytest.approx(ref["norms"], rel=NORM_RTOL), f"{lay['name']} rank {rank}: grad norms"
        assert r["rms_err"] < PARAM_RMS_ATOL, f"{lay['name']} rank {rank}: parameters differ (rms {r['rms_err']:.2e})"
        assert r["max_err"] < PARAM_MAX_ATOL, f"{lay['name']} rank {rank}: a parameter differs by {r['max_err']:.2e}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("group, lay", _cases([FAST_2]) + _cases([SLOW_2], pytest.mark.slow))
def test_two_ranks(group, lay, group_results, refs):
    _check(group_results(group), lay, refs)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("group, lay", _cases(SLOW_4))
def test_four_ranks(group, lay, group_results, refs):
    _check(group_results(group), lay, refs)
