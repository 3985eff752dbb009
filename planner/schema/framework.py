"""The layout choices (data-parallel sharding, activation recompute, pipeline schedule) and the
training framework that runs them, as the cost model sees it (FrameworkProfile).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.schema.bounds import Fraction, Name, Spec, Text, Time
from planner.schema.choices import Recompute, Schedule, Sharding
from planner.schema.machine import CollectiveLibrary, MachineModel, Precision


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
    pipeline_unsharded_grads: bool = Field(True, description="A pipeline schedule defers FSDP2's gradient sync to the last "
                                           "micro-batch (torch.distributed.pipelining), so the stage's unsharded gradients accumulate "
                                           "in fp32 beside the sharded ones (4 bytes a parameter; replicate's 16-bit grads: 2 more): "
                                           "measured by exaplan check at full size.")
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
    tensor_parallel: bool = Field(True, description="Offers tensor parallelism (tp > 1): False where the model code is "
                                                    "the user's (DeepSpeed's ds_config for your own model).")
    pipeline_parallel: bool = Field(True, description="Offers pipeline parallelism (pp > 1).")
    context_parallel: bool = Field(True, description="Offers context parallelism (cp > 1).")
    precisions: list[Precision] = Field(default_factory=lambda: list(Precision), max_length=len(Precision),
                                        description="Compute precisions the framework trains in.")
    schedules: list[Schedule] = Field(default_factory=lambda: list(Schedule), min_length=1,
                                      description="Pipeline schedules the framework runs (pp > 1).")
    even_stages: bool = Field(False, description="Pipeline stages hold equal numbers of layers: pp x virtual stages "
                                                 "divides the layers (Megatron's validate_args); False: any split.")
    pipeline_shardings: list[Sharding] | None = Field(
        None, description="Shardings the framework runs together with pipeline parallelism (DeepSpeed's pipeline "
                          "engine: ZeRO stages 0-1); None: all of `shardings`.")
    replicate_alone: bool = Field(False, description="Sharding none (DDP) only without tensor, pipeline or context "
                                                     "parallelism, and never with cp > 1 (torchtitan: DDP does not "
                                                     "compose with them; context parallelism shards over dp_shard x cp).")
    collective_libraries: list[CollectiveLibrary] | None = Field(
        None, description="Collective libraries the framework trains over (Megatron-LM: nccl, rccl); None: any.")
    workloads: list[Literal["pretrain", "dpo"]] = Field(
        default_factory=lambda: ["pretrain", "dpo"], min_length=1, description="Workloads the framework trains "
        "(torchtitan 0.3.0: next-token pretraining only).")
    dpo_references: list[Literal["in-step", "precomputed"]] = Field(
        default_factory=lambda: ["in-step", "precomputed"], min_length=1, description="DPO: the reference models "
        "it runs (MaxText's train_dpo runs the reference in every step; it reads no precomputed log-probabilities).")
    dpo_shardings: list[Sharding] | None = Field(
        None, description="Shardings the framework's DPO runs with (Megatron-DeepSpeed's dpo_training.py: no ZeRO-3, "
                          "its reference model is built partitioned and then run without ZeRO); None: all of `shardings`.")
    dpo_pipeline_parallel: bool = Field(True, description="DPO runs with pipeline parallelism (Megatron-DeepSpeed's "
                                                          "dpo_training.py calls the model's forward itself, which "
                                                          "DeepSpeed's pipeline engine does not allow).")
    tp_needs_sp: bool = Field(False, description="Tensor parallelism always shards the residual stream over the "
                                                 "tensor ranks (MaxText's activation_embed rule): tp > 1 only with "
                                                 "sequence parallelism.")
    microbatches_multiple_of_stages: bool = Field(
        False, description="With pp > 1 the micro-batches per step are a multiple of the stages (MaxText's "
                           "num_pipeline_microbatches).")
    node_split_axes: list[Literal["tp", "cp", "dp_shard", "dp_replicate", "pp"]] | None = Field(
        None, description="Mesh dimensions in rank order, fastest first, each of which the framework splits at the "
                          "node boundary into an in-node and an across-node factor (MaxText's ici_ and dcn_ axes): "
                          "a degree must divide the ranks a node has left for it or be a multiple of them. None: any.")
    nvidia_only_recompute: list[Recompute] = Field(
        default_factory=list, description="Recompute levels offered on NVIDIA devices only (MaxText names the "
                                          "attention output that selective-op keeps only in its cuDNN and TPU kernels).")
    pipeline_tied_embeddings: bool = Field(True, description="Ties the embedding and the head under pipeline "
                                                             "parallelism (torchtitan 0.3.0 does not).")
    ddp_bucket_per_block: bool = Field(False, description="Replicated gradients are reduced one transformer block "
                                                          "at a time (torchtitan's replicate per block): the DDP bucket "
                                                          "is one block's fp32 gradients, not one of ddp_buckets_mb.")

    @model_validator(mode="after")
    def _check(self) -> "FrameworkProfile":
        for name, what in (("ddp_buckets_mb", "bucket size"), ("shardings", "sharding"), ("precisions", "precision")):
            if not getattr(self, name):
                raise ValueError(f"{name}: at least one {what}")
        return self

    def offers(self) -> str:
        """What the profile runs, for messages: 'shardings none, zero1; no pipeline parallelism'."""
        out = [f"shardings {', '.join(s.value for s in self.shardings)}"]
        out += [f"no {what} parallelism" for what, has in (("tensor", self.tensor_parallel), ("sequence", self.sequence_parallel),
                ("pipeline", self.pipeline_parallel), ("context", self.context_parallel)) if not has]
        return "; ".join(out)

    def pipeline_sharding_ok(self, sharding: "Sharding | str") -> bool:
        return self.pipeline_shardings is None or Sharding(sharding) in self.pipeline_shardings

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


def layout_refusals(profile: FrameworkProfile, *, layers: int | None, pp: int, vpp: int, cp: int, tp: int, dp_replicate: int,
                    dp_shard: int, sharding: "Sharding | str", recompute: "Recompute | str", schedule: "Schedule | str | None",
                    sp: bool, precision: "Precision | str | None", stages: list[tuple[int, int]] | None = None,
                    target: str | None = None, gas: int | None = None, ranks_per_node: int | None = None,
                    device_name: str | None = None, tied_embeddings: bool = False,
                    workload: str | None = None) -> list[str]:
    """Why the framework cannot run one layout (empty when it can), each naming the plan's field:
    the one statement of a profile's constraints that the search (planner.cost.layout, which
    vectorises it) and the exporters (export/) both keep. `stages`: the plan's (first, last)
    layer ranges, checked against even_stages; `gas`, `ranks_per_node`, `device_name`: the
    micro-batches per step, the node's ranks, the device and the workload, where the profile
    constrains them (None: not checked)."""
    name = target or profile.name
    sharding, recompute = Sharding(sharding), Recompute(recompute)
    out = []
    if sharding not in profile.shardings:
        out.append(f"sharding.kind: {name} runs {', '.join(s.value for s in profile.shardings)}, not {sharding.value}")
    if recompute not in profile.recompute_levels:
        out.append(f"recompute: {name} offers {', '.join(r.value for r in profile.recompute_levels)}, not {recompute.value}")
    elif recompute in profile.nvidia_only_recompute and device_name is not None and not is_nvidia(device_name):
        out.append(f"recompute: {name} offers {recompute.value} on NVIDIA devices only, not on {device_name}")
    if sp and not profile.sequence_parallel:
        out.append(f"sequence_parallel: {name} has no sequence parallelism")
    if tp > 1 and not sp and profile.tp_needs_sp:
        out.append(f"sequence_parallel: {name} always shards the residual stream over the tensor ranks; tp {tp} "
                   "needs sequence parallelism")
    if tp > 1 and not profile.tensor_parallel:
        out.append(f"mesh.tp: {name} has no tensor parallelism (tp must be 1, got {tp})")
    if cp > 1 and not profile.context_parallel:
        out.append(f"mesh.cp: {name} has no context parallelism (cp must be 1, got {cp})")
    if precision is not None and Precision(precision) not in profile.precisions:
        out.append(f"job.precision: {name} trains in {', '.join(p.value for p in profile.precisions)}, not {Precision(precision).value}")
    if pp > 1:
        if not profile.pipeline_parallel:
            out.append(f"mesh.pp: {name} has no pipeline parallelism (pp must be 1, got {pp})")
        elif schedule is not None and Schedule(schedule) not in profile.schedules:
            out.append(f"pipeline.schedule: {name} runs {', '.join(s.value for s in profile.schedules)}, not {Schedule(schedule).value}")
        if not profile.pipeline_sharding_ok(sharding):
            out.append(f"sharding.kind: {name} runs {', '.join(s.value for s in profile.pipeline_shardings or [])} with "
                       f"pipeline parallelism, not {sharding.value}")
        if profile.even_stages and layers is not None:
            chunks = pp * vpp
            if layers % chunks:
                out.append(f"pipeline.stages: {name} splits the layers evenly; pp x virtual stages = {chunks} does not "
                           f"divide {layers} layers")
            elif stages and any(b - a != layers // chunks for a, b in stages):
                out.append(f"pipeline.stages: {name} splits the layers evenly ({layers // chunks} a stage); the plan's "
                           f"stages hold {', '.join(str(b - a) for a, b in stages)}")
    if profile.replicate_alone and sharding == Sharding.none and cp > 1:
        out.append(f"sharding.kind: {name} shards the parameters over the context-parallel ranks; with cp {cp} use fsdp or hsdp")
    elif profile.replicate_alone and sharding == Sharding.none and dp_replicate * dp_shard > 1 and max(pp, cp, tp) > 1:
        out.append(f"sharding.kind: {name} runs DDP (sharding none) only as the one parallelism; with pp {pp}, cp {cp}, "
                   f"tp {tp} use fsdp or hsdp")
    if workload == "dpo" and pp > 1 and not profile.dpo_pipeline_parallel:
        out.append(f"mesh.pp: {name}'s DPO has no pipeline parallelism (pp must be 1, got {pp})")
    if workload == "dpo" and profile.dpo_shardings is not None and sharding not in profile.dpo_shardings:
        out.append(f"sharding.kind: {name}'s DPO runs {', '.join(s.value for s in profile.dpo_shardings)}, not {sharding.value}")
    if pp > 1 and gas is not None and profile.microbatches_multiple_of_stages and gas % pp:
        out.append(f"grad_accumulation_steps: {name} runs a multiple of the stages ({pp}) as micro-batches, not {gas}")
    if pp > 1 and tied_embeddings and not profile.pipeline_tied_embeddings:
        out.append(f"model.tied_embeddings: {name} does not tie the embedding and the head under pipeline parallelism")
    if profile.node_split_axes is not None and ranks_per_node is not None:
        degrees = {"tp": tp, "cp": cp, "dp_shard": dp_shard, "dp_replicate": dp_replicate, "pp": pp}
        left = ranks_per_node
        for axis in profile.node_split_axes:
            degree = degrees[axis]
            if left % degree and degree % left:
                out.append(f"mesh.{axis}: the node boundary ({ranks_per_node} ranks, {left} left for {axis}) cuts "
                           f"{axis} = {degree} unevenly; {name} splits each mesh axis into an in-node and an "
                           "across-node factor")
                break
            left //= degree if left % degree == 0 else left
    return out


def is_nvidia(device_name: str) -> bool:
    return device_name.startswith("NVIDIA")


def job_refusals(profile: FrameworkProfile, workload: str, reference: str, library: str | None = None) -> list[str]:
    """Why the framework cannot train the job's workload (empty when it can), or on a machine of
    this collective library, naming the field."""
    libraries = [lib.value for lib in profile.collective_libraries or []]
    if library is not None and libraries and library not in libraries:
        return [f"machine.collective_library: {profile.name} trains over {', '.join(libraries)}, not {library}"]
    if workload not in profile.workloads:
        return [f"job.workload: {profile.name} trains {', '.join(profile.workloads)}, not {workload}"]
    if workload == "dpo" and reference not in profile.dpo_references:
        return [f"job.reference: {profile.name}'s DPO runs the reference {', '.join(profile.dpo_references)}, "
                f"not {reference}"]
    return []
