"""Published rows whose layout is only partly published, validated by searching the rest:
every layout field the source gives is pinned (planner/search/pins.py), the fields the record
had to choose (`assumed`) are left to the search, and the best layout's prediction is compared
with the published figure. A row whose chosen fields were far from what its framework would
run shows it here: its error moves when the search may choose them."""

from __future__ import annotations

from dataclasses import dataclass

from calibration.published import PublishedRun
from planner.schema.specs import MachineModel, Precision
from planner.search.pins import Pins

# Layout fields a record may have had to choose, and the pin each one leaves free.
SEARCHABLE = {"layout.micro_batch": "mbs", "layout.recompute": "recompute", "layout.sequence_parallel": "sp",
              "layout.vpp": "vpp"}
# An unstated 16-bit training precision is searched as both 16-bit formats: they run at one peak
# but a framework may reduce their gradients in different dtypes (Megatron: fp32 under --bf16,
# fp16 under --fp16; machine_models/frameworks.yaml).
SIXTEEN_BIT = (Precision.bf16, Precision.fp16)


@dataclass
class SearchedRow:
    id: str
    free: list[str]  # the pins left to the search
    layout: str | None  # the best layout found (None: nothing legal fits)
    predicted: float | None
    error: float | None


def precisions(run: PublishedRun) -> list[Precision]:
    """The training precisions the search tries for the run: the recorded one, then the other
    16-bit one where the record had to choose a 16-bit precision."""
    if "precision" in run.assumed and run.precision in SIXTEEN_BIT:
        return [run.precision] + [p for p in SIXTEEN_BIT if p != run.precision]
    return [run.precision]


def stated_pins(run: PublishedRun) -> Pins | None:
    """The run's layout as pins, less the fields it had to choose (None: nothing to search)."""
    free = {SEARCHABLE[a] for a in run.assumed if a in SEARCHABLE}
    if not free and len(precisions(run)) == 1:
        return None
    lay = run.layout
    pins = dict(tp=lay.tp, pp=lay.pp, dp=lay.dp, cp=lay.cp, mbs=lay.micro_batch, shard=lay.sharding,
                shard_group=lay.shard_group, vpp=lay.vpp if lay.pp > 1 else None, recompute=lay.recompute,
                sp=lay.sequence_parallel if lay.tp > 1 else None)
    return Pins(**{k: (None if k in free else v) for k, v in pins.items()})


def search_unstated(run: PublishedRun, machine: MachineModel) -> SearchedRow | None:
    """The best layout that keeps every published field, predicted in the run's unit."""
    from planner.schema.errors import PlanError
    from planner.search.search import search

    pins = stated_pins(run)
    if pins is None:
        return None
    tried = precisions(run)
    free = sorted(SEARCHABLE[a] for a in run.assumed if a in SEARCHABLE) + (["precision"] if len(tried) > 1 else [])
    nodes = run.gpus // machine.devices_per_node
    best = None  # (step time, precision, result)
    for precision in tried:
        job = run.model_copy(update={"precision": precision}).job()
        try:
            result = search(run.model, machine, job, nodes, top_k=1, pins=pins)
        except PlanError:
            continue
        if best is None or result.evaluation.step_time_s[0] < best[0]:
            best = (float(result.evaluation.step_time_s[0]), precision, result)
    if best is None:
        return SearchedRow(run.id, free, None, None, None)
    from planner.report import layout_label

    step, precision, result = best
    label = layout_label(result.layouts, 0) + (f" | {precision.value}" if len(tried) > 1 else "")
    predicted = float(run.model_copy(update={"precision": precision}).figure_from_step_time(step, machine))
    return SearchedRow(run.id, free, label, predicted, predicted / run.figure - 1.0)
