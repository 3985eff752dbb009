"""The machine's topology as a networkx graph, and the link figures the cost model reads off it.

Nodes of the graph: devices, one intra-node switch (NVSwitch / Infinity Fabric / Xe Link
plane) per node, NICs, and the fabric (one switch per dragonfly group or leaf, joined by a
global layer). Edges carry `bandwidth_Bps` (per direction) and `latency_s`.

The search does not walk the graph per layout: it reads three tiers off it once (a pair of
devices in one node, a pair in different nodes of one group, a pair in different groups)
with their path latency and bottleneck bandwidth, plus each node's injection bandwidth into
the fabric as a maximum flow over its NICs. Communicator placement then picks the tier; the
global taper limits only the share of a collective's traffic that crosses groups
(planner.cost.comm: beta = min(beta_intra, B_inj / sharing x min(1, taper / phi))).

The tiers of a network are kept on disk (link_tiers: EXAPLAN_CACHE_DIR, else
$XDG_CACHE_HOME/exaplan or ~/.cache/exaplan; "off" keeps none), keyed by the network's
fields and this module's source: importing networkx costs more than a whole search, and a
network's tiers never change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from planner.schema.specs import MachineModel, TopologyKind

if TYPE_CHECKING:
    import networkx as nx

GB = 1e9


@dataclass(frozen=True)
class LinkTiers:
    intra_bandwidth_Bps: float  # per device, per direction, inside a node
    intra_latency_s: float
    node_injection_Bps: float  # all NICs of one node together, per direction
    inter_latency_s: float
    global_taper: float  # global-link bandwidth per node / injection bandwidth (dragonfly; 1 elsewhere)
    nodes_per_group: int
    devices_per_node: int
    allreduce_eff: float = 1.0  # collective_efficiency: what each collective reaches of the links
    reduce_scatter_eff: float = 1.0
    all_gather_eff: float = 1.0


def build_graph(machine: MachineModel, nodes: int, sample_group_size: int | None = None,
                sample_devices: int | None = None) -> nx.Graph:
    """Devices, switches, NICs and fabric of `nodes` nodes (small node counts suffice: the
    figures are per node and per tier). `sample_group_size` places that many of the sampled
    nodes in each group (the global links keep the machine's real group capacity);
    `sample_devices` builds only that many of each node's identical devices and NICs stand
    for all of them aggregated into one edge (their summed bandwidth), so that a machine of a
    million devices per node costs no more than one of two."""
    import networkx as nx

    g = nx.Graph()
    intra_bw = machine.intra_node_bandwidth_gbyte_s * GB
    nic_bw = machine.nic_gbit_s / 8.0 * GB
    half_intra = machine.intra_node_latency_us * 1e-6 / 2
    # Inter-node latency: NIC -> leaf and leaf -> NIC carry half each; crossing the global
    # layer of a dragonfly adds half again.
    hop = machine.inter_node_latency_us * 1e-6 / 2
    dragonfly = machine.topology == TopologyKind.dragonfly
    group_size = machine.nodes_per_group if dragonfly else max(nodes, 1)
    sample = sample_group_size or group_size
    devices = machine.devices_per_node if sample_devices is None else min(sample_devices, machine.devices_per_node)
    # Identical NICs in parallel between the same switch and leaf carry what one edge of their
    # summed bandwidth carries (same latency): aggregated when sampling.
    nics, per_nic = (machine.nics_per_node, nic_bw) if sample_devices is None else (1, nic_bw * machine.nics_per_node)
    for n in range(nodes):
        sw = ("switch", n)
        for d in range(devices):
            g.add_edge(("device", n, d), sw, bandwidth_Bps=intra_bw, latency_s=half_intra)
        leaf = ("group", n // sample)
        for k in range(nics):
            nic = ("nic", n, k)
            g.add_edge(sw, nic, bandwidth_Bps=per_nic, latency_s=0.0)
            g.add_edge(nic, leaf, bandwidth_Bps=per_nic, latency_s=hop)
    groups = {("group", n // sample) for n in range(nodes)}
    taper = machine.global_bandwidth_taper if machine.topology == TopologyKind.dragonfly else 1.0
    for grp in groups:
        # The global layer: each group's share of bisection bandwidth, tapered on dragonfly.
        g.add_edge(grp, ("global",), bandwidth_Bps=taper * group_size * machine.nics_per_node * nic_bw, latency_s=hop / 2)
    if len(groups) == 1:
        # One group: the leaf itself is the whole fabric, joined by a zero-cost edge so that
        # every path has the same shape.
        g.add_edge(next(iter(groups)), ("global",), bandwidth_Bps=float("inf"), latency_s=0.0)
    return g


def path_figures(g: nx.Graph, a, b) -> tuple[float, float]:
    """(latency_s, bottleneck bandwidth_Bps) of the lowest-latency path from a to b."""
    import networkx as nx

    path = nx.shortest_path(g, a, b, weight="latency_s")
    edges = list(zip(path, path[1:]))
    latency = sum(g.edges[e]["latency_s"] for e in edges)
    bandwidth = min(g.edges[e]["bandwidth_Bps"] for e in edges)
    return latency, bandwidth


def node_injection(g: nx.Graph, node: int) -> float:
    """Bytes/s one node can push into the fabric: maximum flow from its switch to the fabric."""
    import networkx as nx

    return nx.maximum_flow_value(g, ("switch", node), ("global",), capacity="bandwidth_Bps")


NETWORK_FIELDS = (
    "devices_per_node", "intra_node_bandwidth_gbyte_s", "intra_node_latency_us", "nics_per_node", "nic_gbit_s",
    "inter_node_latency_us", "topology", "global_bandwidth_taper", "nodes_per_group", "network_efficiency", "nodes",
    "collective_efficiency", "inter_node_efficiency",
)


def cache_dir() -> Path | None:
    """Where exaplan keeps what it derives once (None: EXAPLAN_CACHE_DIR=off)."""
    env = os.environ.get("EXAPLAN_CACHE_DIR")
    if env:
        return None if env == "off" else Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "exaplan"


def _cache_file(network_json: str) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    key = hashlib.sha256(Path(__file__).read_bytes() + network_json.encode()).hexdigest()[:32]
    return root / "link-tiers" / f"{key}.json"


def _read_cached(path: Path | None) -> LinkTiers | None:
    """The tiers kept at `path`, or None (absent, unreadable or not tiers: derived again)."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values()):
            return None
        return LinkTiers(**data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _write_cached(path: Path | None, tiers: LinkTiers) -> None:
    """Keep the tiers at `path`, whole or not at all (a cache that cannot be written is skipped)."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tiers-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dataclasses.asdict(tiers), f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


@lru_cache(maxsize=64)
def _tiers_cached(network_json: str) -> LinkTiers:
    path = _cache_file(network_json)
    tiers = _read_cached(path)
    if tiers is None:
        tiers = tiers_from_graph(network_json)
        _write_cached(path, tiers)
    return tiers


def tiers_from_graph(network_json: str) -> LinkTiers:
    """The tiers of the network whose fields (NETWORK_FIELDS) are `network_json`, read off its
    sample graph."""
    machine = SimpleNamespace(**json.loads(network_json))
    machine.topology = TopologyKind(machine.topology)
    machine.node_injection_gbyte_s = machine.nics_per_node * machine.nic_gbit_s / 8.0
    dragonfly = machine.topology == TopologyKind.dragonfly
    # Two nodes of one group (and on a dragonfly a third in another group) show every tier.
    sample_nodes = min(3 if dragonfly else 2, machine.nodes)
    g = build_graph(machine, sample_nodes, sample_group_size=2 if dragonfly else None, sample_devices=2).to_directed()
    dev0 = ("device", 0, 0)
    if machine.devices_per_node > 1:
        intra_lat, intra_bw = path_figures(g, dev0, ("device", 0, 1))
    else:
        intra_lat, intra_bw = machine.intra_node_latency_us * 1e-6, machine.intra_node_bandwidth_gbyte_s * GB
    if sample_nodes > 1:
        inter_lat, _ = path_figures(g, dev0, ("device", 1, 0))
        injection = node_injection(g, 0)
    else:
        inter_lat, injection = machine.inter_node_latency_us * 1e-6, machine.node_injection_gbyte_s * GB
    # Collectives between nodes may reach a fraction of the NICs of their own (measured apart, e.g.
    # from a framework's comms log); the intra-node fabric keeps network_efficiency.
    inter_eff = machine.network_efficiency if machine.inter_node_efficiency is None else machine.inter_node_efficiency
    return LinkTiers(
        intra_bandwidth_Bps=intra_bw * machine.network_efficiency,
        intra_latency_s=intra_lat,
        node_injection_Bps=injection * inter_eff,
        inter_latency_s=inter_lat,
        global_taper=machine.global_bandwidth_taper if dragonfly else 1.0,
        nodes_per_group=machine.nodes_per_group if dragonfly else max(machine.nodes, 1),
        devices_per_node=machine.devices_per_node,
        allreduce_eff=machine.collective_efficiency["allreduce"],
        reduce_scatter_eff=machine.collective_efficiency["reduce_scatter"],
        all_gather_eff=machine.collective_efficiency["all_gather"],
    )


def link_tiers(machine: MachineModel) -> LinkTiers:
    """The tiers of a machine, cached (in the process and on disk: the module docstring) on the
    fields that shape its network (so that changing efficiency figures, as a fit does, does
    not rebuild the graph)."""
    return _tiers_cached(network_key(machine))


def network_key(machine: MachineModel) -> str:
    """The fields that shape a machine's network, as the JSON its tiers are cached under."""
    return json.dumps(machine.model_dump(mode="json", include=set(NETWORK_FIELDS)), sort_keys=True)
