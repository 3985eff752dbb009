"""Published training runs as data: the record (PublishedRun) and its conventions. The rows are in
calibration/data/published/*.yaml, one file per published source (read by calibration/published.py).

Each record is one published figure with its public source (`source`): the model,
the machine preset, the layout the authors ran, the figure they measured and its kind, and
how to turn the cost model's predicted step time into that figure's unit. Nothing here is
predicted: calibration.validate_published runs the cost model on these records.

Conventions of the published figures (each record's `note` says which applies):
  - Megatron rows (sections A and B) count FLOPs with Megatron's formula for GPT models,
    72 l h^2 (1 + s/(6h)) + 6 h V per token (model FLOPs: no recompute, full s x s
    attention, logits included): planner.cost.flops.megatron_flops_per_token. A row's
    "TFLOP/s per GPU" and "MFU" are that count over the measured step time (MFU: over the
    dense bf16/fp16 peak, 989 TFLOP/s on H100, 312 on A100).
  - llm-foundry rows (C) give MFU and tokens/s per GPU; their MFU is 6 N + 12 l h s FLOPs
    per token (attention counted, no causal halving), i.e. the same information as the
    tokens/s column, which is the figure used here (no FLOP convention involved).
  - fms-fsdp rows (D) give tokens/s per GPU.
  - Iteration-time rows (B, full recompute) are seconds per optimizer step.
Where a field is not published, the record makes a documented choice and lists the field
in `assumed`.

Each record names its training framework (`framework`): megatron for sections A and B,
fsdp for C (llm-foundry) and D (fms-fsdp), both PyTorch FSDP, predicted with the framework's
profile (machine_models/frameworks.yaml; PROFILE_OF: the torch FSDP rows with exaplan's,
whose runtime is torch FSDP2). What a framework sets is part of the record's job (its
attention kernel, Megatron's --tp-comm-overlap: `job()`); what it achieves (hidden
data-parallel traffic, fixed cost per step) is fitted per framework by
calibration.fit_published.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.cost import flops
from planner.cost.compute import FUSED_LOSS_TRAFFIC_BYTES_PER_LOGIT
from planner.cost.layout import Layouts
from planner.cost.memory import LOSS_BYTES_PER_LOGIT
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import MachineModel, ModelSpec, PosInt, Precision, Spec, TrainingJob

FigureKind = Literal["model_tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "iteration_time_s"]
FlopConvention = Literal["megatron", "none"]
# The training framework of a run: its figures (hidden data-parallel traffic, fixed cost per
# step) are fitted per framework, not per run (calibration.fit_published). llm-foundry
# (section C) and fms-fsdp (section D) both train with PyTorch FSDP.
Framework = Literal["megatron", "fsdp", "deepspeed"]
FRAMEWORKS: tuple[str, ...] = ("megatron", "fsdp", "deepspeed")
# The profile (machine_models/frameworks.yaml) each framework's rows are predicted with.
PROFILE_OF = {"megatron": "megatron", "fsdp": "exaplan", "deepspeed": "deepspeed"}
# Data-parallel shardings each framework runs: Megatron's DDP or distributed optimizer,
# FSDP's full, gradient-and-optimizer or hybrid sharding (a single replica: none).
FRAMEWORK_SHARDINGS = {
    "megatron": {Sharding.none, Sharding.zero1},
    "fsdp": {Sharding.none, Sharding.fsdp, Sharding.fsdp_grad_op, Sharding.hsdp},
    "deepspeed": {Sharding.none, Sharding.zero1, Sharding.zero2, Sharding.fsdp},
}

UNITS: dict[str, str] = {
    "model_tflops_per_gpu": "TFLOP/s/GPU",
    "mfu": "MFU %",
    "tokens_per_s_per_gpu": "tok/s/GPU",
    "iteration_time_s": "s/step",
}


# flash-attn 1.x against FlashAttention-2: "around 2x faster" forward + backward (Dao 2023,
# "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", abstract
# and figs. 4-7, A100 and H100).
FLASH_V1_SPEED = 0.5


class PublishedLayout(Spec):
    """The layout a published run used, in the source's own terms."""

    tp: PosInt = Field(1, description="Tensor-parallel degree.")
    pp: PosInt = Field(1, description="Pipeline-parallel degree.")
    cp: PosInt = Field(1, description="Context-parallel degree (Megatron's context_parallel_size: each sequence split over cp ranks).")
    dp: PosInt = Field(description="Data-parallel degree (all replicas and shards).")
    sharding: Sharding = Field(description="Megatron distributed optimizer = zero1; FSDP FULL_SHARD = fsdp; hybrid = hsdp.")
    shard_group: PosInt | None = Field(None, description="hsdp only: ranks sharing one copy (dp_shard).")
    micro_batch: PosInt = Field(description="Sequences per micro-batch.")
    global_batch: PosInt = Field(description="Sequences per optimizer step.")
    vpp: PosInt = Field(1, description="Virtual stages per pipeline rank (interleaved 1F1B when > 1).")
    recompute: Recompute = Field(Recompute.none, description="Activation recompute level.")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (with tp > 1).")

    @model_validator(mode="after")
    def _check(self) -> "PublishedLayout":
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"global batch {self.global_batch} is not a multiple of dp x micro-batch")
        if (self.sharding == Sharding.hsdp) != (self.shard_group is not None):
            raise ValueError("shard_group is given exactly when sharding is hsdp")
        return self

    @property
    def gas(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    def describe(self) -> str:
        """Short text such as 'tp8 pp8 v3 dp1 sp rc selective mbs1 gas64'."""
        parts = [f"tp{self.tp}"] if self.tp > 1 else []
        parts += [f"pp{self.pp}" + (f" v{self.vpp}" if self.vpp > 1 else "")] if self.pp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        sh = self.sharding.value + (f"/{self.shard_group}" if self.shard_group else "")
        parts.append(f"dp{self.dp}" + ("" if self.sharding == Sharding.none else f" {sh}"))
        if self.sequence_parallel:
            parts.append("sp")
        if self.recompute != Recompute.none:
            parts.append(f"rc {self.recompute.value}")
        parts.append(f"mbs{self.micro_batch} gas{self.gas}")
        return " ".join(parts)


class PublishedRun(Spec):
    """One published figure and everything needed to predict it."""

    id: str = Field(description="Short unique id, section letter first.")
    section: str = Field(pattern=r"^[A-Z]$", description="A: Megatron-LM README (DGX H100); B: Korthikanti et al. 2022 (DGX A100); C: MosaicML llm-foundry (H100); D: IBM fms-fsdp (A100); the others: calibration/published.py.")
    source: str = Field(description="Where the figure was published.")
    model: ModelSpec
    machine: str = Field(description="Machine preset (machine_models/<name>.yaml).")
    framework: Framework = Field(description="Training framework: megatron (Megatron-LM) or fsdp (PyTorch FSDP: llm-foundry, fms-fsdp).")
    gpus: PosInt
    layout: PublishedLayout
    precision: Precision = Precision.bf16
    flash_attention: bool = Field(True, description="Fused attention kernel (a software choice: false for 2022 Megatron).")
    tp_comm_overlap: bool = Field(False, description="The framework hides tensor-parallel traffic (Megatron --tp-comm-overlap): a setting of the framework, not fitted.")
    grad_reduce_bf16: bool = Field(False, description="Gradients reduced in bf16 (FSDP's PURE mixed precision) instead of the profile's dtype.")
    grad_reduce_fp32: bool = Field(False, description="Gradients reduced in fp32 instead of the profile's dtype (where a run's software did "
                                                      "and its profile does not; DeepSpeed's BF16_Optimizer casts its fp32 gradients to bf16 first).")
    flash_attention_v1: bool = Field(False, description="The fused attention kernel is flash-attn 1.x or one as fast (llm-foundry's Triton "
                                                        "FlashAttention), about half FlashAttention-2's speed "
                                                        "(Dao 2023): the job's attention_kernel_speed 0.5.")
    recompute_early_stop: bool | None = Field(None, description="Full recompute stops before each block's last GEMM (torch's non-reentrant checkpoint "
                                                               "since 2.1): set where the run's software differs from its profile's; None: the profile's.")
    fused_loss: bool = Field(False, description="The loss is one fused kernel over 16-bit logits (flash-attn's cross_entropy, llm-foundry's default): "
                                                "its memory (planner/cost/memory.py) and traffic (planner/cost/compute.py) per logit.")
    torch_blocks: Literal["eager", "compiled"] | None = Field(
        None, description="The run's blocks are PyTorch ops as exaplan's runtime runs them (a Llama block: "
                          "RMSNorm, SwiGLU, RoPE; section M, and torchtitan in section F): eager (the exaplan "
                          "profile's eager_bytes_per_element and launch figures apply) or compiled; None: the "
                          "framework's own kernels, which the fitted figures describe.")
    exaplan_runtime: bool = Field(False, description="The run is exaplan's own runtime (section M): the exaplan profile's "
                                                    "measured kernels and weight traffic apply (planner/schema/kernels.py).")
    jax_backend: bool = Field(False, description="The run is exaplan's JAX backend (jaxrt/; section M, with exaplan_runtime): "
                                                "predicted with the jax profile, as `exaplan plan --backend jax` predicts it.")
    figure: float = Field(gt=0, description="The published number, in the unit of `kind` (MFU as a fraction).")
    kind: FigureKind
    flop_convention: FlopConvention = Field("none", description="FLOP count behind TFLOP/s and MFU figures.")
    assumed: list[str] = Field(default_factory=list, description="Fields not published; chosen as `note` says.")
    note: str = ""

    @model_validator(mode="after")
    def _check(self) -> "PublishedRun":
        lay = self.layout
        if lay.tp * lay.pp * lay.cp * lay.dp != self.gpus:
            raise ValueError(f"{self.id}: tp x pp x cp x dp = {lay.tp * lay.pp * lay.cp * lay.dp}, published GPUs {self.gpus}")
        if self.kind in ("model_tflops_per_gpu", "mfu") and self.flop_convention == "none":
            raise ValueError(f"{self.id}: a FLOP-rate figure needs its FLOP convention")
        if lay.sharding not in FRAMEWORK_SHARDINGS[self.framework]:
            raise ValueError(f"{self.id}: {self.framework} does not run sharding {lay.sharding.value}")
        if self.tp_comm_overlap and self.framework != "megatron":
            raise ValueError(f"{self.id}: tp_comm_overlap is Megatron's setting")
        if self.grad_reduce_bf16 and self.grad_reduce_fp32:
            raise ValueError(f"{self.id}: gradients reduced in bf16 or in fp32, not both")
        if self.exaplan_runtime and self.framework != "fsdp":
            raise ValueError(f"{self.id}: exaplan_runtime is recorded under framework fsdp, whose profile is exaplan's")
        if self.jax_backend and (not self.exaplan_runtime or self.torch_blocks):
            raise ValueError(f"{self.id}: jax_backend is exaplan's runtime (exaplan_runtime) with no torch blocks")
        if self.torch_blocks and self.framework != "fsdp":
            raise ValueError(f"{self.id}: torch_blocks describes a torch trainer's blocks (framework fsdp)")
        return self

    # --- inputs of the cost model ---------------------------------------------------------

    def job(self) -> TrainingJob:
        """The run's job, with its framework's profile as the run set it (attention kernel,
        Megatron's --tp-comm-overlap). The profile's fitted figures are left to the machine
        (None), so that a fit can vary them there."""
        from machine_models import load_framework

        profile = load_framework(self.profile).model_copy(update={
            "overlap_dp": None, "step_overhead_s": None, "flash_attention": self.flash_attention,
            "compiled": self.torch_blocks == "compiled",
            **({} if self.torch_blocks else {"eager_bytes_per_element": None, "launch_us_per_op": None,
                                             "step_launch_s": 0.0}),
            **({} if self.exaplan_runtime else {"measured_kernels": False, "weight_bytes_per_param": 0.0}),
            "overlap_tp": 1.0 if self.tp_comm_overlap else 0.0,
            **({"grad_reduce_dtype": "bf16", "fp16_grad_reduce_dtype": "fp16"} if self.grad_reduce_bf16 else {}),
            **({"grad_reduce_dtype": "fp32", "fp16_grad_reduce_dtype": "fp32"} if self.grad_reduce_fp32 else {}),
            **({"attention_kernel_speed": FLASH_V1_SPEED} if self.flash_attention_v1 else {}),
            **({} if self.recompute_early_stop is None else {"recompute_early_stop": self.recompute_early_stop}),
            **({"loss_bytes_per_logit": LOSS_BYTES_PER_LOGIT["fused"],
                "loss_traffic_bytes_per_logit": FUSED_LOSS_TRAFFIC_BYTES_PER_LOGIT} if self.fused_loss else {})})
        return TrainingJob(global_batch=self.layout.global_batch, seq_len=self.model.seq_len, precision=self.precision,
                           framework=profile)

    def layouts(self) -> Layouts:
        """The run's layout as a one-row Layouts."""
        lay = self.layout
        return Layouts.one(dp=lay.dp, mbs=lay.micro_batch, gas=lay.gas, tp=lay.tp, pp=lay.pp, cp=lay.cp, sharding=lay.sharding,
                           shard_group=lay.shard_group, recompute=lay.recompute, vpp=lay.vpp, sp=lay.sequence_parallel)

    @property
    def profile(self) -> str:
        """The framework profile the row is predicted with."""
        return "jax" if self.jax_backend else PROFILE_OF[self.framework]

    # --- the published figure's unit -------------------------------------------------------

    def flops_per_token(self) -> float:
        """FLOPs per token under the row's convention (Megatron's formula, model FLOPs)."""
        return flops.megatron_flops_per_token(self.model, self.model.seq_len, full_recompute=False)

    def figure_from_step_time(self, step_time_s, machine: MachineModel):
        """Convert a step time (s; scalar or array) into this row's published unit."""
        tokens = self.layout.global_batch * self.model.seq_len
        if self.kind == "iteration_time_s":
            return step_time_s
        if self.kind == "tokens_per_s_per_gpu":
            return tokens / step_time_s / self.gpus
        tflops = self.flops_per_token() * tokens / step_time_s / self.gpus / 1e12
        if self.kind == "model_tflops_per_gpu":
            return tflops
        return tflops * 1e12 / machine.peak_flops(self.precision)  # mfu

    @property
    def unit(self) -> str:
        return UNITS[self.kind]


def llama31_model(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    """Llama 3.1 as torchtitan and NeMo build it: SwiGLU, RMSNorm, RoPE, 8 KV heads, untied,
    vocab 128256, seq 8192 (the shape of the F and N rows' models)."""
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=8, ffn_hidden=ffn,
                     vocab_size=128256, seq_len=8192, activation="swiglu", norm="rmsnorm", position="rope",
                     tied_embeddings=False)
