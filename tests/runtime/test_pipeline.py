"""Pipeline parallelism against one process: same seed, same global batch, same AdamW.

Each multi-rank test spawns gloo ranks on the CPU (torch.set_num_threads(1) each), runs three
optimizer steps through runtime.parallel.pipeline and compares with a single-process run of the
whole model on the whole global batch: the loss of every step (fp32, relative 1e-5), the
first step's gradients and the parameters after the last step.

AdamW hides a wrong gradient scale (its update is scale-invariant up to eps), so the gradient
comparison is what checks the normalisation; the losses check that the stages chain up.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from planner.schema.plan import Plan, load_plan
from planner.schema.specs import ModelSpec
from planner.schema.vocab import PAD_ID
from runtime.model import ProteinLM, canonical_name, init_weights, loss_fn
from runtime.parallel.pipeline import build_schedule, split_model, stages_of_rank
from dist_helpers import run_on_ranks

ROOT = Path(__file__).resolve().parents[2]
SEED = 1234
STEPS = 3
LR = 1e-2
CLIP = 0.05  # small enough that clipping is active at every step
LOSS_RTOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6  # relative to entries about 1e-3..1e-1; fp32 reduction order differs
# Adam's update is sign-like for a near-zero gradient entry (|g| ~ eps), so fp32 rounding noise
# in one such entry can move its parameter by a fraction of LR; seen: up to 5e-5 in one entry of
# thousands. Parameters after the last step: within 1e-4 absolute (1% of one step of LR = 1e-2).
PARAM_RTOL, PARAM_ATOL = 1e-4, 1e-4


def tiny_spec(layers: int = 4) -> ModelSpec:
    return ModelSpec(name="pp-tiny", layers=layers, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, seq_len=16)


def make_plan(spec: ModelSpec, pp: int, ranges: list[tuple[int, int]] | None = None, schedule: str = "gpipe",
              n_mb: int = 4, mbs: int = 2, dp_shard: int = 1, dp_replicate: int = 1, kind: str | None = None,
              tp: int = 1, sp: bool = False) -> Plan:
    """A legal plan for the tiny model on one CPU 'node' of pp x dp ranks (machine fields from an
    example plan; only the layout fields matter here)."""
    base = load_plan(ROOT / "plans" / "protein-7b_dgx-h100_16n.yaml").model_dump(mode="json")
    world = pp * dp_shard * dp_replicate * tp
    dp = dp_shard * dp_replicate
    if ranges is None:
        ranges = [(i * spec.layers // pp, (i + 1) * spec.layers // pp) for i in range(pp)]
    S = len(ranges)
    d = dict(base)
    d["model"] = spec.model_dump(mode="json")
    d["machine"] = {**base["machine"], "devices_per_node": world}
    d["job"] = {**base["job"], "global_batch": mbs * n_mb * dp, "seq_len": spec.seq_len, "precision": "fp32"}
    d["nodes"], d["ranks_per_node"] = 1, world
    d["mesh"] = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": 1, "tp": tp}
    d["sequence_parallel"] = sp
    d["micro_batch_size"], d["grad_accumulation_steps"] = mbs, n_mb
    kind = kind or ("none" if dp_shard == 1 else ("fsdp" if dp_replicate == 1 else "hsdp"))
    d["sharding"] = {**base["sharding"], "kind": kind, "shard_group_size": dp_shard}
    d["pipeline"] = {
        "schedule": schedule if pp > 1 else None,
        "virtual_stages": S // pp,
        "stages": [] if pp == 1 else [
            {"pp_rank": i % pp, "virtual_index": i // pp, "first_layer": a, "last_layer": b,
             "embedding": i == 0, "head": i == S - 1} for i, (a, b) in enumerate(ranges)],
    }
    return Plan.model_validate(d)


def global_batch(plan: Plan, pad_fraction: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS batches of (tokens, targets), each [global_batch, seq]; some targets PAD if asked
    (unevenly over the micro-batches, so the normalisation matters)."""
    g = torch.Generator().manual_seed(99)
    out = []
    for _ in range(STEPS):
        x = torch.randint(5, 31, (plan.job.global_batch, plan.job.seq_len + 1), generator=g)
        tokens, targets = x[:, :-1].clone(), x[:, 1:].clone()
        if pad_fraction:
            # pad the tail of each row by a row-dependent amount
            B, S = targets.shape
            for r in range(B):
                n_pad = int(S * pad_fraction * (r % 4) / 3)
                if n_pad:
                    targets[r, S - n_pad:] = PAD_ID
        out.append((tokens, targets))
    return out


def reference(plan: Plan, batches) -> dict:
    """One process, whole model, whole global batch."""
    torch.manual_seed(0)
    model = ProteinLM(plan.model)
    init_weights(model, plan.model, SEED)
    model.setup_rope()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], {}
    for step, (tokens, targets) in enumerate(batches):
        opt.zero_grad()
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append((loss.item(), norm.item()))
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


# --------------------------------------------------------------------------------------------
# Ranks
# --------------------------------------------------------------------------------------------


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _rank_main(rank: int, world: int, plan_json: str, cfg: dict, out_dir: str) -> None:
    """The trainer's order: split on meta, data parallelism, materialise, init, schedule."""
    from runtime.mesh import build_mesh
    from runtime.parallel import apply_data_parallel, apply_tp, clip_grad_norm_

    plan = Plan.model_validate_json(plan_json)
    spec = plan.model
    mesh = build_mesh(plan, "cpu")
    coords = plan.coordinates(rank)
    pp_rank = coords["pp"]
    dp_rank = mesh["dp"].get_local_rank()
    with torch.device("meta"):
        model = ProteinLM(spec)
    chunks = split_model(model, plan, pp_rank)
    for c in chunks:
        apply_tp(c, mesh["tp"], plan.sequence_parallel)
    handles = [apply_data_parallel(c, mesh, plan) for c in chunks]
    for c in chunks:
        c.to_empty(device="cpu")
        init_weights(c, spec, SEED)
        c.setup_rope("cpu")
    linear_dtypes: set[str] = set()
    if cfg.get("record_dtypes"):  # what each chunk's first Linear computes in
        for c in chunks:
            first = next((m for m in c.modules() if isinstance(m, torch.nn.Linear)), None)
            if first is not None:
                first.register_forward_hook(lambda mod, args, out: linear_dtypes.add(str(out.dtype)))
    mbs, seq = plan.micro_batch_size, plan.job.seq_len
    runner = build_schedule(chunks, plan, mesh["pp"], "cpu", plan.grad_accumulation_steps, loss_fn, (mbs, seq),
                            normalization=cfg.get("normalization", "microbatch"))
    # AdamW with torch's defaults (as the reference), one per chunk (ZeRO: over its shard).
    opts = [h.build_optimizer(lr=LR, betas=(0.9, 0.999), weight_decay=0.01) for h in handles
            if any(True for _ in h.model.parameters())]  # a stage may own no parameters
    local = mbs * plan.grad_accumulation_steps
    losses, grads = [], {}
    for step, (tokens, targets) in enumerate(global_batch(plan, cfg.get("pad", 0.0))):
        rows = slice(dp_rank * local, (dp_rank + 1) * local)
        loss = runner.step(tokens[rows] if runner.has_first else None, targets[rows] if runner.has_last else None)
        if step == 0:  # (ZeRO keeps gradients in its buckets: none in .grad, the norm checks them)
            grads = {canonical_name(n): _full(p.grad) for c in chunks for n, p in c.named_parameters()
                     if p.grad is not None}
        norm = clip_grad_norm_(handles, CLIP)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        losses.append((float(loss), float(norm)))
    evaluated = runner.evaluate(tokens[rows][:mbs], targets[rows][:mbs]) if cfg.get("evaluate") else None
    params = {canonical_name(n): _full(p) for c in chunks for n, p in c.named_parameters()}
    torch.save({"losses": losses, "grads": grads, "params": params, "dp_rank": dp_rank, "pp_rank": pp_rank,
                "stages": runner.stage_indices, "evaluate": evaluated, "linear_dtypes": sorted(linear_dtypes),
                "param_dtypes": sorted({str(p.dtype) for c in chunks for p in c.parameters()})},
               Path(out_dir) / f"rank{rank}.pt")


def run_ranks(plan: Plan, **cfg) -> list[dict]:
    world = plan.mesh.world_size
    with tempfile.TemporaryDirectory() as tmp:
        run_on_ranks(_rank_main, world, plan.model_dump_json(), cfg, tmp, timeout_s=150)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]


def check_against_reference(plan: Plan, results: list[dict], pad: float = 0.0) -> None:
    ref = reference(plan, global_batch(plan, pad))
    for r in results:  # every rank reports the loss (broadcast over pp), and the same clip norm
        # with dp > 1 each rank's loss is its own batch slice's; their mean is the global one
        mates = [o for o in results if o["pp_rank"] == r["pp_rank"]]
        for step in range(STEPS):
            got_loss = sum(o["losses"][step][0] for o in mates) / len(mates)  # tp ranks: equal losses
            assert got_loss == pytest.approx(ref["losses"][step][0], rel=LOSS_RTOL), (step, got_loss, ref["losses"][step])
            assert r["losses"][step][1] == pytest.approx(ref["losses"][step][1], rel=1e-4), ("grad norm", step)
    seen = set()
    for r in results:
        for name, g in r["grads"].items():
            torch.testing.assert_close(g, ref["grads"][name], rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=lambda m: f"{name}: {m}")
            seen.add(name)
        for name, p in r["params"].items():
            torch.testing.assert_close(p, ref["params"][name], rtol=PARAM_RTOL, atol=PARAM_ATOL, msg=lambda m: f"{name}: {m}")
    if any(r["grads"] for r in results):
        assert seen == set(ref["grads"]), "every parameter lives on some stage"
    assert set().union(*(r["params"] for r in results)) == set(ref["params"])


# --------------------------------------------------------------------------------------------
# Tests without processes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranges,schedule", [
    ([(0, 2), (2, 4)], "gpipe"),
    ([(0, 3), (3, 5)], "1f1b"),
    ([(0, 1), (1, 3), (3, 4), (4, 5)], "interleaved-1f1b"),
    ([(0, 5), (5, 5)], "1f1b"),  # a head-only last stage
])
def test_split_keeps_global_names_and_covers_the_model(ranges, schedule):
    spec = tiny_spec(ranges[-1][1])
    plan = make_plan(spec, pp=2, ranges=ranges, schedule=schedule)
    with torch.device("meta"):
        model = ProteinLM(spec)
    full = {n: tuple(p.shape) for n, p in model.named_parameters()}
    got: dict[str, tuple] = {}
    for pp_rank in range(2):
        chunks = split_model(model, plan, pp_rank)
        assert len(chunks) == plan.pipeline.virtual_stages
        for chunk, (i, st) in zip(chunks, stages_of_rank(plan, pp_rank)):
            assert list(chunk.layers.keys()) == [str(j) for j in range(st.first_layer, st.last_layer)]
            assert (chunk.tok_embeddings is not None) == (i == 0)
            assert (chunk.norm is not None) == (chunk.output is not None) == (i == len(ranges) - 1)
            for n, p in chunk.named_parameters():
                assert p.is_meta and n not in got
                got[n] = tuple(p.shape)
    assert got == full
    assert len(model.layers) == spec.layers and model.tok_embeddings is not None  # the original is untouched


def test_split_shares_nothing_with_the_model():
    spec = tiny_spec(4)
    plan = make_plan(spec, pp=2)
    model = ProteinLM(spec)
    ids = {id(p) for p in model.parameters()}
    for pp_rank in range(2):
        for c in split_model(model, plan, pp_rank):
            assert not ids & {id(p) for p in c.parameters()}


def test_split_refuses_tied_embeddings_across_ranks():
    spec = tiny_spec(4).model_copy(update={"tied_embeddings": True})
    plan = make_plan(spec, pp=2)
    with torch.device("meta"):
        model = ProteinLM(spec)
    with pytest.raises(NotImplementedError):
        split_model(model, plan, 0)


def test_chunks_chained_equal_the_model():
    """Stage by stage in one process: the chunks compose to the full model's forward."""
    spec = tiny_spec(5)
    plan = make_plan(spec, pp=2, ranges=[(0, 1), (1, 3), (3, 3), (3, 5)], schedule="interleaved-1f1b")
    model = ProteinLM(spec)
    init_weights(model, spec, SEED)
    model.setup_rope()
    chunks = {i: c for r in range(2) for (i, _), c in zip(stages_of_rank(plan, r), split_model(model, plan, r))}
    for c in chunks.values():
        init_weights(c, spec, SEED)
        c.setup_rope()
    x = torch.randint(5, 31, (2, spec.seq_len))
    h = x
    for i in range(len(chunks)):
        h = chunks[i](h)
    torch.testing.assert_close(h, model(x), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# Multi-rank tests
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_gpipe_pp2_equals_one_process():
    plan = make_plan(tiny_spec(4), pp=2, schedule="gpipe")
    results = run_ranks(plan, evaluate=True)
    assert [r["stages"] for r in results] == [[0], [1]]
    check_against_reference(plan, results)
    # forward-only evaluation of one micro-batch after the 3 steps, on every pp rank
    ref = reference(plan, global_batch(plan))
    tokens, targets = global_batch(plan)[-1]
    model = ProteinLM(plan.model)
    model.load_state_dict(ref["params"], strict=False)
    model.setup_rope()
    with torch.no_grad():
        want = loss_fn(model(tokens[:2]), targets[:2]).item()
    for r in results:
        assert r["evaluate"] == pytest.approx(want, rel=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule,ranges", [
    ("1f1b", [(0, 2), (2, 4)]),
    ("interleaved-1f1b", [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ("1f1b", [(0, 3), (3, 5)]),  # uneven: 5 layers on 2 stages
    ("interleaved-1f1b", [(0, 2), (2, 3), (3, 5), (5, 5)]),  # uneven, with a head-only stage
    ("interleaved-1f1b", [(0, 2), (2, 2), (2, 3), (3, 4)]),  # an empty (identity) middle stage
])
def test_schedules_pp2_equal_one_process(schedule, ranges):
    plan = make_plan(tiny_spec(ranges[-1][1]), pp=2, ranges=ranges, schedule=schedule)
    check_against_reference(plan, run_ranks(plan))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b"])
def test_padding_token_normalisation_equals_whole_batch(schedule):
    """Micro-batches with unequal pad counts: normalization='token' gives the whole local
    batch's token mean (loss and gradient), as one forward over the whole batch would."""
    ranges = [(0, 2), (2, 4)] if schedule == "1f1b" else [(0, 1), (1, 2), (2, 3), (3, 4)]
    plan = make_plan(tiny_spec(4), pp=2, ranges=ranges, schedule=schedule)
    check_against_reference(plan, run_ranks(plan, pad=0.5, normalization="token"), pad=0.5)


def reference_accumulated(plan: Plan, batches) -> list[float]:
    """The non-pipelined trainer's accumulation: loss_fn(micro-batch) / gas, backward each."""
    model = ProteinLM(plan.model)
    init_weights(model, plan.model, SEED)
    model.setup_rope()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    gas, mbs, out = plan.grad_accumulation_steps, plan.micro_batch_size, []
    for tokens, targets in batches:
        opt.zero_grad()
        total = 0.0
        for i in range(gas):
            loss = loss_fn(model(tokens[i * mbs:(i + 1) * mbs]), targets[i * mbs:(i + 1) * mbs]) / gas
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        out.append((total, norm.item()))
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_padding_microbatch_normalisation_equals_the_trainers_accumulation():
    """The default convention under padding: the mean of micro-batch means, exactly the
    non-pipelined trainer's accumulation, and measurably not the whole-batch token mean."""
    plan = make_plan(tiny_spec(4), pp=2, schedule="1f1b")
    results = run_ranks(plan, pad=0.5)
    want = reference_accumulated(plan, global_batch(plan, 0.5))
    for r in results:
        for (loss, norm), (ref_loss, ref_norm) in zip(r["losses"], want):
            assert loss == pytest.approx(ref_loss, rel=LOSS_RTOL) and norm == pytest.approx(ref_norm, rel=1e-4)
    token_mean = reference(plan, global_batch(plan, 0.5))["losses"][0][0]
    assert abs(results[0]["losses"][0][0] - token_mean) > 1e-3


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind,schedule", [
    ("fsdp", "1f1b"),
    ("none", "interleaved-1f1b"),  # DDP semantics (replicate), two chunks per rank
    ("zero2", "gpipe"),  # gradients in ZeRO buckets, not .grad: the loss carries the scaling
])
def test_pp2_dp2_equals_one_process(kind, schedule):
    ranges = [(0, 2), (2, 4)] if schedule != "interleaved-1f1b" else [(0, 1), (1, 2), (2, 3), (3, 4)]
    dp = {"dp_replicate": 2} if kind == "none" else {"dp_shard": 2}
    plan = make_plan(tiny_spec(4), pp=2, ranges=ranges, schedule=schedule, kind=kind, **dp)
    results = run_ranks(plan)
    assert [(r["pp_rank"], r["dp_rank"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    check_against_reference(plan, results)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_pp2_tp2_equals_one_process(sp):
    """Tensor parallelism inside the stages; with sequence parallelism the stages pass
    [mbs, seq / tp, hidden] slices (the default activation shape follows the plan)."""
    plan = make_plan(tiny_spec(4), pp=2, schedule="1f1b", tp=2, sp=sp)
    check_against_reference(plan, run_ranks(plan))


@pytest.mark.timeout(180)
def test_bf16_pipeline_without_a_precision_policy_computes_in_bf16():
    """pp 2, no data parallelism: no mixed-precision policy casts the weights, so the stages'
    forwards run under autocast (autocast_forward's hooks; they ran in fp32 before): bf16
    GEMMs on fp32 weights, the loss equal to the fp32 one process to bf16 precision."""
    plan = make_plan(tiny_spec(4), pp=2, ranges=[(0, 2), (2, 4)], schedule="1f1b")
    data = plan.model_dump(mode="json")
    data["job"]["precision"] = "bf16"
    plan = Plan.model_validate(data)
    results = run_ranks(plan, record_dtypes=True)
    ref = reference(plan, global_batch(plan))
    for r in results:
        assert r["linear_dtypes"] == ["torch.bfloat16"] and r["param_dtypes"] == ["torch.float32"]
    for step in range(STEPS):
        assert results[0]["losses"][step][0] == pytest.approx(ref["losses"][step][0], rel=1e-2)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bf16_fsdp_activations_follow_the_mixed_precision_policy():
    """FSDP2 with param_dtype bf16 sends bf16 hidden states between stages: the static stage
    metadata must say so (the default activation dtype comes from the policy). bf16 on the
    CPU only checks the path; the loss matches fp32 to bf16 precision."""
    plan = make_plan(tiny_spec(4), pp=2, ranges=[(0, 1), (1, 2), (2, 3), (3, 4)], schedule="interleaved-1f1b",
                     kind="fsdp", dp_shard=2)
    data = plan.model_dump(mode="json")
    data["job"]["precision"] = "bf16"
    plan = Plan.model_validate(data)
    results = run_ranks(plan)
    ref = reference(plan, global_batch(plan))
    for step in range(STEPS):
        mean = sum(r["losses"][step][0] for r in results if r["pp_rank"] == 0) / 2
        assert mean == pytest.approx(ref["losses"][step][0], rel=1e-2)
