"""The pretraining task of runtime/trainer.py's `train` (step 7; DPO's is runtime/dpo.py): the
loader over the prepared sequences, the forward and backward of a step (through the pipeline
schedule when pp > 1), the loss of each step reduced over the ranks, the validation loss.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


class PretrainTask:
    """Next-token pretraining: the loader over the prepared sequences, the forward and
    backward of a step (through the pipeline schedule when pp > 1), the validation loss."""

    def __init__(self, args, plan, mesh, device, parts, handles, out: Path | None, rank: int, loader=None):
        """`loader`: a batch source given in place of the prepared data (exaplan check gives a
        SyntheticLoader: no data is read, there is no validation set)."""
        from runtime.loader import Loader, TokenDataset
        from runtime.model import loss_fn

        self.args, self.plan, self.mesh, self.device, self.parts, self.handles = args, plan, mesh, device, parts, handles
        # All cp ranks of a replica load the same micro-batches; shard_sequence takes this cp rank's tokens.
        self.cp_rank, self.cp_size = mesh["cp"].get_local_rank(), mesh["cp"].size()
        mbs, self.gas, seq = plan.micro_batch_size, plan.grad_accumulation_steps, plan.job.seq_len
        self.val_set = None
        if loader is None:
            from runtime.dataprep.cache import ensure_prepared

            prepared = ensure_prepared(args.data, out / "data", rank=rank)
            self.val_set = TokenDataset(prepared, "validation")
            if len(self.val_set) == 0:  # too few sequences for a held-out split: train, and say so once
                if rank == 0:
                    print(f"warning: {args.data}: the validation split is empty (too few sequences to hold any "
                          "out): validation is skipped (summary.json: val_loss null)", flush=True)
                self.val_set = None
            loader = Loader(TokenDataset(prepared, "train"), seq_len=seq, micro_batch=mbs,
                            dp_rank=mesh["dp"].get_local_rank(), dp_size=mesh["dp"].size(), seed=args.seed,
                            grad_accumulation=self.gas)
        self.loader = loader
        self.tokens_per_step = plan.job.global_batch * seq
        self.runner = None
        if plan.mesh.pp > 1:
            from runtime.parallel.pipeline import build_schedule

            # Stages pass seq / cp tokens; the loss stays on the last stage (reduce_metric_rows).
            self.runner = build_schedule(parts, plan, mesh["pp"], device, self.gas, loss_fn,
                                         (mbs, seq // self.cp_size), broadcast_loss=False)
        self.fixed_batch = None  # io-mode synthetic: one batch, reused
        self.seen: list[int] = []  # global sample numbers of this step on this rank
        self._loss = 0.0  # this rank's loss of the last step

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def _next_batch(self):
        if self.args.io_mode == "synthetic":
            if self.fixed_batch is None:
                self.fixed_batch = self.loader.next_microbatch().to(self.device)
            return self.fixed_batch
        batch = self.loader.next_microbatch()
        self.seen.extend(int(i) for i in self.loader.last_indices)
        return batch.to(self.device)

    def step(self) -> None:
        import torch

        from runtime.model import loss_fn
        from runtime.parallel.context import shard_sequence

        self.seen.clear()
        if self.runner is not None:
            batch = torch.cat([self._next_batch() for _ in range(self.gas)])
            loss = self.runner.step(*shard_sequence(batch, self.cp_rank, self.cp_size))
            self._loss = torch.as_tensor(0.0 if loss is None else loss, dtype=torch.float32).to(self.device)
            return
        self._loss = torch.zeros((), dtype=torch.float32, device=self.device)
        for i in range(self.gas):
            batch = self._next_batch()
            with self.handles[0].no_sync() if i < self.gas - 1 else contextlib.nullcontext():
                inputs, targets = shard_sequence(batch, self.cp_rank, self.cp_size)  # the whole when cp = 1
                part = loss_fn(self.handles[0].forward(inputs), targets) / self.gas
                part.backward()
            self._loss += part.detach().float()  # kept on the device: read when the step is written

    def metric_row(self):
        """This rank's figures of the last step, unread: its loss (runtime/steplog.py)."""
        return self._loss.reshape(1)

    def reduce_metric_rows(self, rows) -> list[tuple[float, None]]:
        """The global batch's loss of each kept step, one all-reduce over all ranks: the ranks
        holding the last pipeline stage (all of them without a pipeline) contribute their
        loss, the others 0; the mean over them is the mean over the data- and context-parallel
        ranks (every cp rank holds the same number of tokens; tp ranks hold the same loss)."""
        import torch
        import torch.distributed as dist

        rows = rows.to(self.device, torch.float32)
        dist.all_reduce(rows)
        holders = dist.get_world_size() // self.plan.mesh.pp
        return [(v / holders, None) for v in rows[:, 0].tolist()]

    def validate(self) -> float | None:
        """Mean loss over `val_batches` global batches of validation samples (no gradients): the
        same samples whatever the layout, split over the data-parallel ranks as in training;
        None without a validation split."""
        import torch

        if self.val_set is None:
            return None

        from runtime.loader import Loader
        from runtime.model import loss_fn
        from runtime.parallel.context import shard_sequence

        plan, mesh = self.plan, self.mesh
        loader = Loader(self.val_set, seq_len=plan.job.seq_len, micro_batch=plan.micro_batch_size,
                        dp_rank=mesh["dp"].get_local_rank(), dp_size=mesh["dp"].size(), seed=1234,
                        grad_accumulation=self.gas)
        losses = []
        with torch.no_grad():
            for _ in range(self.args.val_batches * self.gas):
                batch = loader.next_microbatch().to(self.device)
                inputs, targets = shard_sequence(batch, self.cp_rank, self.cp_size)
                if self.runner is not None:
                    losses.append(self.runner.evaluate(inputs, targets) or 0.0)  # None off the last stage
                else:
                    losses.append(float(loss_fn(self.handles[0].forward(inputs), targets)))
        return self.reduce_metric_rows(torch.tensor([[sum(losses) / len(losses)]]))[0][0]
