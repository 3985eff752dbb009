"""Stage partitioning: DP vs brute force, CP-SAT vs DP, memory caps and first/last extras."""

import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from planner.schema.errors import PlanError
from planner.search.stages import assign_stages, balanced_split, min_max_stage_cost


def splits(n, s):
    for cuts in itertools.combinations(range(1, n), s - 1):
        b = (0, *cuts, n)
        yield list(zip(b[:-1], b[1:]))


def brute(costs, s, mem=None, caps=None, xc=(0, 0), xm=(0, 0)):
    best = math.inf
    for r in splits(len(costs), s):
        extra = lambda x, k: (x[0] if k == 0 else 0) + (x[1] if k == s - 1 else 0)
        if mem is not None and any(sum(mem[a:b]) + extra(xm, k) > caps[k] for k, (a, b) in enumerate(r)):
            continue
        best = min(best, max(sum(costs[a:b]) + extra(xc, k) for k, (a, b) in enumerate(r)))
    return best


def check_ranges(ranges, n, s):
    assert len(ranges) == s and ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a < b for a, b in ranges)
    assert all(ranges[k][1] == ranges[k + 1][0] for k in range(s - 1))


costs_st = st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=9)


@settings(max_examples=300, deadline=None)
@given(costs_st, st.data())
def test_dp_matches_brute_force(costs, data):
    s = data.draw(st.integers(1, len(costs)))
    ranges = balanced_split(costs, s)
    check_ranges(ranges, len(costs), s)
    opt = min_max_stage_cost(tuple(costs), s)
    assert opt == pytest.approx(brute(costs, s), rel=1e-9, abs=1e-9)
    assert max(sum(costs[a:b]) for a, b in ranges) == pytest.approx(opt, rel=1e-9, abs=1e-9)


def test_dp_bad_input():
    with pytest.raises(PlanError):
        balanced_split([1, 2], 3)
    with pytest.raises(PlanError):
        balanced_split([1, 2], 0)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.floats(0.1, 50), min_size=2, max_size=24), st.data())
def test_cpsat_matches_dp_when_caps_loose(costs, data):
    s = data.draw(st.integers(1, len(costs)))
    xc = data.draw(st.tuples(st.floats(0, 100), st.floats(0, 100)))
    sol = assign_stages(costs, [1.0] * len(costs), s, 1e9, first_extra_cost=xc[0],
                        last_extra_cost=xc[1], use_dp_shortcut=False)
    folded = list(costs)
    folded[0] += xc[0]
    folded[-1] += xc[1]
    assert sol.feasible and sol.optimal and sol.status == "OPTIMAL"
    check_ranges(sol.ranges, len(costs), s)
    assert sol.max_cost == pytest.approx(min_max_stage_cost(folded, s), rel=1e-5)
    fast = assign_stages(costs, [1.0] * len(costs), s, math.inf, first_extra_cost=xc[0],
                         last_extra_cost=xc[1])
    assert fast.status == "dp" and fast.max_cost == pytest.approx(sol.max_cost, rel=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=2, max_size=8),
       st.data())
def test_cpsat_matches_constrained_brute_force(layers, data):
    costs, mem = [float(c) for c, _ in layers], [float(m) for _, m in layers]
    s = data.draw(st.integers(1, len(layers)))
    caps = data.draw(st.lists(st.integers(1, 60), min_size=s, max_size=s))
    xm = data.draw(st.tuples(st.integers(0, 5), st.integers(0, 5)))
    sol = assign_stages(costs, mem, s, [float(c) for c in caps], first_extra_memory=xm[0],
                        last_extra_memory=xm[1], first_extra_cost=2.0)
    expect = brute(costs, s, mem, caps, xc=(2.0, 0), xm=xm)
    check_ranges(sol.ranges, len(costs), s)
    if math.isinf(expect):
        assert not sol.feasible
    else:
        assert sol.feasible and sol.optimal
        assert sol.max_cost == pytest.approx(expect, rel=1e-5)
        assert all(m <= c for m, c in zip(sol.stage_memory, caps))


@pytest.mark.parametrize("shortcut", [True, False])
def test_tight_cap_forces_different_split(shortcut):
    costs, mem = [1.0] * 6, [4.0, 1, 1, 1, 1, 1]
    assert balanced_split(costs, 3) == [(0, 2), (2, 4), (4, 6)]  # stage 0 memory 5 > 4
    sol = assign_stages(costs, mem, 3, 4.0, use_dp_shortcut=shortcut)
    assert sol.feasible and sol.optimal and sol.status == "OPTIMAL"
    assert sol.ranges[0] == (0, 1) and sol.max_cost == pytest.approx(3.0)
    assert max(sol.stage_memory) <= 4.0
    # a per-stage cap list: only the first stage is tight
    sol = assign_stages(costs, [1.0] * 6, 3, [1.0, 10, 10], use_dp_shortcut=shortcut)
    assert sol.ranges[0] == (0, 1) and sol.max_cost == pytest.approx(3.0)


def test_infeasible_cap_returns_dp_split():
    sol = assign_stages([1.0, 2, 3, 4], [5.0] * 4, 2, 4.0)
    assert not sol.feasible and not sol.optimal and sol.status == "INFEASIBLE"
    assert sol.ranges == balanced_split([1.0, 2, 3, 4], 2)
    assert assign_stages([1.0] * 4, [1.0] * 4, 2, [10.0, 10], first_extra_memory=20).feasible is False


@pytest.mark.parametrize("shortcut", [True, False])
def test_extras_push_layers_off_first_and_last_stage(shortcut):
    sol = assign_stages([1.0] * 8, [1.0] * 8, 4, 100.0, last_extra_cost=3.0, use_dp_shortcut=shortcut)
    assert sol.ranges[-1] == (7, 8) and sol.max_cost == pytest.approx(4.0)
    sol = assign_stages([1.0] * 8, [1.0] * 8, 4, 100.0, first_extra_cost=3.0, use_dp_shortcut=shortcut)
    assert sol.ranges[0] == (0, 1) and sol.stage_costs[0] == pytest.approx(4.0)
    # embedding memory: stage 0 can hold only one layer under a 5-unit cap
    sol = assign_stages([1.0] * 8, [1.0] * 8, 4, 5.0, first_extra_memory=4.0, use_dp_shortcut=shortcut)
    assert sol.feasible and sol.ranges[0] == (0, 1) and sol.stage_memory[0] == pytest.approx(5.0)
    assert sol.max_cost == pytest.approx(3.0)


def test_single_stage_carries_both_extras():
    sol = assign_stages([1.0, 2.0], [1.0, 1.0], 1, 10.0, first_extra_cost=1, last_extra_cost=2,
                        first_extra_memory=3, last_extra_memory=4)
    assert sol.ranges == [(0, 2)] and sol.max_cost == 6.0 and sol.stage_memory == [9.0]


def test_bad_cap_list_length():
    with pytest.raises(PlanError):
        assign_stages([1.0] * 4, [1.0] * 4, 2, [1.0, 2.0, 3.0])


# --- interleaved: stages grouped by rank (stage s on rank s % ranks) ----------------------------


def brute_ranks(costs, s, ranks, mem, caps, xc=(0, 0), xm=(0, 0)):
    """Min over contiguous splits of the slowest rank (its stages summed), per-rank memory caps."""
    best = math.inf
    for r in splits(len(costs), s):
        extra = lambda x, k: (x[0] if k == 0 else 0) + (x[1] if k == s - 1 else 0)
        load = [0.0] * ranks
        used = [0.0] * ranks
        for k, (a, b) in enumerate(r):
            load[k % ranks] += sum(costs[a:b]) + extra(xc, k)
            used[k % ranks] += sum(mem[a:b]) + extra(xm, k)
        if all(u <= c for u, c in zip(used, caps)):
            best = min(best, max(load))
    return best


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(2, 3), st.data())
def test_ranks_cpsat_matches_brute_force(ranks, v, data):
    s = ranks * v
    n = data.draw(st.integers(s, s + 4))
    costs = [float(c) for c in data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))]
    mem = [float(m) for m in data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))]
    caps = [float(c) for c in data.draw(st.lists(st.integers(5, 40), min_size=ranks, max_size=ranks))]
    xc, xm = (1.0, 2.5), (3.0, 1.0)
    sol = assign_stages(costs, mem, s, caps, first_extra_cost=xc[0], last_extra_cost=xc[1], first_extra_memory=xm[0],
                        last_extra_memory=xm[1], ranks=ranks)
    expect = brute_ranks(costs, s, ranks, mem, caps, xc, xm)
    check_ranges(sol.ranges, n, s)
    if math.isinf(expect):
        assert not sol.feasible
        return
    assert sol.feasible and sol.optimal
    assert sol.max_cost == pytest.approx(expect, rel=1e-5)
    assert max(sol.rank_costs) == sol.max_cost and len(sol.rank_costs) == ranks
    assert all(m <= c * (1 + 1e-5) for m, c in zip(sol.rank_memory, caps))


@pytest.mark.parametrize("layers,ranks,v,head", [(32, 4, 7, 0.0), (32, 4, 7, 2.6), (16, 4, 3, 1.3), (10, 3, 2, 0.4)])
def test_ranks_equal_costs_take_the_cost_models_split(layers, ranks, v, head):
    from planner.cost.pipeline import rank_bottleneck

    sol = assign_stages([1.0] * layers, [1.0] * layers, ranks * v, math.inf, last_extra_cost=head, ranks=ranks)
    assert sol.status == "even" and sol.optimal and sol.feasible
    check_ranges(sol.ranges, layers, ranks * v)
    assert sol.max_cost == float(rank_bottleneck(layers, ranks, v, head)[0])
    cp_sat = assign_stages([1.0] * layers, [1.0] * layers, ranks * v, 1e9, last_extra_cost=head, ranks=ranks,
                           use_dp_shortcut=False)
    assert cp_sat.status == "OPTIMAL" and cp_sat.max_cost == pytest.approx(sol.max_cost, rel=1e-5)


def test_ranks_per_rank_memory_cap():
    # 12 equal layers, 2 ranks x 2 chunks; rank 0 also holds an embedding of 4 units of memory.
    # Unconstrained: 6 + 6 blocks. A cap of 8 per rank leaves rank 0 room for 4 blocks.
    sol = assign_stages([1.0] * 12, [1.0] * 12, 4, 8.0, first_extra_memory=4.0, ranks=2)
    assert sol.feasible and sol.optimal
    assert sol.rank_memory[0] <= 8.0 + 1e-9 and sol.max_cost == pytest.approx(8.0)


def test_ranks_must_divide_the_stages():
    with pytest.raises(PlanError) as err:
        assign_stages([1.0] * 6, [1.0] * 6, 4, 10.0, ranks=3)
    assert err.value.field == "ranks"
