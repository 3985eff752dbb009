"""Alpha-beta collective costs: closed forms by hand, placement, and the large-scale lesson.

Numbers below are worked by hand; every comparison of a closed form is to 1e-12 relative
(floating-point rounding of a handful of operations), never looser.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from machine_models import load_machine
from planner.cost import comm
from planner.cost.topology import LinkTiers, link_tiers

ALPHA = 5e-6  # s
BETA = 10e9  # bytes/s
MB = 1e6
EXACT = dict(rel=1e-12, abs=0.0)


def tiers(dpn=8, intra=100e9, intra_lat=2e-6, injection=100e9, inter_lat=5e-6, taper=1.0, group=10**9) -> LinkTiers:
    return LinkTiers(intra_bandwidth_Bps=intra, intra_latency_s=intra_lat, node_injection_Bps=injection,
                     inter_latency_s=inter_lat, global_taper=taper, nodes_per_group=group, devices_per_node=dpn)


# --- flat algorithms, by hand ------------------------------------------------------------------


def test_ring_allreduce_by_hand():
    # n = 4, M = 100 MB: 2 x 3 x 5 us + 2 x 3/4 x 100e6 / 10e9 = 30 us + 15 ms.
    assert float(comm.ring_allreduce(4, 100 * MB, ALPHA, BETA)) == pytest.approx(30e-6 + 15e-3, **EXACT)
    # n = 2, M = 1 MB: 2 x 5 us + 1e6 / 10e9 = 10 us + 100 us.
    assert float(comm.ring_allreduce(2, 1 * MB, ALPHA, BETA)) == pytest.approx(110e-6, **EXACT)
    # n = 1: nothing to do.
    assert float(comm.ring_allreduce(1, 100 * MB, ALPHA, BETA)) == 0.0


@pytest.mark.parametrize("n", [2, 3, 7, 16, 1000])
def test_ring_allreduce_closed_form(n):
    M = 64 * MB
    expected = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * M / BETA
    assert float(comm.ring_allreduce(n, M, ALPHA, BETA)) == pytest.approx(expected, **EXACT)
    # Reduce-scatter + all-gather (each half of it) add up to the allreduce.
    rs = float(comm.ring_reduce_scatter(n, M, ALPHA, BETA))
    assert rs == pytest.approx((n - 1) * ALPHA + (n - 1) / n * M / BETA, **EXACT)
    assert 2 * rs == pytest.approx(expected, **EXACT)


def test_ring_is_vectorised():
    n = np.array([1, 2, 4, 8])
    out = comm.ring_allreduce(n, 8 * MB, ALPHA, BETA)
    assert out.shape == (4,)
    assert list(out) == pytest.approx([float(comm.ring_allreduce(k, 8 * MB, ALPHA, BETA)) for k in n], **EXACT)


def test_tree_by_hand_and_latency_grows_with_log2_n():
    # n = 8, M = 10 MB: 2 x 3 x 5 us + 2 x 1e7 / 1e10 = 30 us + 2 ms.
    assert float(comm.tree_allreduce(8, 10 * MB, ALPHA, BETA)) == pytest.approx(30e-6 + 2e-3, **EXACT)
    # With M = 0 only latency is left: 2 ceil(log2 n) alpha, linear in log2 n.
    lat = {n: float(comm.tree_allreduce(n, 0.0, ALPHA, BETA)) for n in (2, 4, 8, 1024, 1025)}
    assert lat[2] == pytest.approx(2 * ALPHA, **EXACT)
    assert lat[4] == pytest.approx(4 * ALPHA, **EXACT)
    assert lat[1024] == pytest.approx(20 * ALPHA, **EXACT)
    assert lat[1025] == pytest.approx(22 * ALPHA, **EXACT)  # ceil(log2 1025) = 11
    # Doubling n adds exactly 2 alpha; ring latency doubles instead.
    assert lat[8] - lat[4] == pytest.approx(2 * ALPHA, rel=1e-9)
    ring = lambda n: float(comm.ring_allreduce(n, 0.0, ALPHA, BETA))  # noqa: E731
    assert ring(1024) / ring(512) == pytest.approx(1023 / 511, rel=1e-12)


def test_rabenseifner_power_of_two_by_hand():
    # n = 8, M = 80 MB: 2 x 3 x 5 us + 2 x 7/8 x 8 ms = 30 us + 14 ms.
    assert float(comm.rabenseifner_allreduce(8, 80 * MB, ALPHA, BETA)) == pytest.approx(30e-6 + 14e-3, **EXACT)


def test_rabenseifner_non_power_of_two_pays_an_extra_exchange():
    """n = 6 folds its 2 extra ranks into p' = 4 and unfolds them at the end (Thakur,
    Rabenseifner & Gropp 2005): recursive halving/doubling on 4 ranks, 2 log2(4) alpha +
    2 (3/4) M/beta, plus 2 (alpha + M/beta). With a large message 6 ranks cost more than 8."""
    M = 80 * MB
    six = float(comm.rabenseifner_allreduce(6, M, ALPHA, BETA))
    eight = float(comm.rabenseifner_allreduce(8, M, ALPHA, BETA))
    four = float(comm.rabenseifner_allreduce(4, M, ALPHA, BETA))
    assert six > eight > four
    p_prime = 4
    expected = 2 * math.log2(p_prime) * ALPHA + 2 * (p_prime - 1) / p_prime * M / BETA + 2 * (ALPHA + M / BETA)
    assert six == pytest.approx(expected, **EXACT)
    # Exactly the 4-rank algorithm plus the fold and unfold.
    assert six - four == pytest.approx(2 * (ALPHA + M / BETA), **EXACT)
    # Ring has no power-of-two penalty: 6 ranks are cheaper than 8.
    assert float(comm.ring_allreduce(6, M, ALPHA, BETA)) < float(comm.ring_allreduce(8, M, ALPHA, BETA))


def test_point_to_point():
    assert float(comm.point_to_point(1 * MB, ALPHA, BETA)) == pytest.approx(ALPHA + 1e-4, **EXACT)


# --- placement ---------------------------------------------------------------------------------


def test_communicator_inside_one_node_uses_intra_node_figures():
    t = tiers(dpn=8, intra=100e9, injection=50e9)
    for size, stride in [(8, 1), (4, 2), (2, 4), (4, 1)]:
        pl = comm.place(size, stride, t)
        assert int(pl.nodes) == 1
        assert int(pl.local) == size
        assert float(pl.alpha_s) == t.intra_latency_s
        assert float(pl.beta_Bps) == t.intra_bandwidth_Bps


def test_communicator_spanning_nodes_shares_the_nics():
    """dp groups of 16 ranks on nodes of 8 devices: the stride sets how many members share
    a node (k) and so how many groups (8 / k) share that node's NICs at once."""
    t = tiers(dpn=8, intra=100e9, injection=40e9)
    cases = {  # stride: (members per node k, nodes spanned, per-rank beta = injection / (8 / k))
        1: (8, 2, 40e9),  # one group per node: all of the NICs (under the intra 100 GB/s)
        2: (4, 4, 20e9),  # two groups per node share them
        4: (2, 8, 10e9),
        8: (1, 16, 5e9),  # every device of the node in a different group
        16: (1, 16, 5e9),
    }
    for stride, (k, nodes, beta) in cases.items():
        pl = comm.place(16, stride, t)
        assert (int(pl.local), int(pl.nodes)) == (k, nodes), stride
        assert float(pl.beta_Bps) == pytest.approx(beta, **EXACT), stride
        assert float(pl.alpha_s) == t.inter_latency_s
        # The hierarchical algorithm's inter-node stage always sees every device talking.
        assert float(pl.inter_beta_Bps) == pytest.approx(40e9 / 8, **EXACT)
    # NIC share is capped by the intra-node link.
    fat = tiers(dpn=8, intra=10e9, injection=400e9)
    assert float(comm.place(16, 1, fat).beta_Bps) == 10e9


def test_intra_group_communicator_is_unaffected_by_the_taper():
    """Inside one dragonfly group no byte crosses the global links: every algorithm costs
    what it costs on a full-bisection fabric."""
    tapered, flat = tiers(dpn=4, injection=40e9, taper=0.25, group=8), tiers(dpn=4, injection=40e9)
    M = 100 * MB
    for size, stride in [(32, 1), (8, 4), (16, 2)]:  # 8 nodes, 8 nodes, 8 nodes: one group each
        a, b = comm.place(size, stride, tapered), comm.place(size, stride, flat)
        assert int(a.groups) == 1
        assert float(a.beta_Bps) == float(b.beta_Bps)
        for alg in range(len(comm.ALGORITHMS)):
            assert float(comm.allreduce(alg, a, M)) == float(comm.allreduce(alg, b, M)), (size, stride, alg)
        for alg in (comm.AL_RING, comm.AL_HIERARCHICAL):
            assert float(comm.reduce_scatter(alg, a, M)) == float(comm.reduce_scatter(alg, b, M))


def test_ring_spanning_groups_pays_the_taper_only_on_its_crossing_share():
    """A ring ordered by rank over N nodes in g groups crosses g of its N hops: phi = g / N.
    Each node's rate r obeys r <= B_inj and phi r <= taper B_inj."""
    t = tiers(dpn=4, intra=100e9, injection=40e9, taper=0.25, group=2)
    # 4 nodes in 2 groups: phi = 1/2, taper/phi = 1/2: half the injection.
    pl = comm.place(16, 1, t)
    assert (int(pl.nodes), int(pl.groups)) == (4, 2)
    assert float(comm.crossing_share(comm.AL_RING, pl)) == pytest.approx(0.5, **EXACT)
    assert float(pl.beta_Bps) == pytest.approx(40e9 * 0.25 / 0.5, **EXACT)
    # 2 nodes per group, but taper 0.5 >= phi: the NICs, not the global links, limit it.
    t2 = tiers(dpn=4, intra=100e9, injection=40e9, taper=0.5, group=2)
    assert float(comm.place(16, 1, t2).beta_Bps) == pytest.approx(40e9, **EXACT)
    # Members 4 nodes apart on groups of 2 nodes: every hop crosses (phi = 1), the whole taper.
    pl = comm.place(4, 16, t)
    assert (int(pl.nodes), int(pl.groups)) == (4, 4)
    assert float(pl.beta_Bps) == pytest.approx(40e9 / 4 * 0.25, **EXACT)  # 4 such communicators share a node
    # A machine-sized data-parallel ring (1,024 nodes in groups of 128): phi = 1/128, far
    # under a 0.5 taper, so it runs at the injection bandwidth.
    big = tiers(dpn=4, intra=100e9, injection=40e9, taper=0.5, group=128)
    assert float(comm.place(4096, 1, big).beta_Bps) == pytest.approx(40e9, **EXACT)


def test_crossing_shares_of_tree_and_rabenseifner_by_hand():
    t = tiers(dpn=4, intra=100e9, injection=40e9, taper=0.05, group=4)
    pl = comm.place(64, 1, t)  # 16 nodes in 4 groups: c = 4 nodes (16 ranks) per group
    assert float(comm.crossing_share(comm.AL_TREE, pl)) == pytest.approx((1 + 0.5 * 2) / 4, **EXACT)
    # Rabenseifner on p = 64 ranks, R = 16 ranks per group: (1/16 - 1/64) / (1 - 1/64) = 3/63.
    assert float(comm.crossing_share(comm.AL_RABENSEIFNER, pl)) == pytest.approx(3 / 63, **EXACT)
    # Its across-node stage (hierarchical): 16 nodes, R = 4: (1/4 - 1/16) / (1 - 1/16) = 1/5.
    assert float(comm.crossing_share(comm.AL_RABENSEIFNER, pl, across_nodes=True)) == pytest.approx(0.2, **EXACT)
    M = 64 * MB
    phi = 0.5  # tree: 0.5 / 0.05 = 10 times slower on the NIC-bound bandwidth
    expected = 2 * 6 * t.inter_latency_s + 2 * M / (40e9 * 0.05 / phi)
    assert float(comm.allreduce(comm.AL_TREE, pl, M)) == pytest.approx(expected, **EXACT)


def test_taper_one_changes_nothing():
    """taper 1: global links as fast as injection; nothing depends on the groups."""
    one, fat = tiers(dpn=8, injection=40e9, taper=1.0, group=2), tiers(dpn=8, injection=40e9)
    M = 50 * MB
    for size, stride in [(64, 1), (128, 8), (16, 64), (8, 1)]:
        a, b = comm.place(size, stride, one), comm.place(size, stride, fat)
        assert float(a.beta_Bps) == float(b.beta_Bps)
        for alg in range(len(comm.ALGORITHMS)):
            assert float(comm.allreduce(alg, a, M)) == float(comm.allreduce(alg, b, M)), (size, stride, alg)
            assert float(comm.all_gather(alg, a, M)) == float(comm.all_gather(alg, b, M))


def test_ring_latency_counts_inter_node_latency_on_the_node_crossings():
    """A ring ordered by rank over 4 nodes of 8 ranks: 4 of its 32 hops leave a node."""
    t = tiers(dpn=8, intra=100e9, intra_lat=2e-6, injection=40e9, inter_lat=5e-6)
    pl = comm.place(32, 1, t)
    alpha = (4 * 5e-6 + 28 * 2e-6) / 32
    assert float(pl.ring_alpha_s) == pytest.approx(alpha, **EXACT)
    M = 32 * MB
    expected = 2 * 31 * alpha + 2 * 31 / 32 * M / 40e9
    assert float(comm.allreduce(comm.AL_RING, pl, M)) == pytest.approx(expected, **EXACT)
    # One member per node: every hop is an inter-node one.
    assert float(comm.place(4, 8, t).ring_alpha_s) == pytest.approx(5e-6, **EXACT)


def test_leonardo_data_parallel_ring_has_no_cliff_at_the_group_boundary():
    """180 nodes fill one Leonardo group (De Sensi et al. 2024); at 187 the data-parallel ring spans two,
    crosses 2 of its 187 hops and keeps its bandwidth (the old model halved it)."""
    t = link_tiers(load_machine("leonardo"))
    inside, across = comm.place(180 * 4, 1, t), comm.place(187 * 4, 1, t)
    assert (int(inside.groups), int(across.groups)) == (1, 2)
    assert float(across.beta_Bps) == float(inside.beta_Bps)


def test_link_tiers_of_a_machine():
    """Tiers read off the topology graph: intra-node link x efficiency, all NICs x efficiency."""
    m = load_machine("dgx-h100")
    t = link_tiers(m)
    eff = m.network_efficiency
    assert t.devices_per_node == m.devices_per_node
    assert t.intra_bandwidth_Bps == pytest.approx(m.intra_node_bandwidth_gbyte_s * 1e9 * eff, rel=1e-12)
    assert t.intra_latency_s == pytest.approx(m.intra_node_latency_us * 1e-6, rel=1e-12)
    assert t.node_injection_Bps == pytest.approx(m.nics_per_node * m.nic_gbit_s / 8 * 1e9 * eff, rel=1e-9)
    # Doubling the NICs' speed doubles the injection bandwidth and nothing inside the node.
    t2 = link_tiers(m.model_copy(update={"nic_gbit_s": 2 * m.nic_gbit_s}))
    assert t2.node_injection_Bps == pytest.approx(2 * t.node_injection_Bps, rel=1e-9)
    assert t2.intra_bandwidth_Bps == t.intra_bandwidth_Bps


def test_inter_node_efficiency_slows_only_the_nics():
    """A measured inter-node efficiency (LUMI's, from its comms logs) scales the NICs and leaves the
    intra-node fabric at network_efficiency; a data-parallel ring across nodes slows by the ratio,
    one inside a node does not; unset, the NICs keep network_efficiency."""
    m = load_machine("lumi")
    assert m.inter_node_efficiency == pytest.approx(0.39)
    base = m.model_copy(update={"inter_node_efficiency": None})
    t, t0 = link_tiers(m), link_tiers(base)
    assert t.intra_bandwidth_Bps == t0.intra_bandwidth_Bps
    assert t.node_injection_Bps == pytest.approx(t0.node_injection_Bps * m.inter_node_efficiency / m.network_efficiency, rel=1e-9)
    size = 2.0**31
    across = [float(comm.allreduce(comm.AL_RING, comm.place(16, 8, tiers), size)) for tiers in (t, t0)]
    inside = [float(comm.allreduce(comm.AL_RING, comm.place(8, 1, tiers), size)) for tiers in (t, t0)]
    assert across[0] > 1.8 * across[1]
    assert inside[0] == pytest.approx(inside[1], rel=1e-12)


def test_placement_aware_allreduce_uses_the_placement():
    t = tiers(dpn=8, intra=100e9, intra_lat=2e-6, injection=40e9, inter_lat=5e-6)
    M = 100 * MB
    pl = comm.place(16, 8, t)  # 16 nodes, per-rank beta 5 GB/s, inter latency
    expected = 2 * 15 * 5e-6 + 2 * 15 / 16 * M / 5e9
    assert float(comm.allreduce(comm.AL_RING, pl, M)) == pytest.approx(expected, **EXACT)
    # Hierarchical on 8 x 16 (stride 1): reduce-scatter inside (8 ranks, intra), Rabenseifner
    # across 16 nodes on M/8 at injection/8, all-gather inside.
    pl = comm.place(128, 1, t)
    inside = 7 * 2e-6 + 7 / 8 * M / 100e9
    across = 2 * 4 * 5e-6 + 2 * 15 / 16 * (M / 8) / 5e9
    assert float(comm.allreduce(comm.AL_HIERARCHICAL, pl, M)) == pytest.approx(2 * inside + across, **EXACT)


def test_at_30k_ranks_ring_loses_to_rabenseifner_and_tree():
    """The seed lesson (MProt-DPO, SC24, "Collectives at 30k+ ranks"): 30,000 ranks (2,500 Aurora
    nodes), 100 MB of gradients: ring's 2(n-1) latency steps dominate."""
    t = link_tiers(load_machine("aurora"))
    pl = comm.place(30_000, 1, t)
    M = 100 * MB
    ring = float(comm.allreduce(comm.AL_RING, pl, M))
    rab = float(comm.allreduce(comm.AL_RABENSEIFNER, pl, M))
    tree = float(comm.allreduce(comm.AL_TREE, pl, M))
    assert ring > 5 * rab
    assert ring > 5 * tree
    # Inside one node (12 ranks, not a power of two) the same message favours ring: its
    # 22 latency steps cost less than tree's doubled traffic or Rabenseifner's extra exchange.
    node = comm.place(12, 1, t)
    ring12, rab12, tree12 = (float(comm.allreduce(a, node, M)) for a in (comm.AL_RING, comm.AL_RABENSEIFNER, comm.AL_TREE))
    assert ring12 < rab12 and ring12 < tree12


# --- what each collective of the library reaches ------------------------------------------------


def test_collective_efficiency_slows_only_its_collective():
    """gloo runs reduce-scatter and all-gather at about 0.3 of its allreduce's speed: a
    machine that says so pays 1/0.3 of the ring time for them and nothing more for allreduce."""
    base = load_machine("local")
    slow = base.model_copy(update={"collective_efficiency": base.collective_efficiency.model_copy(
        update={"reduce_scatter": 0.25, "all_gather": 0.5, "allreduce": 1.0})})
    fast = base.model_copy(update={"collective_efficiency": base.collective_efficiency.model_copy(
        update={"reduce_scatter": 1.0, "all_gather": 1.0, "allreduce": 1.0})})
    M = 64 * MB
    ps, pf = comm.place(2, 1, link_tiers(slow)), comm.place(2, 1, link_tiers(fast))
    a = comm.AL_RING
    assert float(comm.reduce_scatter(a, ps, M)) == pytest.approx(4 * float(comm.reduce_scatter(a, pf, M)), **EXACT)
    assert float(comm.all_gather(a, ps, M)) == pytest.approx(2 * float(comm.all_gather(a, pf, M)), **EXACT)
    assert float(comm.allreduce(a, ps, M)) == pytest.approx(float(comm.allreduce(a, pf, M)), **EXACT)
