"""Training data: a deterministic, resumable, data-parallel loader over prepared token shards
(`TokenDataset`, `Loader`). The preparation (FASTA -> shards) and the shard format are in
runtime/dataprep/ (prepare.py, shards.py; `ensure_prepared` in cache.py).

The loader sees one global sample stream per (dataset, seq_len, mode, seed): global sample g
lies in epoch g // samples_per_epoch, and every epoch is its own deterministic shuffle.
`pack` mode cuts the shuffled concatenation of sequences into windows of seq_len + 1 tokens
at stride seq_len (neighbouring windows share one token, so every next-token pair is trained
once per epoch) and shuffles the windows; `pad` mode gives one sequence per sample, cut to
seq_len + 1 tokens and padded with <pad> (the model's loss ignores <pad> targets). A training
step consumes global_batch = micro_batch x grad_accumulation x dp_size consecutive samples; data-
parallel rank r takes the r-th contiguous slice of micro_batch x grad_accumulation of them, one
micro-batch per `next_microbatch()`. The state is the global sample number where the current
step starts (the same on every rank), so a run can resume on another dp_size or global batch
and see exactly the samples that follow: none lost, none repeated.
"""


from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from planner.schema.errors import PlanError
from planner.schema.vocab import BOS_ID, PAD_ID, TOKEN_TO_ID
from runtime.dataprep.fasta import decode
from runtime.dataprep.shards import INDEX_DTYPE, IO_MODES, MODES, TOKEN_DTYPE, check_int, load_manifest, split_entry

# ----------------------------------------------------------------------------- dataset


class TokenDataset:
    """One split of a prepared directory: `len()` sequences, `ds[i]` -> uint8 token array
    (a read-only view into the memory-mapped shard), `ds.lengths` -> int64 token counts."""

    def __init__(self, prepared_dir: str | os.PathLike, split: str = "train"):
        self.dir = Path(prepared_dir)
        self.manifest = load_manifest(self.dir)
        split, info = split_entry(self.dir, self.manifest, split)
        self.split = split
        self.num_sequences = int(info["sequences"])
        self.num_tokens = int(info["tokens"])
        self.num_residues = int(info["residues"])
        self._shard_files = [self.dir / s["file"] for s in info["shards"]]
        self._shards: list[np.ndarray | None] = [None] * len(self._shard_files)
        index_path = self.dir / info["index"]
        self.index = (np.memmap(index_path, dtype=INDEX_DTYPE, mode="r") if self.num_sequences
                      else np.zeros(0, dtype=INDEX_DTYPE))
        self._lengths: np.ndarray | None = None
        key = {k: self.manifest[k] for k in ("max_len", "val_fraction", "seed")}
        key.update(split=split, sequences=self.num_sequences, tokens=self.num_tokens,
                   sha256=[s["sha256"] for s in self.manifest["sources"]])
        self.fingerprint = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return self.num_sequences

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sequence (uint32, in memory: 4 bytes a sequence)."""
        if self._lengths is None:
            self._lengths = np.ascontiguousarray(self.index["length"])
        return self._lengths

    def _shard(self, k: int) -> np.ndarray:
        shard = self._shards[k]
        if shard is None:
            shard = self._shards[k] = np.memmap(self._shard_files[k], dtype=TOKEN_DTYPE, mode="r")
        return shard

    def tokens(self, i: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Tokens [start:stop] of sequence i (a view, no copy)."""
        if not 0 <= i < self.num_sequences:
            raise IndexError(i)
        shard, length, offset = (int(v) for v in self.index[i])
        stop = length if stop is None else min(stop, length)
        return self._shard(shard)[offset + start: offset + stop]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens(int(i))

    def sequence(self, i: int) -> str:
        """Sequence i as residue letters."""
        return decode(self[i])


# ----------------------------------------------------------------------------- loader


def split_batch(batch):
    """[B, seq_len + 1] -> (inputs [B, seq_len], targets [B, seq_len]); <pad> targets are
    ignored by the loss (ignore_index = PAD_ID)."""
    return batch[:, :-1], batch[:, 1:]


class StepCounter:
    """The global sample position shared by Loader and SyntheticLoader (see module doc)."""

    def _init_layout(self, seq_len, micro_batch, dp_rank, dp_size, grad_accumulation, seed) -> None:
        self.seq_len = check_int("seq_len", seq_len, 1)
        self.micro_batch = check_int("micro_batch", micro_batch, 1)
        self.dp_size = check_int("dp_size", dp_size, 1)
        self.dp_rank = check_int("dp_rank", dp_rank, 0)
        if self.dp_rank >= self.dp_size:
            raise PlanError(f"dp_rank {dp_rank} out of range for dp_size {dp_size}")
        self.grad_accumulation = check_int("grad_accumulation", grad_accumulation, 1)
        self.seed = check_int("seed", seed, 0)
        self.per_rank = self.micro_batch * self.grad_accumulation
        self.global_batch = self.per_rank * self.dp_size
        self._step_start = 0        # global sample number where the current step starts
        self._micro = 0             # micro-batches of the current step already taken
        self.last_indices = np.zeros(0, dtype=np.int64)

    def _next_indices(self) -> np.ndarray:
        start = self._step_start + self.dp_rank * self.per_rank + self._micro * self.micro_batch
        self._micro += 1
        if self._micro == self.grad_accumulation:
            self._step_start += self.global_batch
            self._micro = 0
        self.last_indices = np.arange(start, start + self.micro_batch, dtype=np.int64)
        return self.last_indices

    def take_step(self) -> np.ndarray:
        """The global sample numbers of the whole next step on every data-parallel rank, shape
        (grad_accumulation, dp_size, micro_batch): [m, r] is rank r's micro-batch m, the
        samples `next_microbatch` would give that rank. Advances one step (for a single
        controller that assembles every rank's batch: the JAX backend, jaxrt/data.py)."""
        if self._micro:
            raise PlanError("take_step: the loader is in the middle of a step")
        m, r, j = np.ogrid[:self.grad_accumulation, :self.dp_size, :self.micro_batch]
        idx = self._step_start + r * self.per_rank + m * self.micro_batch + j
        self._step_start += self.global_batch
        return idx.astype(np.int64)

    @property
    def samples_consumed(self) -> int:
        """Global samples in completed steps (the same on every rank)."""
        return self._step_start

    def _stream_key(self) -> dict[str, Any]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The exact stream position; identical on every data-parallel rank (save it once)."""
        return {"version": 1, "sample": self._step_start, "microbatch": self._micro,
                "micro_batch": self.micro_batch, "grad_accumulation": self.grad_accumulation, "dp_size": self.dp_size,
                **self._stream_key()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved stream. The data-parallel size, micro-batch and gradient
        accumulation may differ from the saved ones when the state was saved at a step
        boundary (the next step starts at the saved global sample)."""
        if state.get("version") != 1:
            raise PlanError(f"unknown loader state version {state.get('version')!r}")
        mine = self._stream_key()
        for k, v in mine.items():
            if state.get(k) != v:
                raise PlanError(f"loader state is for another sample stream: {k} {state.get(k)!r}, this loader {v!r}")
        micro = int(state["microbatch"])
        if micro and (state["micro_batch"], state["grad_accumulation"], state["dp_size"]) != (
                self.micro_batch, self.grad_accumulation, self.dp_size):
            raise PlanError("loader state was saved in the middle of a step; resuming with another "
                            "micro_batch / grad_accumulation / dp_size needs a state saved at a step boundary")
        self._step_start = int(state["sample"])
        self._micro = micro

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_microbatch()


def _narrow(perm: np.ndarray) -> np.ndarray:
    return perm.astype(np.int32) if len(perm) < 2**31 else perm


class Loader(StepCounter):
    """This data-parallel rank's micro-batches: LongTensor [micro_batch, seq_len + 1].

    `last_indices` holds the global sample numbers of the last micro-batch. Every rank builds
    the epoch's shuffle itself (no communication): in host memory about 4 bytes a sequence
    for lengths and order, plus in pack mode 8 bytes a sequence (cumulative offsets) and 4
    bytes a window, e.g. ~1 GB per rank for 60 M sequences. The shuffle uses numpy's PCG64
    seeded by (seed, epoch, mode): the same on every rank and every restart.
    """

    def __init__(self, dataset: TokenDataset, seq_len: int, micro_batch: int, dp_rank: int, dp_size: int,
                 seed: int, mode: str = "pack", *, grad_accumulation: int = 1):
        self._init_layout(seq_len, micro_batch, dp_rank, dp_size, grad_accumulation, seed)
        if mode not in MODES:
            raise PlanError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.dataset, self.mode = dataset, mode
        if len(dataset) == 0:
            raise PlanError(f"{dataset.dir}: split {dataset.split!r} has no sequences")
        if mode == "pack":
            if dataset.num_tokens < self.seq_len + 1:
                raise PlanError(f"split {dataset.split!r} holds {dataset.num_tokens:,} tokens, fewer than one "
                                f"packed sample of seq_len + 1 = {self.seq_len + 1}")
            self.samples_per_epoch = (dataset.num_tokens - 1) // self.seq_len
        else:
            self.samples_per_epoch = len(dataset)
        self._epochs: dict[int, tuple[np.ndarray, ...]] = {}

    def _stream_key(self) -> dict[str, Any]:
        return {"seed": self.seed, "mode": self.mode, "seq_len": self.seq_len,
                "dataset": self.dataset.fingerprint}

    @property
    def epoch(self) -> int:
        return self._step_start // self.samples_per_epoch

    def _epoch(self, e: int) -> tuple[np.ndarray, ...]:
        plan = self._epochs.get(e)
        if plan is None:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, e, MODES.index(self.mode)])))
            n = len(self.dataset)
            order = _narrow(rng.permutation(n))
            if self.mode == "pack":
                cum = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(self.dataset.lengths[order], out=cum[1:], dtype=np.int64)
                plan = (order, cum, _narrow(rng.permutation(self.samples_per_epoch)))
            else:
                plan = (order,)
            self._epochs[e] = plan
        return plan

    def sample(self, g: int) -> np.ndarray:
        """Global sample g as int64 tokens [seq_len + 1]."""
        e, j = divmod(int(g), self.samples_per_epoch)
        plan = self._epoch(e)
        width = self.seq_len + 1
        out = np.full(width, PAD_ID, dtype=np.int64)
        if self.mode == "pad":
            toks = self.dataset.tokens(int(plan[0][j]), 0, width)
            out[: len(toks)] = toks
            return out
        order, cum, windows = plan
        a = int(windows[j]) * self.seq_len
        b = a + width
        k = int(np.searchsorted(cum, a, side="right")) - 1
        filled = 0
        while filled < width:
            lo = a + filled - int(cum[k])
            take = min(width - filled, int(cum[k + 1] - cum[k]) - lo)
            out[filled: filled + take] = self.dataset.tokens(int(order[k]), lo, lo + take)
            filled += take
            k += 1
        assert filled == b - a
        return out

    def next_microbatch(self):
        import torch

        idx = self._next_indices()
        first = int(idx[0]) // self.samples_per_epoch
        for e in [e for e in self._epochs if e < first]:     # keep only the epochs still in use
            del self._epochs[e]
        return torch.from_numpy(np.stack([self.sample(g) for g in idx]))


def synthetic_batch(seed: int, dp_rank: int, micro_batch: int, seq_len: int) -> np.ndarray:
    """io_mode 'synthetic': data-parallel rank `dp_rank`'s fixed batch, int64 [micro_batch,
    seq_len + 1] (residue tokens after <bos>), the same in every backend."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, dp_rank, 7])))
    first, last = TOKEN_TO_ID["A"], TOKEN_TO_ID["Y"]
    batch = rng.integers(first, last + 1, size=(micro_batch, seq_len + 1), dtype=np.int64)
    batch[:, 0] = BOS_ID
    return batch


class SyntheticLoader(StepCounter):
    """io_mode 'synthetic': one fixed random batch (residue tokens after <bos>) returned on
    every call (the same tensor: no loading, no copy); counts samples like Loader."""

    def __init__(self, seq_len: int, micro_batch: int, dp_rank: int, dp_size: int, seed: int,
                 *, grad_accumulation: int = 1):
        import torch

        self._init_layout(seq_len, micro_batch, dp_rank, dp_size, grad_accumulation, seed)
        self.batch = torch.from_numpy(synthetic_batch(self.seed, self.dp_rank, self.micro_batch, self.seq_len))
        self.mode = "synthetic"

    def _stream_key(self) -> dict[str, Any]:
        return {"seed": self.seed, "mode": "synthetic", "seq_len": self.seq_len, "dataset": None}

    def next_microbatch(self):
        self._next_indices()
        return self.batch


def build_loader(io_mode: str, prepared_dir: str | os.PathLike | None, *, seq_len: int, micro_batch: int,
                 dp_rank: int, dp_size: int, seed: int, mode: str = "pack", grad_accumulation: int = 1,
                 split: str = "train") -> Loader | SyntheticLoader:
    """'real' and 'io-only' -> Loader over `prepared_dir`/`split` (io-only: the trainer runs
    the loader alone, see measure_io); 'synthetic' -> SyntheticLoader (no data read)."""
    if io_mode not in IO_MODES:
        raise PlanError(f"io_mode must be one of {', '.join(IO_MODES)}, got {io_mode!r}")
    if io_mode == "synthetic":
        return SyntheticLoader(seq_len, micro_batch, dp_rank, dp_size, seed, grad_accumulation=grad_accumulation)
    if prepared_dir is None:
        raise PlanError(f"io_mode {io_mode!r} needs a prepared data directory")
    return Loader(TokenDataset(prepared_dir, split), seq_len, micro_batch, dp_rank, dp_size, seed, mode,
                  grad_accumulation=grad_accumulation)


def measure_io(loader: Loader | SyntheticLoader, steps: int) -> dict[str, float]:
    """Time `steps` calls of `loader.next_microbatch()` (micro-batches: pass optimizer steps x
    grad_accumulation for whole steps) with nothing else running; this rank's rates.
    Advances the loader. tokens = input tokens (seq_len per sample); nonpad_tokens counts the
    non-<pad> ones."""
    calls = check_int("steps", steps, 1)
    samples = nonpad = 0
    t0 = time.perf_counter()
    for _ in range(calls):
        batch = loader.next_microbatch()
        samples += batch.shape[0]
        nonpad += int((batch[:, :-1] != PAD_ID).sum())
    seconds = max(time.perf_counter() - t0, 1e-9)
    tokens = samples * loader.seq_len
    return {"samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds,
            "nonpad_tokens_per_s": nonpad / seconds, "samples": samples, "tokens": tokens,
            "microbatches": calls, "seconds": seconds}


__all__ = ["Loader", "StepCounter", "SyntheticLoader", "TokenDataset", "build_loader", "measure_io", "split_batch"]
