"""Interleaved pipelines charged by the layers each rank holds (planner/cost/pipeline.py): the
closed form against a brute force over every contiguous split, vpp == 1 unchanged, no worse
than the old per-chunk charge, and the emitted stages equal to what the cost model assumed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from machine_models import load_machine
from planner.cost import compute, step
from planner.cost.layout import Layouts
from planner.cost.pipeline import bottleneck_chunk, chunk_bottleneck, interleaved_chunks, rank_bottleneck, rank_layers
from planner.emit import build_plan
from planner.inputs import make_job
from planner.presets import get_model
from planner.schema.plan import plan_problems


def old_bottleneck_chunk(layers, chunks, head_weight):
    """planner/cost/step.py's bottleneck_chunk before the move, verbatim (the reference)."""
    S = np.asarray(chunks, dtype=np.float64)
    w = np.asarray(head_weight, dtype=np.float64)
    best = np.full(np.broadcast(S, w).shape, np.inf)
    blocks = np.zeros_like(best)
    k_star = (layers - w * (S - 1)) / np.maximum(S, 1)
    for k in (np.floor(k_star), np.ceil(k_star)):
        k = np.clip(k, 1, layers - S + 1)
        others = np.where(S > 1, np.ceil((layers - k) / np.maximum(S - 1, 1)), 0)
        load = np.maximum(others, k + w)
        better = load < best
        blocks = np.where(better, np.maximum(others, k), blocks)
        best = np.minimum(best, load)
    single = S == 1
    return np.where(single, layers + w, best), np.where(single, layers, blocks)


def splits(layers: int, chunks: int):
    """Every contiguous split of `layers` blocks into `chunks` non-empty chunks (their sizes)."""
    for cuts in itertools.combinations(range(1, layers), chunks - 1):
        b = (0, *cuts, layers)
        yield [b[i + 1] - b[i] for i in range(chunks)]


def rank_loads(sizes, pp: int, w: float) -> list[float]:
    """Per rank: its chunks' blocks (chunk i on rank i % pp) plus the head on rank pp - 1."""
    return [sum(sizes[r::pp]) + (w if r == pp - 1 else 0.0) for r in range(pp)]


def brute_force(layers: int, pp: int, vpp: int, w: float) -> float:
    return min(max(rank_loads(s, pp, w)) for s in splits(layers, pp * vpp))


def small_cases(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        pp, vpp = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        layers = int(rng.integers(pp * vpp, pp * vpp + 7))
        w = float(rng.choice([0.0, 1.0, 2.0, rng.uniform(0, 6)]))
        out.append((layers, pp, vpp, w))
    return out


@pytest.mark.parametrize("layers,pp,vpp,w", small_cases(150))
def test_rank_bottleneck_equals_brute_force(layers, pp, vpp, w):
    load, blocks = rank_bottleneck(layers, pp, vpp, w)
    assert float(load) == pytest.approx(brute_force(layers, pp, vpp, w), rel=1e-12, abs=1e-12)
    # The scalar split of the plan reaches the same load, with every chunk non-empty.
    sizes = interleaved_chunks(layers, pp, vpp, w)
    assert len(sizes) == pp * vpp and min(sizes) >= 1 and sum(sizes) == layers
    assert max(rank_loads(sizes, pp, w)) == float(load)
    assert max(sum(sizes[r::pp]) for r in range(pp)) <= float(blocks)


def test_rank_bottleneck_is_vectorised():
    cases = small_cases(200, seed=1)
    layers = 17
    cases = [(pp, vpp, w) for _, pp, vpp, w in cases if pp * vpp <= layers]
    pp, vpp, w = (np.asarray(c) for c in zip(*cases))
    load, _ = rank_bottleneck(layers, pp, vpp, w)
    assert load.shape == (len(cases),)
    for i, (p, v, h) in enumerate(cases):
        assert load[i] == float(rank_bottleneck(layers, p, v, h)[0])


def test_vpp_one_is_the_old_charge_exactly():
    rng = np.random.default_rng(2)
    layers = 80
    pp = np.repeat(np.arange(1, 81), 5)
    w = rng.uniform(0, 8, len(pp))
    old = old_bottleneck_chunk(layers, pp, w)
    for new in (bottleneck_chunk(layers, pp, w), rank_bottleneck(layers, pp, np.ones_like(pp), w),
                chunk_bottleneck(layers, pp, np.ones_like(pp), w)):
        np.testing.assert_array_equal(new[0], old[0])
        np.testing.assert_array_equal(new[1], old[1])


def test_rank_layers_water_filling():
    assert rank_layers(32, 4, 7, 0.0) == [8, 8, 8, 8]
    assert rank_layers(32, 4, 7, 3.0) == [9, 8, 8, 7]  # the head's rank keeps its 7 chunks of one block
    assert rank_layers(10, 2, 1, 0.0, first_weight=2.0) == [4, 6]
    with pytest.raises(ValueError):
        rank_layers(5, 2, 3)


def test_non_dividing_vpp_predicts_no_worse_than_the_old_charge():
    """Old: vpp x the largest of pp x vpp chunks. New: the busiest rank's blocks. Never more,
    and less where vpp x pp does not divide the layers."""
    rng = np.random.default_rng(3)
    strictly_better = 0
    for layers in range(4, 41):
        for pp in range(2, 9):
            for vpp in range(2, 9):
                if pp * vpp > layers:
                    continue
                w = rng.uniform(0, 4)
                new = float(rank_bottleneck(layers, pp, vpp, w)[0])
                old = vpp * float(old_bottleneck_chunk(layers, pp * vpp, w)[0])
                assert new <= old + 1e-12
                strictly_better += new < old - 1e-9
    assert strictly_better > 100
    # 32 layers, pp 4, vpp 7: old 7 x 2 (28 chunks, some of two blocks) = 14; new: 8 per rank.
    assert float(rank_bottleneck(32, 4, 7, 0.0)[0]) == 8.0
    assert 7 * float(old_bottleneck_chunk(32, 28, 0.0)[0]) == 14.0


def interleaved_7b(vpp: int):
    model, machine = get_model("protein-7b"), load_machine("dgx-h100")
    job = make_job(model, machine, 128, 1024, None, None, None)
    lay = Layouts.one(dp=4, mbs=32, gas=8, tp=8, pp=4, vpp=vpp, sharding="zero1")
    return model, machine, job, lay


@pytest.mark.parametrize("vpp", [3, 5, 7, 8])
def test_step_time_no_worse_than_the_old_charge(vpp, monkeypatch):
    model, machine, job, lay = interleaved_7b(vpp)
    new = step.evaluate(model, machine, job, lay)
    monkeypatch.setattr(step, "chunk_bottleneck", lambda L, pp, v, w: old_bottleneck_chunk(L, pp * v, w))
    old = step.evaluate(model, machine, job, lay)
    assert new.step_time_s[0] <= old.step_time_s[0] * (1 + 1e-12)
    if 32 % (4 * vpp):
        assert new.compute_s[0] < old.compute_s[0]


@pytest.mark.parametrize("vpp", [2, 3, 5, 7, 8])
def test_emitted_interleaved_stages_match_the_cost_model(vpp):
    """The plan's stages: each rank's chunks summed (the head on the last rank) have the
    cost model's busiest-rank load as their maximum; the plan is valid."""
    model, machine, job, lay = interleaved_7b(vpp)
    ev = step.evaluate(model, machine, job, lay)
    plan = build_plan(model, machine, job, 16, lay, ev, 0)
    assert plan_problems(plan) == []
    stages = plan.pipeline.stages
    assert len(stages) == 4 * vpp and all(s.last_layer > s.first_layer for s in stages)
    _, fb = compute.layer_times(model, machine, job, lay)
    w = float(compute.head_time(model, machine, job, lay)[0] / fb[0])
    per_rank = [0.0] * 4
    for s in stages:
        per_rank[s.pp_rank] += s.last_layer - s.first_layer
    per_rank[3] += w
    assert max(per_rank) == float(rank_bottleneck(model.layers, 4, vpp, w)[0])


def test_search_takes_a_non_dividing_vpp_when_it_wins():
    """protein-7b (32 layers) pinned to tp 8, pp 4 on 16 DGX H100 nodes: the best is interleaved
    with virtual stages that do not divide 32 / 4, charged 8 blocks per rank."""
    from planner.search.pins import Pins
    from planner.search.search import search

    model, machine, job, _ = interleaved_7b(2)
    res = search(model, machine, job, 16, top_k=10, pins=Pins(tp=8, pp=4))
    assert any(32 % (4 * v) for v in res.layouts.vpp)
