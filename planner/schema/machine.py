"""The machine (the system): nodes of identical devices, their precisions, an intra-node fabric
and NICs into a fabric, the collective library and its algorithms, and the figures fitted per
device kind.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field, model_validator

from planner.schema.band import StepTimeBand
from planner.schema.bounds import (MAX_NODES, MAX_SIZE_GIB, MAX_WIDTH, Count, Efficiency, Fraction, Name, PosTime, Rate, Spec,
                                   Text, Time)
from planner.schema.kernels import RuntimeKernels
from planner.schema.launch import LaunchSettings


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


def bytes_per_element(precision: Precision | str) -> int:
    """Bytes of one activation or working-weight element at the compute precision."""
    return 4 if Precision(precision) == Precision.fp32 else 2


class CollectiveLibrary(str, Enum):
    nccl = "nccl"
    rccl = "rccl"
    oneccl = "oneccl"
    gloo = "gloo"


class Algorithm(str, Enum):
    """Collective algorithms the cost model knows (alpha-beta costs in planner.cost.comm)."""

    ring = "ring"
    tree = "tree"  # double binary tree
    rabenseifner = "rabenseifner"  # recursive halving reduce-scatter + doubling all-gather
    hierarchical = "hierarchical"  # inside the node, then across nodes, then inside again


ALGORITHM_ORDER = [a.value for a in Algorithm]


class TopologyKind(str, Enum):
    single_node = "single-node"
    fat_tree = "fat-tree"  # full bisection between nodes
    dragonfly = "dragonfly"  # groups of nodes; global links may be tapered


class MatmulEfficiency(Spec):
    """Achievable fraction of peak for a matrix multiply of a given size.

    eff(d) = peak_fraction * d / (d + half_dim), with d the geometric mean (M*N*K)^(1/3) of
    the GEMM's dimensions: a saturating curve (small per-rank shapes from high TP or small
    micro-batches run less efficiently), two physical figures per device kind.
    """

    peak_fraction: Efficiency = Field(0.8, description="Efficiency reached by very large GEMMs.")
    half_dim: float = Field(256.0, ge=0, le=MAX_WIDTH, description="GEMM size d at which half of peak_fraction is reached.")


class Overlap(Spec):
    """Fractions of communication hidden behind computation (fitted per device kind)."""

    dp: Fraction = Field(0.9, description="Of dp/FSDP traffic under backward (or forward) compute, the part hidden.")
    tp: Fraction = Field(0.0, description="Of tensor-parallel traffic hidden (0 unless the framework overlaps it).")
    pp: Fraction = Field(0.5, description="Of pipeline point-to-point traffic hidden.")
    cp: Fraction = Field(0.8, description="Of context-parallel (ring attention) traffic hidden behind attention.")


class CollectiveEfficiency(Spec):
    """Fraction of the link figures (fitted on allreduce) that each collective of the library
    reaches. 1.0 on NCCL/RCCL/oneCCL, whose rings run every collective at the link rate; gloo
    runs reduce-scatter and all-gather as slower generic algorithms (about 0.3 measured)."""

    allreduce: Efficiency = Field(1.0, description="Allreduce, relative to the link figures.")
    reduce_scatter: Efficiency = Field(1.0, description="Reduce-scatter, relative to a ring at the link figures.")
    all_gather: Efficiency = Field(1.0, description="All-gather, relative to a ring at the link figures.")


# Machine fields renamed in plan schema 2 (old -> new): units in the name that cannot be
# misread (Gbit/s for NICs, GB/s for memory and fabrics). Old machine files and `--set` get
# the new name in their error message.
RENAMED_MACHINE_FIELDS = {
    "nic_gbps": "nic_gbit_s",
    "memory_bandwidth_gbps": "memory_bandwidth_gbyte_s",
    "intra_node_bandwidth_gbps": "intra_node_bandwidth_gbyte_s",
}


class MachinePower(Spec):
    """The `power:` section of a machine file: what a node draws while training (`exaplan
    whatif`'s energy = node_w x nodes x time). Not part of plan files (MachineModel.power is
    excluded from a plan's dump and its content hash); the sources are comments in the file."""

    device_w: Rate = Field(description="Power of one device (rank) under load, W: the vendor TDP, halved for a "
                                           "tile or GCD that runs its own rank.")
    node_w: Rate = Field(description="Power of one whole node under load (devices, CPUs, memory, NICs), W; "
                                         "cooling and facility overheads (PUE) excluded.")


class MachineModel(Spec):
    """A machine: nodes of identical devices, an intra-node fabric and NICs into a fabric."""

    name: Name = Field("custom", description="Machine name.")
    description: Text = Field("", description="Free text: where the figures come from.")
    device_name: Name = Field(description="Device kind (e.g. 'NVIDIA H100 80GB SXM'); efficiency figures are per kind.")
    devices_per_node: Count = Field(description="Ranks per node: a GPU, or a tile/GCD where each runs its own rank.")
    device_memory_gib: Annotated[float, Field(gt=0, le=MAX_SIZE_GIB)] = Field(description="Memory per device (GiB).")
    peak_tflops: dict[Precision, Rate] = Field(description="Peak dense TFLOP/s per device for each precision.")
    matmul_efficiency: MatmulEfficiency = Field(default_factory=MatmulEfficiency)
    attention_efficiency_factor: Efficiency = Field(
        0.8, description="Attention-core efficiency relative to a GEMM of the same size, d = (s_local s head_dim)^(1/3): "
                         "what the fused (flash) or batched kernel reaches of the matmul curve; the backward's FLOPs "
                         "are modelled (FlashAttention-2 recomputes Q K^T: 2.5 x forward). Fitted per device kind, "
                         "at least 0.3 for GPUs (calibration/fit_published.py)."
    )
    memory_bandwidth_gbyte_s: Rate = Field(description="Device memory bandwidth (GB/s) for elementwise ops and the optimizer.")
    elementwise_efficiency: float = Field(1.0, gt=0, le=1, description="Fraction of memory_bandwidth_gbyte_s that a block's memory-bound elementwise "
        "kernels (norms, residual adds, activations, RoPE, layout copies, the loss's softmax) reach on activation-sized tensors: launch and tail "
        "effects of many small kernels, reduction passes. Fitted per device kind, 0.3-0.95 for GPUs (calibration/fit_published.py); 1 (the default): the copy bandwidth.")
    elementwise_reference_gbyte_s: Rate | None = Field(
        None, description="The memory bandwidth (GB/s) of the part the device kind's elementwise_efficiency was fitted "
                          "on: on a part of the kind with other memory, only a share of the elementwise time scales with "
                          "the bandwidth (planner/cost/compute.py elementwise_bandwidth); None: all of it.")
    flash_attention: bool = Field(True, description="Fused attention that never stores the s x s scores.")
    intra_node_bandwidth_gbyte_s: Rate = Field(description="Intra-node fabric bandwidth per device per direction (GB/s).")
    intra_node_latency_us: PosTime = Field(description="Latency of one intra-node message (microseconds).")
    nics_per_node: Count = Field(description="Network interfaces per node.")
    nic_gbit_s: Rate = Field(description="Bandwidth per NIC per direction (Gbit/s).")
    inter_node_latency_us: PosTime = Field(description="Latency of one inter-node message (microseconds).")
    topology: TopologyKind = Field(TopologyKind.fat_tree, description="Kind of inter-node fabric.")
    global_bandwidth_taper: Efficiency = Field(1.0, description="Fraction of injection bandwidth available between dragonfly groups (1 = full).")
    nodes_per_group: Annotated[int, Field(gt=0, le=MAX_NODES)] = Field(128, description="Nodes per dragonfly group (or leaf switch).")
    network_efficiency: Efficiency = Field(0.85, description="Achievable fraction of link bandwidth for collectives.")
    inter_node_efficiency: Efficiency | None = Field(None, description="Achievable fraction of the NICs' bandwidth for "
                                                     "collectives between nodes, where measured apart; None: network_efficiency.")
    collective_library: CollectiveLibrary = Field(description="nccl, rccl, oneccl or gloo.")
    algorithms: list[Algorithm] = Field(max_length=len(Algorithm), description="Allreduce algorithms the library can be told to use.")
    nodes: Annotated[int, Field(gt=0, le=MAX_NODES)] = Field(description="Nodes in the whole system.")
    overlap: Overlap = Field(default_factory=Overlap)
    collective_efficiency: CollectiveEfficiency = Field(default_factory=CollectiveEfficiency)
    dp_buffer_copies: float = Field(0.0, ge=0, le=1000, description="Passes (a read and a write each) over every data-parallel collective's "
        "buffer that the framework makes around it, in line (FSDP2's copy-in/copy-out on a CPU: 2; on GPUs the communication stream's: 0).")
    optimizer_bytes_per_param: Annotated[float, Field(gt=0, le=1e6)] | None = Field(
        None, description="Memory traffic of one AdamW step per parameter of the shard (bytes; default 28 fp32, 30 "
                          "mixed: a fused kernel's one pass). Unfused per-tensor optimizers on CPUs move 2-3x that."
    )
    op_overhead_us: Time = Field(0.0, description="Framework cost of launching one operator (Python dispatch, autograd, kernel "
                                                  "launch), microseconds; matters for small models and CPUs.")
    dtensor_op_overhead_us: Time = Field(0.0, description="Extra framework cost of one operator on tensor-parallel DTensors (sharding "
                                                          "propagation, redistribution), microseconds; paid by every block's operators when tp > 1.")
    step_overhead_s: Time = Field(0.0, description="Fixed cost of every optimizer step in the training framework (launches, clipping, loss sync), s.")
    memory_reserve_gib: float = Field(2.0, ge=0, le=MAX_SIZE_GIB, description="Per device: runtime context, workspace (GiB).")
    fragmentation_fraction: Fraction = Field(0.1, description="Extra fraction of allocated memory lost to fragmentation.")
    calibrated: bool = Field(False, description="True when the efficiency figures were measured or fitted.")
    runtime_kernels: RuntimeKernels | None = Field(None, description="exaplan's runtime's kernels measured on this device "
                                                   "kind (planner/schema/kernels.py); None: not measured.")
    launch: LaunchSettings | None = Field(
        None, exclude=True, description="How jobs start on this machine (`exaplan launch`; planner/schema/launch.py). "
                                        "Not written into plan files, nor into their content hash.")
    power: MachinePower | None = Field(None, exclude=True, description="Power under load (`exaplan whatif` energy; MachinePower). "
                                       "Not written into plan files, nor into their content hash.")
    step_time_band: StepTimeBand | None = Field(None, exclude=True, description="This machine's own step-time interval from its calibration "
        "runs (planner/schema/band.py); None: its device kind's. Not written into plan files, whose intervals record it.")

    @model_validator(mode="after")
    def _check(self) -> "MachineModel":
        if not self.algorithms:
            raise ValueError("algorithms: the collective library must offer at least one algorithm")
        if self.collective_library == CollectiveLibrary.gloo and len(self.algorithms) > 1:
            raise ValueError("algorithms: gloo has no user-selectable algorithm; list exactly one")
        if Precision.fp32 not in self.peak_tflops:
            raise ValueError("peak_tflops: must give fp32 (the fallback precision)")
        return self

    @property
    def nic_efficiency(self) -> float:
        """The fraction of the NICs that collectives between nodes reach: inter_node_efficiency where measured apart."""
        return self.network_efficiency if self.inter_node_efficiency is None else self.inter_node_efficiency

    @property
    def node_injection_gbyte_s(self) -> float:
        """Bytes/s a node can send into the fabric (GB/s), all NICs together."""
        return self.nics_per_node * self.nic_gbit_s / 8.0

    def peak_flops(self, precision: Precision) -> float:
        """Peak dense FLOP/s per device at this precision (falls back to fp32 if absent)."""
        tf = self.peak_tflops.get(Precision(precision), self.peak_tflops[Precision.fp32])
        return tf * 1e12
