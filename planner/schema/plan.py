"""The plan file: the one contract between the planner and the runtime.

A plan says how to lay one training job out on one machine: the mesh, the batch split,
pipeline stages, sharding, recompute, the collective algorithm per communicator with the
environment that makes the library use it, and what the cost model predicts. It carries its
provenance and a content hash that `load_plan` checks, so an edited plan is refused.

The runtime imports this module (and the specs it names) and nothing else from the planner.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from planner.schema.errors import PlanError, check_name_or_path, format_validation_error
from planner.schema.files import load_yaml_file
from planner.schema.launch import env_problems
from planner.schema.specs import (  # noqa: F401 - the layout enums are part of the plan's API
    Algorithm, Fraction, FrameworkProfile, MachineModel, ModelSpec, PosInt, Precision, Recompute, Schedule, Sharding, Spec,
    TrainingJob,
)

SCHEMA_VERSION = 2
# What changed in each version, for the message that refuses an older plan file.
SCHEMA_CHANGES = {
    2: "machine bandwidths renamed with unambiguous units (nic_gbps -> nic_gbit_s, memory_bandwidth_gbps -> "
       "memory_bandwidth_gbyte_s, intra_node_bandwidth_gbps -> intra_node_bandwidth_gbyte_s); rank_mapping, "
       "sharding.backward_prefetch and sharding.limit_all_gathers removed (derivable or never read)",
}

# Mesh axes, outermost first; the rank is the row-major index over these degrees, so tp is
# the fastest-varying axis (tensor-parallel ranks are neighbours, inside a node).
MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class Communicator(str, Enum):
    dp = "dp"
    tp = "tp"
    pp = "pp"
    cp = "cp"


class Mesh(Spec):
    """Degrees of the mesh axes, in the fixed order pp, dp_replicate, dp_shard, cp, tp.

    Where each global rank runs follows from the degrees (no table is stored): ranks fill
    nodes in order (node = rank // ranks_per_node, device = rank % ranks_per_node) and take
    mesh coordinates row-major over MESH_AXES, tp fastest (`Plan.placement`,
    `Plan.coordinates`, `Plan.rank_table`)."""

    pp: PosInt = 1
    dp_replicate: PosInt = 1
    dp_shard: PosInt = 1
    cp: PosInt = 1
    tp: PosInt = 1

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(getattr(self, a) for a in MESH_AXES)

    @property
    def world_size(self) -> int:
        n = 1
        for d in self.degrees:
            n *= d
        return n

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


class StageAssignment(Spec):
    """One (virtual) pipeline stage: layers [first_layer, last_layer) on pipeline rank pp_rank."""

    pp_rank: int = Field(ge=0)
    virtual_index: int = Field(0, ge=0, description="Chunk index on that rank (interleaved schedules).")
    first_layer: int = Field(ge=0)
    last_layer: int = Field(ge=0, description="Exclusive.")
    embedding: bool = False
    head: bool = False


class Pipeline(Spec):
    schedule: Schedule | None = Field(None, description="None when pp == 1.")
    virtual_stages: PosInt = Field(1, description="Model chunks per pipeline rank (interleaved 1F1B).")
    stages: list[StageAssignment] = Field(default_factory=list, description="In model order.")


class ShardingOptions(Spec):
    kind: Sharding = Sharding.none
    shard_group_size: PosInt = Field(1, description="Ranks that shard one replica (= dp_shard).")
    reshard_after_forward: bool = True
    ddp_bucket_mb: float = Field(25.0, gt=0, description="DDP gradient bucket size (MB).")
    ddp_impl: Literal["ddp", "replicate"] | None = Field(
        None, description="How the runtime replicates under kind none: torch's DistributedDataParallel (plain "
                          "tensors: tp == pp == 1, fp32 or bf16) or the FSDP2-based `replicate` (DTensors, pipeline "
                          "stages); None (plans before 0.14, or another kind): replicate. planner.schema.plan.ddp_impl_for.")


class CollectiveChoice(Spec):
    """The collective one communicator runs, and how: its size and where its ranks sit."""

    op: Literal["allreduce", "reduce_scatter+all_gather", "all_gather+reduce_scatter", "send_recv"]
    algorithm: Algorithm
    ranks: PosInt
    nodes_spanned: PosInt
    bytes_per_step: float = Field(ge=0)


class Collectives(Spec):
    library: str
    communicators: dict[Communicator, CollectiveChoice] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict, description="Set before the process group starts: names on the "
                                "allow-list of planner/schema/launch.py (LD_*, PATH, PYTHON* refused), printable values.")

    @field_validator("env", mode="before")
    @classmethod
    def _allowed_env(cls, env):
        """A tampered plan (re-hashed, so the hash cannot tell) still cannot set the loader's or
        Python's variables nor a shell string: the same check as `exaplan launch`'s."""
        problems = env_problems(env) if isinstance(env, dict) else []
        if problems:
            raise ValueError("; ".join(problems))
        return env


class StepTimeBreakdown(Spec):
    compute_s: float
    bubble_s: float
    optimizer_s: float
    exposed_comm_s: dict[Communicator, float]


class MemoryBreakdown(Spec):
    parameters_gib: float
    gradients_gib: float = Field(description="Gradients held at the peak: all of them, or, in a step of one micro-batch "
                                             "whose framework frees them between steps, what the backward's end holds "
                                             "(the gradients, the first block's activations, less autocast's weight "
                                             "copies) beyond the forward's peak.")
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float
    reserve_gib: float
    reference_gib: float = Field(0.0, description="dpo: the frozen reference model's parameters.")


class PredictionUncertainty(Spec):
    """How far to trust the prediction: relative half-widths of its intervals, from the
    leave-one-out errors of the published-run fit (machine_models/uncertainty.py)."""

    step_time: Fraction = Field(description="Step time (and every time and rate derived from it): x (1 +/- this).")
    memory: Fraction = Field(description="Memory per device: x (1 +/- this).")
    basis: str = Field(description="The published rows it comes from, or the stated default used.")
    fitted: bool = Field(description="False for a device kind or framework with no fitted published rows.")

    def time_interval(self, value: float) -> tuple[float, float]:
        return value * (1 - self.step_time), value * (1 + self.step_time)

    def rate_interval(self, value: float) -> tuple[float, float]:
        """A rate is inversely proportional to the step time."""
        return value / (1 + self.step_time), value / max(1 - self.step_time, 1e-9)

    def memory_interval(self, value: float) -> tuple[float, float]:
        return value * (1 - self.memory), value * (1 + self.memory)

    def as_json(self) -> dict:
        return self.model_dump(mode="json")


class Prediction(Spec):
    step_time_s: float
    step_time: StepTimeBreakdown
    memory_gib_per_device: float
    memory: MemoryBreakdown
    fits: bool
    tokens_per_s: float
    model_tflops_per_device: float
    hardware_tflops_per_device: float
    mfu: float
    time_to_train_days: float
    model_flops_per_step: float = Field(gt=0, description="Model FLOPs per optimizer step as the trainer executes them "
                                                          "(forward + backward; dpo: plus the reference's forward in the step).")
    six_n_flops_per_step: float = Field(gt=0, description="6 x parameters x the policy's tokens per step (the usual convention).")
    uncertainty: PredictionUncertainty | None = Field(None, description="The intervals' half-widths and their basis.")


class Provenance(Spec):
    exaplan_version: str
    cost_model_version: str
    command: str = Field(description="Regenerates this plan.")
    machine_file: str | None = Field(
        None, max_length=4096, description="The machine file the plan was made from (its absolute path), when "
                                           "--machine named a file rather than a preset: exaplan launch reads the "
                                           "file's launch: section from it.")
    content_hash: str = Field("", description="sha256 of the plan without this field; checked on load.")


class Plan(Spec):
    schema_version: Literal[2] = SCHEMA_VERSION
    backend: Literal["torch", "jax"] | None = Field(
        None, description="The runtime the plan was made for: torch (runtime/) or jax (jaxrt/: pp == 1, cp == 1, "
                          "bf16 or fp32, pretrain); None: torch (plans before the JAX backend).")
    model: ModelSpec
    machine: MachineModel
    job: TrainingJob
    nodes: PosInt
    ranks_per_node: PosInt
    mesh: Mesh
    micro_batch_size: PosInt
    grad_accumulation_steps: PosInt
    sequence_parallel: bool = False
    pipeline: Pipeline = Field(default_factory=Pipeline)
    sharding: ShardingOptions = Field(default_factory=ShardingOptions)
    recompute: Recompute = Recompute.none
    compile: bool = False
    collectives: Collectives
    prediction: Prediction
    provenance: Provenance

    @field_validator("machine")
    @classmethod
    def _without_launch(cls, machine: MachineModel) -> MachineModel:
        """A plan never carries the machine's `launch:` or `power:` section (excluded from its
        file and hash; `exaplan launch` and `whatif` read them from the machine file): the same
        in memory."""
        if machine.launch is None and machine.power is None:
            return machine
        return machine.model_copy(update={"launch": None, "power": None})

    @model_validator(mode="after")
    def _consistent(self) -> "Plan":
        problems = plan_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def placement(self, rank: int) -> tuple[int, int]:
        """(node, local device) of a global rank: ranks fill nodes in order."""
        return divmod(rank, self.ranks_per_node)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major over MESH_AXES, tp fastest)."""
        return mesh_coordinates(self.mesh, rank)

    def rank_table(self) -> list[list[int]]:
        """[rank, node, device, *coordinates] for every rank."""
        return [[r, *self.placement(r), *self.coordinates(r).values()] for r in range(self.world_size)]


def ddp_impl_for(kind: Sharding, tp: int, pp: int, precision: Precision) -> str | None:
    """The fastest correct replication the runtime has for a layout (issue 14, measured in
    `make bench-runtime`): DistributedDataParallel wherever its parameters are plain tensors
    (no tensor parallelism: DDP around DTensors fails on gloo) and no pipeline stage drives
    it, in fp32 or bf16 (autocast; fp16 would need a loss scaler); else FSDP2's replicate."""
    if kind != Sharding.none:
        return None
    return "ddp" if tp == 1 and pp == 1 and precision != Precision.fp16 else "replicate"


def mesh_coordinates(mesh: Mesh, rank: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for axis, degree in reversed(list(zip(MESH_AXES, mesh.degrees))):
        rank, out[axis] = divmod(rank, degree)
    return {a: out[a] for a in MESH_AXES}


def plan_problems(plan: Plan) -> list[str]:
    """Every inconsistency between the parts of a plan (empty when it is legal)."""
    p: list[str] = []
    m, mesh, model = plan, plan.mesh, plan.model
    if mesh.world_size != m.nodes * m.ranks_per_node:
        p.append(f"mesh: degrees multiply to {mesh.world_size}, but nodes x ranks_per_node = {m.nodes * m.ranks_per_node}")
    if m.ranks_per_node != m.machine.devices_per_node:
        p.append(f"ranks_per_node ({m.ranks_per_node}) != machine.devices_per_node ({m.machine.devices_per_node})")
    for name, size in (("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn_hidden", model.ffn_hidden)):
        if size % mesh.tp:
            p.append(f"mesh.tp: {mesh.tp} does not divide model.{name} ({size})")
    if m.job.seq_len % (2 * mesh.cp) and mesh.cp > 1:
        p.append(f"mesh.cp: 2 x cp ({2 * mesh.cp}) must divide job.seq_len ({m.job.seq_len})")
    if m.micro_batch_size * m.grad_accumulation_steps * mesh.dp != m.job.global_batch:
        p.append(
            f"micro_batch_size x grad_accumulation_steps x dp = {m.micro_batch_size} x "
            f"{m.grad_accumulation_steps} x {mesh.dp} != job.global_batch ({m.job.global_batch})"
        )
    if m.sequence_parallel and mesh.tp == 1:
        p.append("sequence_parallel: needs tp > 1")
    if m.sequence_parallel and (m.job.seq_len // mesh.cp) % mesh.tp:
        p.append(f"sequence_parallel: tp ({mesh.tp}) must divide seq_len / cp ({m.job.seq_len // mesh.cp})")
    kind = m.sharding.kind
    if kind in (Sharding.none,) and mesh.dp_shard != 1:
        p.append("sharding.kind none (DDP) needs dp_shard == 1: data parallelism is dp_replicate")
    if kind in (Sharding.zero1, Sharding.zero2, Sharding.fsdp, Sharding.fsdp_grad_op) and mesh.dp_replicate != 1:
        p.append(f"sharding.kind {kind.value} shards over all data-parallel ranks: needs dp_replicate == 1")
    if kind == Sharding.hsdp and (mesh.dp_shard < 2 or mesh.dp_replicate < 2):
        p.append("sharding.kind hsdp needs dp_shard >= 2 and dp_replicate >= 2")
    impl = m.sharding.ddp_impl
    if impl is not None and kind != Sharding.none:
        p.append(f"sharding.ddp_impl ({impl}) applies to kind none only (kind is {kind.value})")
    if impl == "ddp" and (mesh.tp > 1 or mesh.pp > 1 or m.job.precision == Precision.fp16):
        p.append("sharding.ddp_impl ddp needs tp == 1, pp == 1 and fp32 or bf16 (use replicate)")
    if m.sharding.shard_group_size != mesh.dp_shard:
        p.append(f"sharding.shard_group_size ({m.sharding.shard_group_size}) != mesh.dp_shard ({mesh.dp_shard})")
    p += _pipeline_problems(plan) + _backend_problems(plan)
    return p


def _backend_problems(plan: Plan) -> list[str]:
    """What the JAX backend (jaxrt/) cannot run: pipelines, context parallelism, fp16, dpo."""
    if plan.backend != "jax":
        return []
    p = [f"{name}: backend jax runs {name.split('.')[1]} == 1 only (got {degree})"
         for name, degree in (("mesh.pp", plan.mesh.pp), ("mesh.cp", plan.mesh.cp)) if degree > 1]
    if plan.job.precision == Precision.fp16:
        p.append("job.precision: backend jax trains in bf16 or fp32, not fp16")
    if plan.job.workload.value != "pretrain":
        p.append(f"job.workload: backend jax runs pretrain only, not {plan.job.workload.value}")
    return p


def _pipeline_problems(plan: Plan) -> list[str]:
    p: list[str] = []
    pipe, pp = plan.pipeline, plan.mesh.pp
    if pp == 1:
        if pipe.schedule is not None or pipe.virtual_stages != 1:
            p.append("pipeline: pp == 1 takes no schedule and one virtual stage")
        return p
    if pipe.schedule is None:
        p.append("pipeline.schedule: needed when pp > 1")
    if pipe.virtual_stages > 1 and pipe.schedule != Schedule.interleaved_1f1b:
        p.append("pipeline.virtual_stages > 1 needs the interleaved-1f1b schedule")
    if pipe.schedule == Schedule.interleaved_1f1b and plan.grad_accumulation_steps % pp:
        p.append(f"interleaved-1f1b needs grad_accumulation_steps ({plan.grad_accumulation_steps}) divisible by pp ({pp})")
    n = pp * pipe.virtual_stages
    if len(pipe.stages) != n:
        p.append(f"pipeline.stages: {len(pipe.stages)} given, pp x virtual_stages = {n}")
        return p
    layer = 0
    for i, st in enumerate(pipe.stages):
        if st.pp_rank != i % pp or st.virtual_index != i // pp:
            p.append(f"pipeline.stages[{i}]: must sit on pp rank {i % pp}, chunk {i // pp}")
        if st.first_layer != layer or st.last_layer < st.first_layer:
            p.append(f"pipeline.stages[{i}]: layers must continue from {layer}")
        layer = st.last_layer
        if st.embedding != (i == 0) or st.head != (i == n - 1):
            p.append(f"pipeline.stages[{i}]: embedding goes on the first stage, head on the last")
    if layer != plan.model.layers:
        p.append(f"pipeline.stages: cover {layer} layers, the model has {plan.model.layers}")
    return p


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


# Fields added after plans were committed, with the value every earlier plan had: left out of
# the file and of the content hash while they hold it, so that earlier plans keep their hash
# and a plan made as before is written byte for byte as before. Where the schema's default
# differs from that value (recompute_early_stop: plans made before it was modelled charged a
# whole replay), load_plan fills it in for a file that lacks the field (_EARLIER_VALUES).
_FRAMEWORK_DEFAULTS = {"pipeline_parallel": True, "context_parallel": True, "precisions": [p.value for p in Precision],
                       "cpu_figures": {}, "loss_traffic_bytes_per_logit": None,
                       "attention_kernel_speed": 1.0, "recompute_early_stop": False,
                       "eager_bytes_per_element": None, "compiled": False, "launch_us_per_op": None,
                       "step_launch_s": 0.0, "measured_kernels": False, "weight_bytes_per_param": 0.0,
                       "recompute_levels": ["none", "selective", "full"], "head_bytes_per_element": {},
                       "compiled_step": False, "sp_collective_copies": False,
                       "schedules": [s.value for s in Schedule], "even_stages": False, "pipeline_shardings": None,
                       "replicate_alone": False, "workloads": ["pretrain", "dpo"],
                       "dpo_references": ["in-step", "precomputed"], "tp_needs_sp": False,
                       "microbatches_multiple_of_stages": False, "node_split_axes": None, "nvidia_only_recompute": [],
                       "pipeline_tied_embeddings": True, "ddp_bucket_per_block": False,
                       "tensor_parallel": True, "collective_libraries": None, "dpo_shardings": None,
                       "dpo_pipeline_parallel": True, "pipeline_unsharded_grads": False}


_EARLIER_VALUES = {name: value for name, value in _FRAMEWORK_DEFAULTS.items()
                   if FrameworkProfile.model_fields[name].default != value}


def _body(plan: Plan, for_hash: bool = False) -> dict:
    """The plan as JSON without the later fields that hold their earlier value (above; backend
    None; for the hash also sharding.ddp_impl None, which files have said since 0.14)."""
    body = plan.model_dump(mode="json")
    if body.get("backend") is None:
        body.pop("backend", None)
    if body["provenance"].get("machine_file") is None:  # added later: absent for a preset's plan
        body["provenance"].pop("machine_file", None)
    if for_hash and body["sharding"].get("ddp_impl") is None:  # plans made before the field was added keep their hash
        body["sharding"].pop("ddp_impl", None)
    if body["machine"].get("inter_node_efficiency", 0) is None:  # added later: absent where not measured apart
        body["machine"].pop("inter_node_efficiency")
    kernels = body["machine"].get("runtime_kernels")
    if kernels is None:  # added later: absent where no kind measured it
        body["machine"].pop("runtime_kernels", None)
    elif kernels.get("eager_surplus_efficiency") is None:  # added after the first plans that carry kernels
        kernels.pop("eager_surplus_efficiency", None)
    framework = body["job"]["framework"]
    for name, value in _FRAMEWORK_DEFAULTS.items():
        if framework.get(name) == value:
            framework.pop(name)
    return body


def content_hash(plan: Plan) -> str:
    """sha256 over the canonical JSON of the plan with an empty content_hash."""
    body = _body(plan, for_hash=True)
    body["provenance"]["content_hash"] = ""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def seal(plan: Plan) -> Plan:
    """Return the plan with its content hash filled in."""
    plan = plan.model_copy(deep=True)
    plan.provenance.content_hash = content_hash(plan)
    return plan


def dumps_plan(plan: Plan, fmt: str = "yaml") -> str:
    """Serialise a sealed plan; YAML starts with a comment naming the regenerating command."""
    plan = seal(plan)
    body = _body(plan)
    if fmt == "json":
        return json.dumps(body, indent=2) + "\n"
    header = (
        f"# exaplan plan (schema {SCHEMA_VERSION}) for {plan.model.name} on {plan.nodes} x {plan.machine.name}\n"
        f"# Regenerate with: {plan.provenance.command}\n"
    )
    return header + yaml.safe_dump(body, sort_keys=False, width=100, default_flow_style=None)


def write_plan(plan: Plan, path: str | Path, fmt: str | None = None, force: bool = False) -> None:
    """Write atomically (a temporary file in the same directory, then a rename): nothing
    half-written on failure; an existing file replaced only with `force`, never a symlink, a
    device or a directory (planner.schema.files.write_new)."""
    from planner.schema.files import write_new

    path = Path(path)
    fmt = fmt or ("json" if path.suffix == ".json" else "yaml")
    write_new(path, dumps_plan(plan, fmt), what="the plan", force=force)


def load_plan(path: str | Path) -> Plan:
    """Read and check a plan file: schema, consistency and content hash."""
    path = Path(check_name_or_path(str(path), "plan"))
    # JSON is YAML. A device, a FIFO, a directory, a binary file, one over 64 MiB or nested over
    # 64 levels is refused before it is parsed (planner/schema/files.py).
    data = load_yaml_file(path, "plan file")
    if not isinstance(data, dict):
        raise PlanError("not a plan (expected a mapping at the top level)", field=str(path))
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PlanError(_version_message(version, data), field=str(path))
    job = data.get("job")
    framework = job.get("framework") if isinstance(job, dict) else None
    if isinstance(framework, dict):
        for name, value in _EARLIER_VALUES.items():
            framework.setdefault(name, value)
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        raise PlanError(format_validation_error(e), field=str(path)) from None
    expected = content_hash(plan)
    if plan.provenance.content_hash != expected:
        raise PlanError(
            "content hash does not match: the plan was edited after it was made "
            "(regenerate it with the command in its header)",
            field=str(path),
        )
    return plan


def _version_message(version, data: dict) -> str:
    """Why a plan of another schema version is refused, and how to make a current one."""
    command = (data.get("provenance") or {}).get("command") if isinstance(data.get("provenance"), dict) else None
    regenerate = f"regenerate it: {command}" if command else "regenerate it with the command in its header"
    if isinstance(version, int) and 0 < version < SCHEMA_VERSION:
        changes = "; ".join(f"schema {v}: {SCHEMA_CHANGES[v]}" for v in range(version + 1, SCHEMA_VERSION + 1))
        return f"schema_version {version} was written by an older exaplan (this one reads {SCHEMA_VERSION}; {changes}); {regenerate}"
    return f"schema_version {version!r} is not supported (this exaplan reads {SCHEMA_VERSION}); {regenerate}"
