"""Input specs: the model (application), the machine (system) and the training job.

Three inputs kept apart, as in Calculon: cost is a pure function of (model, machine, job,
layout). Every figure carries its unit in its name; every model forbids unknown fields.
"""

from __future__ import annotations

from enum import Enum
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.schema.band import StepTimeBand
from planner.schema.kernels import RuntimeKernels
from planner.schema.launch import LaunchSettings
from planner.schema.vocab import VOCAB_SIZE

PosInt = Annotated[int, Field(gt=0)]
PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
# Efficiencies divide a time: above zero (0 would make every step last forever).
Efficiency = Annotated[float, Field(gt=0, le=1)]

# Physical bounds: every figure is finite (no inf or nan anywhere: Spec's allow_inf_nan) and at
# most these, far past any machine or model built or announced, so that no arithmetic of the
# cost model overflows and a typo (1e30 tokens per sequence) is refused naming its field.
MAX_COUNT = 2**20  # layers, heads, devices per node, NICs per node, ... (1,048,576)
MAX_WIDTH = 2**22  # hidden, ffn_hidden, vocabulary (4,194,304)
MAX_SEQ_LEN = 2**26  # tokens per sequence (67,108,864)
MAX_BATCH = 2**30  # sequences per optimizer step
MAX_NODES = 2**24  # nodes of one system (16,777,216)
MAX_TOKENS = 1e18  # token budget
MAX_RATE = 1e9  # TFLOP/s per device, GB/s, Gbit/s per NIC (a million times today's)
MAX_SIZE_GIB = 2.0**30  # GiB per device (an exbibyte)
MAX_TIME = 1e9  # latencies (us), overheads (us or s)
MAX_NAME = 256  # characters of a name
MAX_TEXT = 8192  # characters of a description

Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
Rate = Annotated[float, Field(gt=0, le=MAX_RATE)]
Time = Annotated[float, Field(ge=0, le=MAX_TIME)]
PosTime = Annotated[float, Field(gt=0, le=MAX_TIME)]
# Names print in reports and job scripts: printable, no control characters, bounded.
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=r"^[^\x00-\x1f\x7f]+$")]
Text = Annotated[str, Field(max_length=MAX_TEXT, pattern=r"^[^\x00-\x08\x0b-\x1f\x7f]*$")]


class Spec(BaseModel):
    """Base of every spec: strict about unknown fields, validated on assignment, every float
    finite (inf and nan refused naming the field)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


# --- Model ----------------------------------------------------------------------------------


class ModelSpec(Spec):
    """A dense decoder-only transformer (Llama-style protein LM by default)."""

    name: Name = Field("custom", description="Preset or user name of the model.")
    layers: Count = Field(description="Number of transformer blocks.")
    hidden: Width = Field(description="Model width d (residual stream size).")
    heads: Count = Field(description="Attention (query) heads.")
    kv_heads: Count = Field(description="Key/value heads (grouped-query attention); = heads for MHA.")
    ffn_hidden: Width = Field(description="Inner width of the MLP.")
    vocab_size: Width = Field(VOCAB_SIZE, description="Vocabulary size (protein: 31 tokens).")
    seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] = Field(description="Default training sequence length in tokens.")
    activation: Literal["gelu", "swiglu"] = Field("swiglu", description="MLP activation.")
    norm: Literal["layernorm", "rmsnorm"] = Field("rmsnorm", description="Normalisation layer.")
    position: Literal["rope", "learned"] = Field("rope", description="Position encoding.")
    tied_embeddings: bool = Field(False, description="Share the input embedding and output head.")

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# --- Machine --------------------------------------------------------------------------------


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


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


# --- Layout choices and the training framework ----------------------------------------------


class Sharding(str, Enum):
    """How data-parallel ranks hold parameters, gradients and optimizer state."""

    none = "none"  # DDP: everything replicated, gradients allreduced
    zero1 = "zero1"  # optimizer state sharded over dp
    zero2 = "zero2"  # optimizer state and gradients sharded over dp
    fsdp = "fsdp"  # everything sharded, parameters resharded after forward (FULL_SHARD)
    fsdp_grad_op = "fsdp-grad-op"  # everything sharded, gathered parameters kept to backward
    hsdp = "hsdp"  # fsdp inside a shard group of dp_shard ranks, replicated across groups


class Recompute(str, Enum):
    """Activation recompute levels (memory kept: none > selective > selective-op > full)."""

    none = "none"  # keep every activation
    selective = "selective"  # recompute the attention core only (Korthikanti et al. 2022)
    full = "full"  # keep only each block's input; recompute the block in backward
    selective_op = "selective-op"  # torchtitan's per-op policy: keep the attention core's and every other GEMM's output


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved_1f1b = "interleaved-1f1b"


class FrameworkProfile(Spec):
    """The training software a job runs with, as the cost model sees it: what the framework
    achieves (fitted per framework from its published runs) and what it offers. Profiles are
    data (machine_models/frameworks.yaml); `exaplan plan --framework NAME` picks one."""

    name: Name = Field("exaplan", description="exaplan (torch FSDP2/DDP/pipelining), megatron, deepspeed, ...")
    description: Text = Field("", description="What the profile stands for and where its figures come from.")
    overlap_dp: Fraction | None = Field(
        None, description="Hidden fraction of the data-parallel traffic under compute (fitted); None: the machine's own figure "
                          "(its device kind's, fitted for exaplan's runtime).")
    step_overhead_s: Time | None = Field(None, description="Fixed cost of every optimizer step (fitted), s; None: the machine's own figure.")
    overlap_tp: Fraction = Field(0.0, description="Hidden fraction of tensor-parallel traffic (Megatron's --tp-comm-overlap: 1).")
    flash_attention: bool = Field(True, description="Uses fused attention where the device has it.")
    sequence_parallel: bool = Field(True, description="Offers sequence parallelism with tensor parallelism.")
    pp_sends_split_over_tp: bool = Field(
        False, description="Pipeline sends split over the tensor-parallel ranks even without sequence parallelism "
                           "(Megatron's scatter/gather of p2p messages).")
    sp_collective_copies: bool = Field(True, description="Sequence parallelism shards dim 1 (batch first: torch DTensor's Shard(1)), "
                                       "so each reduce-scatter, and each all-gather of 2+ sequences, also copies the activation.")
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field("fp32", description="Precision of gradient reduction in bf16 training.")
    fp16_grad_reduce_dtype: Literal["fp32", "fp16"] = Field("fp32", description="The same in fp16 training (Megatron: fp16).")
    loss_bytes_per_logit: Annotated[float, Field(gt=0, le=1024)] = Field(
        12.0, description="Memory the loss holds per logit (torch's eager cross-entropy 12; Megatron's vocab-parallel "
                         "or a fused kernel 4): planner/cost/memory.py.")
    head_bytes_per_element: dict[Literal["rmsnorm", "layernorm"], Annotated[float, Field(ge=0, le=100)]] = Field(
        default_factory=lambda: {"rmsnorm": 24.0, "layernorm": 12.0}, description="By norm: memory the last stage holds as backward passes the final "
        "norm, beyond the blocks' kept tensors, per residual-stream element (planner/cost/memory.py head_bytes); a norm not given: not counted.")
    swiglu_kept_tensors: Literal[3, 4] = Field(4, description="ffn-wide tensors a SwiGLU block keeps for backward: 4 op by op (gate, up, "
                                               "silu(gate), product; torch eager), 3 fused (gate and up, product: Megatron's bias_swiglu).")
    grads_freed_between_steps: bool = Field(True, description="Gradients are freed after each step (torch's zero_grad(set_to_none=True)), "
                                            "so one micro-batch's forward peaks without them; False: flat gradient buffers (Megatron, DeepSpeed).")
    attention_kernel_speed: Annotated[float, Field(gt=0, le=4)] = Field(
        1.0, description="Speed of the framework's fused attention kernel relative to FlashAttention-2, the kernel "
                         "the device kinds' attention_efficiency_factor describes (flash-attn 1.x: 0.5, Dao 2023).")
    recompute_early_stop: bool = Field(
        True, description="Full recompute stops once backward has every tensor it needs, before each block's last "
                           "GEMM (the MLP down projection): torch.utils.checkpoint non-reentrant since torch 2.1 "
                           "(planner/cost/compute.py layer_times). False: the whole block's forward is recomputed "
                           "(reentrant checkpointing: Megatron-LM, DeepSpeed; torch before 2.1).")
    loss_traffic_bytes_per_logit: Annotated[float, Field(gt=0, le=1024)] | None = Field(
        None, description="Bytes the loss moves per logit, forward and backward (planner/cost/compute.py head_time); "
                          "None: 48, twelve fp32 passes (torch's eager or Megatron's vocab-parallel cross-entropy); "
                          "a fused kernel over 16-bit logits (flash-attn's cross_entropy) 6.")
    ddp_buckets_mb: list[Annotated[float, Field(gt=0, le=1e6)]] = Field(default_factory=lambda: [25.0, 100.0, 400.0], max_length=64,
                                           description="DDP gradient bucket sizes the framework can use (MB).")
    zero_bucket_params: Annotated[float, Field(gt=0, le=1e15)] = Field(25 * 2**20 / 4, description="ZeRO-1/2 gradient bucket, parameters (exaplan's "
                                                                     "runtime: 25 MiB of fp32).")
    zero_bucket_params_per_rank: float = Field(0.0, ge=0, le=1e15, description="ZeRO buckets grow to this many parameters per data-parallel rank (Megatron: 1M).")
    eager_bytes_per_element: Annotated[float, Field(gt=0, le=100)] | None = Field(
        10.2, description="Bytes a block's unfused (eager) elementwise ops move on a GPU per element of the fused "
                          "count (planner/cost/compute.py eager_extra_time; exaplan's eager runtime ~10: fp32 norms "
                          "and rotary embeddings op by op); None: the framework's kernels are fused (the count).")
    launch_us_per_op: Annotated[float, Field(gt=0, le=1e4)] | None = Field(
        20.4, description="Host time per operator on a GPU where the blocks run eager (dispatch, launch, Python), us: "
                          "a micro-batch takes at least its operators x this (planner/cost/compute.py "
                          "launch_floor_s); exaplan's runtime measured on an H100 host; None: no floor.")
    step_launch_s: Annotated[float, Field(ge=0, le=10)] = Field(
        0.004, description="Host time per optimizer step on a GPU where the blocks run eager (clipping, the optimizer's "
                           "launches, the loss's synchronisation, records), s: the optimizer's time is at least this.")
    compiled: bool = Field(False, description="The blocks run through torch.compile (`exaplan plan --compile` writes `compile: "
                                              "true` into the plan): eager_bytes_per_element and the launch floor do not apply.")
    compiled_step: bool = Field(False, description="The whole step is one XLA graph (the JAX backend): the residual stream stays in the "
                                "compute dtype and recompute saves no 16-bit weight casts (jax's saved_residuals; planner/cost/memory.py).")
    measured_kernels: bool = Field(True, description="Where the machine carries runtime_kernels (measured for exaplan's "
                                   "runtime), attention and elementwise work are charged at those rates (planner/cost/compute.py).")
    weight_bytes_per_param: Annotated[float, Field(ge=0, le=1e3)] = Field(
        24.0, description="Bytes each parameter a rank holds moves per micro-batch beside the GEMMs, charged with measured_kernels: "
                         "fp32 weights cast under autocast and fp32 gradient accumulation (exaplan's runtime: 24).")
    shardings: list[Sharding] = Field(default_factory=lambda: list(Sharding), description="Data-parallel shardings the framework runs.")
    recompute_levels: list[Recompute] = Field(default_factory=lambda: list(Recompute), min_length=1,
                                              description="Recompute levels the framework offers (selective-op: torch's per-op policy).")
    cpu_figures: dict[str, float] = Field(
        default_factory=dict, description="Figures (planner/schema/figures.py names) this framework reaches on a CPU workstation, "
                                          "fitted from its local runs (`exaplan validate --local --backend jax --refit`); they "
                                          "replace a CPU machine's own (figures.framework_machine). Empty: the machine's.")
    pipeline_parallel: bool = Field(True, description="Offers pipeline parallelism (pp > 1).")
    context_parallel: bool = Field(True, description="Offers context parallelism (cp > 1).")
    precisions: list[Precision] = Field(default_factory=lambda: list(Precision), max_length=len(Precision),
                                        description="Compute precisions the framework trains in.")

    @model_validator(mode="after")
    def _check(self) -> "FrameworkProfile":
        for name, what in (("ddp_buckets_mb", "bucket size"), ("shardings", "sharding"), ("precisions", "precision")):
            if not getattr(self, name):
                raise ValueError(f"{name}: at least one {what}")
        return self

    def offers(self) -> str:
        """What the profile runs, for messages: 'shardings none, zero1; no pipeline parallelism'."""
        out = [f"shardings {', '.join(s.value for s in self.shardings)}"]
        out += [f"no {what} parallelism" for what, has in (("sequence", self.sequence_parallel),
                ("pipeline", self.pipeline_parallel), ("context", self.context_parallel)) if not has]
        return "; ".join(out)

    def grad_reduce_bytes(self, precision: "Precision | str") -> int:
        """Bytes a gradient element the data-parallel reduction moves in `precision` training."""
        dtype = {"fp32": "fp32", "fp16": self.fp16_grad_reduce_dtype}.get(Precision(precision).value, self.grad_reduce_dtype)
        return 4 if dtype == "fp32" else 2

    def applied_to(self, machine: "MachineModel") -> "MachineModel":
        """The machine as this framework uses it: its fitted figures where it has them, its
        tensor-parallel overlap, fused attention only where both offer it. Idempotent."""
        overlap = machine.overlap.model_copy(update={"tp": self.overlap_tp, **(
            {} if self.overlap_dp is None else {"dp": self.overlap_dp})})
        update = {}
        if overlap != machine.overlap:
            update["overlap"] = overlap
        if self.step_overhead_s is not None and self.step_overhead_s != machine.step_overhead_s:
            update["step_overhead_s"] = self.step_overhead_s
        if machine.flash_attention and not self.flash_attention:
            update["flash_attention"] = False
        return machine.model_copy(update=update) if update else machine


# --- Training job ---------------------------------------------------------------------------


class Workload(str, Enum):
    pretrain = "pretrain"
    dpo = "dpo"  # preference tuning (Rafailov et al. 2023): a global batch of (chosen, rejected) pairs


class Reference(str, Enum):
    in_step = "in-step"  # a frozen reference model's forward passes run in every step
    precomputed = "precomputed"  # its log-probabilities were computed once and stored with the pairs


class TrainingJob(Spec):
    """What to train: batch held fixed, sequence length, precision, token budget."""

    global_batch: Annotated[int, Field(gt=0, le=MAX_BATCH)] = Field(
        description="Sequences per optimizer step (dpo: pairs); never changed by the search.")
    seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] = Field(description="Tokens per sequence.")
    precision: Precision = Field(Precision.bf16, description="Compute precision; accumulation and reduction are fp32.")
    optimizer: Literal["adamw"] = Field("adamw", description="Optimizer (AdamW: two fp32 moments per parameter).")
    workload: Workload = Field(Workload.pretrain, description="pretrain, or dpo (each sample a chosen and a rejected sequence).")
    reference: Reference = Field(
        Reference.in_step, description="dpo: the frozen reference model runs in every step (in-step: its forward "
                                       "passes and its parameters count), or its log-probabilities were precomputed."
    )
    token_budget: float = Field(1e9, gt=0, le=MAX_TOKENS, description="Tokens to train on, for time-to-train.")
    framework: FrameworkProfile = Field(default_factory=FrameworkProfile,
                                        description="The training software (default: exaplan's own runtime).")

    @model_validator(mode="after")
    def _check_precision(self) -> "TrainingJob":
        if self.precision not in self.framework.precisions:
            raise ValueError(f"precision: {precision_message(self.precision, self.framework)}")
        return self

    @property
    def sequences_per_sample(self) -> int:
        """Sequences the policy runs per sample of the global batch: 2 for a dpo pair."""
        return 2 if self.workload == Workload.dpo else 1

    @property
    def reference_in_step(self) -> bool:
        return self.workload == Workload.dpo and self.reference == Reference.in_step

    @property
    def tokens_per_step(self) -> int:
        """Tokens the policy trains on per step (dpo: both sequences of every pair)."""
        return self.global_batch * self.sequences_per_sample * self.seq_len


def precision_message(precision: Precision | str, framework: FrameworkProfile) -> str:
    """Why a job of this precision cannot run with this framework."""
    return (f"{Precision(precision).value} is not one the framework {framework.name} trains in "
            f"({', '.join(p.value for p in framework.precisions)})")


def bytes_per_element(precision: Precision | str) -> int:
    """Bytes of one activation or working-weight element at the compute precision."""
    return 4 if Precision(precision) == Precision.fp32 else 2


def is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending (from its prime factors: fast for the worlds of
    huge machines, 2^44 ranks included; cached, so callers must not mutate the list)."""
    return list(_divisors(n))


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    out = [1]
    for p, k in _factorise(n).items():
        out = [d * p**e for d in out for e in range(k + 1)]
    return tuple(sorted(out))


def _factorise(n: int) -> dict[int, int]:
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors
