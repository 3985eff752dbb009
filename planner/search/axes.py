"""The legal values of each layout axis on its own: the tensor- and context-parallel degrees,
the pipeline schedules for a number of stages and micro-batches, the data-parallel shardings.

planner.search.space combines them into every legal layout; planner.search.pins checks pinned
values against them.
"""

from __future__ import annotations

from planner.cost.layout import SC_1F1B, SC_GPIPE, SC_INTERLEAVED, SC_NONE, SH_HSDP, SH_NONE, SHARDINGS
from planner.schema.specs import ModelSpec, TrainingJob, divisors

# Virtual stages per rank the unpinned search tries (each doubles the pipeline's transfers and
# halves its bubble; past 8 the published runs gain nothing). A pinned --vpp, and estimate, take
# any count the layers allow (NeMo runs 12 for GPT-3 175B and Nemotron-4 340B).
MAX_VIRTUAL_STAGES = 8


def tp_options(model: ModelSpec, world: int) -> list[int]:
    return [t for t in divisors(world) if model.heads % t == 0 and model.kv_heads % t == 0 and model.ffn_hidden % t == 0]


def cp_options(job: TrainingJob, rest: int) -> list[int]:
    return [c for c in divisors(rest) if c == 1 or job.seq_len % (2 * c) == 0]


def pipeline_options(layers: int, pp: int, gas: int, max_vpp: int = MAX_VIRTUAL_STAGES) -> list[tuple[int, int]]:
    """(schedule code, virtual stages) pairs legal for pp and gas micro-batches, up to max_vpp
    virtual stages per rank (the search's default; `layers` for every count that is legal)."""
    if pp == 1:
        return [(SC_NONE, 1)]
    if gas < pp:
        return []
    out = [(SC_GPIPE, 1), (SC_1F1B, 1)]
    if gas % pp == 0:
        out += [(SC_INTERLEAVED, v) for v in range(2, max_vpp + 1) if pp * v <= layers]
    return out


def sharding_options(dp: int, cp: int) -> list[tuple[int, int, int]]:
    """(sharding code, dp_replicate, dp_shard) for dp data-parallel ranks."""
    if dp * cp == 1:
        return [(SH_NONE, 1, 1)]
    out = [(SH_NONE, dp, 1)]
    out += [(code, 1, dp) for code in range(1, len(SHARDINGS)) if code != SH_HSDP]
    out += [(SH_HSDP, dp // g, g) for g in divisors(dp) if 2 <= g and dp // g >= 2]
    return out
