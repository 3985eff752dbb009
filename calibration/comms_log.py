"""What a training run's own collectives reached on the NICs, read from DeepSpeed's comms logger.

DeepSpeed with `comms_logger: {enabled: true, prof_all: true}` prints one line per collective:

    [Rank 0] rank=0 | comm op: all_reduce | time (ms): 838.94 | msg size: 2.73 GB | algbw (Gbps): ...

(sizes by DeepSpeed's convert_size, powers of 1024; an all_gather's size is one rank's input).
Its own bandwidth columns use a world size that need not be the collective's group, so they are
recomputed here from the time and the size for the group size the caller gives (the data-parallel
degree for gradient allreduces and ZeRO's all-gathers): a ring's bus bandwidth per rank,

    all_reduce:  2 (n - 1) / n x size / time        all_gather, reduce_scatter: (n - 1) x size / time
    send:        size / time

and its fraction of one rank's share of the node's NICs (nics x Gbit/s / 8 / devices per node:
every rank of the node in a group of its own kind, active at once, as data parallelism over
tensor- and pipeline-parallel ranks has it). The median call of each (op, size) is taken: a call's
time includes waiting for the group's last rank, which the median of many steps sheds. That
fraction is the machine file's `inter_node_efficiency` for those collectives (`exaplan calibrate
--from-comms-log`; machine_models/lumi.yaml's 0.39 comes from LUMI's logs this way).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from planner.schema.errors import PlanError
from planner.schema.specs import MachineModel

_LINE = re.compile(r"comm op: (?P<op>\w+) \| time \(ms\): (?P<ms>[0-9.]+) \| msg size: (?P<size>[0-9.]+) (?P<unit>[KMGT]?B)\b")
_UNITS = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}
# Ops whose bandwidth says something about the NICs, and the ring's bus factor for n ranks.
_BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1,
        "send": lambda n: 1.0}
MIN_BYTES = 64 * 2**20  # smaller messages are latency-bound: their bandwidth says little about the NICs


@dataclass(frozen=True)
class CommRow:
    op: str
    size_bytes: float
    calls: int
    median_s: float
    bus_gbyte_s: float  # per rank
    nic_fraction: float  # of one rank's share of the node's NICs


def parse(text: str) -> list[tuple[str, float, float]]:
    """(op, bytes, seconds) of every comms-logger line in `text`."""
    out = []
    for m in _LINE.finditer(text):
        out.append((m["op"], float(m["size"]) * _UNITS[m["unit"]], float(m["ms"]) / 1e3))
    return out


def nic_share_gbyte_s(machine: MachineModel) -> float:
    """One rank's share of its node's NICs, GB/s per direction."""
    return machine.nics_per_node * machine.nic_gbit_s / 8 / machine.devices_per_node


def comm_rows(calls: list[tuple[str, float, float]], group_size: int, machine: MachineModel,
              min_bytes: float = MIN_BYTES) -> list[CommRow]:
    """Per (op, size) of at least `min_bytes`: calls, median time, bus bandwidth, NIC fraction."""
    if group_size < 2:
        raise PlanError("a collective's group has at least 2 ranks", field="--group-size")
    groups: dict[tuple[str, float], list[float]] = {}
    for op, size, seconds in calls:
        if op in _BUS and size >= min_bytes and seconds > 0:
            groups.setdefault((op, size), []).append(seconds)
    share = nic_share_gbyte_s(machine)
    rows = []
    for (op, size), times in sorted(groups.items()):
        median = statistics.median(times)
        bus = _BUS[op](group_size) * size / median / 1e9
        rows.append(CommRow(op, size, len(times), median, bus, bus / share))
    return rows


def read_rows(path: str | Path, group_size: int, machine: MachineModel) -> list[CommRow]:
    """comm_rows of a log file, with clear errors for a missing file or one without such lines."""
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"no such file: {path}", field="--from-comms-log")
    calls = parse(p.read_text(errors="replace"))
    if not calls:
        raise PlanError("no DeepSpeed comms-logger lines ('comm op: ... | time (ms): ... | msg size: ...') in "
                        f"{path}", field="--from-comms-log")
    rows = comm_rows(calls, group_size, machine)
    if not rows:
        raise PlanError(f"no all_reduce, all_gather, reduce_scatter or send of at least {MIN_BYTES // 2**20} MiB "
                        f"in {path}", field="--from-comms-log")
    return rows


def suggested_efficiency(rows: list[CommRow], op: str = "all_reduce") -> float | None:
    """The highest NIC fraction among `op`'s largest messages (at least half the largest: the
    gradient buckets; smaller ones may belong to other groups, as the tied embedding's allreduce
    between the first and last pipeline stage does), or None. Waiting for a late rank only lowers
    a call's bandwidth (a step's first bucket waits for the slowest stage), so the fastest bucket
    is the nearest to what the NICs reach."""
    of_op = [r for r in rows if r.op == op]
    if not of_op:
        return None
    largest = max(r.size_bytes for r in of_op)
    return max(r.nic_fraction for r in of_op if r.size_bytes >= largest / 2)
