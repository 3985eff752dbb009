"""Latency-bandwidth (alpha-beta) costs of collectives, vectorised over layouts.

Notation: n ranks, a message of M bytes (the full buffer: what each rank holds before an
allreduce, after an all-gather), alpha the per-message latency (s), beta the per-rank link
bandwidth (bytes/s). Sources: Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH" (IJHPCA 2005) for ring, recursive halving/doubling and
Rabenseifner's algorithm, including the extra exchange for a non-power-of-two n; Sanders,
Speck & Traeff (2009) and NCCL's double binary trees for the tree; hierarchical = reduce-
scatter inside the node, allreduce across nodes on 1/k of the data, all-gather inside.

Placement: ranks are numbered row-major over the mesh (tp fastest), nodes are filled in
order. A communicator of `size` ranks whose members are `stride` ranks apart has
k = min(size, devices_per_node // stride) members in each node it touches (1 if stride >=
devices_per_node) and spans N = size / k nodes; the devices_per_node / k communicators of
that axis living on one node share its NICs while they run at the same time.

Ring latency: a ring ordered by rank leaves a node once per node it spans, so of its n hops
N cross the network and n - N stay inside a node; the data of a pipelined ring follows the
ring, so each step costs the mean hop latency (NCCL's own model counts inter-node latency
on 2N of an allreduce's 2(n-1) steps):  alpha_ring = (N alpha_inter + (n - N) alpha_intra) / n.
A large message does not hide these: once a rank's share of a step (M/n, split over the
channels) is one chunk or less, every step waits for its predecessor's, so a reduce-scatter
or all-gather over n ranks pays n - 1 hop latencies whatever its size. NCCL's tuning model
(src/graph/tuning.cc, ncclTopoTuneModel) charges a ring a base latency once (6.6-14 us) and
per step 0.6 / 1.9 / 3.4 us over NVLink and 2.7 / 4 / 14 us over the network (LL / LL128 /
Simple), an intra-node step of a multi-node ring at least the network proxy's overhead (1-2
us, x3 for Simple); RCCL's tables (MI200) give 1.5 us inside and 5-12 us across for LL128.
The machine files' per-hop figures (2.5-6 us inside, 3-5 us across) lie in that range; no
base latency is charged. At 16k ranks that is 0.04-0.2 s a call: what reduce-scatters and
all-gathers over every rank cost at that scale (NCCL and RCCL offer only the ring for them
with several GPUs per node; PAT, NCCL 2.23+, needs one per node and keeps a term linear in
the ranks in the same model), while a tree allreduce pays 2 log2(nodes) network hops.

Dragonfly taper: a group's global links carry taper x the injection bandwidth of its nodes
(global_bandwidth_taper). A communicator on N nodes spanning g = ceil(N x node stride /
nodes_per_group) groups (c = N / g of its nodes per group) sends a share phi of each node's
bytes to other groups. Adaptive routing spreads a group's crossing traffic over all of its
global links (bisection-limited), so a node's rate r obeys r <= B_inj and phi r <= taper
B_inj, and a rank's bandwidth is

    beta = min(beta_intra, B_inj / sharing x min(1, taper / phi))

(phi = 0 inside one group; with taper 1 nothing changes). phi per algorithm, ranks ordered
by node and nodes by group:
  - ring (and neighbour sends): g of its N inter-node hops cross a group boundary,
    phi = g / N = 1 / c;
  - double binary tree over nodes: an edge at level l spans 2^l nodes and crosses with
    probability min(1, 2^l / c); there are N / 2^(l+1) of them: phi = min(1, (1 + log2(c)/2) / c);
  - Rabenseifner (MPICH order: recursive halving from the nearest partner, so the large
    halves stay inside a group): only the exchanges with partners R = k c ranks away or more
    cross, M (1/R - 1/p) of the (1 - 1/p) M a rank sends: phi = (1/R - 1/p) / (1 - 1/p),
    p = 2^floor(log2 n);
  - hierarchical: its across-node stage is a Rabenseifner allreduce or a ring over the N
    nodes (R = c).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.cost.topology import LinkTiers
from planner.schema.specs import Algorithm

ALGORITHMS = tuple(Algorithm)
AL_RING, AL_TREE, AL_RABENSEIFNER, AL_HIERARCHICAL = range(len(ALGORITHMS))


@dataclass
class Placement:
    """Where the ranks of one communicator sit; arrays over layouts."""

    size: np.ndarray  # ranks in the communicator
    local: np.ndarray  # members per node (k)
    nodes: np.ndarray  # nodes spanned (N)
    groups: np.ndarray  # dragonfly groups spanned (g; 1 on a fat tree)
    alpha_s: np.ndarray  # latency of one message between neighbours in different nodes
    ring_alpha_s: np.ndarray  # mean latency of a hop of a ring ordered by rank
    beta_Bps: np.ndarray  # per-rank bandwidth of a ring (neighbour traffic), taper on its crossing share
    nic_beta_Bps: np.ndarray  # per-rank bandwidth of a flat algorithm before the taper
    intra_alpha_s: float
    intra_beta_Bps: float
    inter_beta_Bps: np.ndarray  # per-rank share of the NICs when every device talks at once (before the taper)
    taper: float  # global bandwidth per node / injection bandwidth
    eff: dict[str, float]  # collective -> fraction of the modelled speed the library reaches
    _betas: dict = field(default_factory=dict, repr=False)  # (algorithm, stage) -> bandwidth, computed once

    def algorithm_beta(self, algorithm: int, across_nodes: bool = False) -> np.ndarray:
        """Per-rank bandwidth of `algorithm` over the whole communicator (flat), or of the
        hierarchical algorithm's across-node stage run as `algorithm` (one rank per node,
        inter_beta_Bps), with the taper on its crossing share."""
        key = (algorithm, across_nodes)
        if key not in self._betas:
            phi = crossing_share(algorithm, self, across_nodes)
            self._betas[key] = self.tapered(self.inter_beta_Bps, phi) if across_nodes else self.flat_beta(phi)
        return self._betas[key]

    def tapered(self, beta, phi) -> np.ndarray:
        """`beta` (bytes/s of NIC-bound traffic) when a share `phi` of it crosses groups
        whose global links give each node taper x its injection: beta x min(1, taper / phi)."""
        return np.where(self.nodes > 1, beta / np.maximum(1.0, phi / self.taper), beta)

    def flat_beta(self, phi) -> np.ndarray:
        """Per-rank bandwidth of a flat algorithm that sends a share `phi` across groups."""
        return np.where(self.nodes > 1, np.minimum(self.intra_beta_Bps, self.tapered(self.nic_beta_Bps, phi)),
                        self.intra_beta_Bps)


def place(size, stride, tiers: LinkTiers) -> Placement:
    """Figures of a communicator of `size` ranks, `stride` ranks apart (arrays)."""
    size = np.asarray(size, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    dpn = tiers.devices_per_node
    local = np.where(stride >= dpn, 1, np.minimum(size, np.maximum(dpn // np.maximum(stride, 1), 1)))
    nodes = np.maximum(size // np.maximum(local, 1), 1)
    multi = nodes > 1
    # Nodes between consecutive members (1 when members fill nodes), and so the groups spanned.
    node_stride = np.maximum(stride / dpn, 1.0)
    groups = np.clip(np.ceil(nodes * node_stride / tiers.nodes_per_group), 1, nodes)
    sharing = dpn / local  # communicators of this axis on one node, all active together
    nic_share = tiers.node_injection_Bps / sharing
    alpha = np.where(multi, tiers.inter_latency_s, tiers.intra_latency_s)
    ring_alpha = np.where(multi, (nodes * tiers.inter_latency_s + (size - nodes) * tiers.intra_latency_s) / size,
                          tiers.intra_latency_s)
    eff = {"allreduce": tiers.allreduce_eff, "reduce_scatter": tiers.reduce_scatter_eff, "all_gather": tiers.all_gather_eff}
    pl = Placement(size, local, nodes, groups, alpha, ring_alpha, tiers.intra_bandwidth_Bps, nic_share,
                   tiers.intra_latency_s, tiers.intra_bandwidth_Bps,
                   np.minimum(tiers.intra_bandwidth_Bps, tiers.node_injection_Bps / dpn), tiers.global_taper, eff)
    pl.beta_Bps = pl.algorithm_beta(AL_RING)
    return pl


def crossing_share(algorithm: int, pl: Placement, across_nodes: bool = False) -> np.ndarray:
    """phi: the share of its bytes that a rank of `pl` sends to another dragonfly group
    (module docstring). `across_nodes`: the across-node stage of the hierarchical
    algorithm (one rank per node)."""
    g = pl.groups
    c = pl.nodes / g  # the communicator's nodes per group
    if algorithm == AL_RING:
        phi = g / pl.nodes
    elif algorithm == AL_TREE:
        phi = np.minimum(1.0, (1.0 + 0.5 * np.log2(c)) / c)
    elif algorithm == AL_RABENSEIFNER:
        n = pl.nodes if across_nodes else pl.size
        p = 2.0 ** np.floor(np.log2(np.maximum(n, 2)))
        R = c if across_nodes else c * pl.local
        phi = np.clip((1.0 / R - 1.0 / p) / (1.0 - 1.0 / p), 0.0, 1.0)
    else:
        raise ValueError(f"no crossing share for algorithm code {algorithm}")
    return np.where(g > 1, phi, 0.0)


def _log2(n) -> np.ndarray:
    return np.ceil(np.log2(np.maximum(np.asarray(n, dtype=np.float64), 1.0)))


def _non_pow2(n) -> np.ndarray:
    n = np.asarray(n, dtype=np.int64)
    return (n & (n - 1)) != 0


# --- flat algorithms ----------------------------------------------------------------------


def ring_allreduce(n, M, alpha, beta) -> np.ndarray:
    """2(n-1) steps of M/n bytes: 2(n-1) alpha + 2 (n-1)/n M / beta."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, 2 * (n - 1) * alpha + 2 * (n - 1) / n * M / beta, 0.0)


def ring_reduce_scatter(n, M, alpha, beta) -> np.ndarray:
    """(n-1) alpha + (n-1)/n M / beta; the all-gather costs the same."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, (n - 1) * alpha + (n - 1) / n * M / beta, 0.0)


ring_all_gather = ring_reduce_scatter


def tree_allreduce(n, M, alpha, beta) -> np.ndarray:
    """Double binary tree, pipelined: 2 log2(n) alpha + 2 M / beta (each tree carries M/2
    up and down, and every rank is an inner node of at most one tree)."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, 2 * _log2(n) * alpha + 2 * M / beta, 0.0)


def rabenseifner_allreduce(n, M, alpha, beta) -> np.ndarray:
    """Reduce-scatter by recursive halving + all-gather by recursive doubling on
    p' = 2^floor(log2 n) ranks: 2 log2(p') alpha + 2 (p'-1)/p' M / beta. A non-power-of-two
    n first folds its n - p' extra ranks into the others and unfolds them at the end:
    2 (alpha + M / beta) more (Thakur, Rabenseifner & Gropp 2005)."""
    n = np.asarray(n, dtype=np.float64)
    p2 = 2.0 ** np.floor(np.log2(np.maximum(n, 1)))
    base = 2 * np.log2(p2) * alpha + 2 * (p2 - 1) / p2 * M / beta
    extra = np.where(_non_pow2(n.astype(np.int64)), 2 * (alpha + M / beta), 0.0)
    return np.where(n > 1, base + extra, 0.0)


def point_to_point(M, alpha, beta) -> np.ndarray:
    return alpha + M / beta


# --- placement-aware collectives ------------------------------------------------------------


def allreduce(algorithm: int, pl: Placement, M) -> np.ndarray:
    """Time of one allreduce of M bytes on the communicator `pl` with the given algorithm."""
    return _allreduce(algorithm, pl, np.asarray(M, dtype=np.float64)) / pl.eff["allreduce"]


def _allreduce(algorithm: int, pl: Placement, M: np.ndarray) -> np.ndarray:
    if algorithm == AL_RING:
        return ring_allreduce(pl.size, M, pl.ring_alpha_s, pl.beta_Bps)
    if algorithm == AL_TREE:
        return tree_allreduce(pl.size, M, pl.alpha_s, pl.algorithm_beta(AL_TREE))
    if algorithm == AL_RABENSEIFNER:
        return rabenseifner_allreduce(pl.size, M, pl.alpha_s, pl.algorithm_beta(AL_RABENSEIFNER))
    if algorithm == AL_HIERARCHICAL:
        inside_rs = ring_reduce_scatter(pl.local, M, pl.intra_alpha_s, pl.intra_beta_Bps)
        across = rabenseifner_allreduce(pl.nodes, M / pl.local, pl.alpha_s, pl.algorithm_beta(AL_RABENSEIFNER, True))
        return np.where(pl.nodes > 1, 2 * inside_rs + across, ring_allreduce(pl.size, M, pl.ring_alpha_s, pl.beta_Bps))
    raise ValueError(f"unknown algorithm code {algorithm}")


def reduce_scatter(algorithm: int, pl: Placement, M) -> np.ndarray:
    """Reduce-scatter of an M-byte buffer. Libraries implement it as a ring, or
    hierarchically (inside the node, then across nodes)."""
    return _ring_or_hierarchical(algorithm, pl, np.asarray(M, dtype=np.float64)) / pl.eff["reduce_scatter"]


def all_gather(algorithm: int, pl: Placement, M) -> np.ndarray:
    """All-gather into an M-byte buffer: a reduce-scatter's traffic, run backwards."""
    return _ring_or_hierarchical(algorithm, pl, np.asarray(M, dtype=np.float64)) / pl.eff["all_gather"]


def _ring_or_hierarchical(algorithm: int, pl: Placement, M: np.ndarray) -> np.ndarray:
    if algorithm == AL_HIERARCHICAL:
        inside = ring_reduce_scatter(pl.local, M, pl.intra_alpha_s, pl.intra_beta_Bps)
        across = ring_reduce_scatter(pl.nodes, M / pl.local, pl.alpha_s, pl.algorithm_beta(AL_RING, True))
        return np.where(pl.nodes > 1, inside + across, ring_reduce_scatter(pl.size, M, pl.ring_alpha_s, pl.beta_Bps))
    return ring_reduce_scatter(pl.size, M, pl.ring_alpha_s, pl.beta_Bps)

