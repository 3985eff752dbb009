"""Load a machine model: a preset shipped here, a user's YAML file, or the local machine.

Presets are the `*.yaml` files next to this module (except `device_kinds.yaml`). Figures that
belong to a device kind rather than to one machine (matmul efficiency, attention efficiency,
overlap) live once per kind in `device_kinds.yaml`, keyed by `device_name`; a machine file
inherits them unless it sets them itself. `local` is the machine running the command: read
from `local.yaml` once a calibration has written it, detected otherwise.
"""

from __future__ import annotations

import difflib
import functools
import os
import platform
import re
import warnings
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.schema.errors import PlanError, check_name_or_path, format_validation_error
from planner.schema.files import load_yaml_file, read_text
from planner.schema.launch import LaunchSettings, SchedulerKind
from planner.schema.specs import RENAMED_MACHINE_FIELDS, CollectiveEfficiency, MachineModel, MatmulEfficiency, Overlap, Precision, TopologyKind

PRESET_DIR = Path(__file__).resolve().parent
DEVICE_KINDS_FILE = PRESET_DIR / "device_kinds.yaml"
# YAML files beside the machine presets that are not machines.
NOT_MACHINES = frozenset({DEVICE_KINDS_FILE, PRESET_DIR / "frameworks.yaml", PRESET_DIR / "uncertainty.yaml"})
# The figures a device kind gives a machine (device_kinds.yaml); a machine file whose
# device_name is no known kind and that sets not all of them gets the schema's defaults.
DEVICE_KIND_FIELDS = ("matmul_efficiency", "attention_efficiency_factor", "overlap", "step_overhead_s")
LOCAL = "local"
LOCAL_FILE = PRESET_DIR / f"{LOCAL}.yaml"
DEFAULT_LOCAL_RANKS = 2

# --- Defaults for the local CPU machine (measured on a 2-core AMD EPYC VM, AVX2, gloo) ---
CPU_MATMUL_GFLOPS_PER_CORE = 65.0  # measured fp32 matmul 2048^3 on one thread (AVX2 EPYC)
# With AVX-512 (e.g. this project's Xeon host): fp32 2048^3 on one thread, operands from memory.
CPU_MATMUL_GFLOPS_PER_CORE_AVX512 = 150.0
CPU_MATMUL_DIM = 2048  # the size that figure was measured at
CPU_MATMUL_EFFICIENCY = MatmulEfficiency(peak_fraction=0.8, half_dim=128.0)
CPU_LOW_PRECISION_SLOWDOWN = 200.0  # bf16/fp16 matmul: ~0.3 GFLOP/s, 200x slower than fp32
CPU_MEMORY_BANDWIDTH_GBYTE_S = 20.0  # 16-25 GB/s copy, shared by all ranks
GLOO_BANDWIDTH_GBYTE_S = 0.8  # allreduce fit from 1 MiB up: 1.1-1.3 ns/byte (2 ranks)
GLOO_ALLREDUCE_LATENCY_US = 2500.0  # allreduce fit intercept (2 ranks); a lone tiny collective ~500 us
CPU_MEMORY_RESERVE_GIB = 0.3  # interpreter, torch, gloo buffers
# Framework figures of training on a CPU with gloo, fitted by `calibration.fit_runs.refit_from_runs`
# (the framework figures only; the matmul and link figures above stay as measured) on 24 runs
# of the 12 `validate --local` layouts (protein-small, 2 ranks of a 2-core Xeon VM, torch 2.13,
# 2026-11-23), after issue 14 made the runtime faster (DDP, foreach AdamW and clipping, ZeRO's
# overlapped collectives); held-out layouts 38.2% -> 9.2% median step-time error. DDP's
# allreduce now runs under the backward on gloo's own thread: the fit puts its efficiency at
# the bound (1.0, the microbenchmark's rate); reduce-scatter / all-gather (FSDP2) reach 0.85;
# foreach AdamW moves about 41 bytes per parameter (was 65 on the single-tensor path); every
# operator costs about 43 us of dispatch, 111 us more on tensor-parallel DTensors.
GLOO_ALLREDUCE_TRAINING_EFFICIENCY = 1.0
GLOO_TRAINING_EFFICIENCY = 0.85  # reduce-scatter and all-gather
CPU_OPTIMIZER_BYTES_PER_PARAM = 41.5
CPU_OP_OVERHEAD_US = 43.0
CPU_DTENSOR_OP_OVERHEAD_US = 111.0


class UnknownDeviceKindWarning(UserWarning):
    """A machine file names a device kind that device_kinds.yaml does not know."""


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def list_machines() -> list[str]:
    """Names `load_machine` accepts: the shipped presets and `local`."""
    names = {p.stem for p in PRESET_DIR.glob("*.yaml") if p not in NOT_MACHINES}
    names.add(LOCAL)
    return sorted(names)


def load_machine(name_or_path: str | Path, *, ranks: int | None = None) -> MachineModel:
    """A machine by preset name (`frontier`, `local`, ...) or by path to a YAML file.

    `ranks` is used only for `local`: CPU ranks on this machine (default 2).
    Every problem raises PlanError naming the file and the field.
    """
    text = check_name_or_path(str(name_or_path), "machine")
    if text == LOCAL:
        if LOCAL_FILE.exists():
            machine = load_machine_file(LOCAL_FILE)
            if machine.launch is None:  # a local.yaml written before the local machine had one
                machine = machine.model_copy(update={"launch": local_launch(machine.devices_per_node)})
            return machine if ranks is None else _with_ranks(machine, ranks)
        return detect_local_machine(DEFAULT_LOCAL_RANKS if ranks is None else ranks)
    preset = PRESET_DIR / f"{text}.yaml"
    if not _looks_like_path(text) and _exists(preset) and preset not in NOT_MACHINES:
        return load_machine_file(preset)
    if _looks_like_path(text) or _exists(Path(text)):
        return load_machine_file(Path(text))
    raise PlanError(
        f"unknown machine {text!r}; presets: {', '.join(list_machines())} (or a path to a YAML file)",
        field="machine",
    )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name longer than the file system's limit for one component
        return False


def load_machine_file(path: str | Path) -> MachineModel:
    """Read, complete from the device kind, and validate one machine YAML file."""
    path = Path(path)
    data = _read_yaml_mapping(path, what="machine file")
    data.setdefault("name", path.stem)
    _check_top_level_keys(data, path)
    _warn_if_unknown_device_kind(data, path)
    data = _with_device_kind_defaults(data)
    try:
        return MachineModel.model_validate(data)
    except ValidationError as e:
        raise PlanError(format_validation_error(e), field=str(path)) from None


def device_kind_status() -> dict[str, str]:
    """Every device kind of device_kinds.yaml and where its figures come from, read off the
    "# fit:" comments of its block (which `exaplan validate --published --refit` writes):
    "fitted" (fitted to published rows), "copied from <kind>" (another kind's fit), or
    "unfitted" (first guesses: no published rows of its own)."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in DEVICE_KINDS_FILE.read_text().splitlines():
        key = re.match(r"^([^\s#][^:]*):\s*$", line)
        if key:
            current = key.group(1).strip()
            blocks[current] = []
        elif current is not None and re.match(r"^\s+# fit:", line):
            blocks[current].append(line.split("# fit:", 1)[1].strip())
    status = {}
    for kind, fits in blocks.items():
        copied = next((m.group(1) for m in (re.search(r"copied from (.+?)(?: \(|[.;,]?$)", f) for f in fits) if m), None)
        if copied:
            status[kind] = f"copied from {copied}"
        elif any(re.search(r"over \d+ published rows", f) for f in fits):
            status[kind] = "fitted"
        else:
            status[kind] = "unfitted"
    return status


def measured_kernels_source() -> dict[str, str]:
    """The device kinds whose runtime kernels were measured (device_kinds.yaml runtime_kernels,
    which the exaplan and jax profiles charge), each with its measurement's source."""
    return {kind: str(fig["runtime_kernels"].get("source", "measured"))
            for kind, fig in _device_kinds().items() if isinstance(fig.get("runtime_kernels"), dict)}


def presets_by_device_kind() -> dict[str, list[str]]:
    """The machine presets (not `local`) that name each device kind, kinds in device_kinds.yaml
    order first, then any kind a preset names that the file does not know."""
    out: dict[str, list[str]] = {kind: [] for kind in device_kind_status()}
    for name in list_machines():
        if name == LOCAL:
            continue
        kind = _read_yaml_mapping(PRESET_DIR / f"{name}.yaml", what="machine file").get("device_name")
        out.setdefault(str(kind), []).append(name)
    return out


def detect_local_machine(ranks: int = DEFAULT_LOCAL_RANKS) -> MachineModel:
    """The machine running this command, as `ranks` CPU ranks on one node.

    Cores and memory are detected and split evenly between ranks; speeds are the uncalibrated
    defaults measured on the project's 2-core VMs (a calibration run replaces them by writing
    local.yaml).
    """
    if ranks < 1:
        raise PlanError(f"must be at least 1, got {ranks}", field="ranks")
    cores = cpu_cores()
    memory_gib = _memory_gib()
    cores_per_rank = cores / ranks
    oversubscription = max(1.0, ranks / cores)  # ranks sharing a core also share its comm work

    # Peak chosen so that peak x efficiency(2048) = the measured 65 GFLOP/s per core.
    measured = CPU_MATMUL_GFLOPS_PER_CORE_AVX512 if "avx512f" in _cpu_flags() else CPU_MATMUL_GFLOPS_PER_CORE
    peak_gflops_per_core = measured / _efficiency(CPU_MATMUL_EFFICIENCY, CPU_MATMUL_DIM)
    fp32_tflops = peak_gflops_per_core * cores_per_rank / 1e3
    low_tflops = fp32_tflops / CPU_LOW_PRECISION_SLOWDOWN

    # Ring allreduce over 2 ranks is 2 steps, so a per-step latency of half the fitted
    # intercept reproduces it. The 4-rank-on-2-core run measured ~4 ms: oversubscription^0.7.
    step_latency_us = GLOO_ALLREDUCE_LATENCY_US / 2 * oversubscription**0.7
    bandwidth_gbyte_s = GLOO_BANDWIDTH_GBYTE_S / oversubscription
    return MachineModel(
        name=LOCAL,
        description=(
            f"This machine, detected: {cores} cores, {memory_gib:.1f} GiB, split into {ranks} CPU ranks "
            f"({_cpu_model()}). Uncalibrated defaults: fp32 matmul {measured:g} GFLOP/s per core at "
            "2048^3 (AVX2: measured on a 2-core EPYC VM; AVX-512: on a 2-core Xeon VM), bf16/fp16 "
            "~200x slower, ~20 GB/s memory bandwidth shared, gloo on loopback ~0.8 GB/s with a 2.5 ms "
            "allreduce intercept; framework figures fitted from training runs (loader.py). Run a "
            "calibration to replace them."
        ),
        device_name=f"CPU rank ({_cpu_model()})",
        devices_per_node=ranks,
        device_memory_gib=round(memory_gib / ranks, 3),
        peak_tflops={Precision.fp32: fp32_tflops, Precision.bf16: low_tflops, Precision.fp16: low_tflops},
        matmul_efficiency=CPU_MATMUL_EFFICIENCY,
        attention_efficiency_factor=0.5,  # SDPA math path: bmm + softmax + bmm, all unfused
        memory_bandwidth_gbyte_s=CPU_MEMORY_BANDWIDTH_GBYTE_S / ranks,
        flash_attention=False,
        intra_node_bandwidth_gbyte_s=bandwidth_gbyte_s,
        intra_node_latency_us=step_latency_us,
        nics_per_node=1,
        nic_gbit_s=bandwidth_gbyte_s * 8,  # single node: never used, kept equal to loopback
        inter_node_latency_us=step_latency_us,
        topology=TopologyKind.single_node,
        nodes_per_group=1,
        network_efficiency=1.0,  # the gloo figures above are already achieved, not link peaks
        collective_library="gloo",
        algorithms=["ring"],
        nodes=1,
        # FSDP2 (which also runs DDP here) waits for each collective on a CPU: nothing of
        # the data-parallel traffic hides behind compute.
        overlap=Overlap(dp=0.0, tp=0.0, pp=0.3, cp=0.3),
        collective_efficiency=CollectiveEfficiency(allreduce=GLOO_ALLREDUCE_TRAINING_EFFICIENCY,
                                                   reduce_scatter=GLOO_TRAINING_EFFICIENCY,
                                                   all_gather=GLOO_TRAINING_EFFICIENCY),
        optimizer_bytes_per_param=CPU_OPTIMIZER_BYTES_PER_PARAM,
        op_overhead_us=CPU_OP_OVERHEAD_US,
        dtensor_op_overhead_us=CPU_DTENSOR_OP_OVERHEAD_US,
        dp_buffer_copies=2.0,  # FSDP2's copy-in and copy-out, in line with the collective on a CPU
        memory_reserve_gib=CPU_MEMORY_RESERVE_GIB,
        calibrated=False,
        launch=local_launch(ranks),
    )


def local_launch(ranks: int) -> LaunchSettings:
    """The local machine's launch: section: all its ranks on this one node, torchrun by default
    (a workstation), Slurm and PBS where this machine runs one (tests/slurm/ runs the Slurm
    scripts under a real Slurm on this machine); no binding (the cores may be shared), the
    staged environment in /tmp."""
    return LaunchSettings(schedulers=[SchedulerKind.torchrun, SchedulerKind.slurm, SchedulerKind.pbs],
                          default_scheduler=SchedulerKind.torchrun, ranks_per_node=ranks, local_scratch="/tmp")


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.endswith((".yaml", ".yml"))


def _read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; errors name the file (and line). A device,
    a FIFO, a directory, a binary file, one over 64 MiB or nested over 64 levels is refused
    (planner/schema/files.py)."""
    data = load_yaml_file(path, what)
    if not isinstance(data, dict):
        raise PlanError(f"not a {what} (expected a mapping of fields at the top level)", field=str(path))
    return data


def _check_top_level_keys(data: dict[str, Any], path: Path) -> None:
    """Unknown fields, with a suggestion for a likely misspelling."""
    known = list(MachineModel.model_fields)
    problems = []
    for key in data:
        if key in RENAMED_MACHINE_FIELDS:
            problems.append(f"{key}: renamed to {RENAMED_MACHINE_FIELDS[key]!r} (plan schema 2: units in names that cannot be misread)")
        elif key not in MachineModel.model_fields:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{key}: unknown field{hint}")
    if problems:
        raise PlanError("; ".join(problems), field=str(path))


def _device_kinds() -> dict[str, dict[str, Any]]:
    """The device kinds file, read once per version of it (a machine load asks twice), a copy each time."""
    import copy

    try:
        mtime_ns = DEVICE_KINDS_FILE.stat().st_mtime_ns
    except OSError:  # missing: read, to be refused by name
        return _read_device_kinds()
    return copy.deepcopy(_read_device_kinds_of(str(DEVICE_KINDS_FILE), mtime_ns))


@functools.lru_cache(maxsize=4)
def _read_device_kinds_of(path: str, mtime_ns: int) -> dict[str, dict[str, Any]]:
    return _read_device_kinds()


def _read_device_kinds() -> dict[str, dict[str, Any]]:
    kinds = _read_yaml_mapping(DEVICE_KINDS_FILE, what="device kinds file")
    for kind, figures in kinds.items():
        if not isinstance(figures, dict):
            raise PlanError(f"{kind}: expected a mapping of fields", field=str(DEVICE_KINDS_FILE))
        _check_top_level_keys(figures, DEVICE_KINDS_FILE)
    return kinds


def _warn_if_unknown_device_kind(data: dict[str, Any], path: Path) -> None:
    """One warning (stderr) when the file's device_name is no known kind and the file leaves
    some device-kind figure to the schema's generic defaults; names the closest kinds."""
    name = data.get("device_name")
    kinds = list(_device_kinds())
    if not isinstance(name, str) or name in kinds or all(f in data for f in DEVICE_KIND_FIELDS):
        return
    close = difflib.get_close_matches(name, kinds, n=3, cutoff=0.5)
    hint = f"closest known: {', '.join(repr(k) for k in close)}" if close else f"known: {', '.join(map(repr, kinds))}"
    missing = [f for f in DEVICE_KIND_FIELDS if f not in data]
    lines = read_text(path, "machine file").splitlines()
    lineno = next((i + 1 for i, line in enumerate(lines) if line.startswith("device_name:")), 1)
    # Reported at the file's own device_name line, once per load (no registry: not deduplicated).
    warnings.warn_explicit(
        f"device_name {name!r} is not a device kind of {DEVICE_KINDS_FILE.name} ({hint}); generic "
        f"schema defaults are used for {', '.join(missing)}. Name a known kind, or set these fields "
        "in the file.",
        UnknownDeviceKindWarning, filename=str(path), lineno=lineno, module=path.stem,
    )


def _with_device_kind_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Fill fields the machine file leaves out from its device kind (nested blocks merged)."""
    figures = _device_kinds().get(data.get("device_name"), {})
    out = dict(data)
    for key, value in figures.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = {**value, **out[key]}
    return out


def _with_ranks(machine: MachineModel, ranks: int) -> MachineModel:
    """A calibrated local machine re-split into `ranks` ranks: node-shared figures divided."""
    if ranks < 1:
        raise PlanError(f"must be at least 1, got {ranks}", field="ranks")
    old = machine.devices_per_node
    if ranks == old:
        return machine
    scale = old / ranks
    return machine.model_copy(
        update=dict(
            devices_per_node=ranks,
            device_memory_gib=machine.device_memory_gib * scale,
            peak_tflops={p: tf * scale for p, tf in machine.peak_tflops.items()},
            memory_bandwidth_gbyte_s=machine.memory_bandwidth_gbyte_s * scale,
            launch=None if machine.launch is None else machine.launch.model_copy(update={"ranks_per_node": ranks}),
            description=machine.description + f" Re-split from {old} to {ranks} ranks (compute and memory divided).",
        )
    )


def _efficiency(eff: MatmulEfficiency, dim: float) -> float:
    """The saturating GEMM efficiency curve of MatmulEfficiency at size `dim`."""
    return eff.peak_fraction * dim / (dim + eff.half_dim)


def cpu_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _memory_gib() -> float:
    """Physical memory, capped by a cgroup (container) limit when there is one."""
    total_bytes = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total_bytes = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if total_bytes is None:
        total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total_bytes = min(total_bytes, int(limit))
    except OSError:
        pass
    return total_bytes / 2**30


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
