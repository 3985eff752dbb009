"""Layout search: hand-derivable winners, legality and completeness of the enumeration,
the fixed global batch, clear errors, and fast vs detailed scores."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from machine_models import load_machine
from planner.cost.layout import (
    RC_NONE,
    RECOMPUTES,
    SC_1F1B,
    SC_GPIPE,
    SC_INTERLEAVED,
    SC_NONE,
    SH_FSDP,
    SH_GRAD_OP,
    SH_HSDP,
    SH_NONE,
    SH_ZERO2,
    SHARDINGS,
    Layouts,
)
from planner.cost.step import evaluate, evaluate_space
from planner.schema.errors import PlanError
from planner.inputs import make_job
from planner.presets import get_model
from planner.search.axes import MAX_VIRTUAL_STAGES
from planner.search.space import enumerate_space, layout_problems
from planner.search.search import FINALISTS, search
from planner.schema.specs import (Algorithm, CollectiveLibrary, FrameworkProfile, MachineModel, ModelSpec, Overlap,
                                  Precision, TrainingJob)

GIB = 2.0**30


def two_device_machine(**kw) -> MachineModel:
    """One node of two devices on gloo (one algorithm: ring); figures chosen per test."""
    d = dict(name="pair", device_name="test device", devices_per_node=2, device_memory_gib=16.0,
             peak_tflops={Precision.fp32: 10.0, Precision.bf16: 100.0}, memory_bandwidth_gbyte_s=1000.0,
             intra_node_bandwidth_gbyte_s=100.0, intra_node_latency_us=5.0, nics_per_node=1, nic_gbit_s=100.0,
             inter_node_latency_us=5.0, topology="single-node", collective_library="gloo", algorithms=["ring"], nodes=1)
    d.update(kw)
    return MachineModel(**d)


def tiny(**kw) -> ModelSpec:
    d = dict(name="t", layers=4, hidden=128, heads=4, kv_heads=2, ffn_hidden=352, seq_len=128)
    d.update(kw)
    return ModelSpec(**d)


# --- winners derivable by hand --------------------------------------------------------------------


def test_latency_bound_network_picks_pure_data_parallelism():
    """Latency 1 s per message, bandwidth effectively free, nothing overlapped, a tiny model.
    Exposed messages per step on 2 ranks: dp2 = one ring allreduce = 2 steps (ZeRO-1: one
    reduce-scatter + one all-gather = 2); tp2 >= 4 blocks x 4 allreduces x 2 = 32 per
    micro-batch; pp2 >= 2 sends x (gas + 1) >= 6; cp2 = 4 blocks x 3 passes = 12. So dp2
    wins, with a step of 2 s plus (negligible) compute."""
    alpha_s = 1.0
    mach = two_device_machine(intra_node_latency_us=alpha_s * 1e6, inter_node_latency_us=alpha_s * 1e6,
                              intra_node_bandwidth_gbyte_s=1e6, nic_gbit_s=1e6, overlap=Overlap(dp=0, tp=0, pp=0, cp=0))
    model = tiny()
    job = TrainingJob(global_batch=8, seq_len=128, precision="bf16")
    res = search(model, mach, job, nodes=1, top_k=5)
    best = res.layouts.row(0)
    assert (best["pp"], best["tp"], best["cp"], best["dp_replicate"] * best["dp_shard"]) == (1, 1, 1, 2)
    assert SHARDINGS[best["sharding"]].value in ("none", "zero1", "zero2")
    # 2 alpha; compute of a 0.7M-parameter model on 8 x 128 tokens is < 1 ms here.
    assert res.evaluation.step_time_s[0] == pytest.approx(2 * alpha_s, rel=1e-2)
    # Every layout with tp, pp or cp is at least 3x slower (6 alpha for the best pipeline).
    ev = evaluate(model, mach, job, enumerate_space(model, job, 2).layouts())
    others = ev.space.units.tp[ev.space.unit] * ev.space.units.pp[ev.space.unit] * ev.space.units.cp[ev.space.unit] > 1
    assert ev.step_time_s[others].min() >= 6 * alpha_s


def test_memory_forces_sharding():
    """A 1-layer, 1-head model with an odd sequence length has no tp, pp or cp: the only
    layouts of 2 ranks are dp 2 under each sharding. Bytes per parameter of this 16.8M-
    parameter model on 2 ranks (bf16), states + buffers (memory.py's accounting):
      none          18 + 3 (two 25 MB DDP buckets = 50e6 / 16.8e6 B/param)  = 21
      zero1         6 + 12/2 + 3                                          = 15
      zero2         2 + 16/2 + 3                                          = 13
      fsdp-grad-op  16/2 + 2 (whole 16-bit stage kept gathered) + 4 (one block of fp32 grads) = 14
      fsdp          16/2 + 2 (the only block, gathered) + 4               = 14
    Activations of one 127-token sequence are ~6.5 MB. With room for 13.7 B/param + 8 MB
    only zero2 fits, and the search must pick it (16-bit weights: a framework that keeps fp32
    weights under autocast holds 4 bytes a parameter more under ZeRO)."""
    from planner.cost import flops

    model = ModelSpec(name="wide", layers=1, hidden=1024, heads=1, kv_heads=1, ffn_hidden=4096, seq_len=127)
    P = flops.total_params(model)
    assert P == 16_843_776
    cap_gib = (13.7 * P + 8e6) / GIB
    mach = two_device_machine(device_memory_gib=cap_gib, memory_reserve_gib=0.0, fragmentation_fraction=0.0)
    # Gradients held through the step (flat buffers), as the accounting above counts them; torch's
    # set_to_none would leave them out of a one-micro-batch step's forward peak (step._row_memory).
    # 16-bit weights (no autocast on fp32 weights, whose ZeRO holds 4 bytes more a parameter).
    job = TrainingJob(global_batch=2, seq_len=127, precision="bf16",
                      framework=FrameworkProfile(grads_freed_between_steps=False, weight_bytes_per_param=0.0))
    lay = enumerate_space(model, job, 2).layouts()
    assert set(lay.tp) == set(lay.pp) == set(lay.cp) == {1}
    ev = evaluate(model, mach, job, lay)
    fits = {SHARDINGS[s].value for s, f in zip(lay.sharding, ev.memory.fits) if f}
    assert fits == {"zero2"}
    res = search(model, mach, job, nodes=1)
    assert res.layouts.sharding[0] == SH_ZERO2
    assert res.fitting == int(ev.memory.fits.sum())
    assert res.fitting == len(RECOMPUTES)  # zero2 under each recompute level


def test_fsdp_never_gathers_more_than_its_stage():
    """FSDP gathers the block in use and the prefetched one, but never more blocks than the
    stage holds: with one block per stage (pp = layers) it holds less than fsdp-grad-op,
    which keeps the whole stage (block + embedding or head) gathered."""
    from planner.cost import flops, memory

    model, job = get_model("protein-3.5b"), TrainingJob(global_batch=64, seq_len=512)
    lay = Layouts.concat([
        Layouts(pp=16, dp_replicate=1, dp_shard=4, cp=1, tp=1, mbs=1, gas=16, vpp=1, schedule=SC_1F1B, sharding=s,
                recompute=RC_NONE, sp=0) for s in (SH_FSDP, SH_GRAD_OP)])
    fsdp, grad_op = memory.buffer_bytes(model, job, lay)
    block = flops.layer_params(model)
    assert fsdp == pytest.approx(block * 2 + block * 4, rel=1e-12)  # one 16-bit block + its fp32 gradients
    assert fsdp < grad_op


@pytest.mark.parametrize("model_name,machine_name,nodes", [
    ("protein-small", "aurora", 2),  # oneCCL: four allreduce and two rs/ag algorithms
    ("protein-3.5b", "dgx-h100", 2),
    ("protein-tiny", "frontier", 4),
])
def test_search_finds_the_exhaustive_optimum(model_name, machine_name, nodes):
    """Score every legal layout with the detailed (library-consistent) model: the search's
    best has the least step time of all that fit (exactly: same arithmetic)."""
    model, mach = get_model(model_name), load_machine(machine_name)
    world = nodes * mach.devices_per_node
    job = make_job(model, mach, world, None, None, None, None)
    res = search(model, mach, job, nodes)
    ev = evaluate(model, mach, job, enumerate_space(model, job, world).layouts())
    best = np.where(ev.memory.fits, ev.step_time_s, np.inf).min()
    assert res.evaluation.step_time_s[0] == pytest.approx(best, rel=1e-12)
    assert list(res.evaluation.step_time_s) == sorted(res.evaluation.step_time_s)
    assert res.total_layouts == len(ev)


# --- legality and completeness ------------------------------------------------------------------


def brute_force_layouts(model: ModelSpec, job: TrainingJob, world: int) -> set[tuple]:
    """Every legal layout, from the rules in planner/search/space.py's docstring, written
    out directly: (pp, dp_replicate, dp_shard, cp, tp, mbs, gas, vpp, schedule, sharding,
    recompute, sp)."""
    out = set()
    rng = range(1, world + 1)
    for pp, dp, cp, tp in itertools.product(rng, rng, rng, rng):
        if pp * dp * cp * tp != world:
            continue
        if model.heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
            continue
        if cp > 1 and job.seq_len % (2 * cp):
            continue
        if pp > model.layers:
            continue
        for mbs in range(1, job.global_batch + 1):
            if job.global_batch % (mbs * dp):
                continue
            gas = job.global_batch // (mbs * dp)
            if pp == 1:
                pipes = [(SC_NONE, 1)]
            elif gas < pp:
                pipes = []
            else:
                pipes = [(SC_GPIPE, 1), (SC_1F1B, 1)]
                if gas % pp == 0:
                    pipes += [(SC_INTERLEAVED, v) for v in range(2, MAX_VIRTUAL_STAGES + 1) if pp * v <= model.layers]
            if dp * cp == 1:
                shards = [(SH_NONE, 1, 1)]
            else:
                shards = [(SH_NONE, dp, 1)] + [(k, 1, dp) for k in range(len(SHARDINGS)) if k not in (SH_NONE, SH_HSDP)]
                shards += [(SH_HSDP, dp // g, g) for g in range(2, dp + 1) if dp % g == 0 and dp // g >= 2]
            for (sched, v), (kind, rep, shard), rc, sp in itertools.product(pipes, shards, range(len(RECOMPUTES)), (0, 1)):
                if sp and tp == 1:
                    continue
                out.add((pp, rep, shard, cp, tp, mbs, gas, v, sched, kind, rc, sp))
    return out


def as_tuples(lay: Layouts) -> list[tuple]:
    cols = [lay.pp, lay.dp_replicate, lay.dp_shard, lay.cp, lay.tp, lay.mbs, lay.gas, lay.vpp, lay.schedule,
            lay.sharding, lay.recompute, lay.sp]
    return [tuple(int(x) for x in row) for row in zip(*cols)]


@pytest.mark.parametrize("world,gb,layers,seq", [(8, 16, 8, 64), (12, 24, 24, 48), (16, 32, 4, 128), (6, 6, 3, 30)])
def test_enumeration_equals_brute_force(world, gb, layers, seq):
    model = tiny(layers=layers, heads=4, kv_heads=2, ffn_hidden=96, hidden=64, seq_len=seq)
    job = TrainingJob(global_batch=gb, seq_len=seq)
    got = as_tuples(enumerate_space(model, job, world).layouts())
    assert len(got) == len(set(got)), "duplicate layouts"
    assert set(got) == brute_force_layouts(model, job, world)


def test_enumeration_hits_the_virtual_stage_cap():
    # 24 layers on pp 2 would allow v up to 12; the enumerator stops at MAX_VIRTUAL_STAGES.
    model = tiny(layers=24)
    job = TrainingJob(global_batch=4, seq_len=128)
    lay = enumerate_space(model, job, 2).layouts()
    assert lay.vpp.max() == MAX_VIRTUAL_STAGES == 8


@pytest.mark.parametrize("model_name,machine_name,nodes", [
    ("protein-3.5b", "aurora", 8), ("protein-70b", "frontier", 16), ("protein-7b", "dgx-h100", 4)])
def test_every_enumerated_layout_is_legal_and_keeps_the_batch(model_name, machine_name, nodes):
    model, mach = get_model(model_name), load_machine(machine_name)
    world = nodes * mach.devices_per_node
    job = make_job(model, mach, world, None, None, None, None)
    space = enumerate_space(model, job, world)
    lay = space.layouts()
    assert len(lay) > 1000
    # The global batch is never changed: every row, vectorised.
    assert np.all(lay.mbs * lay.gas * lay.dp == job.global_batch)
    assert np.all(lay.world == world)
    rows = np.random.default_rng(0).choice(len(lay), size=300, replace=False)
    for i in rows:
        assert layout_problems(model, job, world, lay.take([i])) == [], lay.row(i)


def test_layout_problems_names_each_broken_rule():
    model, job = get_model("protein-3.5b"), TrainingJob(global_batch=64, seq_len=512)

    def problems(**kw):
        d = dict(pp=1, dp_replicate=8, dp_shard=1, cp=1, tp=1, mbs=8, gas=1, vpp=1, schedule=SC_NONE, sharding=SH_NONE,
                 recompute=RC_NONE, sp=0)
        d.update(kw)
        return " | ".join(layout_problems(model, job, 8, Layouts(**d)))

    assert problems() == ""
    assert problems(tp=2).startswith("degrees:")
    assert "tp: 3 does not divide model.heads" in problems(tp=3, dp_replicate=1, pp=1, mbs=64)  # world is wrong too
    assert problems(pp=2, dp_replicate=4, mbs=8, gas=2, schedule=SC_1F1B) == ""
    assert "schedule:" in problems(pp=2, dp_replicate=4, mbs=16, gas=1, schedule=SC_1F1B)
    assert "mbs:" in problems(mbs=3)
    assert "sp:" in problems(sp=1)
    assert "shard_group:" in problems(sharding=SH_HSDP, dp_replicate=1, dp_shard=8)
    assert "cp: 2 x cp = 6 does not divide the sequence length 512" in problems(cp=3)
    assert "pp: 40 stages for 16 layers" in problems(pp=40)


# --- errors ---------------------------------------------------------------------------------------


def test_global_batch_with_no_layout_lists_batches_that_work():
    """One layer, one head and an odd sequence: no tp, pp or cp, so dp is the whole world
    (2 ranks) and must divide the batch. Batch 3 has no layout; 2 and 4 do."""
    model = ModelSpec(name="one", layers=1, hidden=64, heads=1, kv_heads=1, ffn_hidden=128, seq_len=127)
    mach = two_device_machine()
    job = TrainingJob(global_batch=3, seq_len=127)
    with pytest.raises(PlanError) as err:
        search(model, mach, job, nodes=1)
    msg = str(err.value)
    assert err.value.field == "global_batch"
    assert "global batch 3" in msg and "never changed" in msg
    listed = [int(x) for x in msg.split("Global batches that work here:")[1].split(",")]
    assert sorted(listed) == [2, 4]
    for b in listed:
        assert len(enumerate_space(model, job.model_copy(update={"global_batch": b}), 2)) > 0


def test_model_that_fits_nowhere_names_needed_and_available_gib():
    model, mach = get_model("protein-70b"), load_machine("dgx-h100")
    job = make_job(model, mach, 8, None, None, None, None)
    with pytest.raises(PlanError) as err:
        search(model, mach, job, nodes=1)
    msg = str(err.value)
    assert err.value.field == "memory"
    space = enumerate_space(model, job, 8)
    least_gib = evaluate_space(model, mach, job, space, detail=False).memory_bytes.min() / GIB
    assert least_gib > 80
    assert f"needs {least_gib:.1f} GiB per device" in msg
    assert "a device has 80.0 GiB" in msg


def test_more_nodes_than_the_machine_has():
    model, mach = get_model("protein-tiny"), load_machine("dgx-h100")
    job = TrainingJob(global_batch=8, seq_len=128)
    with pytest.raises(PlanError, match="nodes"):
        search(model, mach, job, nodes=mach.nodes + 1)


# --- fast vs detailed scores ---------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 3])
def test_fast_equals_detailed_with_one_algorithm(nodes):
    """gloo offers only ring: the fast scores (each communicator's cheapest algorithm) and
    the library-consistent ones are the same sums. 1e-9 relative: identical arithmetic
    except for the order of a few additions."""
    mach = load_machine("dgx-h100").model_copy(
        update={"collective_library": CollectiveLibrary.gloo, "algorithms": [Algorithm.ring], "nodes": 4})
    model = get_model("protein-small")
    world = nodes * mach.devices_per_node
    job = make_job(model, mach, world, None, None, None, None)
    res = search(model, mach, job, nodes, top_k=FINALISTS)
    fast = evaluate(model, mach, job, res.layouts, fast=True).step_time_s
    np.testing.assert_allclose(fast, res.evaluation.step_time_s, rtol=1e-9, atol=0)
    # And over the whole space, not only the finalists.
    space = enumerate_space(model, job, world)
    a = evaluate_space(model, mach, job, space, fast=True, detail=False).step_time_s
    b = evaluate_space(model, mach, job, space, fast=False, detail=False).step_time_s
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=0)


def test_local_machine_fast_equals_detailed():
    from machine_models import detect_local_machine

    mach = detect_local_machine(2)
    model = get_model("protein-tiny")
    job = TrainingJob(global_batch=8, seq_len=128, precision="fp32")
    res = search(model, mach, job, 1, top_k=10)
    fast = evaluate(model, mach, job, res.layouts, fast=True).step_time_s
    np.testing.assert_allclose(fast, res.evaluation.step_time_s, rtol=1e-9, atol=0)


def test_fast_is_a_lower_bound_with_many_algorithms_nccl():
    # NCCL: ring/tree allreduce, ring-only rs/ag: each term's cheapest is the row's optimum.
    model, mach = get_model("protein-3.5b"), load_machine("dgx-h100")
    world = 32
    job = make_job(model, mach, world, None, None, None, None)
    space = enumerate_space(model, job, world)
    fast = evaluate_space(model, mach, job, space, fast=True, detail=False).step_time_s
    detailed = evaluate_space(model, mach, job, space, fast=False, detail=False).step_time_s
    assert np.all(fast <= detailed * (1 + 1e-12))


def test_fast_is_a_lower_bound_with_oneccl():
    """oneCCL offers ring and hierarchical reduce-scatter/all-gather. ZeRO-2 repeats its
    reduce-scatters every micro-batch and its all-gather once, so the cheapest algorithm must
    be chosen on exposed time, not on total traffic (this row once scored 0.16% above the
    library-consistent one). Checked on the row and on the whole space."""
    model, mach = get_model("protein-3.5b"), load_machine("aurora")
    world = 4 * mach.devices_per_node
    job = make_job(model, mach, world, None, None, None, None)
    lay = Layouts(pp=1, dp_replicate=1, dp_shard=3, cp=4, tp=4, mbs=1, gas=128, vpp=1, schedule=SC_NONE,
                  sharding=SH_ZERO2, recompute=RC_NONE, sp=0)
    assert layout_problems(model, job, world, lay) == []
    fast = evaluate(model, mach, job, lay, fast=True).step_time_s[0]
    detailed = evaluate(model, mach, job, lay, fast=False).step_time_s[0]
    assert fast <= detailed * (1 + 1e-12)
    space = enumerate_space(model, job, world)
    fast = evaluate_space(model, mach, job, space, fast=True, detail=False).step_time_s
    detailed = evaluate_space(model, mach, job, space, fast=False, detail=False).step_time_s
    assert np.all(fast <= detailed * (1 + 1e-12))


def test_scores_without_detail_take_the_best_job_wide_algorithms():
    """fast=False scores (detail=False, float32) are the best library-consistent algorithm pair
    of each row, as the detailed evaluation's step time is (once the last pair tried won)."""
    model, mach = get_model("protein-3.5b"), load_machine("aurora")
    world = 4 * mach.devices_per_node
    job = make_job(model, mach, world, None, None, None, None)
    space = enumerate_space(model, job, world)
    scores = evaluate_space(model, mach, job, space, fast=False, detail=False).step_time_s
    detailed = evaluate_space(model, mach, job, space, fast=False, detail=True).step_time_s
    np.testing.assert_allclose(scores, detailed, rtol=1e-5)


def test_scores_without_memory_rank_as_the_full_scores():
    """evaluate_space(memory=False), which the robustness draws use: the same step times, row for
    row, as the scores the search ranks by; memory and fit left out; refused with detail."""
    model, machine = get_model("protein-3.5b"), load_machine("frontier")
    world = 8 * machine.devices_per_node
    job = make_job(model, machine, world, 512, None, None, None)
    space = enumerate_space(model, job, world)
    full = evaluate_space(model, machine, job, space, detail=False)
    quick = evaluate_space(model, machine, job, space, detail=False, memory=False)
    assert len(space) > 100 and np.array_equal(full.step_time_s, quick.step_time_s)
    assert np.isnan(quick.memory_bytes).all() and not quick.fits.any() and full.fits.any()
    with pytest.raises(ValueError, match="detail=False"):
        evaluate_space(model, machine, job, space, memory=False)


def test_scores_in_chunks_match_scores_at_once(monkeypatch):
    """The search scores rows ROW_CHUNK at a time; chunk boundaries change no row's score."""
    import planner.cost.step as step

    model, machine = get_model("protein-3.5b"), load_machine("frontier")
    world = 8 * machine.devices_per_node
    job = make_job(model, machine, world, 512, None, None, None)
    space = enumerate_space(model, job, world)
    monkeypatch.setattr(step, "ROW_CHUNK", len(space) + 1)
    whole = evaluate_space(model, machine, job, space, detail=False)
    monkeypatch.setattr(step, "ROW_CHUNK", 97)  # many chunks, the last one short
    assert len(space) > 10 * 97 and len(space) % 97
    chunked = evaluate_space(model, machine, job, space, detail=False)
    assert np.array_equal(whole.step_time_s, chunked.step_time_s)
    assert np.array_equal(whole.memory_bytes, chunked.memory_bytes) and np.array_equal(whole.fits, chunked.fits)
    assert whole.fits.any() and not whole.fits.all()
