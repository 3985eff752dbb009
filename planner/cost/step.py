"""Step time of a training iteration, assembled from compute, communication and memory.

One optimizer step on the busiest pipeline rank:
    step = m * work_per_microbatch + bubble + exposed data-parallel traffic + optimizer
    work_per_microbatch = its blocks' compute + exposed tp, cp and pipeline traffic
    bubble = (p - 1) / v * work_per_microbatch  (GPipe/1F1B: v = 1; Narayanan et al. 2021)
Data-parallel and FSDP traffic overlaps the compute it runs under by buckets or blocks; what
does not fit under that compute is exposed, and of what does, the fraction 1 - overlap (the
collectives' kernels share the SMs and the memory with the compute they overlap, which slows
both), never less than one bucket or block (all of it where the framework hides none:
DeepSpeed's weight all-gather in step()):
    exposed = max(traffic - min(traffic, window) * overlap, floor).
(Until 2026-11-27 the window was discounted instead, max(traffic - overlap * window, floor):
a framework that hides little under large windows then over-charged traffic that exceeds
its window; the published rows' leave-one-out median went 3.19% -> 2.29% with the change.)

The work is done in three levels (planner.cost.layout.Space): per micro-batch "unit"
(compute, tp/cp/pp traffic, activations), per "mesh" (model states, data-parallel traffic,
optimizer: planner.cost.dp), and per row (what combines them: accumulation steps, schedule,
overlap).

Collective algorithms: in `fast` mode each communicator takes its cheapest algorithm (a
lower bound used by the search); otherwise the job takes one allreduce algorithm and one
reduce-scatter/all-gather algorithm for all communicators, as libraries set them process-
wide (NCCL_ALGO, CCL_ALLREDUCE), and the best such pair is chosen per layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.cost import comm, compute, flops
from planner.cost.dp import DDP_BUCKETS_MB, MeshCosts, mesh_costs, zero_collectives
from planner.cost.layout import RC_FULL, RC_OP, SH_NONE, SH_ZERO1, SH_ZERO2, Layouts, Space
from planner.cost.memory import (
    MemoryParts,
    activation_parts,
    backward_tail_bytes,
    backward_temporaries_bytes,
    copies_never_held,
    microbatches_in_flight,
    microbatches_in_flight_last,
    reserve_bytes,
)
from planner.cost.pipeline import chunk_bottleneck
from planner.cost.topology import LinkTiers, link_tiers
from planner.schema.figures import framework_machine
from planner.schema.specs import Algorithm, CollectiveLibrary, MachineModel, ModelSpec, TrainingJob, bytes_per_element

__all__ = ["DDP_BUCKETS_MB", "Evaluation", "MeshCosts", "Scores", "evaluate", "evaluate_space", "mesh_costs",
           "offered_algorithms", "unit_costs"]
GIB = 2.0**30


@dataclass
class Evaluation:
    """Predictions for each row (arrays), with the algorithm and bucket choices made."""

    space: Space
    step_time_s: np.ndarray
    compute_s: np.ndarray
    bubble_s: np.ndarray
    optimizer_s: np.ndarray
    dp_s: np.ndarray
    tp_s: np.ndarray
    pp_s: np.ndarray
    cp_s: np.ndarray
    tp_algorithm: np.ndarray  # code into comm.ALGORITHMS
    allreduce_algorithm: np.ndarray  # gradient allreduce (DDP, ZeRO-1, HSDP across replicas)
    rsag_algorithm: np.ndarray  # reduce-scatter / all-gather (ZeRO, FSDP)
    ddp_bucket_mb: np.ndarray
    memory: MemoryParts
    tokens_per_s: np.ndarray
    model_tflops_per_device: np.ndarray
    hardware_tflops_per_device: np.ndarray
    mfu: np.ndarray
    time_to_train_days: np.ndarray
    layouts_scored: int  # rows x algorithm choices evaluated

    def __len__(self) -> int:
        return len(self.step_time_s)


def offered_algorithms(machine: MachineModel) -> tuple[list[int], list[int]]:
    """(allreduce codes, reduce-scatter/all-gather codes) the library can be told to use.
    Reduce-scatter and all-gather run as rings (NCCL's and RCCL's only algorithm for them on
    ordinary networks with several GPUs per node: tuning.cc; NCCL 2.23's PAT needs one GPU
    per node), or hierarchically where the library offers a hierarchical mode (oneCCL's topo,
    its default for GPU buffers)."""
    ar = [comm.ALGORITHMS.index(Algorithm(a)) for a in machine.algorithms]
    rsag = [comm.AL_RING]
    if Algorithm.hierarchical in machine.algorithms and machine.collective_library == CollectiveLibrary.oneccl:
        rsag.append(comm.AL_HIERARCHICAL)
    return ar, rsag


def _cheapest(costs: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise minimum over algorithms: (cost, algorithm code)."""
    codes = list(costs)
    stacked = np.stack([costs[c] for c in codes])
    pick = np.argmin(stacked, axis=0)
    return np.take_along_axis(stacked, pick[None], axis=0)[0], np.asarray(codes)[pick]


def _minimum(arrays) -> np.ndarray:
    """Elementwise minimum of an iterable of arrays."""
    it = iter(arrays)
    out = next(it)
    for a in it:
        out = np.minimum(out, a)
    return out


# --------------------------------------------------------------------------------------------
# Level 1: one micro-batch
# --------------------------------------------------------------------------------------------


@dataclass
class UnitCosts:
    compute_mb: np.ndarray  # compute of one micro-batch on the busiest rank (s)
    tp_mb: dict[int, np.ndarray]  # exposed tp traffic per micro-batch, by algorithm code
    cp_mb: np.ndarray
    pp_mb: np.ndarray
    act_per_mb: np.ndarray  # activation bytes per in-flight micro-batch
    act_fixed: np.ndarray  # the last stage's fixed activation bytes (loss, final norm, a block's backward)
    act_working: np.ndarray  # the other stages': a block's backward alone (memory.activation_parts)
    act_tail: np.ndarray  # activation bytes alive as a backward pass ends (memory.backward_tail_bytes)


def unit_costs(model: ModelSpec, machine: MachineModel, job: TrainingJob, u: Layouts, tiers: LinkTiers, algos) -> UnitCosts:
    # dpo: a micro-batch of mbs pairs is 2 mbs sequences through the policy (chosen and
    # rejected in one batch), so every per-micro-batch cost below sees 2 mbs sequences.
    if job.sequences_per_sample > 1:
        u = replace(u, mbs=u.mbs * job.sequences_per_sample)
    ov, B, t, v = machine.overlap, bytes_per_element(job.precision), u.tp, u.vpp
    compute_mb, blocks_on_rank = micro_batch_compute(model, machine, job, u)
    T = u.mbs * job.seq_len / u.cp
    M_act = T * model.hidden * B
    # Tensor parallel: per block 2 collectives forward, 2 backward (+2 when recomputed);
    # with sequence parallelism each is a reduce-scatter + all-gather pair. A recompute that
    # stops early (compute.layer_times) skips the one after the down projection: its
    # allreduce, or its pair's reduce-scatter. selective-op keeps the reduce-scatters' outputs
    # (runtime/parallel/recompute.py) and replays the two all-gathers, or the allreduces.
    pl_tp = comm.place(t, 1, tiers)
    replay = np.where(u.sp == 1, 1.5, 1.0) if compute.recompute_early_stop(job) else 2.0
    replay_op = np.where(u.sp == 1, 1.0, replay)
    replays = np.where(u.recompute == RC_FULL, replay, np.where(u.recompute == RC_OP, replay_op, 0))
    calls = np.where(t > 1, blocks_on_rank * (4 + replays) * (1 - ov.tp), 0.0)
    # Sequence parallelism over dim 1 (torch DTensor, sp_collective_copies): the libraries gather
    # and scatter dim 0, so each reduce-scatter first cats its input's chunks, and each all-gather
    # of more than one sequence cats its output's (one: a view), a read and a write of the whole
    # activation in line (torch/_utils.py _chunk_or_narrow_cat, _maybe_view_chunk_cat). Replays:
    # both all-gathers where any, 2 x replays - 2 reduce-scatters (selective-op: none).
    copy_s = 0.0
    if job.framework.sp_collective_copies:  # only then: the search's hot path pays nothing for Megatron
        ag, rs = 4 + np.where(replays > 0, 2.0, 0.0), 4 + np.maximum(2 * replays - 2, 0.0)
        copies = np.where((t > 1) & (u.sp == 1), blocks_on_rank * (rs + ag * (u.mbs > 1)) * 2 * M_act, 0.0)
        copy_s = copies / (machine.memory_bandwidth_gbyte_s * 1e9 * compute.EAGER_BANDWIDTH_FRACTION)
    ar_codes, rsag_codes = algos
    tp_mb = {}
    for a in sorted(set(ar_codes) | set(rsag_codes)):
        ar_cost = comm.allreduce(a, pl_tp, M_act) if a in ar_codes else np.inf
        sp_cost = comm.reduce_scatter(a, pl_tp, M_act) + comm.all_gather(a, pl_tp, M_act) if a in rsag_codes else np.inf
        cost = np.where(u.sp == 1, sp_cost, ar_cost)  # inf where the library lacks the algorithm
        with np.errstate(invalid="ignore"):
            tp_mb[a] = np.where(calls > 0, calls * cost, 0.0) + copy_s
    # Context parallel (runtime/parallel/context.py): every block all-gathers K and V over
    # the cp ranks in forward (again when recomputed) and reduce-scatters their gradients
    # in backward: (cp-1)/cp of the full sequence's K and V per pass, as a ring would move.
    pl_cp = comm.place(u.cp, t, tiers)
    kv_full = T * u.cp * 2 * model.kv_heads * model.head_dim * B / t
    passes = 2 + np.where((u.recompute == RC_FULL) | (u.recompute == RC_OP), 1, 0)
    cp_mb = blocks_on_rank * passes * comm.ring_all_gather(pl_cp.size, kv_full, pl_cp.alpha_s, pl_cp.beta_Bps) / pl_cp.eff["all_gather"] * (1 - ov.cp)
    # Pipeline: each chunk sends its activations forward and their gradients back.
    pl_pp = comm.place(u.pp, u.dp * u.cp * t, tiers)
    pp_bytes = np.where((u.sp == 1) | job.framework.pp_sends_split_over_tp, M_act / t, M_act)
    pp_mb = np.where(u.pp > 1, 2 * v * comm.point_to_point(pp_bytes, pl_pp.alpha_s, pl_pp.beta_Bps) * (1 - ov.pp), 0.0)
    act_per_mb, act_working, act_fixed = activation_parts(model, machine, job, u)
    return UnitCosts(compute_mb, tp_mb, np.where(u.cp > 1, cp_mb, 0.0), pp_mb, act_per_mb, act_fixed, act_working,
                     backward_tail_bytes(model, machine, job, u) + backward_temporaries_bytes(model, job, u))


def micro_batch_compute(model: ModelSpec, machine: MachineModel, job: TrainingJob, u: Layouts):
    """Per unit: a micro-batch's compute on the busiest rank (s), the blocks that rank runs."""
    v = u.vpp
    f_layer, fb_layer = compute.layer_times(model, machine, job, u)
    head = compute.head_time(model, machine, job, u)
    load, blocks = chunk_bottleneck(model.layers, u.pp, v, head / fb_layer)  # the busiest rank's, per chunk
    blocks_on_rank = blocks * v
    compute_mb = load * v * fb_layer + compute.framework_overhead_s(machine, blocks_on_rank, u.recompute, u.tp)
    if job.reference_in_step:
        # The frozen reference model's forward over the same sequences (no backward, no
        # recompute); `load` counts the head in block units, so load x forward covers its share.
        compute_mb = compute_mb + load * v * f_layer + compute.forward_overhead_s(machine, blocks_on_rank)
    # On a GPU a micro-batch takes at least the host's time to launch its operators.
    compute_mb = np.maximum(compute_mb, compute.launch_floor_s(machine, job, blocks_on_rank, u.recompute,
                                                               job.reference_in_step))
    return compute_mb, blocks_on_rank


def ddp_buckets(model: ModelSpec, job: TrainingJob, ddp_buckets_mb) -> tuple[float, ...]:
    """The DDP bucket sizes (MiB) evaluate_space scores: those given, else the framework's."""
    if not ddp_buckets_mb and job.framework.ddp_bucket_per_block:
        ddp_buckets_mb = (flops.layer_params(model) * 4 / 2**20,)  # one block's fp32 gradients (MiB, as torch's bucket_cap_mb)
    return tuple(map(float, ddp_buckets_mb or job.framework.ddp_buckets_mb))


# --------------------------------------------------------------------------------------------
# Level 3: rows
# --------------------------------------------------------------------------------------------


def _fix_algorithms(U: UnitCosts, M: MeshCosts, u_sp: np.ndarray, pair) -> tuple:
    """Per-unit tp terms, per-mesh data-parallel terms (by rs/ag algorithm) and per-bucket S
    terms under one choice of algorithms.

    pair = (allreduce, rs/ag) codes: the job-wide setting. pair = None: each communicator
    takes its cheapest algorithm; for S (once a step) the allreduce with the least traffic
    for each bucket size (exposure grows with both total and floor, which scale together,
    so this is the per-row optimum); the rs/ag choice is left to the row level, where the
    per-micro-batch repetition is known."""
    if pair is not None:
        a, r = pair
        tp_mb = np.where(u_sp == 1, U.tp_mb[r], U.tp_mb[a])
        tp_code = np.where(u_sp == 1, r, a)
        S = [(M.S_total[a][k], M.S_floor[a][k], np.full(len(M.optimizer_s), a)) for k in range(len(M.S_total[a]))]
        return tp_mb, tp_code, [r], S
    tp_mb, tp_code = _cheapest(U.tp_mb)
    S = []
    for k in range(len(next(iter(M.S_total.values())))):
        total, a_code = _cheapest({a: M.S_total[a][k] for a in M.S_total})
        floor = np.select([a_code == a for a in M.S_total], [M.S_floor[a][k] for a in M.S_total])
        S.append((total, floor, a_code))
    return tp_mb, tp_code, list(M.F_total), S


def _cast(obj, dtype):
    """A copy of a UnitCosts/MeshCosts with every float array (also inside dicts and lists)
    cast to dtype."""
    def conv(x):
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            return x.astype(dtype)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list):
            return [conv(v) for v in x]
        return x

    return type(obj)(**{k: conv(v) for k, v in vars(obj).items()})


@dataclass
class Scores:
    """What the search ranks by, for every row: step time, peak memory, fit."""

    step_time_s: np.ndarray
    memory_bytes: np.ndarray
    fits: np.ndarray
    layouts_scored: int


@dataclass
class _Rows:
    """Every row's share of its unit's and its mesh's costs (rows index units by `u`, meshes
    by `mi`), and the exposed data-parallel traffic built from them:
    exposed = max(traffic - min(traffic, window) x overlap, floor) (_interfered)."""

    u: np.ndarray
    mi: np.ndarray
    m: np.ndarray  # micro-batches per step, per row
    repeats_u: np.ndarray  # per unit: the step repeats a micro-batch's work m + (p-1)/v times
    base_u: np.ndarray  # per unit: compute + cp + pp traffic of a micro-batch
    fwd_mb: np.ndarray  # per row: forward compute of a micro-batch (a third of it)
    bwd_mb: np.ndarray
    F_reps: np.ndarray  # how often F, K and S are paid: every micro-batch or once a step
    K_reps: np.ndarray
    S_reps: np.ndarray | None  # None: every S term once a step
    overlap: float | np.ndarray  # machine.overlap.dp (per row in the robustness draws)
    s_bwd: np.ndarray  # per row: the compute S may run under (bwd_mb; 0 where the framework reduces after a pipeline's flush)

    @classmethod
    def gather(cls, space: Space, U: UnitCosts, M: MeshCosts, overlap: float, dtype,
               pipeline_hides_s: bool = True) -> "_Rows":
        units, u, mi = space.units, space.unit, space.mesh
        m_u = units.gas.astype(dtype)
        m = m_u[u]
        fwd_mb = (U.compute_mb / 3.0)[u]
        s_bwd = 2.0 * fwd_mb if pipeline_hides_s else np.where(units.pp[u] > 1, dtype(0.0), 2.0 * fwd_mb)
        return cls(
            u=u, mi=mi, m=m,
            repeats_u=m_u + ((units.pp - 1) / units.vpp).astype(dtype),
            base_u=U.compute_mb + U.cp_mb + U.pp_mb,
            fwd_mb=fwd_mb, bwd_mb=2.0 * fwd_mb,
            F_reps=np.where(M.F_per_mb[mi], m, dtype(1.0)),
            K_reps=np.where(M.K_per_mb[mi], m, dtype(1.0)),
            S_reps=np.where(M.S_per_mb[mi], m, dtype(1.0)) if M.S_per_mb.any() else None,
            # (an array where the robustness draws give each row its own figure: in the rows' dtype,
            # as a scalar would be taken)
            overlap=overlap if np.ndim(overlap) == 0 else np.asarray(overlap, dtype), s_bwd=s_bwd,
        )

    def dp_exposed(self, M: MeshCosts, r: int) -> np.ndarray:
        """Exposed F (under forward) and K (under backward) traffic with rs/ag algorithm r."""
        mi, ov = self.mi, self.overlap
        return (self.F_reps * np.maximum(_interfered(M.F_total[r][mi], self.fwd_mb, ov), M.F_floor[r][mi])
                + self.K_reps * np.maximum(_interfered(M.K_total[r][mi], self.bwd_mb, ov), M.K_floor[r][mi]))

    def s_exposed(self, St: np.ndarray, Sf: np.ndarray) -> np.ndarray:
        """Exposed S traffic (under the last backward, or every backward) of one bucket size."""
        exposed = np.maximum(_interfered(St[self.mi], self.s_bwd, self.overlap), Sf[self.mi])
        return exposed if self.S_reps is None else self.S_reps * exposed

    def step(self, M: MeshCosts, tp_mb_u: np.ndarray, dp: np.ndarray, s_cost: np.ndarray) -> np.ndarray:
        return (self.repeats_u * (self.base_u + tp_mb_u))[self.u] + dp + s_cost + M.optimizer_s[self.mi]


def _interfered(traffic, window, hidden):
    """Exposed seconds of `traffic` run under `window` seconds of compute: what does not fit
    the window, and the fraction 1 - hidden of what runs under it (the collectives' kernels and
    the compute they overlap share the SMs and memory)."""
    return traffic - np.minimum(traffic, window) * hidden


def _step_only(R: _Rows, M: MeshCosts, tp_mb_u, rsag, S) -> dict:
    """The step time under one choice of algorithms, as the search needs it: minima over the
    remaining choices, none recorded."""
    dp = _minimum(R.dp_exposed(M, r) for r in rsag)
    s_cost = _minimum(R.s_exposed(St, Sf) for St, Sf, _ in S)
    return {"step": R.step(M, tp_mb_u, dp, s_cost)}


def _step_with_choices(R: _Rows, M: MeshCosts, tp_mb_u, tp_code_u, rsag, S) -> dict:
    """The step time under one choice of algorithms, with the rs/ag algorithm, DDP bucket
    (index k) and allreduce algorithm that reach it, and the exposed dp and tp terms."""
    dp, r_code = _cheapest({r: R.dp_exposed(M, r) for r in rsag})
    s_cost, k = _cheapest({j: R.s_exposed(St, Sf) for j, (St, Sf, _) in enumerate(S)})
    return dict(step=R.step(M, tp_mb_u, dp, s_cost), dp=dp + s_cost, k=k, tp_code=tp_code_u[R.u], rs_code=r_code,
                ar_code=np.select([k == j for j in range(len(S))], [S[j][2][R.mi] for j in range(len(S))]),
                tp_mb=tp_mb_u[R.u])


def _best_choices(R: _Rows, U: UnitCosts, M: MeshCosts, u_sp: np.ndarray, algos, fast: bool, detail: bool) -> dict:
    """Per row, the step time and (with detail) the choices behind it: each communicator's
    cheapest algorithm when `fast`, else the best job-wide (allreduce, rs/ag) pair."""
    ar_codes, rsag_codes = algos
    best = None
    for pair in [None] if fast else [(a, r) for a in ar_codes for r in rsag_codes]:
        tp_mb_u, tp_code_u, rsag, S = _fix_algorithms(U, M, u_sp, pair)
        if not detail:
            cand = _step_only(R, M, tp_mb_u, rsag, S)
            best = cand if best is None else {"step": np.minimum(best["step"], cand["step"])}
            continue
        cand = _step_with_choices(R, M, tp_mb_u, tp_code_u, rsag, S)
        if best is None:
            best = cand
        else:
            better = cand["step"] < best["step"]
            best = {key: np.where(better, cand[key], best[key]) for key in best}
    return best


def _row_memory(machine: MachineModel, job: TrainingJob, space: Space, U: UnitCosts, M: MeshCosts, R: _Rows):
    """(parameters, gradients at the peak, activations, reserve, total, fits) per row. Activations
    depend on the unit and, through the micro-batches in flight, on the schedule. A step of one
    micro-batch whose framework frees the gradients between steps (grads_freed_between_steps:
    torch's set_to_none; not ZeRO-1/2's flat buffers) peaks at the end of its forward without
    them, or at the end of its backward with them, the first block's activations (act_tail) and
    none of autocast's weight copies: gradients are shown as what that peak holds beyond the
    forward's. Compiled blocks under full or selective-op recompute hold no copies at all
    (memory.copies_never_held): the parameters are shown without them."""
    units, u, mi = space.units, R.u, R.mi
    copies = np.where(copies_never_held(job, units.recompute[u]), 0.0, M.autocast_copies[mi])
    piped = (units.pp[u] > 1) & (R.m > 1)
    # The first stage holds the most micro-batches, the last one the loss and the final norm.
    # Under autocast on fp32 weights each micro-batch in flight keeps the 16-bit weight copies
    # its backward reads (one set is counted with the parameters): `exaplan check`, pp4 zero1.
    n_first = microbatches_in_flight(units.pp[u], R.m, units.vpp[u], space.schedule)
    n_last = microbatches_in_flight_last(units.pp[u], R.m, units.vpp[u], space.schedule)
    # (ZeRO, or one data-parallel rank: a pipeline's replicate casts under its 16-bit policy;
    # full recompute saves none)
    sh, alone = space.meshes.sharding[mi], space.meshes.grad_group[mi] == 1
    autocast_stage = (sh == SH_ZERO1) | (sh == SH_ZERO2) | ((sh == SH_NONE) & alone)
    held_copies = np.where(piped & autocast_stage & (units.recompute[u] != RC_FULL), copies, 0.0)
    first = U.act_per_mb[u] * n_first + U.act_working[u] + held_copies * (n_first - 1)
    last = U.act_per_mb[u] * n_last + U.act_fixed[u] + held_copies * np.maximum(n_last - 1, 0.0)
    acts = np.maximum(first, last)
    # A pipeline of several micro-batches: the deferred gradient sync's unsharded gradients,
    # allocated by a stage's first backward: on the first stage it frees one of the micro-batches
    # in flight, on the last (one in flight) they meet its micro-batch.
    G = np.where(piped, M.pipeline_grads[mi], 0.0)
    with_grads = np.maximum(first + np.maximum(G - U.act_per_mb[u], 0.0), last + G)
    grads = M.gradients[mi] + np.maximum(with_grads - acts, 0.0)
    params = M.parameters[mi] - (M.autocast_copies[mi] - copies)
    flat = (space.meshes.sharding == SH_ZERO1) | (space.meshes.sharding == SH_ZERO2)
    freed = bool(getattr(job.framework, "grads_freed_between_steps", False)) & (R.m == 1) & ~flat[mi]
    backward_end = grads + U.act_tail[u] - copies
    grads = np.where(freed, np.maximum(backward_end - acts, 0.0), grads)
    allocated = params + (M.optimizer + M.buffers + M.reference)[mi] + grads + acts
    reserve = reserve_bytes(machine, acts + M.buffers[mi])
    total = allocated + reserve
    fits = total <= machine.device_memory_gib * GIB
    return params, grads, acts, reserve, total, fits


def _evaluation(model: ModelSpec, machine: MachineModel, job: TrainingJob, space: Space, U: UnitCosts, M: MeshCosts,
                R: _Rows, best: dict, mem: MemoryParts, ddp_buckets_mb: tuple[float, ...], layouts_scored: int) -> Evaluation:
    """The detailed predictions: the step's parts, throughput, FLOP rates, MFU, time to train."""
    units, u, mi, m = space.units, R.u, R.mi, R.m
    step_time = best["step"]
    tokens = job.tokens_per_step
    world = units.world[u].astype(np.float64)
    # Model FLOPs as the trainer executes them (dpo: the policy's passes and the reference's
    # forward over both sequences of every pair); flops.step_flops also gives the policy alone and 6 N.
    ref_fl = flops.reference_flops_per_token(model, job.seq_len) if job.reference_in_step else 0.0
    model_fl = (flops.model_flops_per_token(model, job.seq_len) + ref_fl) * tokens
    hw_fl = (flops.hardware_flops_per_token(model, job.seq_len, units.recompute, compute.recompute_early_stop(job))[u]
             + ref_fl) * tokens
    tps = tokens / step_time
    model_tf = model_fl / step_time / world / 1e12
    work_mb = R.base_u[u] + best["tp_mb"]
    return Evaluation(
        space=space, step_time_s=step_time, compute_s=m * U.compute_mb[u], bubble_s=((units.pp - 1) / units.vpp)[u] * work_mb,
        optimizer_s=M.optimizer_s[mi], dp_s=best["dp"], tp_s=m * best["tp_mb"], pp_s=m * U.pp_mb[u], cp_s=m * U.cp_mb[u],
        tp_algorithm=best["tp_code"], allreduce_algorithm=best["ar_code"], rsag_algorithm=best["rs_code"],
        ddp_bucket_mb=np.asarray(ddp_buckets_mb, dtype=float)[best["k"]],
        memory=mem, tokens_per_s=tps, model_tflops_per_device=model_tf,
        hardware_tflops_per_device=hw_fl / step_time / world / 1e12,
        mfu=model_tf / (machine.peak_flops(job.precision) / 1e12),
        time_to_train_days=job.token_budget / tps / 86400.0,
        layouts_scored=layouts_scored,
    )


# Rows scored at once by the search: their few dozen temporaries (float32) stay in the
# caches, and the same heap blocks serve every chunk (a whole space's temporaries are
# hundreds of MB of fresh pages). Each row's figures are computed as they would be at once.
ROW_CHUNK = 1 << 16


def _scores(machine: MachineModel, job: TrainingJob, space: Space, U: UnitCosts, M: MeshCosts, algos, fast: bool,
            memory: bool, hides_s: bool, layouts_scored: int) -> Scores:
    """The search's Scores of every row (float32), ROW_CHUNK rows at a time."""
    n, overlap = len(space), machine.overlap.dp  # (per row in the robustness draws)
    step = np.empty(n, np.float32)
    total = np.full(n, np.nan, np.float32)
    fits = np.zeros(n, dtype=bool)
    for a in range(0, n, ROW_CHUNK):
        b = min(a + ROW_CHUNK, n)
        part = space.rows(a, b)
        R = _Rows.gather(part, U, M, overlap if np.ndim(overlap) == 0 else overlap[a:b], np.float32, hides_s)
        step[a:b] = _best_choices(R, U, M, part.units.sp, algos, fast, False)["step"]
        if memory:
            total[a:b], fits[a:b] = _row_memory(machine, job, part, U, M, R)[4:]
    return Scores(step, total, fits, layouts_scored)


def evaluate_space(model: ModelSpec, machine: MachineModel, job: TrainingJob, space: Space, fast: bool = True,
                   detail: bool = True, ddp_buckets_mb: tuple[float, ...] | None = None, memory: bool = True):
    """Predict every row of a layout space (see the module docstring for `fast`). With
    detail=False only the Scores the search needs are computed (much less work per row);
    memory=False as well leaves their memory and fit out (NaN, False: no drawn time figure
    moves them, so the robustness draws skip them). The machine is taken as the job's
    framework uses it (figures.framework_machine); the DDP bucket sizes default to the
    framework's."""
    if not memory and detail:
        raise ValueError("memory=False is for detail=False scores only")
    machine = framework_machine(machine, job.framework)
    ddp_buckets_mb = ddp_buckets(model, job, ddp_buckets_mb)
    tiers = link_tiers(machine)
    algos = offered_algorithms(machine)
    U = unit_costs(model, machine, job, space.units, tiers, algos)
    M = mesh_costs(model, machine, job, space.meshes, tiers, algos, ddp_buckets_mb)
    if not detail:
        # The search ranks in float32 (half the memory traffic per row); the finalists are
        # re-scored in float64 by `evaluate`.
        U, M = _cast(U, np.float32), _cast(M, np.float32)
    hides_s = zero_collectives(job).allreduce_hidden_in_pipeline
    layouts_scored = len(space) * len(algos[0]) * len(algos[1])
    if not detail:
        return _scores(machine, job, space, U, M, algos, fast, memory, hides_s, layouts_scored)
    R = _Rows.gather(space, U, M, machine.overlap.dp, np.float64, hides_s)
    best = _best_choices(R, U, M, space.units.sp, algos, fast, detail)
    params, grads, acts, reserve, total, fits = _row_memory(machine, job, space, U, M, R)
    mi = R.mi
    mem = MemoryParts(params, grads, M.optimizer[mi], acts, M.buffers[mi], reserve, total, fits,
                      reference=M.reference[mi])
    return _evaluation(model, machine, job, space, U, M, R, best, mem, ddp_buckets_mb, layouts_scored)


def evaluate(model: ModelSpec, machine: MachineModel, job: TrainingJob, lay: Layouts, fast: bool = False,
             ddp_buckets_mb: tuple[float, ...] | None = None) -> Evaluation:
    """Predict explicit layouts (one row each), with library-consistent algorithms by default.
    `ddp_buckets_mb`: the DDP bucket sizes to choose from (default the job's framework's; one
    size to predict a given plan's)."""
    if ddp_buckets_mb is not None and (not ddp_buckets_mb or min(ddp_buckets_mb) <= 0):
        raise ValueError(f"ddp_buckets_mb must be positive sizes, got {ddp_buckets_mb!r}")
    return evaluate_space(model, machine, job, Space.of(lay), fast=fast, ddp_buckets_mb=ddp_buckets_mb)
