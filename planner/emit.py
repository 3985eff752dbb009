"""Turn one scored layout into a Plan: stages, collectives and their environment, prediction."""

from __future__ import annotations

import shlex
import sys

import numpy as np
from pydantic import ValidationError

from planner import COST_MODEL_VERSION, __version__
from planner.cost import comm, compute, flops
from planner.cost.layout import RC_FULL, RC_OP, RECOMPUTES, SCHEDULES, SHARDINGS, SH_NONE, Layouts
from planner.cost.memory import GIB, activation_bytes, autocast_on_fp32_weights, microbatches_in_flight, zero_on_fp32_weights
from planner.cost.step import Evaluation
from planner.schema.plan import (
    CollectiveChoice,
    Collectives,
    Communicator,
    MemoryBreakdown,
    Mesh,
    Pipeline,
    Plan,
    Prediction,
    Provenance,
    Sharding,
    ShardingOptions,
    StageAssignment,
    StepTimeBreakdown,
    ddp_impl_for,
    seal,
)
from planner.schema.errors import PlanError, format_validation_error
from planner.search.stages import assign_stages
from planner.schema.specs import Algorithm, CollectiveLibrary, MachineModel, ModelSpec, TrainingJob

# How each library is told which algorithm to use (process-wide, per collective).
NCCL_NAMES = {Algorithm.ring: "ring", Algorithm.tree: "tree"}
ONECCL_ALLREDUCE = {Algorithm.ring: "ring", Algorithm.tree: "double_tree", Algorithm.rabenseifner: "rabenseifner", Algorithm.hierarchical: "topo"}
ONECCL_RSAG = {Algorithm.ring: "ring", Algorithm.hierarchical: "topo"}


def library_env(machine: MachineModel, allreduce: Algorithm | None, rsag: Algorithm | None) -> dict[str, str]:
    """Environment variables that make the machine's library use the chosen algorithms.
    NCCL/RCCL: NCCL_ALGO with per-collective syntax (NCCL >= 2.24), so that forcing the
    allreduce algorithm leaves collectives that only run as rings untouched. oneCCL: one
    variable per collective. gloo: nothing to set (no user-selectable algorithm)."""
    lib = machine.collective_library
    env: dict[str, str] = {}
    if lib in (CollectiveLibrary.nccl, CollectiveLibrary.rccl):
        parts = []
        if allreduce is not None:
            parts.append(f"allreduce:{NCCL_NAMES[allreduce]}")
        if rsag is not None:
            parts += ["reducescatter:ring", "allgather:ring"]
        if parts:
            env["NCCL_ALGO"] = ";".join(parts)
    elif lib == CollectiveLibrary.oneccl:
        if allreduce is not None:
            env["CCL_ALLREDUCE"] = ONECCL_ALLREDUCE[allreduce]
        if rsag is not None:
            env["CCL_REDUCE_SCATTER"] = ONECCL_RSAG[rsag]
            env["CCL_ALLGATHERV"] = ONECCL_RSAG[rsag]
    return env


def stage_assignment(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts) -> list[StageAssignment]:
    """Layers of each (virtual) stage, from CP-SAT: equal blocks, the head's compute on the
    last stage, each rank's memory (its blocks' states and in-flight activations) under the
    device memory left after the fixed parts. Interleaved: the load of each rank (its chunks
    summed) is balanced, the split the cost model charges (planner.cost.pipeline)."""
    pp, v = int(lay.pp[0]), int(lay.vpp[0])
    if pp == 1:
        return []
    S = pp * v
    if job.framework.even_stages and model.layers % S == 0:  # Megatron: equal stages, whatever the head costs
        per = model.layers // S
        return [StageAssignment(pp_rank=i % pp, virtual_index=i // pp, first_layer=i * per, last_layer=(i + 1) * per,
                                embedding=i == 0, head=i == S - 1) for i in range(S)]
    _, fb = compute.layer_times(model, machine, job, lay)
    head = compute.head_time(model, machine, job, lay)
    per_mb, fixed = activation_bytes(model, machine, job, lay)
    inflight = microbatches_in_flight(lay.pp, lay.gas, lay.vpp, lay.schedule)
    blocks_per_rank = np.ceil(model.layers / pp)
    state_bytes = 18.0 / (lay.dp_shard[0] * lay.cp[0] if lay.sharding[0] != SH_NONE else 1)
    churn = 1 + machine.fragmentation_fraction  # fragmentation on activations, not on model states (memory.reserve_bytes)
    layer_mem = flops.layer_params(model) / lay.tp[0] * state_bytes + churn * float(per_mb[0] / blocks_per_rank * inflight[0])
    head_mem = (flops.head_params(model) / lay.tp[0]) * state_bytes + churn * float(fixed[0])
    emb_mem = (flops.embedding_params(model) / lay.tp[0]) * state_bytes
    cap = machine.device_memory_gib * GIB - machine.memory_reserve_gib * GIB
    sol = assign_stages([1.0] * model.layers, [layer_mem] * model.layers, S, cap, ranks=pp,
                        last_extra_cost=float(head[0] / fb[0]), first_extra_memory=emb_mem, last_extra_memory=head_mem)
    return [
        StageAssignment(pp_rank=i % pp, virtual_index=i // pp, first_layer=a, last_layer=b, embedding=i == 0, head=i == S - 1)
        for i, (a, b) in enumerate(sol.ranges)
    ]


def _algorithms(ev: Evaluation, i: int) -> tuple[Algorithm, Algorithm, Algorithm]:
    """(tensor-parallel, allreduce, reduce-scatter/all-gather) algorithms chosen for row i."""
    return (comm.ALGORITHMS[int(ev.tp_algorithm[i])], comm.ALGORITHMS[int(ev.allreduce_algorithm[i])],
            comm.ALGORITHMS[int(ev.rsag_algorithm[i])])


def _collective_env(machine: MachineModel, one: Layouts, row: dict, kind: Sharding, ev: Evaluation, i: int) -> dict[str, str]:
    """The library's environment: an algorithm is set only for the collectives the layout runs."""
    _, ar_alg, rsag_alg = _algorithms(ev, i)
    data_parallel = one.grad_group[0] > 1
    dp_allreduce = data_parallel and kind in (Sharding.none, Sharding.hsdp)
    dp_rsag = data_parallel and kind != Sharding.none
    tp_allreduce = row["tp"] > 1 and not row["sp"]
    tp_rsag = row["tp"] > 1 and bool(row["sp"])
    return library_env(machine, ar_alg if (dp_allreduce or tp_allreduce) else None, rsag_alg if (dp_rsag or tp_rsag) else None)


def _communicators(model: ModelSpec, machine: MachineModel, job: TrainingJob, one: Layouts, row: dict, kind: Sharding,
                   ev: Evaluation, i: int) -> dict[Communicator, CollectiveChoice]:
    """Each communicator of more than one rank: its collective, algorithm, ranks, the nodes
    it spans and the bytes of the collectives exaplan's runtime issues on it in a step, as a
    rank of the first or last pipeline stage counts them: a call's gathered output, scattered
    input, reduced or sent tensor (`exaplan check` records the same at full size)."""
    tp_alg, ar_alg, rsag_alg = _algorithms(ev, i)
    P = flops.total_params(model) / row["pp"] / row["tp"]
    B = 2 if job.precision.value != "fp32" else 4
    seqs = job.sequences_per_sample  # dpo: chosen and rejected through the policy
    ref = 1 if job.reference_in_step else 0  # dpo: the reference's forward passes
    gas, v = row["gas"], row["vpp"]
    act = row["mbs"] * seqs * job.seq_len / row["cp"] * model.hidden * B
    comms: dict[Communicator, CollectiveChoice] = {}
    dpn = machine.devices_per_node

    def spanned(size: int, stride: int) -> int:
        local = 1 if stride >= dpn else min(size, max(dpn // stride, 1))
        return max(size // local, 1)

    grad_n = int(one.grad_group[0])
    if grad_n > 1:
        comms[Communicator.dp] = CollectiveChoice(
            op="allreduce" if kind == Sharding.none else "reduce_scatter+all_gather",
            algorithm=ar_alg if kind == Sharding.none else rsag_alg,
            ranks=grad_n, nodes_spanned=spanned(grad_n, row["tp"]),
            bytes_per_step=_dp_bytes(job, one, kind, P, B, gas, row["pp"], ref, int(one.shard_group[0])))
    # Under autocast on fp32 weights (ZeRO, one replica) the residual stream stays fp32: what a
    # pipeline stage sends, and the norm outputs sequence parallelism gathers, are 4 bytes a value.
    fp32_stream = B == 2 and bool(autocast_on_fp32_weights(job, one)[0]) and (
        kind in (Sharding.zero1, Sharding.zero2) or row["dp_replicate"] * row["dp_shard"] * row["cp"] == 1)
    if row["tp"] > 1:
        # A block's forward: all-gather and reduce-scatter around attention and the MLP under
        # sequence parallelism (an all-reduce after each without), its backward the transposes,
        # full recompute the forward's again but its last (checkpoint's recompute stops once the
        # saved tensors are back: the block's output is not one), selective-op the gathers of the
        # k and up GEMMs' inputs it recomputes. On an fp32 stream the gathers (forward) and their
        # transposes (backward), half the calls, move fp32.
        # Without sequence parallelism each column-parallel input's gradient is all-reduced on its
        # own (wq, wk, wv and the MLP's w1, w3: no PrepareModuleInput gathers them once).
        forward = 4 if row["sp"] else 2
        backward = 4 if row["sp"] else 3 + (2 if model.activation == "swiglu" else 1)
        per_block = (forward + backward + (forward - 1 if row["recompute"] == RC_FULL else 0)
                     + ref * forward)  # dpo: the reference's forward
        per_block += 2 if row["sp"] and row["recompute"] == RC_OP else 0
        widen = 1.5 if row["sp"] and fp32_stream else 1.0
        calls = per_block * model.layers / row["pp"] * row["gas"]
        comms[Communicator.tp] = CollectiveChoice(
            op="reduce_scatter+all_gather" if row["sp"] else "allreduce", algorithm=tp_alg, ranks=row["tp"],
            nodes_spanned=spanned(row["tp"], 1), bytes_per_step=float(calls * act * widen))
    if row["pp"] > 1:
        # Each chunk receives its input and sends its output forward, and the gradients back;
        # the first stage receives and the last sends nothing forward (an end rank: 4v - 2
        # transfers a micro-batch, a middle one 4v); the reference's forward passes too. Under
        # sequence parallelism a stage sends its sequence shard (1/tp); an fp32 stream, 4 bytes.
        stride = row["dp_replicate"] * row["dp_shard"] * row["cp"] * row["tp"]
        sent = act / (row["tp"] if row["sp"] else 1) * (2 if fp32_stream else 1)
        comms[Communicator.pp] = CollectiveChoice(
            op="send_recv", algorithm=Algorithm.ring, ranks=row["pp"], nodes_spanned=spanned(row["pp"], stride),
            bytes_per_step=float(gas * sent * ((4 * v - 2) + ref * (2 * v - 1))))
    if row["cp"] > 1:
        # Every block all-gathers K and V in forward (again when recomputed, and in the
        # reference's forward) and reduce-scatters their gradients in backward: the whole
        # sequence's K and V a call.
        kv = row["mbs"] * seqs * job.seq_len * 2 * model.kv_heads * model.head_dim * B / row["tp"]
        passes = (3 if row["recompute"] in (2, 3) else 2) + ref
        comms[Communicator.cp] = CollectiveChoice(
            op="all_gather+reduce_scatter", algorithm=Algorithm.ring, ranks=row["cp"], nodes_spanned=spanned(row["cp"], row["tp"]),
            bytes_per_step=float(gas * passes * model.layers / row["pp"] * kv))
    return comms


def _dp_bytes(job: TrainingJob, one: Layouts, kind: Sharding, P: float, B: int, gas: int, pp: int, ref: int,
              shard_group: int) -> float:
    """The data-parallel collectives of a step as exaplan's runtime issues them (P: a stage's
    parameters / tp; B: the 16-bit or fp32 weight bytes; gradients reduced in fp32):
    none    one all-reduce of the gradients at the last micro-batch
    zero1   one reduce-scatter, one all-gather of the updated weights (fp32 under autocast)
    zero2   a reduce-scatter every micro-batch, one all-gather
    fsdp, hsdp      each micro-batch all-gathers the blocks in forward and again in backward
                    (resharded after forward) and reduce-scatters the gradients; a pipeline
                    keeps them gathered through its backwards (gas + 1 gathers) and reduces at
                    the last; hsdp all-reduces the shard over the replicas once
    fsdp-grad-op    one gather and one reduce-scatter a micro-batch
    dpo: the reference's forward gathers its blocks once a micro-batch where it is sharded."""
    grads = 4.0 * P
    if kind == Sharding.none:
        return float(grads)
    gather = P * (4.0 if bool(zero_on_fp32_weights(job, one)[0]) else B)
    if kind == Sharding.zero1:
        return float(grads + gather)
    if kind == Sharding.zero2:
        return float(gas * grads + gather)
    if pp > 1:
        policy = (gas + 1) * gather + grads
    else:
        gathers = 1 if kind == Sharding.fsdp_grad_op else 2
        policy = gas * (gathers * gather + grads)
    out = policy + ref * gas * gather
    if kind == Sharding.hsdp:
        out += grads / shard_group
    return float(out)


def _prediction(model: ModelSpec, machine: MachineModel, job: TrainingJob, ev: Evaluation, i: int,
                point=None) -> Prediction:
    """Row i of the evaluation as the plan's prediction (memory in GiB), with its uncertainty
    (widened by the distance of `point`, the layout's, from the fitted rows)."""
    from machine_models.uncertainty import uncertainty_of

    mem = ev.memory
    return Prediction(
        step_time_s=float(ev.step_time_s[i]),
        step_time=StepTimeBreakdown(
            compute_s=float(ev.compute_s[i]), bubble_s=float(ev.bubble_s[i]), optimizer_s=float(ev.optimizer_s[i]),
            exposed_comm_s={Communicator.dp: float(ev.dp_s[i]), Communicator.tp: float(ev.tp_s[i]),
                            Communicator.pp: float(ev.pp_s[i]), Communicator.cp: float(ev.cp_s[i])},
        ),
        memory_gib_per_device=float(mem.total[i] / GIB),
        memory=MemoryBreakdown(
            parameters_gib=float(mem.parameters[i] / GIB), gradients_gib=float(mem.gradients[i] / GIB),
            optimizer_gib=float(mem.optimizer[i] / GIB), activations_gib=float(mem.activations[i] / GIB),
            buffers_gib=float(mem.buffers[i] / GIB), reserve_gib=float(mem.reserve[i] / GIB),
            reference_gib=float(np.broadcast_to(np.asarray(mem.reference, dtype=np.float64), mem.total.shape)[i] / GIB),
        ),
        fits=bool(mem.fits[i]),
        tokens_per_s=float(ev.tokens_per_s[i]),
        model_tflops_per_device=float(ev.model_tflops_per_device[i]),
        hardware_tflops_per_device=float(ev.hardware_tflops_per_device[i]),
        mfu=float(ev.mfu[i]),
        time_to_train_days=float(ev.time_to_train_days[i]),
        model_flops_per_step=flops.step_flops(model, job)["executed"], six_n_flops_per_step=flops.step_flops(model, job)["six_n"],
        uncertainty=uncertainty_of(machine, job.framework, point=point),
    )


def _finite_prediction(model: ModelSpec, machine: MachineModel, job: TrainingJob, ev: Evaluation, i: int, point=None):
    """The prediction of row i; PlanError (not a traceback) when a figure of the inputs, legal
    on its own, drives one of its figures to infinity or nan."""
    try:
        return _prediction(model, machine, job, ev, i, point)
    except ValidationError as e:
        raise PlanError("the cost model's prediction is not finite for these inputs (" + format_validation_error(
            e, prefix="prediction") + "); check the machine's and the model's figures") from None


def layout_point(model: ModelSpec, job: TrainingJob, lay: Layouts, i: int):
    """Where row i of `lay` lies for the intervals (machine_models/support.py Point)."""
    from machine_models.support import Point

    r = lay.row(i)
    world = r["pp"] * r["dp_replicate"] * r["dp_shard"] * r["cp"] * r["tp"]
    return Point(world=int(world), seq_len=job.seq_len, params=float(flops.total_params(model)),
                 sharding=SHARDINGS[r["sharding"]].value, pipeline=r["pp"] > 1)


def build_plan(model: ModelSpec, machine: MachineModel, job: TrainingJob, nodes: int, lay: Layouts, ev: Evaluation, i: int,
               command: str | None = None, backend: str | None = None, machine_file: str | None = None) -> Plan:
    """The plan of row i of an evaluation of explicit layouts, for `backend` (torch, jax; None:
    the torch runtime, unnamed as in plans before the JAX backend); `machine_file`: the file
    --machine named, when not a preset (recorded for `exaplan launch`)."""
    one = lay.take([i])
    row = one.row(0)
    kind = SHARDINGS[row["sharding"]]
    mesh = Mesh(pp=row["pp"], dp_replicate=row["dp_replicate"], dp_shard=row["dp_shard"], cp=row["cp"], tp=row["tp"])
    env = _collective_env(machine, one, row, kind, ev, i)
    comms = _communicators(model, machine, job, one, row, kind, ev, i)
    parts = dict(
        model=model, machine=machine, job=job, nodes=nodes, ranks_per_node=machine.devices_per_node, mesh=mesh,
        micro_batch_size=row["mbs"], grad_accumulation_steps=row["gas"], sequence_parallel=bool(row["sp"]),
        pipeline=Pipeline(schedule=SCHEDULES[row["schedule"]], virtual_stages=row["vpp"],
                          stages=stage_assignment(model, machine, job, one)),
        sharding=ShardingOptions(
            kind=kind, shard_group_size=row["dp_shard"], reshard_after_forward=kind != Sharding.fsdp_grad_op,
            ddp_bucket_mb=float(ev.ddp_bucket_mb[i]), ddp_impl=ddp_impl_for(kind, row["tp"], row["pp"], job.precision),
        ),
        recompute=RECOMPUTES[row["recompute"]],
        compile=bool(getattr(job.framework, "compiled", False)),
        collectives=Collectives(library=machine.collective_library.value, communicators=comms, env=env),
        prediction=_finite_prediction(model, machine, job, ev, i, layout_point(model, job, one, 0)),
        provenance=Provenance(exaplan_version=__version__, cost_model_version=COST_MODEL_VERSION,
                              command=command or shlex.join(["exaplan", *sys.argv[1:]]), machine_file=machine_file),
    )
    try:
        plan = Plan(backend=backend, **parts)
    except ValidationError as e:
        raise PlanError(format_validation_error(e)) from None
    return seal(plan)
