"""Tensor, sequence and data parallelism and recompute against one process.

From one seed, a tiny protein LM trains for three AdamW steps (clipped at a norm small enough
that clipping is active every step) under each layout; its losses, gradient norms and final
parameters must equal those of one process running the whole model on the whole global batch
(and under ZeRO its AdamW moments, through the layout-independent `dcp_state_dict`). Each
rank of a layout sees its data-parallel slice of the same global batches, split into the
layout's micro-batches, and applies the runtime's functions in the trainer's order:
apply_tp, apply_recompute, apply_data_parallel on the meta device, then to_empty,
init_weights, setup_rope, build_optimizer; `handle.no_sync()` around every micro-batch but
the last, `handle.clip_grad_norm`, step.

Tolerances (fp32). The layouts do the same arithmetic in another order (sums over
micro-batches and ranks, split matmuls, reduce-scatter instead of allreduce), so results
differ by rounding, which AdamW then amplifies for entries whose gradient is near zero
(its update g / (sqrt(v) + eps) is ~lr whatever the size of g). Measured over every layout
below (max): losses 2e-7 relative, gradient norms 3e-6 relative, parameters 1e-6 rms and
6e-5 in the worst single entry, moments 1e-5 (relative norm). For scale: one process alone
with 2 micro-batches instead of 1 moves a parameter entry by 1.2e-5, and fp32 against fp64
by 4.5e-5. The bounds sit well above rounding and well below real errors:
    losses        1e-5 relative (a missing gradient reduction moves the step-2 loss ~1e-3)
    grad norms    2e-5 relative (the norm is what checks the gradient's scale, since AdamW is
                  scale-invariant; a norm missing one dp reduction was off by 20-40 %)
    parameters    rms 1e-5 and max 1e-3 absolute, against steps of lr = 1e-2 per entry
                  (the same bug gave rms 4e-4, max 1.6e-3)
    ZeRO moments  1e-4 relative in norm per tensor; reloading them is exact.

Fast set (no marker: one spawn of 2 ranks, about 15-20 s; plus two single-process tests):
DDP with 2 micro-batches, FSDP, ZeRO-2 with 2 micro-batches, TP 2 with sequence parallelism,
selective recompute. The other 2-rank layouts (one spawn, about 20 s) and every 4-rank layout
(oversubscribed on 2 cores, two spawns, about 20-25 s each) are marked slow. A spawn's time
is charged to the first test of its group.
"""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path

import pytest
import torch

from dist_helpers import run_on_ranks
from planner.schema.plan import Plan, ddp_impl_for, load_plan
from planner.schema.specs import ModelSpec, Precision, Sharding
from runtime.model import ProteinLM, canonical_name, init_weights, loss_fn

ROOT = Path(__file__).resolve().parents[2]
SEED = 1234
STEPS = 3
LR = 1e-2
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
CLIP = 0.05
GLOBAL_BATCH = 8
LOSS_RTOL = 1e-5
NORM_RTOL = 2e-5
PARAM_RMS_ATOL = 1e-5
PARAM_MAX_ATOL = 1e-3
STATE_RTOL = 1e-4

SPECS = {
    # Llama-style: rope, SwiGLU, RMSNorm, grouped-query attention; vocabulary 31 (not a
    # multiple of tp: uneven vocabulary shards in the embedding and the head).
    "llama": ModelSpec(name="par-tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, seq_len=32),
    # GPT-style: learned positions, GELU (no w3), LayerNorm, multi-head attention.
    "gpt": ModelSpec(name="par-tiny-gpt", layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=128, seq_len=32,
                     activation="gelu", norm="layernorm", position="learned"),
}


def layout(name: str, world: int, kind: str = "none", tp: int = 1, dp_replicate: int = 1, gas: int = 1,
           sp: bool = False, recompute: str = "none", spec: str = "llama", bucket_mb: float = 25.0,
           ddp_impl: str | None = None) -> dict:
    """One layout; `ddp_impl` (kind none): the planner's choice unless given."""
    dp = world // tp
    dp_shard = dp // dp_replicate
    if ddp_impl is None:
        ddp_impl = ddp_impl_for(Sharding(kind), tp, 1, Precision.fp32)
    return dict(name=name, world=world, kind=kind, tp=tp, dp_replicate=dp_replicate, dp_shard=dp_shard, gas=gas,
                sp=sp, recompute=recompute, spec=spec, bucket_mb=bucket_mb, ddp_impl=ddp_impl)


FAST_2 = [
    layout("ddp-gas2", 2, "none", dp_replicate=2, gas=2),  # DistributedDataParallel
    layout("replicate-gas2", 2, "none", dp_replicate=2, gas=2, ddp_impl="replicate"),  # FSDP2's replicate
    layout("fsdp", 2, "fsdp"),
    layout("zero2-gas2", 2, "zero2", gas=2),
    layout("tp2-sp", 2, tp=2, sp=True),
    layout("recompute-selective", 2, "none", dp_replicate=2, recompute="selective"),
    layout("fsdp-selective-op", 2, "fsdp", recompute="selective-op"),
]
SLOW_2 = [
    layout("ddp-small-buckets", 2, "none", dp_replicate=2, bucket_mb=0.01),  # a DDP bucket per few tensors
    layout("replicate-small-buckets", 2, "none", dp_replicate=2, bucket_mb=0.01, ddp_impl="replicate"),  # a unit per block
    layout("fsdp-gas2", 2, "fsdp", gas=2),
    layout("fsdp-grad-op", 2, "fsdp-grad-op"),
    layout("zero1-small-buckets", 2, "zero1", bucket_mb=0.01),  # several buckets, odd sizes (padding)
    layout("zero1-gas2", 2, "zero1", gas=2),
    layout("zero2", 2, "zero2"),
    layout("tp2", 2, tp=2),
    layout("tp2-gas2", 2, tp=2, gas=2),
    layout("recompute-full", 2, "fsdp", recompute="full"),
    layout("recompute-full-ddp-gas2", 2, "none", dp_replicate=2, gas=2, recompute="full"),
    layout("tp2-gpt", 2, tp=2, spec="gpt"),
    layout("tp2-sp-gpt", 2, tp=2, sp=True, spec="gpt"),
    layout("fsdp-gpt", 2, "fsdp", spec="gpt"),
]
SLOW_4 = [  # two spawns, so that each stays far inside its test's timeout on a loaded machine
    [
        layout("hsdp-2x2-gas2", 4, "hsdp", dp_replicate=2, gas=2),
        layout("hsdp-2x2-full", 4, "hsdp", dp_replicate=2, recompute="full"),
        layout("tp2-fsdp2", 4, "fsdp", tp=2),
        layout("tp2-sp-fsdp2-gas2", 4, "fsdp", tp=2, sp=True, gas=2),
    ],
    [
        layout("tp2-ddp2", 4, "none", tp=2, dp_replicate=2),
        layout("tp2-sp-zero1-gas2", 4, "zero1", tp=2, sp=True, gas=2),
        layout("tp2-sp-zero2-selective", 4, "zero2", tp=2, sp=True, recompute="selective"),
        layout("tp2-sp-ddp2-selective-op", 4, "none", tp=2, dp_replicate=2, sp=True, recompute="selective-op"),
    ],
]


def make_plan(lay: dict) -> Plan:
    """A legal plan for the tiny model on one CPU 'node' of `world` ranks (machine and
    prediction fields from an example plan; only the layout fields matter here)."""
    spec = SPECS[lay["spec"]]
    base = load_plan(ROOT / "plans" / "protein-7b_dgx-h100_16n.yaml").model_dump(mode="json")
    world, dp = lay["world"], lay["dp_replicate"] * lay["dp_shard"]
    d = dict(base)
    d["model"] = spec.model_dump(mode="json")
    d["machine"] = {**base["machine"], "devices_per_node": world}
    d["job"] = {**base["job"], "global_batch": GLOBAL_BATCH, "seq_len": spec.seq_len, "precision": "fp32"}
    d["nodes"], d["ranks_per_node"] = 1, world
    d["mesh"] = {"pp": 1, "dp_replicate": lay["dp_replicate"], "dp_shard": lay["dp_shard"], "cp": 1, "tp": lay["tp"]}
    d["micro_batch_size"], d["grad_accumulation_steps"] = GLOBAL_BATCH // (dp * lay["gas"]), lay["gas"]
    d["sequence_parallel"] = lay["sp"]
    d["recompute"] = lay["recompute"]
    d["sharding"] = {**base["sharding"], "kind": lay["kind"], "shard_group_size": lay["dp_shard"],
                     "ddp_bucket_mb": lay["bucket_mb"], "ddp_impl": lay.get("ddp_impl") or ddp_impl_for(Sharding(lay["kind"]), lay["tp"], 1, Precision.fp32)}
    d["pipeline"] = {"schedule": None, "virtual_stages": 1, "stages": []}
    return Plan.model_validate(d)


def global_batches(spec: ModelSpec) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS global batches of (tokens, next tokens), no padding (amino-acid ids only)."""
    g = torch.Generator().manual_seed(99)
    out = []
    for _ in range(STEPS):
        x = torch.randint(5, 31, (GLOBAL_BATCH, spec.seq_len + 1), generator=g)
        out.append((x[:, :-1].clone(), x[:, 1:].clone()))
    return out


def reference(spec_key: str) -> dict:
    """One process, whole model, whole global batch, plain AdamW and clip_grad_norm_."""
    spec = SPECS[spec_key]
    with torch.device("meta"):
        model = ProteinLM(spec)
    model.to_empty(device="cpu")
    init_weights(model, spec, SEED)
    model.setup_rope()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, foreach=False)
    losses, norms = [], []
    for tokens, targets in global_batches(spec):
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    state = {canonical_name(n): opt.state[p] for n, p in model.named_parameters()}
    return {"losses": losses, "norms": norms,
            "params": {canonical_name(n): p.detach().clone() for n, p in model.named_parameters()},
            "exp_avg": {n: st["exp_avg"].clone() for n, st in state.items()},
            "exp_avg_sq": {n: st["exp_avg_sq"].clone() for n, st in state.items()}}


# --------------------------------------------------------------------------------------------
# One process: what each recompute level recomputes
# --------------------------------------------------------------------------------------------


def _count_ops(level: str) -> tuple[dict[str, int], dict[str, torch.Tensor], list[str]]:
    """Calls of the attention core and of matmuls in one forward + backward, the gradients
    and the parameter names, with `level` applied."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from runtime.parallel import apply_recompute

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = {"sdpa": 0, "mm": 0}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if "scaled_dot_product" in name and "backward" not in name:
                self.n["sdpa"] += 1
            elif name in ("mm", "bmm", "addmm"):
                self.n["mm"] += 1
            return func(*args, **(kwargs or {}))

    spec = SPECS["llama"]
    with torch.device("meta"):
        model = ProteinLM(spec)
    apply_recompute(model, level)
    model.to_empty(device="cpu")
    init_weights(model, spec, SEED)
    model.setup_rope()
    tokens, targets = global_batches(spec)[0]
    with Count() as count:
        loss_fn(model(tokens), targets).backward()
    grads = {canonical_name(n): p.grad for n, p in model.named_parameters()}
    return count.n, grads, [n for n, _ in model.named_parameters()]


def test_recompute_levels_recompute_what_they_say():
    none, g_none, names_none = _count_ops("none")
    selective, g_sel, names_sel = _count_ops("selective")
    full, g_full, _ = _count_ops("full")
    op, g_op, _ = _count_ops("selective-op")
    layers = SPECS["llama"].layers
    assert none["sdpa"] == layers
    # selective: the attention core runs again in backward, and nothing else does
    assert selective["sdpa"] == 2 * layers and selective["mm"] == none["mm"]
    assert names_sel == names_none  # the module tree is unchanged
    # full: the whole block runs again (its attention core and its 7 projections)
    assert full["sdpa"] == 2 * layers and full["mm"] > none["mm"]
    # selective-op: the attention kernel's output is kept, three of the seven projections
    # (k, o, up) run again
    assert op["sdpa"] == layers and op["mm"] == none["mm"] + 3 * layers
    for n, g in g_none.items():
        torch.testing.assert_close(g_sel[n], g, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(g_full[n], g, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(g_op[n], g, rtol=1e-6, atol=1e-9)


def test_replicate_units_follow_the_bucket_size():
    from runtime.parallel.data_parallel import _replicate_units

    blocks = [torch.nn.Linear(256, 256, bias=False) for _ in range(5)]  # 256 KiB each in fp32
    assert _replicate_units(blocks, 25.0) == [blocks]
    assert _replicate_units(blocks, 0.01) == [[b] for b in blocks]
    # from the last block backwards, each unit closes once it holds >= 0.5 MiB
    assert _replicate_units(blocks, 0.5) == [[blocks[0]], blocks[1:3], blocks[3:5]]


# --------------------------------------------------------------------------------------------
# Ranks
# --------------------------------------------------------------------------------------------


def _train(lay: dict, ref: dict) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from runtime.mesh import build_mesh
    from runtime.parallel import ZeroOptimizer, apply_data_parallel, apply_recompute, apply_tp

    plan = make_plan(lay)
    spec = plan.model
    mesh = build_mesh(plan, "cpu")
    with torch.device("meta"):
        model = ProteinLM(spec)
    # The trainer's order: TP, recompute, data parallelism; then materialise and initialise.
    apply_tp(model, mesh["tp"], plan.sequence_parallel)
    apply_recompute(model, plan.recompute)
    handle = apply_data_parallel(model, mesh, plan)
    model.to_empty(device="cpu")
    init_weights(model, spec, SEED)
    model.setup_rope()
    opt = handle.build_optimizer(lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)

    dp_rank, dp = mesh["dp"].get_local_rank(), mesh["dp"].size()
    gas, mbs = plan.grad_accumulation_steps, plan.micro_batch_size
    losses, norms = [], []
    for tokens, targets in global_batches(spec):
        rows = slice(dp_rank * mbs * gas, (dp_rank + 1) * mbs * gas)
        tokens, targets = tokens[rows], targets[rows]
        total = 0.0
        for i in range(gas):
            mb = slice(i * mbs, (i + 1) * mbs)
            ctx = handle.no_sync() if i < gas - 1 else contextlib.nullcontext()
            with ctx:
                loss = loss_fn(handle.forward(tokens[mb]), targets[mb]) / gas
                loss.backward()
            total += float(loss.detach())
        norms.append(handle.clip_grad_norm(CLIP))
        opt.step()
        opt.zero_grad()
        t = torch.tensor([total])
        dist.all_reduce(t, group=mesh["dp_cp"].get_group())
        losses.append(float(t) / mesh["dp_cp"].size())

    ref_params = ref["params"]
    max_err = rms_err = 0.0
    names = set()
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        name = canonical_name(name)
        names.add(name)
        diff = (full.detach() - ref_params[name]).double()
        max_err = max(max_err, float(diff.abs().max()))
        rms_err = max(rms_err, float(diff.pow(2).mean().sqrt()))
    out = {"losses": losses, "norms": norms, "max_err": max_err, "rms_err": rms_err,
           "names_match": names == set(ref_params)}
    if isinstance(opt, ZeroOptimizer):
        out.update(_zero_state_check(opt, ref))
    return out


def _zero_state_check(opt, ref: dict) -> dict:
    """The layout-independent optimizer state equals the single process's AdamW state, and
    loading it back restores this rank's shards exactly."""
    from torch.distributed.tensor import DTensor

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    whole = opt.dcp_state_dict()
    sd = whole["state"]
    err = 0.0
    for name, st in sd.items():
        for what in ("exp_avg", "exp_avg_sq"):
            a, b = full(st[what]).double(), ref[what][name].double()
            err = max(err, float((a - b).norm() / b.norm()))
    before = {id(p): {k: v.clone() for k, v in st.items()} for p, st in opt.state.items()}
    for st in opt.state.values():
        st["exp_avg"].zero_()
        st["exp_avg_sq"].zero_()
    opt.load_dcp_state_dict(whole)
    exact = all(torch.equal(before[id(p)][k], st[k]) for p, st in opt.state.items() for k in before[id(p)])
    return {"state_err": err, "state_roundtrip": exact, "steps": [float(sd[n]["step"]) for n in sd]}


def _run_layouts(rank: int, world: int, layouts: list[dict], refs: dict) -> dict:
    out = {}
    for lay in layouts:
        try:
            out[lay["name"]] = _train(lay, refs[lay["spec"]])
        except Exception:  # symmetric failures (the same on every rank) leave the others runnable
            out[lay["name"]] = {"error": traceback.format_exc()}
    return out


def _group(layouts: list[dict], world: int, refs: dict) -> dict:
    per_rank = run_on_ranks(_run_layouts, world, layouts, {k: refs[k] for k in {lay["spec"] for lay in layouts}},
                            timeout_s=110)
    return {lay["name"]: [r[lay["name"]] for r in per_rank] for lay in layouts}


# --------------------------------------------------------------------------------------------
# Fixtures: one spawn per group of layouts, run only when one of its tests is selected
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def refs() -> dict:
    return {k: reference(k) for k in SPECS}


@pytest.fixture(scope="module")
def group_results(refs):
    """Results of each group of layouts, computed (one spawn) when a test first asks."""
    cache: dict[int, dict] = {}

    def get(group: list[dict]) -> dict:
        key = id(group)
        if key not in cache:
            cache[key] = _group(group, group[0]["world"], refs)
        return cache[key]

    return get


def _check(results: dict, lay: dict, refs: dict) -> None:
    ref = refs[lay["spec"]]
    for rank, r in enumerate(results[lay["name"]]):
        assert "error" not in r, f"{lay['name']} rank {rank}:\n{r.get('error')}"
        assert r["names_match"], "parameter names differ from the single-process model"
        assert r["losses"] == pytest.approx(ref["losses"], rel=LOSS_RTOL), f"{lay['name']} rank {rank}: losses"
        assert r["norms"] == pytest.approx(ref["norms"], rel=NORM_RTOL), f"{lay['name']} rank {rank}: grad norms"
        assert r["rms_err"] < PARAM_RMS_ATOL, f"{lay['name']} rank {rank}: parameters differ (rms {r['rms_err']:.2e})"
        assert r["max_err"] < PARAM_MAX_ATOL, f"{lay['name']} rank {rank}: a parameter differs by {r['max_err']:.2e}"
        if lay["kind"] in ("zero1", "zero2"):
            assert r["state_err"] < STATE_RTOL, \
                f"{lay['name']} rank {rank}: AdamW moments differ ({r['state_err']:.1e})"
            assert r["state_roundtrip"], f"{lay['name']} rank {rank}: dcp_state_dict does not load back exactly"
            assert set(r["steps"]) == {float(STEPS)}


def _cases(groups: list[list[dict]], *marks) -> list:
    return [pytest.param(g, lay, id=lay["name"], marks=marks) for g in groups for lay in g]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("group, lay", _cases([FAST_2]) + _cases([SLOW_2], pytest.mark.slow))
def test_two_ranks(group, lay, group_results, refs):
    _check(group_results(group), lay, refs)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("group, lay", _cases(SLOW_4))
def test_four_ranks(group, lay, group_results, refs):
    _check(group_results(group), lay, refs)
