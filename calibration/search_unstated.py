"""Published rows whose layout is only partly published, validated by searching the rest:
every layout field the source gives is pinned (planner/search/pins.py), the fields the record
had to choose (`assumed`) are left to the search, and the best layout's prediction is compared
with the published figure. A row whose chosen fields were far from what its framework would
run shows it here: its error moves when the search may choose them."""

from __future__ import annotations

from dataclasses import dataclass

from calibration.published import PublishedRun
from planner.schema.specs import MachineModel
from planner.search.pins import Pins

# Layout fields a record may have had to choose, and the pin each one leaves free.
SEARCHABLE = {"layout.micro_batch": "mbs", "layout.recompute": "recompute", "layout.sequence_parallel": "sp",
              "layout.vpp": "vpp"}


@dataclass
class SearchedRow:
    id: str
    free: list[str]  # the pins left to the search
    layout: str | None  # the best layout found (None: nothing legal fits)
    predicted: float | None
    error: float | None


def stated_pins(run: PublishedRun) -> Pins | None:
    """The run's layout as pins, less the fields it had to choose (None: nothing to search)."""
    free = {SEARCHABLE[a] for a in run.assumed if a in SEARCHABLE}
    if not free:
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
    free = sorted(SEARCHABLE[a] for a in run.assumed if a in SEARCHABLE)
    nodes = run.gpus // machine.devices_per_node
    try:
        result = search(run.model, machine, run.job(), nodes, top_k=1, pins=pins)
    except PlanError:
        return SearchedRow(run.id, free, None, None, None)
    from planner.report import layout_label

    predicted = float(run.figure_from_step_time(result.evaluation.step_time_s[0], machine))
    return SearchedRow(run.id, free, layout_label(result.layouts, 0), predicted, predicted / run.figure - 1.0)
