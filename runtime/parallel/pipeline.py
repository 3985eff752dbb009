"""Pipeline parallelism: cut the model into the plan's stages and run them with
torch.distributed.pipelining (manual PipelineStage, static shapes, GPipe / 1F1B /
interleaved 1F1B).

Layout (the plan's): stage i (in model order) holds layers [first_layer, last_layer) and runs on
pp rank i % pp as that rank's chunk i // pp; the embedding lives on stage 0, the final norm
and the output head on the last stage. A chunk is a copy of the whole ProteinLM with the
other blocks deleted and the embedding / norm / head it does not own set to None, so every
parameter keeps its full-model name ("layers.7.attention.wq.weight"): init_weights and
checkpoints do not depend on the layout.

Gradient normalisation. The normalisation is put into the loss each micro-batch hands to the
schedule, and the schedule's own gradient division is switched off (scale_grads=False), so it
holds wherever the gradients go (.grad, FSDP's reduce-scatter, ZeRO's bucket hooks, which
torch's scale_grads cannot see):

    "microbatch" (default)  loss_fn(micro-batch) / n_microbatches: the gradient is the mean over
                  micro-batches of each micro-batch's mean token loss, exactly what the
                  non-pipelined trainer's accumulation (loss_fn(mb) / grad_accumulation_steps,
                  backward per micro-batch) gives. torch's schedules with scale_grads=True give
                  the same numbers.
    "token"       loss_fn(micro-batch) x (non-pad targets in it) / (non-pad targets in the
                  step): the gradient of the mean loss over every non-pad target of this rank's
                  batch for the step, as one forward/backward over the whole local batch would
                  give, whatever the padding.

The two agree when every micro-batch holds the same number of non-pad targets (packed data,
the loader's default: no padding at all). Data parallelism (DDP-style replicate, FSDP, ZeRO)
then averages over the dp ranks, as in the non-pipelined trainer: the gradient of the mean loss
over the global batch (exactly the token mean when dp ranks hold equal non-pad counts). The
step's loss reported by PipelineRunner.step is the sum of the normalised micro-batch losses,
i.e. this rank's batch mean under the same convention. `loss_fn` must be a mean over non-pad
targets, like runtime.model.loss_fn.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from planner.schema.plan import Plan, Schedule, StageAssignment
from planner.schema.vocab import PAD_ID
from runtime.model import ProteinLM

__all__ = ["split_model", "build_schedule", "PipelineRunner", "stages_of_rank"]

_SCHEDULES = {
    Schedule.gpipe: ScheduleGPipe,
    Schedule.one_f_one_b: Schedule1F1B,
    Schedule.interleaved_1f1b: ScheduleInterleaved1F1B,
}


def stages_of_rank(plan: Plan, pp_rank: int) -> list[tuple[int, StageAssignment]]:
    """(global stage index, assignment) of every stage pp rank `pp_rank` runs, by virtual index."""
    pp = plan.mesh.pp
    if not 0 <= pp_rank < pp:
        raise ValueError(f"pp_rank {pp_rank} outside the plan's {pp} pipeline ranks")
    mine = [(i, st) for i, st in enumerate(plan.pipeline.stages) if st.pp_rank == pp_rank]
    mine.sort(key=lambda t: t[1].virtual_index)
    for i, st in mine:  # the plan validator checks this too; the runtime relies on it
        if i % pp != pp_rank or i // pp != st.virtual_index:
            raise ValueError(f"pipeline.stages[{i}] must sit on pp rank {i % pp}, chunk {i // pp}")
    return mine


def _unwrap(m: nn.Module) -> nn.Module:
    """The ProteinLM inside DDP / checkpoint / compile wrappers (FSDP2 wraps in place)."""
    while True:
        inner = getattr(m, "module", None) or getattr(m, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return m
        m = inner


def split_model(model: ProteinLM, plan: Plan, pp_rank: int) -> list[ProteinLM]:
    """The model chunks pp rank `pp_rank` runs, in virtual-stage order (one chunk, or
    virtual_stages of them for interleaved 1F1B).

    Each chunk is a deep copy of `model` (cheap on the meta device; blocks a chunk does not
    keep are not copied) holding only layers [first_layer, last_layer) under their global
    ModuleDict keys, the embeddings only on stage 0 and the norm + output head only on the
    last stage (None elsewhere). With pp == 1 the model itself is returned: [model].
    """
    if plan.mesh.pp == 1:
        return [model]
    n_layers = len(model.layers)
    if n_layers != plan.model.layers:
        raise ValueError(f"the model has {n_layers} layers, the plan's model {plan.model.layers}")
    if model.spec.tied_embeddings:
        raise NotImplementedError("tied embeddings with pp > 1 (the head would share a weight across pipeline ranks)")
    chunks = []
    for _, st in stages_of_rank(plan, pp_rank):
        keep = {str(i) for i in range(st.first_layer, st.last_layer)}
        dropped: list[nn.Module] = [blk for key, blk in model.layers.items() if key not in keep]
        if not st.embedding:
            dropped += [m for m in (model.tok_embeddings, model.pos_embeddings) if m is not None]
        if not st.head:
            dropped += [m for m in (model.norm, model.output) if m is not None]
        # Pre-seeding deepcopy's memo makes it share (not copy) the modules about to be dropped.
        memo = {id(m): m for m in dropped}
        chunk = copy.deepcopy(model, memo)
        for key in [k for k in chunk.layers.keys() if k not in keep]:
            del chunk.layers[key]
        if not st.embedding:
            chunk.tok_embeddings = None
            chunk.pos_embeddings = None
        if not st.head:
            chunk.norm = None
            chunk.output = None
        chunks.append(chunk)
    return chunks


def _pp_group(pp_mesh_or_group) -> dist.ProcessGroup:
    if pp_mesh_or_group is None:
        return dist.group.WORLD
    if isinstance(pp_mesh_or_group, DeviceMesh):
        mesh = pp_mesh_or_group
        if mesh.ndim > 1:
            if not mesh.mesh_dim_names or "pp" not in mesh.mesh_dim_names:
                raise ValueError("a multi-dimensional mesh needs a 'pp' axis")
            mesh = mesh["pp"]
        return mesh.get_group()
    return pp_mesh_or_group


def _default_activation_dtype(chunks: Sequence[nn.Module]) -> torch.dtype:
    """The dtype hidden states travel in: FSDP2 / replicate with a mixed-precision policy
    compute (and return) in its param dtype; otherwise the parameters' dtype, fp32 here
    (autocast keeps the residual stream fp32: the residual adds promote)."""
    from torch.distributed.fsdp import FSDPModule

    for chunk in chunks:
        if isinstance(chunk, FSDPModule):
            try:
                mp = chunk._get_fsdp_state()._mp_policy
                return mp.output_dtype or mp.param_dtype or torch.float32
            except AttributeError:  # private API moved: fall back to the parameters' dtype
                pass
        for p in chunk.parameters():
            if p.is_floating_point():
                return p.dtype
    return torch.float32


class PipelineRunner:
    """One optimizer step's worth of micro-batches through the pipeline.

    step(tokens, targets): tokens [n_microbatches * mbs, seq] on the rank holding stage 0,
    targets of the same shape on the rank holding the last stage (None elsewhere is fine;
    passing both everywhere is fine too). Runs forward and backward of every micro-batch and
    leaves the gradients (accumulated, normalised as the module docstring says) for the
    optimizer: zero them between steps. Returns the step's loss (a detached fp32 0-dim tensor)
    on every pp rank when broadcast_loss (one broadcast over the pp group), else on the last
    stage's rank only (None elsewhere).

    evaluate(tokens, targets): forward only, no gradients, for any batch [b, seq] (one call,
    not split into micro-batches); returns loss_fn over it as a float on every pp rank
    (forward_only: the same, as a tensor).
    """

    def __init__(self, schedule, stages: list[PipelineStage], chunks: list[nn.Module], group: dist.ProcessGroup,
                 n_microbatches: int, microbatch_shape: tuple[int, int], hidden_shape: tuple[int, ...],
                 activation_dtype: torch.dtype, loss_fn: Callable, normalization: str, broadcast_loss: bool,
                 device: torch.device):
        self.schedule = schedule
        self.stages = stages
        self.chunks = chunks
        self.group = group
        self.n_microbatches = n_microbatches
        self.microbatch_shape = microbatch_shape
        self.hidden_shape = hidden_shape
        self.activation_dtype = activation_dtype
        self.loss_fn = loss_fn
        self.normalization = normalization
        self.broadcast_loss = broadcast_loss
        self.device = device
        self.pp_size = dist.get_world_size(group)
        self.pp_rank = dist.get_rank(group)
        self.n_stages = stages[0].num_stages
        self.has_first = any(s.is_first for s in stages)
        self.has_last = any(s.is_last for s in stages)
        self.stage_indices = [s.stage_index for s in stages]
        self._tokens_in_step: torch.Tensor | None = None  # "token" normalisation, last stage, per step

    def parameters(self) -> Iterable[nn.Parameter]:
        for c in self.chunks:
            yield from c.parameters()

    def _check(self, name: str, t: torch.Tensor | None, rows: int | None) -> torch.Tensor:
        seq = self.microbatch_shape[1]
        if t is None:
            which = "the first stage" if name == "tokens" else "the last stage"
            raise ValueError(f"pp rank {self.pp_rank} holds {which}: {name} needed")
        if t.dim() != 2 or t.shape[1] != seq or (rows is not None and t.shape[0] != rows):
            want = f"({rows}, {seq})" if rows is not None else f"(batch, {seq})"
            raise ValueError(f"{name} of shape {tuple(t.shape)}, expected {want}")
        return t.to(self.device, non_blocking=True)

    def _share_loss(self, loss: torch.Tensor | None) -> torch.Tensor | None:
        if not self.broadcast_loss or self.pp_size == 1:
            return loss
        buf = loss.reshape(()).clone() if loss is not None else torch.zeros((), dtype=torch.float32, device=self.device)
        dist.broadcast(buf, group_src=self.pp_size - 1, group=self.group)
        return buf

    def step(self, tokens: torch.Tensor | None, targets: torch.Tensor | None) -> torch.Tensor | None:
        rows = self.n_microbatches * self.microbatch_shape[0]
        args = (self._check("tokens", tokens, rows),) if self.has_first else ()
        kwargs = {}
        losses: list[torch.Tensor] = []
        if self.has_last:
            targets = self._check("targets", targets, rows)
            self._tokens_in_step = (targets != PAD_ID).sum()
            kwargs = {"target": targets, "losses": losses}
        try:
            self.schedule.step(*args, return_outputs=False, **kwargs)
        finally:
            self._tokens_in_step = None
        # The schedule's micro-batch losses carry the normalisation: their sum is the step's loss.
        loss = torch.stack([x.detach().float() for x in losses]).sum().to(self.device) if self.has_last else None
        return self._share_loss(loss)

    def evaluate(self, tokens: torch.Tensor | None, targets: torch.Tensor | None) -> float | None:
        out = self.forward_only(tokens, targets)
        return float(out) if out is not None else None

    @torch.no_grad()
    def forward_only(self, tokens: torch.Tensor | None, targets: torch.Tensor | None) -> torch.Tensor | None:
        """evaluate's pass, its loss left a 0-dim tensor (not read back: DPO's reference pass,
        which takes what the loss captured, and a pass under fake tensors)."""
        from torch.distributed.fsdp import FSDPModule

        given = tokens if tokens is not None else targets
        rows = given.shape[0] if given is not None else self.microbatch_shape[0]
        loss = None
        for index, chunk in sorted(zip(self.stage_indices, self.chunks), key=lambda t: t[0]):
            if index == 0:
                x = self._check("tokens", tokens, rows)
            else:  # consecutive stages always sit on different pp ranks (stage i on rank i % pp)
                x = torch.empty((rows, *self.hidden_shape[1:]), dtype=self.activation_dtype, device=self.device)
                dist.recv(x, group_src=(index - 1) % self.pp_size, group=self.group)
            y = chunk(x)
            if index == self.n_stages - 1:
                loss = self.loss_fn(y, self._check("targets", targets, rows)).detach().float()
            else:
                dist.send(y.to(self.activation_dtype).contiguous(), group_dst=(index + 1) % self.pp_size,
                          group=self.group)
            for m in chunk.modules():  # leave FSDP parameters sharded, as after a training step
                if isinstance(m, FSDPModule):
                    m.reshard()
        return self._share_loss(loss)


def build_schedule(chunks: Sequence[nn.Module], plan: Plan, pp_mesh_or_group, device: torch.device | str,
                   n_microbatches: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   microbatch_shape: tuple[int, int], *, activation_dtype: torch.dtype | None = None,
                   activation_shape: tuple[int, ...] | None = None, logits_shape: tuple[int, ...] | None = None,
                   normalization: str = "microbatch", broadcast_loss: bool = True) -> PipelineRunner:
    """A PipelineRunner over this pp rank's materialised (and possibly TP/recompute/DP-wrapped)
    chunks, as split_model returned them, in the plan's schedule.

    pp_mesh_or_group: the world DeviceMesh (its "pp" axis is used), the 1-D pp mesh, a process
    group over the pp ranks, or None (the whole world is the pipeline). microbatch_shape:
    (micro_batch_size, seq_len). Stage shapes are static (no shape-inference round trip):
    stage 0 takes int64 tokens [mbs, seq]; stages pass hidden states `activation_shape`
    (default [mbs, seq, hidden], or [mbs, seq / tp, hidden] under sequence parallelism, as
    runtime.parallel.tensor leaves them) of `activation_dtype` (default: the FSDP/replicate
    mixed-precision param dtype of the chunk, else its parameters' dtype); the last stage emits
    logits `logits_shape` (default [mbs, seq, vocab]). Rotary tables are set up on chunks that
    lack them. normalization: "microbatch" (default, the non-pipelined trainer's) or "token";
    see the module docstring.
    """
    group, mine, schedule_cls = _check_schedule(chunks, plan, pp_mesh_or_group, n_microbatches, normalization)
    device = torch.device(device)

    spec = plan.model
    mbs, seq = microbatch_shape
    # Sequence parallelism (runtime.parallel.tensor) passes this rank's slice of the sequence
    # between stages as a plain tensor; otherwise the whole (replicated) hidden states.
    seq_local = seq // plan.mesh.tp if plan.sequence_parallel and plan.mesh.tp > 1 else seq
    hidden_shape = tuple(activation_shape or (mbs, seq_local, spec.hidden))
    out_shape = tuple(logits_shape or (mbs, seq, spec.vocab_size))
    dtype = activation_dtype or _default_activation_dtype(chunks)
    stages = [_stage(chunk, index, len(plan.pipeline.stages), device, group, (mbs, seq), hidden_shape, out_shape, dtype)
              for chunk, (index, _) in zip(chunks, mine)]
    runner: PipelineRunner | None = None

    def stage_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if normalization == "microbatch":
            return loss_fn(logits, target) / n_microbatches
        n = (target != PAD_ID).sum()
        if int(n) == 0:  # an all-pad micro-batch contributes nothing (loss_fn would be nan)
            return logits.sum() * 0.0
        return loss_fn(logits, target) * (n.to(torch.float32) / runner._tokens_in_step.to(torch.float32))

    if schedule_cls is ScheduleInterleaved1F1B:
        schedule = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=stage_loss, scale_grads=False)
    else:
        schedule = schedule_cls(stages[0], n_microbatches=n_microbatches, loss_fn=stage_loss, scale_grads=False)
    runner = PipelineRunner(schedule, stages, list(chunks), group, n_microbatches, (mbs, seq), hidden_shape, dtype,
                            loss_fn, normalization, broadcast_loss, device)
    return runner


def _check_schedule(chunks: Sequence[nn.Module], plan: Plan, pp_mesh_or_group, n_microbatches: int,
                    normalization: str) -> tuple[dist.ProcessGroup, list[tuple[int, StageAssignment]], type]:
    """build_schedule's checks: (the pp group, this pp rank's stages, the schedule class);
    ValueError when the plan, the pp group, the chunks and the arguments do not fit together."""
    if plan.mesh.pp == 1 or plan.pipeline.schedule is None:
        raise ValueError("build_schedule needs a plan with pp > 1 (pp == 1 runs the model directly)")
    if normalization not in ("token", "microbatch"):
        raise ValueError(f"normalization must be 'token' or 'microbatch', not {normalization!r}")
    if n_microbatches < 1:
        raise ValueError("n_microbatches must be >= 1")
    group = _pp_group(pp_mesh_or_group)
    pp = plan.mesh.pp
    if dist.get_world_size(group) != pp:
        raise ValueError(f"the pp group has {dist.get_world_size(group)} ranks, the plan's pp is {pp}")
    pp_rank = dist.get_rank(group)
    mine = stages_of_rank(plan, pp_rank)
    if len(chunks) != len(mine):
        raise ValueError(f"pp rank {pp_rank} runs {len(mine)} stages but got {len(chunks)} chunks")
    schedule_cls = _SCHEDULES[plan.pipeline.schedule]
    if schedule_cls is ScheduleInterleaved1F1B and n_microbatches % pp:
        raise ValueError(f"interleaved-1f1b needs n_microbatches ({n_microbatches}) divisible by pp ({pp})")
    if schedule_cls is not ScheduleInterleaved1F1B and len(chunks) != 1:
        raise ValueError(f"{plan.pipeline.schedule.value} runs one chunk per rank, got {len(chunks)}")
    return group, mine, schedule_cls


def _stage(chunk: nn.Module, index: int, n_stages: int, device: torch.device, group, token_shape: tuple[int, int],
           hidden_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype: torch.dtype) -> PipelineStage:
    """Stage `index` over `chunk`, with static input and output shapes (rotary tables set up
    if the chunk lacks them)."""
    inner = _unwrap(chunk)
    if isinstance(inner, ProteinLM) and inner.rope_cos is None and inner.spec.position == "rope":
        inner.setup_rope(device, token_shape[1])
    # Static metadata: torch takes requires_grad from these examples (a float activation
    # without it would get no gradient sent back), so floating ones require grad.
    if index == 0:
        x = torch.empty(token_shape, dtype=torch.long, device=device)
    else:
        x = torch.empty(hidden_shape, dtype=dtype, device=device, requires_grad=True)
    y = torch.empty(out_shape if index == n_stages - 1 else hidden_shape, dtype=dtype, device=device,
                    requires_grad=True)
    return PipelineStage(chunk, index, n_stages, device, input_args=(x,), output_args=(y,), group=group)
