"""DPO's data: the preference pairs of an `exaplan data pairs` directory read and tokenised
(`PairSet`: chosen and rejected sequences framed as in pretraining, <pad>-filled), and this
data-parallel rank's micro-batches of pairs (`PairLoader`, resumable like runtime.loader.Loader).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from planner.schema.errors import PlanError
from planner.schema.vocab import PAD_ID
from runtime.dataprep.fasta import encode
from runtime.loader import StepCounter


def read_pairs(dir: str | os.PathLike, split: str) -> list[tuple[str, str]]:
    """(chosen, rejected) residue strings of one split of an `exaplan data pairs` directory."""
    from runtime.dataprep.pairs import read_pairs as read_split

    return [(p.chosen, p.rejected) for p in read_split(dir, split)]


@dataclass
class PairSet:
    """One split's pairs as tokens: uint8 [n, 2 (chosen, rejected), seq_len + 1], <pad>-filled."""

    tokens: np.ndarray
    seq_len: int
    fingerprint: str

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, idx) -> torch.Tensor:
        """LongTensor [2 len(idx), seq_len + 1]: the chosen sequences of the pairs, then their rejected."""
        rows = self.tokens[np.asarray(idx)]
        return torch.from_numpy(np.concatenate([rows[:, 0], rows[:, 1]]).astype(np.int64))


def encode_pairs(pairs: list[tuple[str, str]], seq_len: int, where: str = "pairs") -> PairSet:
    """Tokenise pairs for a plan of sequence length `seq_len`; PlanError (naming the pair) for a
    sequence longer than seq_len - 1 residues or outside the alphabet."""
    out = np.full((len(pairs), 2, seq_len + 1), PAD_ID, dtype=np.uint8)
    for i, pair in enumerate(pairs):
        for j, seq in enumerate(pair):
            try:
                toks = encode(seq)
            except PlanError as e:
                raise PlanError(f"{where}, pair {i + 1}: {e}", field="--pairs") from None
            if len(toks) > seq_len + 1:
                which = ("chosen", "rejected")[j]
                raise PlanError(f"{where}, pair {i + 1}: the {which} sequence has {len(toks) - 2} residues; the plan's "
                                f"seq_len {seq_len} holds at most {seq_len - 1} (<bos> residues <eos>)", field="--pairs")
            out[i, j, :len(toks)] = toks
    digest = hashlib.sha256(out.tobytes() + str(seq_len).encode()).hexdigest()[:16]
    return PairSet(out, seq_len, digest)


def load_pair_sets(dir: str | os.PathLike, seq_len: int) -> tuple[PairSet, PairSet]:
    """(train, validation) of a pairs directory, tokenised; PlanError for bad input."""
    train = encode_pairs(read_pairs(dir, "train"), seq_len, f"{dir}/train")
    if len(train) == 0:
        raise PlanError(f"{dir}: the train split holds no pairs", field="--pairs")
    return train, encode_pairs(read_pairs(dir, "validation"), seq_len, f"{dir}/validation")


class PairLoader(StepCounter):
    """This data-parallel rank's micro-batches of pairs, resumable like runtime.loader.Loader
    (the same global-sample bookkeeping: one global stream of pairs, each epoch its own
    deterministic shuffle, rank r takes the r-th slice of every global batch).

    next_microbatch() -> (LongTensor [2 mbs, seq_len + 1], pair indices [mbs])."""

    def __init__(self, pairs: PairSet, micro_batch: int, dp_rank: int, dp_size: int, seed: int,
                 grad_accumulation: int = 1):
        self._init_layout(pairs.seq_len, micro_batch, dp_rank, dp_size, grad_accumulation, seed)
        self.pairs = pairs
        self._orders: dict[int, np.ndarray] = {}

    def _stream_key(self) -> dict[str, Any]:
        return {"seed": self.seed, "mode": "pairs", "seq_len": self.seq_len, "dataset": self.pairs.fingerprint}

    def pair_indices(self, samples: np.ndarray) -> np.ndarray:
        n = len(self.pairs)
        out = np.empty(len(samples), dtype=np.int64)
        for k, g in enumerate(samples):
            e, j = divmod(int(g), n)
            if e not in self._orders:
                rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, e, 17])))
                self._orders = {e: rng.permutation(n)}  # one epoch at a time (a step spans at most two)
            out[k] = self._orders[e][j]
        return out

    def next_microbatch(self) -> tuple[torch.Tensor, np.ndarray]:
        idx = self.pair_indices(self._next_indices())
        return self.pairs.batch(idx), idx
