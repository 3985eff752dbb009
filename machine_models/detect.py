"""`exaplan machine detect`: what a node of a new cluster can tell about itself, as a machine file.

Each probe is a function of a tool's output as text (or of sysfs files as a mapping), so that
recorded outputs test it (tests/cli/data/machine_detect/); `probe_node` runs the tools, each
with a timeout, and reads sysfs. A tool that is missing or fails is normal (a login node, a
CPU-only machine): it is named in `Node.missing`, and the figures it would have given come from
the preset the file starts from, marked as not measured.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from machine_models.describe import Made, follow_device_kind, load_source, machine_data, made_from_data
from machine_models.loader import DEFAULT_LOCAL_RANKS, LOCAL, detect_local_machine, load_machine, presets_by_device_kind

TIMEOUT_S = 20  # per tool: nvidia-smi can take seconds to wake idle GPUs
SYS_ROOT = Path("/")  # where /sys is read from (tests point it at recorded files)
NVLINK_GBYTE_S = 25.0  # one NVLink 3 or 4 link per direction: A100 12 x 25 = 300 GB/s, H100 18 x 25 = 450
MAX_NVLINKS = 18  # links of one GPU (Hopper); a larger sum over peers means an NVSwitch repeats them
PCIE_GBYTE_S = 25.0  # PCIe 4.0 x16 per direction, about what GPUs without NVLink get from each other
ANSI = re.compile(r"\x1b\[[0-9;]*m")

COMMANDS = {
    "nvidia": ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
    "nvidia_topo": ["nvidia-smi", "topo", "-m"],
    "rocm": ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"],
    "xpu": ["xpu-smi", "discovery"],
    "xpu_device": ["xpu-smi", "discovery", "-d", "0"],
    "lscpu": ["lscpu", "-J"],
    "ibv": ["ibv_devinfo", "-v"],
}
# The tool's name of a part -> (device kind of device_kinds.yaml, ranks per part). First match wins:
# GH200 before H200 before H100.
GPU_KINDS = (
    (r"GH200", "NVIDIA GH200", 1),
    (r"H200", "NVIDIA H200 SXM", 1),
    (r"H100", "NVIDIA H100 SXM5", 1),
    (r"A100", "NVIDIA A100 SXM4", 1),
    (r"MI250", "AMD MI250X GCD", 1),  # rocm-smi lists each GCD as a card of its own
    (r"Max 1550", "Intel Max 1550 tile", 2),  # two tiles per GPU, each its own rank (Aurora's setting)
)
# A part of a kind whose figures are another form factor's (the kinds are SXM parts).
OTHER_FORM = re.compile(r"PCIe|NVL\b", re.I)
# Per vendor: the collective library and the preset a part of no known kind starts from.
VENDORS = {"nvidia": ("nccl", "dgx-h100"), "amd": ("rccl", "frontier"), "intel": ("oneccl", "aurora")}

Runner = Callable[[list[str]], tuple[str | None, str]]  # argv -> (stdout, "") or (None, why not)


@dataclass
class Gpus:
    vendor: str  # nvidia, amd or intel
    name: str  # as the tool names the part
    ranks: int  # devices in the schema's sense: GPUs, GCDs or tiles
    memory_gib: float | None  # per rank
    tool: str


@dataclass
class Cpus:
    model: str
    sockets: int
    cores_per_socket: int
    numa_nodes: int | None

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket


@dataclass
class Nic:
    device: str  # mlx5_0/1 (device/port) or eth0
    gbit_s: float
    link_layer: str  # InfiniBand, Ethernet
    active: bool = True


@dataclass
class Links:
    gbyte_s: float  # per device per direction
    how: str
    measured: bool  # False: PCIe between some GPUs, a rough figure


@dataclass
class Node:
    gpus: Gpus | None = None
    links: Links | None = None
    cpus: Cpus | None = None
    nics: list[Nic] = field(default_factory=list)
    scheduler: str | None = None
    missing: list[str] = field(default_factory=list)  # what could not be found, in words
    notes: list[str] = field(default_factory=list)  # what was found and left out, in words
    host: str = ""


# --------------------------------------------------------------------------------------------
# Probes: each takes a tool's output as text
# --------------------------------------------------------------------------------------------


def parse_nvidia_smi(text: str) -> Gpus | None:
    """`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`: one line per GPU,
    'NVIDIA H100 80GB HBM3, 81559 MiB'."""
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if "," in line]
    if not rows:
        return None
    memory = [float(m.group(1)) for _, mem, *_ in rows if (m := re.match(r"([\d.]+)\s*MiB", mem))]
    gib = round(min(memory) / 1024, 1) if len(memory) == len(rows) else None
    return Gpus("nvidia", rows[0][0], len(rows), gib, "nvidia-smi")


def parse_nvidia_topo(text: str) -> Links | None:
    """`nvidia-smi topo -m`: the GPU x GPU matrix. NV# is # bonded NVLinks: where every pair
    is joined, a GPU's links are the sum over its peers (HGX 4-GPU boards: NV6 x 3 = 18), or,
    where that sum passes what one GPU has, the links to the NVSwitch that each pair shows
    (DGX H100: NV18 between every pair). PCIe between some pair: a rough 25 GB/s."""
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    header = next((line.split() for line in lines if re.match(r"^\s+GPU0\b", line)), None)
    if not header:
        return None
    n = sum(1 for t in header if re.fullmatch(r"GPU\d+", t))
    rows = [line.split()[1:1 + n] for line in lines if re.match(r"^GPU\d+\s", line)]
    if n < 2 or len(rows) != n:
        return None
    links = [[int(c[2:]) if re.fullmatch(r"NV\d+", c) else 0 for j, c in enumerate(row) if j != i]
             for i, row in enumerate(rows)]
    if any(0 in peers for peers in links):
        return Links(PCIE_GBYTE_S, "PCIe between some GPUs in nvidia-smi topo -m: 25 GB/s assumed (PCIe 4.0 x16)",
                     measured=False)
    per_gpu = min(sum(p) if sum(p) <= MAX_NVLINKS else max(p) for p in links)
    return Links(per_gpu * NVLINK_GBYTE_S, f"nvidia-smi topo -m: {per_gpu} NVLinks per GPU x "
                                           f"{NVLINK_GBYTE_S:g} GB/s", measured=True)


def parse_rocm_smi(text: str) -> Gpus | None:
    """`rocm-smi --showproductname --showmeminfo vram --json`: one entry per card (an MI250X
    GCD is a card of its own); the key names vary with the version ('Card series', 'Card Series')."""
    try:
        cards = {k: v for k, v in json.loads(text).items() if k.lower().startswith("card") and isinstance(v, dict)}
    except (ValueError, AttributeError):
        return None
    if not cards:
        return None
    first = {k.lower(): str(v) for k, v in next(iter(cards.values())).items()}
    name = next((first[k] for k in ("card series", "device name", "card model") if first.get(k, "").strip()
                 and not first[k].startswith("0x")), "AMD GPU")
    memory = [int(v) for card in cards.values() for k, v in card.items()
              if k.lower().startswith("vram total memory") and str(v).isdigit()]
    gib = round(min(memory) / 2**30, 1) if memory else None
    return Gpus("amd", name, len(cards), gib, "rocm-smi")


def parse_xpu_smi(text: str, device_text: str | None = None) -> Gpus | None:
    """`xpu-smi discovery` (a table, one 'Device Name:' per GPU) and, for the memory,
    `xpu-smi discovery -d 0` ('Memory Physical Size: 131072.00 MiB', the GPU's, both tiles)."""
    names = re.findall(r"Device Name:\s*(.+?)\s*\|", text)
    if not names:
        return None
    per_gpu = next((r for pattern, _, r in GPU_KINDS if re.search(pattern, names[0])), 1)
    size = re.search(r"Memory Physical Size:\s*([\d.]+)\s*MiB", device_text or "")
    gib = round(float(size.group(1)) / 1024 / per_gpu, 1) if size else None
    return Gpus("intel", names[0], len(names) * per_gpu, gib, "xpu-smi")


def parse_lscpu(text: str) -> Cpus | None:
    """`lscpu -J`: fields, flat (util-linux < 2.38) or nested under "children" (newer)."""
    try:
        entries = json.loads(text)["lscpu"]
    except (ValueError, KeyError, TypeError):
        return None
    fields: dict[str, str] = {}
    stack = list(entries)
    while stack:
        e = stack.pop()
        fields.setdefault(str(e.get("field", "")).rstrip(":"), str(e.get("data")))
        stack.extend(e.get("children") or [])
    numbers = {k: int(v) for k, v in fields.items() if v.isdigit()}
    if "Socket(s)" not in numbers or "Core(s) per socket" not in numbers:
        return None
    return Cpus(fields.get("Model name", "unknown CPU"), numbers["Socket(s)"], numbers["Core(s) per socket"],
                numbers.get("NUMA node(s)"))


def parse_ib_ports(ports: Mapping[str, Mapping[str, str]]) -> list[Nic]:
    """/sys/class/infiniband/DEV/ports/N/{rate,state,link_layer}, keyed 'DEV/N':
    rate '200 Gb/sec (4X HDR)', state '4: ACTIVE', link_layer 'InfiniBand' or 'Ethernet' (RoCE)."""
    nics = []
    for name, files in sorted(ports.items()):
        rate = re.match(r"\s*([\d.]+)\s*Gb/sec", files.get("rate", ""))
        if rate:
            nics.append(Nic(name, float(rate.group(1)), files.get("link_layer", "InfiniBand").strip() or "InfiniBand",
                            "ACTIVE" in files.get("state", "ACTIVE")))
    return nics


def parse_ibv_devinfo(text: str) -> list[Nic]:
    """`ibv_devinfo -v`: per port, active_width (4X) x active_speed (50.0 Gbps) = the rate."""
    nics, device, port = [], "", {}
    for line in text.splitlines() + ["hca_id: end"]:
        key, _, value = line.strip().partition(":")
        speed = re.match(r"([\d.]+)", port.get("active_speed", ""))
        if key in ("hca_id", "port") and speed:
            width = re.match(r"(\d+)X", port.get("active_width", "1X"))
            nics.append(Nic(f"{device}/{port['port']}", float(speed.group(1)) * int(width.group(1) if width else 1),
                            port.get("link_layer", "InfiniBand"), "ACTIVE" in port.get("state", "")))
            port = {}
        if key == "hca_id":
            device, port = value.strip(), {}
        elif key == "port":
            port = {"port": value.strip()}
        elif port:
            port[key] = value.strip()
    return nics


def parse_net_speeds(ifaces: Mapping[str, Mapping[str, str]]) -> list[Nic]:
    """/sys/class/net/IF/{type,speed} of the physical interfaces (those with a device/):
    type 1 is Ethernet (32, IPoIB, is counted as InfiniBand); speed in Mb/s, -1 when unknown."""
    nics = []
    for name, files in sorted(ifaces.items()):
        speed = files.get("speed", "").strip()
        if files.get("type", "").strip() == "1" and files.get("device") and speed.isdigit() and int(speed) > 0:
            nics.append(Nic(name, int(speed) / 1000, "Ethernet"))
    return nics


def scheduler_from_env(env: Mapping[str, str]) -> str | None:
    """The scheduler this runs under: Slurm (SLURM_JOB_ID), PBS (PBS_JOBID), or none."""
    if env.get("SLURM_JOB_ID"):
        return "slurm"
    if env.get("PBS_JOBID"):
        return "pbs"
    return None


def choose_nics(nics: list[Nic]) -> tuple[list[Nic], list[Nic]]:
    """The NICs a job's collectives use, and the others: active ports, InfiniBand before
    Ethernet (RoCE storage ports), then the commonest rate (the fastest of a tie)."""
    pool = [n for n in nics if n.active] or nics
    pool = [n for n in pool if n.link_layer.lower() == "infiniband"] or pool
    if not pool:
        return [], nics
    counts = Counter(n.gbit_s for n in pool)
    rate = max(counts, key=lambda r: (counts[r], r))
    chosen = [n for n in pool if n.gbit_s == rate]
    return chosen, [n for n in nics if n not in chosen]


# --------------------------------------------------------------------------------------------
# Running the probes
# --------------------------------------------------------------------------------------------


def run_command(argv: list[str]) -> tuple[str | None, str]:
    """(stdout, "") or (None, why not): never raises, never waits past TIMEOUT_S."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError:
        return None, "not installed"
    except subprocess.TimeoutExpired:
        return None, f"no answer in {TIMEOUT_S} s"
    except OSError as e:
        return None, e.strerror or str(e)
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        return None, f"exit code {done.returncode}" + (f": {first[0][:120]}" if first else "")
    return done.stdout, ""


def read_files(folder: Path, depth: int) -> dict[str, dict[str, str]]:
    """The small text files `depth` folders below `folder`, keyed by their folder's path below it
    (depth 1: net/eth0; depth 3: infiniband/mlx5_0/ports/1 as 'mlx5_0/1'). Unreadable: left out."""
    out: dict[str, dict[str, str]] = {}
    pattern = "*/ports/*" if depth == 3 else "*"
    for d in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        key = f"{d.parts[-3]}/{d.name}" if depth == 3 else d.name
        files = {"device": "yes"} if (d / "device").exists() else {}
        for f in ("rate", "state", "link_layer", "type", "speed"):
            try:
                files[f] = (d / f).read_text().strip()
            except OSError:
                pass
        out[key] = files
    return out


def _gpus(run: Runner, missing: list[str]) -> tuple[Gpus | None, Links | None]:
    """The first GPU tool that answers: nvidia-smi, rocm-smi, xpu-smi."""
    text, why = run(COMMANDS["nvidia"])
    gpus = parse_nvidia_smi(text) if text else None
    if gpus:
        topo, _ = run(COMMANDS["nvidia_topo"])
        return gpus, parse_nvidia_topo(topo) if topo else None
    tried = [f"nvidia-smi: {why or 'no GPU listed'}"]
    text, why = run(COMMANDS["rocm"])
    if text and (gpus := parse_rocm_smi(text)):
        return gpus, None
    tried.append(f"rocm-smi: {why or 'no GPU listed'}")
    text, why = run(COMMANDS["xpu"])
    if text and parse_xpu_smi(text):
        return parse_xpu_smi(text, run(COMMANDS["xpu_device"])[0]), None
    tried.append(f"xpu-smi: {why or 'no GPU listed'}")
    missing.append("no GPU (" + "; ".join(tried) + ")")
    return None, None


def _nics(run: Runner, root: Path, missing: list[str]) -> list[Nic]:
    """RDMA ports from sysfs (or ibv_devinfo -v), else the physical Ethernet interfaces."""
    nics = parse_ib_ports(read_files(root / "sys/class/infiniband", 3))
    if not nics:
        text, why = run(COMMANDS["ibv"])
        nics = parse_ibv_devinfo(text) if text else []
        if not nics:
            missing.append(f"no RDMA NIC (/sys/class/infiniband: none; ibv_devinfo: {why or 'no port'})")
    if not nics:
        nics = parse_net_speeds(read_files(root / "sys/class/net", 1))
        if not nics:
            missing.append("no network interface with a known speed (/sys/class/net/*/speed)")
    return nics


def probe_node(run: Runner | None = None, root: Path | None = None, env: Mapping[str, str] | None = None) -> Node:
    """Everything the node tells: GPUs and their links, CPUs, NICs, the scheduler."""
    run = run or run_command
    root = SYS_ROOT if root is None else root
    env = os.environ if env is None else env
    node = Node(host=socket.gethostname())
    node.gpus, node.links = _gpus(run, node.missing)
    if node.gpus and node.gpus.vendor == "nvidia" and node.links is None and node.gpus.ranks > 1:
        node.missing.append("the links between GPUs (nvidia-smi topo -m gave no matrix)")
    text, why = run(COMMANDS["lscpu"])
    node.cpus = parse_lscpu(text) if text else None
    if node.cpus is None:
        node.missing.append(f"the CPUs (lscpu -J: {why or 'no sockets or cores in its output'})")
    node.nics = _nics(run, root, node.missing)
    node.scheduler = scheduler_from_env(env)
    if node.scheduler is None:
        node.missing.append("the scheduler (neither SLURM_JOB_ID nor PBS_JOBID is set: not inside a job)")
    return node


def device_kind(gpus: Gpus) -> str | None:
    """The device kind of device_kinds.yaml that the part is, or None."""
    return next((kind for pattern, kind, _ in GPU_KINDS if re.search(pattern, gpus.name)), None)


# --------------------------------------------------------------------------------------------
# The machine file: detected figures over the preset the node is closest to
# --------------------------------------------------------------------------------------------

UNKNOWN = "unknown: measure with exaplan calibrate --arrival"
# Figures one node cannot read off its tools: calibrate --arrival measures or fits them.
MEASURABLE = ("peak_tflops", "matmul_efficiency", "attention_efficiency_factor", "memory_bandwidth_gbyte_s",
              "elementwise_efficiency", "intra_node_bandwidth_gbyte_s", "intra_node_latency_us", "nic_gbit_s",
              "inter_node_latency_us", "network_efficiency", "inter_node_efficiency", "overlap",
              "collective_efficiency", "op_overhead_us", "step_overhead_s")
# Figures of the whole cluster: no node sees them.
CLUSTER = ("topology", "nodes_per_group", "global_bandwidth_taper", "nodes")


def closest_preset(node: Node) -> str:
    """The preset to start from: `local` without a GPU; else the preset of the part's device
    kind with the nearest memory per device (the first of a tie); else the vendor's."""
    if node.gpus is None:
        return LOCAL
    presets = presets_by_device_kind().get(device_kind(node.gpus) or "", [])
    if not presets:
        return VENDORS[node.gpus.vendor][1]
    memory = node.gpus.memory_gib
    return min(presets, key=lambda p: abs(load_machine(p).device_memory_gib - memory) if memory else 0.0)


def _put_gpus(data: dict, node: Node, like: str, marks: dict[str, str], found: list[str]) -> None:
    g = node.gpus
    if g is None:
        if data["collective_library"] != "gloo":  # a GPU preset given with --like on a node without GPUs
            for f in ("device_name", "devices_per_node", "device_memory_gib"):
                marks[f] = f"not detected: no GPU tool answered ({like}'s)"
        else:
            marks["devices_per_node"] = f"CPU ranks, no GPU found: {like}'s split of this node's cores"
        return
    kind = device_kind(g)
    data["device_name"] = kind or g.name
    marks["device_name"] = f"detected: {g.tool}, {g.name}" + ("" if kind else " (no device kind of device_kinds.yaml)")
    data["devices_per_node"] = g.ranks
    marks["devices_per_node"] = f"detected: {g.tool}"
    found.append(f"{g.ranks} x {g.name} ({g.tool})")
    if g.memory_gib:
        data["device_memory_gib"] = g.memory_gib
        marks["device_memory_gib"] = f"detected: {g.tool}, as the part reports it"
    else:
        marks["device_memory_gib"] = f"not detected: {g.tool} gave no memory ({like}'s)"
    library = VENDORS[g.vendor][0]
    if data["collective_library"] != library:
        data["collective_library"], data["algorithms"] = library, ["ring", "tree"]
        marks["collective_library"] = f"follows the GPU vendor ({like}'s was another)"
    if OTHER_FORM.search(g.name):
        marks["peak_tflops"] = f"{UNKNOWN}: {like}'s are an SXM part's; a {g.name} runs slower (its datasheet)"
    if node.links is not None:
        data["intra_node_bandwidth_gbyte_s"] = node.links.gbyte_s
        said = "detected" if node.links.measured else UNKNOWN
        marks["intra_node_bandwidth_gbyte_s"] = f"{said}: {node.links.how}"
        found.append(node.links.how)


def _put_nics(data: dict, node: Node, like: str, marks: dict[str, str], found: list[str]) -> None:
    chosen, others = choose_nics(node.nics)
    if not chosen:
        marks["nics_per_node"] = f"not detected: no NIC found ({like}'s)"
        return
    data["nics_per_node"], data["nic_gbit_s"] = len(chosen), chosen[0].gbit_s
    names = ", ".join(n.device for n in chosen)
    marks["nics_per_node"] = f"detected: {names} ({chosen[0].link_layer})"
    marks["nic_gbit_s"] = "detected: the ports' rate (per direction)"
    found.append(f"{len(chosen)} x {chosen[0].gbit_s:g} Gb/s {chosen[0].link_layer} ({names})")
    if others:
        node.notes.append("left out of the NICs (another rate, link layer or down: storage or management?): "
                          + ", ".join(f"{n.device} {n.gbit_s:g} Gb/s {n.link_layer}" for n in others))


def _put_launch(data: dict, node: Node, like: str, marks: dict[str, str], found: list[str]) -> None:
    """The scheduler found, and one rank per device on the cores the node has."""
    launch, ranks = data.get("launch"), data["devices_per_node"]
    if launch is None and node.scheduler is None:
        return
    if launch is None:
        launch = data["launch"] = {"schedulers": ["torchrun"], "default_scheduler": "torchrun", "ranks_per_node": ranks}
        marks["launch"] = f"made by machine detect ({like} has no launch section)"
    if node.scheduler:
        launch["schedulers"] = [node.scheduler] + [s for s in launch["schedulers"] if s != node.scheduler]
        launch["default_scheduler"] = node.scheduler
        marks["launch.default_scheduler"] = f"detected: {'SLURM_JOB_ID' if node.scheduler == 'slurm' else 'PBS_JOBID'}"
        found.append(f"scheduler {node.scheduler}")
    else:
        marks["launch.default_scheduler"] = f"not detected: not inside a job ({like}'s)"
    if launch.get("gpus_per_node") == launch["ranks_per_node"] and node.gpus:
        launch["gpus_per_node"] = ranks
        marks["launch.gpus_per_node"] = "one GPU per rank"
    chosen, others = choose_nics(node.nics)
    if any("/" in n.device for n in others) and all("/" in n.device for n in chosen):
        launch["ib_hca"] = ",".join(n.device.replace("/", ":") for n in chosen)  # NCCL_IB_HCA, UCX_NET_DEVICES
        marks["launch.ib_hca"] = "detected: the NICs above, and not the others"
    launch["ranks_per_node"] = ranks
    marks["launch.ranks_per_node"] = "one rank per device"
    if node.cpus:
        launch["cpus_per_rank"] = max(1, node.cpus.cores // ranks)
        marks["launch.cpus_per_rank"] = f"detected: lscpu, {node.cpus.cores} cores / {ranks} ranks"
    if launch.get("cpu_sets") and len(launch["cpu_sets"]) != ranks:
        launch["cpu_sets"] = []
        marks["launch.cpu_sets"] = f"cleared: {like}'s were for another number of ranks"


def detected_machine(node: Node, like: str | None, name: str, when: str) -> Made:
    """The machine file of `node`: what it told, the rest from `like` (default: the closest
    preset), every figure it could not measure marked."""
    like = like or closest_preset(node)
    base = detect_local_machine(DEFAULT_LOCAL_RANKS) if like == LOCAL else load_machine(like)
    data, marks, found = machine_data(base), {}, []
    _put_gpus(data, node, base.name, marks, found)
    own = frozenset(data) if like == LOCAL else load_source(like).own_keys
    for f in follow_device_kind(data, base.device_name, own, set()):  # --like of another kind than the GPUs'
        marks[f] = f"{UNKNOWN} ({data['device_name']}'s figure)"
    _put_nics(data, node, base.name, marks, found)
    _put_launch(data, node, base.name, marks, found)
    if node.cpus:
        found.append(f"{node.cpus.sockets} x {node.cpus.cores_per_socket}-core {node.cpus.model}"
                     + (f", {node.cpus.numa_nodes} NUMA nodes" if node.cpus.numa_nodes else ""))
    for f in MEASURABLE:
        marks.setdefault(f, f"{UNKNOWN} ({base.name}'s)")
    for f in CLUSTER:
        marks.setdefault(f, f"unknown: {base.name}'s; set it for your cluster (one node cannot see the fabric)")
    data["name"] = name
    told = "; ".join(found) or "no GPU, NIC or scheduler"
    data["description"] = (f"Detected on {node.host} by exaplan machine detect ({when}): {told}. The figures it "
                           f"could not measure are {base.name}'s, marked in the file.")[:8192]
    header = [f"{name}: made by exaplan machine detect on {node.host} ({when}), starting from {base.name}.",
              "Every MachineModel field under a line of its description. 'detected' figures say where they come "
              f"from; '{UNKNOWN}' figures are {base.name}'s until calibrate --arrival measures this machine "
              "(exaplan launch --calibrate writes the job); 'set it for your cluster' figures are the fabric's "
              "and the system's size, which no node can see."]
    return made_from_data(data, header, marks, found)
