"""The figures the fits change, and the one codec between them and a MachineModel.

A *figure* is one number of a machine model that calibration fits: the matmul efficiency
curve, the attention factor, overlap, framework overheads, collective efficiencies. Each has
a name (what fits, reports and device_kinds.yaml call it), how to read it from a machine,
where it lives in the machine, the range a value is clamped to when written (what the
field can mean), and its physical bounds (the widest range any fit may search; a fit may
narrow them, as the published-run fit does for GPUs, but not widen them).

    figures_of(machine)                      # every figure, by name
    figures_of(machine, ("peak_fraction",))  # some
    with_figures(machine, {"overlap_dp": 0.4, "half_dim": 300.0})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from planner.schema.errors import PlanError
from planner.schema.specs import MachineModel

# The AdamW traffic a machine with no figure of its own is predicted with (the cost model's
# fused fp32 default; planner/cost/step.py).
DEFAULT_OPTIMIZER_BYTES_PER_PARAM = 28.0


@dataclass(frozen=True)
class Figure:
    """One fittable figure: read, write (clamped to `clamp`) and physical fit `bounds`."""

    name: str
    get: Callable[[MachineModel], float]
    set: Callable[[MachineModel, float], MachineModel]
    bounds: tuple[float, float]
    clamp: tuple[float | None, float | None]
    description: str


def _nested(block: str, *fields: str) -> Callable[[MachineModel, float], MachineModel]:
    """A setter of `block.<field>` for each field name given (all to the same value)."""
    def set_(m: MachineModel, v: float) -> MachineModel:
        inner = getattr(m, block).model_copy(update={f: v for f in fields})
        return m.model_copy(update={block: inner})

    return set_


def _top(field: str) -> Callable[[MachineModel, float], MachineModel]:
    return lambda m, v: m.model_copy(update={field: v})


def _rs_ag(m: MachineModel) -> float:
    ce = m.collective_efficiency
    return (ce.reduce_scatter * ce.all_gather) ** 0.5


_FIGURES = (
    Figure("peak_fraction", lambda m: m.matmul_efficiency.peak_fraction, _nested("matmul_efficiency", "peak_fraction"),
           (0.02, 1.0), (0.0, 1.0), "fraction of peak reached by very large GEMMs"),
    Figure("half_dim", lambda m: m.matmul_efficiency.half_dim, _nested("matmul_efficiency", "half_dim"),
           (0.0, 4096.0), (0.0, None), "GEMM size at which half of peak_fraction is reached"),
    Figure("attention_efficiency_factor", lambda m: m.attention_efficiency_factor, _top("attention_efficiency_factor"),
           (0.05, 1.0), (0.0, 1.0), "attention core's efficiency relative to a GEMM of its size"),
    # Never 0: elementwise time is bytes / (bandwidth x this figure).
    Figure("elementwise_efficiency", lambda m: m.elementwise_efficiency, _top("elementwise_efficiency"),
           (0.05, 1.0), (0.01, 1.0), "fraction of memory bandwidth the elementwise kernels reach"),
    Figure("overlap_dp", lambda m: m.overlap.dp, _nested("overlap", "dp"),
           (0.0, 1.0), (0.0, 1.0), "hidden fraction of data-parallel traffic"),
    Figure("step_overhead_s", lambda m: m.step_overhead_s, _top("step_overhead_s"),
           (0.0, 2.0), (0.0, None), "fixed framework cost per optimizer step (s)"),
    Figure("op_overhead_us", lambda m: m.op_overhead_us, _top("op_overhead_us"),
           (0.0, 500.0), (0.0, None), "framework cost per operator launched (us)"),
    Figure("dtensor_op_overhead_us", lambda m: m.dtensor_op_overhead_us, _top("dtensor_op_overhead_us"),
           (0.0, 2000.0), (0.0, None), "extra cost per operator on tensor-parallel DTensors (us)"),
    Figure("optimizer_bytes_per_param", lambda m: m.optimizer_bytes_per_param or DEFAULT_OPTIMIZER_BYTES_PER_PARAM,
           _top("optimizer_bytes_per_param"), (8.0, 400.0), (1.0, None), "AdamW memory traffic per parameter (bytes)"),
    Figure("allreduce_efficiency", lambda m: m.collective_efficiency.allreduce,
           _nested("collective_efficiency", "allreduce"), (0.02, 1.0), (0.01, 1.0),
           "allreduce's share of the link figures"),
    # Reduce-scatter and all-gather at one figure: runs seldom tell them apart.
    Figure("rs_ag_efficiency", _rs_ag, _nested("collective_efficiency", "reduce_scatter", "all_gather"),
           (0.02, 1.0), (0.01, 1.0), "reduce-scatter's and all-gather's share of the link figures"),
    Figure("dp_buffer_copies", lambda m: m.dp_buffer_copies, _top("dp_buffer_copies"),
           (0.0, 6.0), (0.0, None), "passes over each data-parallel buffer around its collective"),
    Figure("memory_bandwidth_gbyte_s", lambda m: m.memory_bandwidth_gbyte_s, _top("memory_bandwidth_gbyte_s"),
           (0.5, 200.0), (None, None), "device memory bandwidth (GB/s; the bounds are a CPU's)"),
)
FIGURES: dict[str, Figure] = {f.name: f for f in _FIGURES}
BOUNDS: dict[str, tuple[float, float]] = {f.name: f.bounds for f in _FIGURES}


def _figure(name: str) -> Figure:
    try:
        return FIGURES[name]
    except KeyError:
        raise PlanError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}", field="figures") from None


def figures_of(machine: MachineModel, names: Iterable[str] | None = None) -> dict[str, float]:
    """The figures a machine carries (all of them, or `names`)."""
    return {n: float(_figure(n).get(machine)) for n in (FIGURES if names is None else names)}


def with_figures(machine: MachineModel, figures: dict[str, float]) -> MachineModel:
    """A copy of `machine` carrying `figures` (any subset of FIGURES), each clamped to what
    its field can mean. An unknown name raises PlanError naming the known ones."""
    m = machine
    for name, value in figures.items():
        fig = _figure(name)
        lo, hi = fig.clamp
        v = float(value)
        v = v if lo is None else max(v, lo)
        v = v if hi is None else min(v, hi)
        m = fig.set(m, v)
    return m


def narrowed(bounds: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """Bounds for one fit, checked to lie inside each figure's physical bounds."""
    for name, (lo, hi) in bounds.items():
        plo, phi = _figure(name).bounds
        if not plo <= lo < hi <= phi:
            raise ValueError(f"{name}: fit bounds ({lo}, {hi}) outside the physical ({plo}, {phi})")
    return dict(bounds)


def is_cpu(machine: MachineModel) -> bool:
    """A CPU workstation's machine model (machine_models/loader.py names its device "CPU ...")."""
    return machine.device_name.startswith("CPU")


def framework_machine(machine: MachineModel, framework) -> MachineModel:
    """The machine as `framework` (a FrameworkProfile) uses it: FrameworkProfile.applied_to,
    and on a CPU workstation the framework's fitted CPU figures in place of the machine's."""
    machine = framework.applied_to(machine)
    if framework.cpu_figures and is_cpu(machine):
        machine = with_figures(machine, framework.cpu_figures)
    return machine
