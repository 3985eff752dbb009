"""Checkpoints: atomic saves, latest(), pruning, clear errors, and resharding: an FSDP2 model
and its AdamW state saved from 4 ranks reload on 2 ranks and on one process (no sharding)
exactly, and training continues as it would have on 4. Multi-rank tests spawn gloo processes
on the CPU (torch.multiprocessing, one thread each)."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from planner.schema.errors import PlanError
from planner.schema.specs import ModelSpec
from runtime import checkpoint as ck
from runtime.checkpoint import io as ck_io  # save's helpers: a test makes one fail
from runtime.model import ProteinLM, init_weights, loss_fn

SPEC = ModelSpec(name="ckpt-test", layers=3, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, seq_len=32, vocab_size=32)
SEQ = 16
GLOBAL_BATCH = 4
LR = 1e-3


# --- helpers (module level: spawned workers import them) ----------------------------------------


def batch(step: int) -> torch.Tensor:
    """The global batch of a step: no padding, so every rank's mean loss has equal weight."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(5, 31, (GLOBAL_BATCH, SEQ + 1), generator=g)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int = 0, world: int = 1) -> float:
    x = batch(step)
    per = GLOBAL_BATCH // world
    x = x[rank * per:(rank + 1) * per]
    loss = loss_fn(model(x[:, :-1]), x[:, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def make_opt(params) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1)


def plain_model(seed: int = 0) -> ProteinLM:
    m = ProteinLM(SPEC)
    init_weights(m, SPEC, seed)
    m.setup_rope()
    return m


def fsdp_model(world: int, seed: int = 0) -> ProteinLM:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        m = ProteinLM(SPEC)
    mesh = init_device_mesh("cpu", (world,))
    for block in m.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    m.to_empty(device="cpu")
    init_weights(m, SPEC, seed)
    m.setup_rope()
    return m


def full_state(model: nn.Module, opt) -> tuple[dict, dict]:
    """Gathered model and flattened optimizer state (every rank gets all of it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    o = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    copy = lambda sd: {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
    return copy(get_model_state_dict(model, options=o)), copy(get_optimizer_state_dict(model, opt, options=o))


def assert_same(a: dict, b: dict, exact: bool = True, atol: float = 0.0) -> None:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())[:5]
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            x, y = x.detach().cpu(), torch.as_tensor(y).detach().cpu()
            if exact:
                assert torch.equal(x, y), k
            else:
                torch.testing.assert_close(x, y, atol=atol, rtol=0, msg=k)
        else:
            assert x == y, (k, x, y)


def _init(rank: int, world: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _spawn(fn, world: int, *args) -> None:
    store = tempfile.mktemp(prefix="exaplan-pg-")
    try:
        mp.spawn(fn, args=(world, store, *args), nprocs=world, join=True)
    finally:
        Path(store).unlink(missing_ok=True)


# --- fast, single process ------------------------------------------------------------------------


def test_missing_and_incomplete_checkpoints_raise_plan_error(tmp_path):
    m = plain_model()
    assert ck.latest(tmp_path) is None
    assert ck.latest(tmp_path / "nowhere") is None
    with pytest.raises(PlanError, match="no checkpoint at"):
        ck.load(tmp_path / "nowhere", [m], None)
    with pytest.raises(PlanError, match="no complete checkpoint"):
        ck.load(tmp_path, [m], None)
    (tmp_path / "step-00000007.tmp").mkdir()
    with pytest.raises(PlanError, match="interrupted save"):
        ck.load(tmp_path / "step-00000007.tmp", [m], None)
    (tmp_path / "step-00000008").mkdir()  # e.g. a partial copy: no COMPLETE marker
    with pytest.raises(PlanError, match="no COMPLETE marker"):
        ck.load(tmp_path / "step-00000008", [m], None)
    with pytest.raises(PlanError, match="only incomplete ones"):
        ck.load(tmp_path, [m], None)
    assert ck.latest(tmp_path) is None


def test_single_process_round_trip_interrupted_save_and_pruning(tmp_path, monkeypatch):
    torch.manual_seed(0)
    m, opt = plain_model(), None
    opt = make_opt(m.parameters())
    train_step(m, opt, 0)
    p1 = ck.save(tmp_path, 1, [m], opt, {"seed": 5, "data": {"sequences_seen": 4}})
    assert p1 == tmp_path / "step-00000001" and ck.latest(tmp_path) == p1
    want_model, want_opt = full_state(m, opt)
    after_save = (random.random(), np.random.rand(), torch.rand(3))

    # A save that dies half-way leaves a .tmp folder; the previous checkpoint stays the latest.
    train_step(m, opt, 1)

    def boom(*a, **k):
        raise RuntimeError("killed during save")

    monkeypatch.setattr(ck_io, "_write_rank_items", boom)
    with pytest.raises(RuntimeError, match="killed"):
        ck.save(tmp_path, 2, [m], opt, {"seed": 5})
    monkeypatch.undo()
    assert (tmp_path / "step-00000002.tmp").is_dir()
    assert ck.latest(tmp_path) == p1
    with pytest.raises(PlanError, match="interrupted"):
        ck.load(tmp_path / "step-00000002.tmp", [m], opt)

    m2 = plain_model(seed=1)
    opt2 = make_opt(m2.parameters())
    extra = ck.load(tmp_path, [m2], opt2)  # the folder: its latest
    assert extra["step"] == 1 and extra["seed"] == 5 and extra["data"] == {"sequences_seen": 4}
    assert extra["_resume"]["rng"] == "restored" and not extra["_resume"]["resharded"]
    assert (random.random(), np.random.rand()) == after_save[:2] and torch.equal(torch.rand(3), after_save[2])
    got_model, got_opt = full_state(m2, opt2)
    assert_same(got_model, want_model)
    assert_same(got_opt, want_opt)

    # Saving again: the stale .tmp goes, and only the newest two stay.
    for step in (2, 3, 4):
        ck.save(tmp_path, step, [m2], opt2, {"seed": 5})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]
    meta = json.loads((tmp_path / "step-00000004" / "meta.json").read_text())
    assert meta["step"] == 4 and meta["world_size"] == 1 and meta["optimizer"] == "torch-dcp"

    # A checkpoint that does not fit the model is refused with a clear message.
    other = ProteinLM(SPEC.model_copy(update={"layers": 2}))
    with pytest.raises(PlanError, match="checkpoint parameters not in the model"):
        ck.load(tmp_path, [other], None)


def _stage_parts(seed: int = 0) -> list[ProteinLM]:
    """Two pipeline-stage parts of the model (layers 0 | 1, 2), keeping canonical names."""
    a, b = plain_model(seed), plain_model(seed)
    del b.layers["0"]
    del a.layers["1"], a.layers["2"]
    a.norm, a.output, b.tok_embeddings = None, None, None
    return [a, b]


def test_pipeline_parts_reload_as_one_model_and_back(tmp_path):
    torch.manual_seed(0)
    # Saved from two stage parts with one optimizer over both ...
    parts = _stage_parts()
    opt = make_opt([p for part in parts for p in part.parameters()])
    x = batch(0)
    loss_fn(parts[1](parts[0](x[:, :-1])), x[:, 1:]).backward()
    opt.step()
    path = ck.save(tmp_path / "a", 1, parts, opt, {})
    # ... loads into the whole model ...
    whole = plain_model(seed=3)
    wopt = make_opt(whole.parameters())
    ck.load(path, [whole], wopt)
    want_model = {k: v for part in parts for k, v in part.state_dict().items()}
    got_model, got_opt = full_state(whole, wopt)
    assert_same(got_model, want_model)
    for i, part in enumerate(parts):
        for name, p in part.named_parameters():
            st = opt.state[p]
            assert torch.equal(got_opt[f"state.{name}.exp_avg"], st["exp_avg"]), name
            assert torch.equal(got_opt[f"state.{name}.exp_avg_sq"], st["exp_avg_sq"]), name
    # ... and back into two parts with one optimizer each.
    path = ck.save(tmp_path / "b", 1, [whole], wopt, {})
    parts2 = _stage_parts(seed=4)
    opts2 = [make_opt(p.parameters()) for p in parts2]
    ck.load(path, parts2, opts2)
    for part, popt in zip(parts2, opts2):
        for name, p in part.named_parameters():
            assert torch.equal(p, got_model[name]), name
            assert torch.equal(popt.state[p]["exp_avg"], got_opt[f"state.{name}.exp_avg"]), name


# --- fast, 2 ranks -------------------------------------------------------------------------------


def _two_rank_worker(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    try:
        root = Path(out)
        torch.manual_seed(100 + rank)
        m = fsdp_model(world)
        opt = make_opt(m.parameters())
        train_step(m, opt, 0, rank, world)
        p1 = ck.save(root, 1, [m], opt, {"seed": 7, "data": {"sequences_seen": GLOBAL_BATCH}})
        local = {k: v.to_local().clone() for k, v in m.state_dict().items()}
        draw = torch.rand(4)
        want_model, want_opt = full_state(m, opt)

        # Every rank dies after DCP wrote its shards, before COMPLETE: the save must not count.
        train_step(m, opt, 1, rank, world)
        real = ck_io._write_rank_items
        ck_io._write_rank_items = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed during save"))
        try:
            ck.save(root, 2, [m], opt, {"seed": 7})
            raise AssertionError("the save should have failed")
        except RuntimeError as e:
            assert "killed" in str(e)
        finally:
            ck_io._write_rank_items = real
        dist.barrier()
        assert (root / "step-00000002.tmp").is_dir() and (root / "step-00000002.tmp" / ".metadata").is_file()
        assert ck.latest(root) == p1

        m2 = fsdp_model(world, seed=9)
        opt2 = make_opt(m2.parameters())
        extra = ck.load(ck.latest(root), [m2], opt2)
        assert extra["data"] == {"sequences_seen": GLOBAL_BATCH} and extra["step"] == 1
        assert extra["_resume"]["rng"] == "restored", extra["_resume"]
        assert torch.equal(torch.rand(4), draw)  # this rank's RNG stream continues
        for k, v in m2.state_dict().items():
            assert torch.equal(v.to_local(), local[k]), k
        got_model, got_opt = full_state(m2, opt2)
        assert_same(got_model, want_model)
        assert_same(got_opt, want_opt)
        dist.barrier()  # nobody tears gloo down while a peer is still in a collective
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_ranks_fsdp2_save_interrupted_save_and_reload(tmp_path):
    _spawn(_two_rank_worker, 2, str(tmp_path / "ckpt"))
    assert [p.name for p in ck.list_checkpoints(tmp_path / "ckpt")] == ["step-00000001"]


# --- slow: resharding 4 -> 2 -> 1 ----------------------------------------------------------------


def _save4_worker(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    try:
        root = Path(out)
        torch.manual_seed(100 + rank)
        m = fsdp_model(world)
        opt = make_opt(m.parameters())
        for step in range(2):
            train_step(m, opt, step, rank, world)
        ck.save(root / "ckpt", 2, [m], opt, {"seed": 7, "data": {"sequences_seen": 2 * GLOBAL_BATCH}})
        model_sd, opt_sd = full_state(m, opt)
        loss = train_step(m, opt, 2, rank, world)  # what the next step gives on 4 ranks
        next_sd, _ = full_state(m, opt)
        losses = [None] * world
        dist.all_gather_object(losses, loss)
        if rank == 0:
            torch.save({"model": model_sd, "opt": opt_sd, "next": next_sd, "loss": sum(losses) / world}, root / "ref.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _load2_worker(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    try:
        root = Path(out)
        ref = torch.load(root / "ref.pt", weights_only=False)
        m = fsdp_model(world, seed=9)
        opt = make_opt(m.parameters())
        extra = ck.load(root / "ckpt", [m], opt)
        info = extra["_resume"]
        assert info["saved_world_size"] == 4 and info["world_size"] == 2 and info["resharded"]
        assert info["rng"].startswith(f"reseeded from (seed=7, step=2, rank={rank})"), info
        assert extra["data"] == {"sequences_seen": 2 * GLOBAL_BATCH}
        model_sd, opt_sd = full_state(m, opt)
        assert_same(model_sd, ref["model"])
        assert_same(opt_sd, ref["opt"])
        loss = train_step(m, opt, 2, rank, world)  # training continues as it would on 4 ranks
        losses = [None] * world
        dist.all_gather_object(losses, loss)
        assert abs(sum(losses) / world - ref["loss"]) < 1e-5
        next_sd, _ = full_state(m, opt)
        assert_same(next_sd, ref["next"], exact=False, atol=1e-6)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fsdp2_checkpoint_from_4_ranks_reloads_on_2_ranks_and_one_process(tmp_path):
    _spawn(_save4_worker, 4, str(tmp_path))
    _spawn(_load2_worker, 2, str(tmp_path))

    # One process, no process group, no sharding.
    ref = torch.load(tmp_path / "ref.pt", weights_only=False)
    m = plain_model(seed=9)
    opt = make_opt(m.parameters())
    extra = ck.load(tmp_path / "ckpt", [m], opt, seed=11)
    assert extra["_resume"]["rng"].startswith("reseeded from (seed=11, step=2, rank=0)")
    model_sd, opt_sd = full_state(m, opt)
    assert_same(model_sd, ref["model"])
    assert_same(opt_sd, ref["opt"])
    train_step(m, opt, 2)
    assert_same(full_state(m, opt)[0], ref["next"], exact=False, atol=1e-6)


# --- slow: ZeRO (runtime/parallel/zero.py, dcp hooks) -> FSDP2 and one process ---------------------


def _zero_save_worker(rank: int, world: int, store: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from runtime.parallel.zero import ZeroOptimizer

    _init(rank, world, store)
    try:
        root = Path(out)
        m = plain_model()
        opt = ZeroOptimizer(m, init_device_mesh("cpu", (world,)), stage=2, lr=LR, weight_decay=0.1)
        for step in range(2):
            train_step(m, opt, step, rank, world)
        ck.save(root / "ckpt", 2, [m], opt, {"seed": 7})
        st = opt.dcp_state_dict()["state"]
        ref_opt = {f"state.{n}.{w}": t.detach().clone() for n, d in st.items() for w, t in d.items()}
        if rank == 0:
            torch.save({"model": {k: v.clone() for k, v in m.state_dict().items()}, "opt": ref_opt}, root / "ref.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _fsdp_load_worker(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    try:
        root = Path(out)
        ref = torch.load(root / "ref.pt", weights_only=False)
        m = fsdp_model(world, seed=9)
        opt = make_opt(m.parameters())
        extra = ck.load(root / "ckpt", [m], opt)
        assert extra["_resume"]["optimizer"] == "torch-dcp" and extra["_resume"]["rng"] == "restored"
        model_sd, opt_sd = full_state(m, opt)
        assert_same(model_sd, ref["model"])
        assert_same({k: v for k, v in opt_sd.items() if k.startswith("state.")}, ref["opt"])
        assert opt_sd[f"param_groups.{next(iter(model_sd))}.lr"] == LR  # hyper-parameters stay the running ones
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_zero_checkpoint_reloads_into_fsdp2_and_one_process(tmp_path):
    pytest.importorskip("runtime.parallel.zero")
    _spawn(_zero_save_worker, 2, str(tmp_path))
    _spawn(_fsdp_load_worker, 2, str(tmp_path))
    ref = torch.load(tmp_path / "ref.pt", weights_only=False)
    m = plain_model(seed=9)
    opt = make_opt(m.parameters())
    ck.load(tmp_path / "ckpt", [m], opt)
    model_sd, opt_sd = full_state(m, opt)
    assert_same(model_sd, ref["model"])
    assert_same({k: v for k, v in opt_sd.items() if k.startswith("state.")}, ref["opt"])
