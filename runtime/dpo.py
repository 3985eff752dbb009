"""Direct Preference Optimisation (Rafailov et al. 2023) in the runtime: `exaplan run PLAN
--pairs DIR` with a plan whose job.workload is `dpo`.

Objective. For a pair (chosen c, rejected r) of sequences, with the policy's and the frozen
reference model's sequence log-probabilities pi and ref (sum over the non-pad target tokens
of log p(token), next-token log-softmax in fp32):

    z    = beta * ((pi_c - ref_c) - (pi_r - ref_r))
    loss = -(1 - eps) * logsigmoid(z) - eps * logsigmoid(-z)      (eps: label smoothing)

averaged over the pairs of the global batch. Metrics (STAT_KEYS): loss, reward accuracy
(beta (pi_c - ref_c) strictly above beta (pi_r - ref_r): ties, as at the start, are wrong),
margin, mean rewards and log-probs, log-prob accuracy (pi_c > pi_r: the policy alone).

Batches. The global batch and the plan's micro-batch size count PAIRS: a micro-batch of mbs
pairs is one forward of 2 mbs sequences (mbs chosen, then their mbs rejected), so pipeline,
tensor, context and data parallelism all see an ordinary batch of sequences. A sequence is
framed as in pretraining, `<bos> residues <eos>`, padded with <pad> to seq_len + 1 tokens
(inputs [:-1], targets [1:]); longer ones are refused.

Layouts. Every layout kind of the pretraining runtime works: the loss is a function of the
logits of one micro-batch and the reference log-probabilities of its pairs.
  * context parallelism: `SumOverCP` adds the cp ranks' partial log-probs (backward: the sum
    of the gradients, which the gradient reduction's mean over dp x cp turns back into the
    gradient of the loss);
  * pipelines: the schedule computes the loss on the last stage from (logits, target) of a
    micro-batch, so the target tensor carries one extra column, the reference
    log-probability of each sequence as the bits of a float64 (`encode_reference`): it is split into
    micro-batches together with the targets. The reference model runs its own pipeline
    (forward only, PipelineRunner.evaluate) before the policy's step.
  * the reference model is built by the trainer's own build_model (same mesh, same sharding,
    same seed), frozen (requires_grad False, eval, torch.no_grad): the initial policy (the
    seed's weights, or --init's) or --reference's weights. With --precompute-reference (or a
    plan with job.reference: precomputed) it runs once over all train and validation pairs
    (spread over the data-parallel ranks, gathered to every rank), the table is stored in
    OUT/reference_logps.npz under a hash of the pairs and of the reference weights' origin
    (the model and seed, or the checkpoint's metadata), reused on resume, and the reference
    model is dropped.

The parts: the objective (dpo_objective.py: STAT_KEYS, the loss, SumOverCP, the reference
column), the pairs (dpo_pairs.py: reading, tokenising, PairLoader); this module checks the
command line and runs the task (DPOTask) the trainer's loop calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from planner.schema.errors import PlanError
from runtime.dpo_objective import (DEFAULT_BETA, STAT_KEYS, SumOverCP, decode_reference, dpo_loss, encode_reference,
                                   mean_stats, sequence_logps)
from runtime.dpo_pairs import PairLoader, PairSet, encode_pairs, load_pair_sets, read_pairs
from runtime.parallel.context import shard_sequence

# DPO's names in one place: the objective's (runtime/dpo_objective.py) and the pairs'
# (runtime/dpo_pairs.py) with the task's.
__all__ = ["DEFAULT_BETA", "REFERENCE_FILE", "STAT_KEYS", "DPOTask", "PairLoader", "PairSet", "SumOverCP", "check_args",
           "decode_reference", "dpo_loss", "encode_pairs", "encode_reference", "load_pair_sets", "mean_stats",
           "read_pairs", "resolve_checkpoint", "sequence_logps"]

REFERENCE_FILE = "reference_logps.npz"


# --------------------------------------------------------------------------------------------
# The command line: checked before any rank starts
# --------------------------------------------------------------------------------------------


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder, a folder of checkpoints, or a run folder (its checkpoints/)."""
    from runtime import checkpoint

    p = Path(path)
    if (p / "checkpoints").is_dir():
        p = p / "checkpoints"
    return checkpoint.resolve(p)


def check_args(args, plan) -> None:
    """Refuse what does not fit: a dpo plan without --pairs, DPO options with a pretraining
    plan, pairs longer than the plan's sequence, bad beta / label smoothing / checkpoints
    (--init is checked for pretraining plans too)."""
    from planner.schema.specs import Workload

    dpo_only = [flag for flag, given in (("--pairs", args.pairs), ("--reference", args.reference),
                                         ("--precompute-reference", args.precompute_reference),
                                         ("--beta", args.beta is not None),
                                         ("--label-smoothing", args.label_smoothing is not None)) if given]
    for flag, path in (("--init", args.init), ("--reference", args.reference)):
        if path:
            try:
                resolve_checkpoint(path)
            except PlanError as e:
                raise PlanError(str(e), field=flag) from None
    if plan.job.workload != Workload.dpo:
        if dpo_only:
            raise PlanError(f"{', '.join(dpo_only)}: DPO options, but {args.plan} is a {plan.job.workload.value} plan "
                            "(job.workload: dpo trains on preference pairs)", field=dpo_only[0])
        return
    if not args.pairs:
        raise PlanError(f"{args.plan} is a dpo plan (job.workload: dpo): give the preference pairs with --pairs DIR "
                        "(made by `exaplan data pairs`)", field="--pairs")
    if args.io_mode != "real":
        raise PlanError("DPO reads its pairs: --io-mode synthetic / io-only are for pretraining", field="--io-mode")
    if args.data:
        raise PlanError("DPO reads --pairs; --data is for pretraining", field="--data")
    beta = DEFAULT_BETA if args.beta is None else args.beta
    if not beta > 0:
        raise PlanError(f"must be positive, got {beta}", field="--beta")
    eps = args.label_smoothing or 0.0
    if not 0 <= eps < 0.5:
        raise PlanError(f"must be in [0, 0.5), got {eps}", field="--label-smoothing")
    load_pair_sets(args.pairs, plan.job.seq_len)


# --------------------------------------------------------------------------------------------
# Training: what the trainer's loop calls
# --------------------------------------------------------------------------------------------


class DPOTask:
    """The DPO side of `runtime.trainer.train`: step() runs one optimizer step's forward and
    backward (gradients left for the trainer's clip and optimizer), validate() the held-out
    pairs; state_dict() is the pair loader's position for checkpoints."""

    def __init__(self, args, plan, mesh, device, parts, handles, out: Path | None, build_model, pair_sets=None):
        """`pair_sets`: (train, validation) given in place of --pairs (exaplan check's synthetic
        pairs); with `out` None the reference's log-probs are neither read nor written."""
        from runtime.parallel.pipeline import build_schedule

        self.args, self.plan, self.mesh, self.device, self.parts, self.handles = args, plan, mesh, device, parts, handles
        self.beta = DEFAULT_BETA if args.beta is None else args.beta
        self.eps = args.label_smoothing or 0.0
        self.mbs, self.gas, self.seq = plan.micro_batch_size, plan.grad_accumulation_steps, plan.job.seq_len
        self.dp_rank, self.dp = mesh["dp"].get_local_rank(), mesh["dp"].size()
        self.cp_rank, self.cp = mesh["cp"].get_local_rank(), mesh["cp"].size()
        self.cp_group = mesh["cp"].get_group() if self.cp > 1 else None
        self.train_set, self.val_set = pair_sets or load_pair_sets(args.pairs, self.seq)
        self.loader = PairLoader(self.train_set, self.mbs, self.dp_rank, self.dp, args.seed, self.gas)
        self.tokens_per_step = plan.job.tokens_per_step  # both sequences of every pair
        self.seen: list[int] = []
        self._stats = torch.zeros(len(STAT_KEYS), dtype=torch.float64)
        self._captured: torch.Tensor | None = None

        def schedule(model_parts):
            if plan.mesh.pp == 1:
                return None
            return build_schedule(model_parts, plan, mesh["pp"], device, self.gas, self._stage_loss,
                                  (2 * self.mbs, self.seq // self.cp))

        self.runner = schedule(parts)
        last = self.runner is None or self.runner.has_last
        # One rank per data-parallel replica holds the replica's statistics: the last stage's
        # first tp and cp rank (the others hold copies of them).
        self.owner = last and mesh["tp"].get_local_rank() == 0 and self.cp_rank == 0

        # The reference: a frozen copy of the initial policy (or of --reference), same layout.
        self.ref_parts = self.ref_runner = None
        self.ref_table: dict[str, torch.Tensor] | None = None
        source = args.reference or args.init
        key = self._reference_key(source)
        path = out / REFERENCE_FILE if out is not None else None
        # The plan may say so too (job.reference: precomputed; its memory estimate then has no reference model).
        self.precompute = args.precompute_reference or not plan.job.reference_in_step
        if self.precompute and plan.job.reference_in_step and dist.get_rank() == 0:
            print("note: the plan has the reference model in the step (job.reference: in-step): its predicted time, "
                  "memory and model FLOPs count a reference this run does not hold (--precompute-reference)", flush=True)
        if self.precompute and path is not None:
            self.ref_table = self._load_table(path, key)
            if self.ref_table is not None and dist.get_rank() == 0:
                print(f"reference log-probs: reusing {path}", flush=True)
        if self.ref_table is None:
            self.ref_parts, _ = build_model(plan, mesh, device, args.seed)
            if source:
                from runtime import checkpoint

                checkpoint.load(resolve_checkpoint(source), self.ref_parts, None, restore_rng=False)
            for part in self.ref_parts:
                part.requires_grad_(False)
                part.eval()
            self.ref_runner = schedule(self.ref_parts)
            if self.precompute:
                t0 = time.perf_counter()
                with torch.no_grad():
                    self.ref_table = {"train": self._all_logps(self.ref_parts, self.ref_runner, self.train_set),
                                      "validation": self._all_logps(self.ref_parts, self.ref_runner, self.val_set)}
                if dist.get_rank() == 0 and path is not None:
                    _save_table(path, key, self.ref_table)
                    print(f"reference log-probs of {len(self.train_set)} train and {len(self.val_set)} validation "
                          f"pairs in {time.perf_counter() - t0:.1f} s: {path}", flush=True)
                self.ref_parts = self.ref_runner = None  # no reference model kept in memory

    # ------------------------------------------------------------------------- forward

    def _stage_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The pipeline's loss: target with the reference column (encode_reference): the DPO loss of
        the micro-batch; plain targets (PipelineRunner.evaluate): capture the log-probs."""
        if target.shape[1] == logits.shape[1]:
            self._captured = self._cp_sum(sequence_logps(logits, target))
            return self._captured.sum()
        targets, ref = decode_reference(target)
        return self._loss(self._cp_sum(sequence_logps(logits, targets)), ref)

    def _cp_sum(self, logps: torch.Tensor) -> torch.Tensor:
        return logps if self.cp_group is None else SumOverCP.apply(logps, self.cp_group)

    def _loss(self, logps: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """Mean DPO loss of a micro-batch (chosen rows first); its statistics are added up."""
        n = logps.shape[0] // 2
        losses, stats = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], self.beta, self.eps)
        if self.owner:
            self._stats += stats.cpu()
        return losses.mean()

    def _logps(self, parts, runner, batch: torch.Tensor) -> torch.Tensor | None:
        """Sequence log-probs [rows] of a batch [rows, seq + 1], forward only (on the last
        pipeline stage; None on the others)."""
        inputs, targets = shard_sequence(batch.to(self.device), self.cp_rank, self.cp)
        if runner is None:
            logps = self._cp_sum(sequence_logps(parts[0](inputs), targets))
            for m in parts[0].modules():  # no backward follows: leave FSDP's parameters sharded
                if isinstance(m, FSDPModule):
                    m.reshard()
            return logps
        self._captured = None
        runner.forward_only(inputs, targets)
        return self._captured

    def _reference(self, batch: torch.Tensor, idx: np.ndarray, split: str) -> torch.Tensor | None:
        if self.ref_table is not None:
            table = self.ref_table[split][torch.from_numpy(idx)]
            return torch.cat([table[:, 0], table[:, 1]]).float().to(self.device)
        with torch.no_grad():
            return self._logps(self.ref_parts, self.ref_runner, batch)

    # ----------------------------------------------------------------------------- step

    def step(self) -> None:
        """One optimizer step's forward and backward (the gradients are left for the trainer)."""
        self.seen.clear()
        self._stats.zero_()
        batches = []
        for _ in range(self.gas):
            batch, idx = self.loader.next_microbatch()
            self.seen.extend(int(i) for i in self.loader.last_indices)
            batches.append((batch, self._reference(batch, idx, "train")))
        if self.runner is not None:
            inputs, targets = shard_sequence(torch.cat([b for b, _ in batches]).to(self.device), self.cp_rank, self.cp)
            kwargs = {}
            if self.runner.has_last:
                kwargs = {"target": encode_reference(targets, torch.cat([r for _, r in batches])), "losses": []}
            self.runner.schedule.step(*((inputs,) if self.runner.has_first else ()), return_outputs=False, **kwargs)
        else:
            for i, (batch, ref) in enumerate(batches):
                inputs, targets = shard_sequence(batch.to(self.device), self.cp_rank, self.cp)
                with self.handles[0].no_sync() if i < self.gas - 1 else contextlib.nullcontext():
                    logps = self._cp_sum(sequence_logps(self.handles[0].forward(inputs), targets))
                    (self._loss(logps, ref) / self.gas).backward()

    def metric_row(self) -> torch.Tensor:  # this rank's sums of the last step, reduced later (runtime/steplog.py)
        return self._stats.clone()

    def reduce_metric_rows(self, rows: torch.Tensor) -> list[tuple[float, dict[str, float]]]:  # each step's means
        return [(stats["loss"], stats) for stats in map(mean_stats, self._reduce(rows))]

    def _reduce(self, sums: torch.Tensor) -> torch.Tensor:
        t = sums.to(self.device)
        dist.all_reduce(t)  # owners only hold non-zero sums: one per data-parallel replica
        return t.cpu()

    # ----------------------------------------------------------------------- validation

    @torch.no_grad()
    def validate(self) -> dict[str, float] | None:
        """DPO metrics over the validation pairs (the first --val-pairs of them when given)."""
        pairs = self.val_set
        if self.args.val_pairs:
            pairs = PairSet(pairs.tokens[: self.args.val_pairs], pairs.seq_len, pairs.fingerprint)
        if len(pairs) == 0:
            return None
        policy = self._all_logps(self.parts, self.runner, pairs)
        if self.ref_table is not None:
            ref = self.ref_table["validation"][: len(pairs)]
        else:
            ref = self._all_logps(self.ref_parts, self.ref_runner, pairs)
        _, sums = dpo_loss(policy[:, 0].float(), policy[:, 1].float(), ref[:, 0].float(), ref[:, 1].float(),
                           self.beta, self.eps)
        return mean_stats(sums)

    def _all_logps(self, parts, runner, pairs: PairSet) -> torch.Tensor:
        """Sequence log-probs [n, 2] (chosen, rejected) of every pair, on every rank: the pairs
        are spread over the data-parallel ranks in micro-batches of mbs pairs (the last ones
        filled up with pair 0, whose results are dropped), then summed over the world."""
        n, mbs = len(pairs), self.mbs
        out = torch.zeros(n, 2, dtype=torch.float64)
        for start in range(0, n, self.dp * mbs):
            idx = np.arange(start + self.dp_rank * mbs, start + (self.dp_rank + 1) * mbs)
            valid = idx < n
            logps = self._logps(parts, runner, pairs.batch(np.where(valid, idx, 0)))
            if self.owner:
                logps = logps.double().cpu()
                keep = torch.from_numpy(idx[valid])
                out[keep, 0] = logps[:mbs][torch.from_numpy(valid)]
                out[keep, 1] = logps[mbs:][torch.from_numpy(valid)]
        return self._reduce(out)

    # ---------------------------------------------------------------- state, reference file

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def _reference_key(self, source: str | None) -> str:
        """Hash of what the reference log-probs depend on: the pairs, the model, and where the
        reference weights come from (the seed, or the checkpoint's metadata)."""
        h = hashlib.sha256()
        h.update(json.dumps({"model": self.plan.model.model_dump(mode="json"), "seq_len": self.seq,
                             "seed": None if source else self.args.seed,
                             "pairs": [self.train_set.fingerprint, self.val_set.fingerprint]}, sort_keys=True).encode())
        if source:
            ckpt = resolve_checkpoint(source)
            for name in ("meta.json", ".metadata"):
                h.update((ckpt / name).read_bytes())
        return h.hexdigest()

    def _load_table(self, path: Path, key: str) -> dict[str, torch.Tensor] | None:
        """The stored table when it was made for `key` (rank 0 decides for everyone)."""
        ok = [False]
        if dist.get_rank() == 0 and path.is_file():
            with np.load(path) as f:
                ok = [str(f["key"]) == key]
        dist.broadcast_object_list(ok, src=0)
        if not ok[0]:
            return None
        with np.load(path) as f:
            return {"train": torch.from_numpy(f["train"]), "validation": torch.from_numpy(f["validation"])}


def _save_table(path: Path, key: str, table: dict[str, torch.Tensor]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(tmp, key=np.array(key), train=table["train"].numpy(), validation=table["validation"].numpy())
    os.replace(tmp, path)
