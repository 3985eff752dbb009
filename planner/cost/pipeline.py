"""Pipeline stages as the cost model sees them: which rank is busiest, and with how much.

A pipeline of pp ranks runs S = pp x vpp chunks (virtual stages) of equal blocks, in order;
chunk i sits on rank i % pp (rank r holds chunks r, r + pp, r + 2 pp, ...), and the output
head's cost (`head_weight`, in block units) sits on the last chunk, on rank pp - 1. In the
steady state every micro-batch passes once through each of a rank's chunks, so a rank's work
per micro-batch is the sum of its chunks: the busiest rank sets the pace.

Any contiguous split into S non-empty chunks gives rank r some b_r >= vpp blocks (one per
chunk at least), and any such b_r (summing to the layers) comes from some split. So the best
split for the busiest rank is a min-max split of the layers into pp parts of at least vpp
blocks each, the head on the last part: closed form below (vectorised, for the search), and
`rank_layers` / `interleaved_chunks` for the emitted plan (scalars).
"""

from __future__ import annotations

import numpy as np


def _min_max_parts(layers: int, parts, least, head_weight) -> tuple[np.ndarray, np.ndarray]:
    """Min-max split of `layers` equal blocks into `parts` parts of at least `least` blocks
    each, plus a head of `head_weight` blocks on the last part: (load of the busiest part in
    block units, the most blocks any part holds). The optimum puts k blocks on the last part
    with k + w close to (L - k)/(S - 1); both integer neighbours of that k are tried."""
    S = np.asarray(parts, dtype=np.float64)
    w = np.asarray(head_weight, dtype=np.float64)
    best = np.full(np.broadcast(S, w, least).shape, np.inf)
    blocks = np.zeros_like(best)
    k_star = (layers - w * (S - 1)) / np.maximum(S, 1)
    for k in (np.floor(k_star), np.ceil(k_star)):
        k = np.clip(k, least, layers - least * (S - 1))
        others = np.where(S > 1, np.ceil((layers - k) / np.maximum(S - 1, 1)), 0)
        load = np.maximum(others, k + w)
        better = load < best
        blocks = np.where(better, np.maximum(others, k), blocks)
        best = np.minimum(best, load)
    single = S == 1
    return np.where(single, layers + w, best), np.where(single, layers, blocks)


def bottleneck_chunk(layers: int, chunks, head_weight) -> tuple[np.ndarray, np.ndarray]:
    """Min-max contiguous split of `layers` equal blocks plus a head of `head_weight` blocks
    (on the last chunk) into `chunks` non-empty chunks: (load of the slowest chunk in block
    units, blocks on it)."""
    return _min_max_parts(layers, chunks, 1, head_weight)


def rank_bottleneck(layers: int, pp, vpp, head_weight) -> tuple[np.ndarray, np.ndarray]:
    """The busiest pipeline rank under the best contiguous split into pp x vpp non-empty
    chunks (module docstring): (its load per micro-batch in block units, head included; the
    most blocks any rank holds). With vpp == 1 this is `bottleneck_chunk(layers, pp, w)`."""
    return _min_max_parts(layers, pp, np.asarray(vpp, dtype=np.float64), head_weight)


def chunk_bottleneck(layers: int, pp, vpp, head_weight) -> tuple[np.ndarray, np.ndarray]:
    """`rank_bottleneck` divided by vpp: the busiest rank's mean chunk, which the step model
    (planner.cost.step.unit_costs) multiplies by vpp. Exactly `bottleneck_chunk(layers, pp,
    w)` where vpp == 1."""
    load, blocks = rank_bottleneck(layers, pp, vpp, head_weight)
    return load / vpp, blocks / vpp


def rank_layers(layers: int, pp: int, vpp: int, head_weight: float = 0.0, first_weight: float = 0.0) -> list[int]:
    """Blocks each of the pp ranks holds in a min-max split (each at least vpp; rank 0 also
    carries `first_weight`, rank pp - 1 `head_weight`, in block units). Water-filling: every
    rank starts with vpp blocks and each further block goes where the load it makes is least
    (ties: the lowest rank), which is optimal for equal blocks."""
    if pp < 1 or vpp < 1 or layers < pp * vpp:
        raise ValueError(f"{layers} layers cannot fill {pp} x {vpp} non-empty chunks")
    extra = [0.0] * pp
    extra[0] += first_weight
    extra[-1] += head_weight
    held = [vpp] * pp
    for _ in range(layers - pp * vpp):
        r = min(range(pp), key=lambda i: (held[i] + 1 + extra[i], i))
        held[r] += 1
    return held


def interleaved_chunks(layers: int, pp: int, vpp: int, head_weight: float = 0.0, first_weight: float = 0.0) -> list[int]:
    """Blocks of each of the pp x vpp chunks in pipeline order (chunk i on rank i % pp): each
    rank's `rank_layers` share, cut as evenly as its chunks allow (the earlier chunks take
    the remainder)."""
    held = rank_layers(layers, pp, vpp, head_weight, first_weight)
    sizes = [0] * (pp * vpp)
    for r, b in enumerate(held):
        q, rem = divmod(b, vpp)
        for j in range(vpp):
            sizes[r + j * pp] = q + (1 if j < rem else 0)
    return sizes
