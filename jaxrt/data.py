"""The torch runtime's sample stream as global JAX arrays.

The JAX backend reads the same prepared token shards with the same `runtime.loader.Loader`
(the same shuffle, the same global sample numbers, the same resumable state), but one
process feeds all of its devices: each step is one array of shape (accumulation,
dp x micro-batch, seq + 1) whose rows r x micro-batch ... (r + 1) x micro-batch of micro-batch m
are data-parallel rank r's micro-batch m, exactly what rank r of the torch runtime loads.
Built with `jax.make_array_from_callback`: a process reads only the rows its own devices
hold (each row once, however many tensor-parallel devices share it).
"""

from __future__ import annotations

import jax
import numpy as np

from runtime.loader import Loader, StepCounter, synthetic_batch


class SyntheticCounter(StepCounter):
    """io_mode 'synthetic' without torch: counts samples as runtime.loader.SyntheticLoader
    does (its batches come from `synthetic_batch`, the same function)."""

    def __init__(self, seq_len: int, micro_batch: int, dp_size: int, seed: int, *, grad_accumulation: int = 1):
        self._init_layout(seq_len, micro_batch, 0, dp_size, grad_accumulation, seed)

    def _stream_key(self) -> dict:
        return {"seed": self.seed, "mode": "synthetic", "seq_len": self.seq_len, "dataset": None}


class GlobalBatches:
    """Step after step of `loader`'s samples as sharded arrays (`next()`), or with
    `synthetic`, every data-parallel rank's fixed synthetic batch (runtime.loader)."""

    def __init__(self, loader: Loader | StepCounter, sharding, *, synthetic: bool = False):
        self.loader, self.sharding, self.synthetic = loader, sharding, synthetic
        self.seen: list[int] = []  # global sample numbers of the last step (this process's rows)
        self._fixed = None

    @property
    def shape(self) -> tuple[int, int, int]:
        ld = self.loader
        return ld.grad_accumulation, ld.dp_size * ld.micro_batch, ld.seq_len + 1

    def next(self) -> jax.Array:
        if self.synthetic:
            self.loader.take_step()  # count the samples as the torch runtime does
            if self._fixed is None:
                self._fixed = self._array(self._synthetic_rows)
            return self._fixed
        idx = self.loader.take_step().reshape(self.shape[0], -1)  # (accumulation, dp x micro-batch)
        cache: dict[int, np.ndarray] = {}
        self.seen = []

        def rows(m: slice, r: slice) -> np.ndarray:
            out = []
            for g in idx[m, r].reshape(-1):
                g = int(g)
                if g not in cache:
                    cache[g] = self.loader.sample(g)
                    self.seen.append(g)
                out.append(cache[g])
            return np.stack(out).reshape(*idx[m, r].shape, -1)

        return self._array(rows)

    def _synthetic_rows(self, m: slice, r: slice) -> np.ndarray:
        ld = self.loader
        ranks = [synthetic_batch(ld.seed, rank, ld.micro_batch, ld.seq_len) for rank in range(ld.dp_size)]
        step = np.stack([np.concatenate(ranks)] * ld.grad_accumulation)
        return step[m, r]

    def _array(self, rows) -> jax.Array:
        def callback(index):
            m, r, cols = (index + (slice(None),) * 3)[:3]
            return rows(m, r)[..., cols].astype(np.int32)

        return jax.make_array_from_callback(self.shape, self.sharding, callback)
