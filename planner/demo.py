"""`make demo`: plan the protein LM for the five seed systems at the scale of the seed paper.

For each system: search every legal layout for protein-3.5b with the paper's global batch
(8 sequences per rank), print the chosen layout, and compare it with the layout the paper
ran (data parallel + ZeRO-1, micro-batch 8) as the cost model predicts it.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from machine_models import load_machine
from planner.cost.layout import Layouts
from planner.cost.step import evaluate
from planner.inputs import make_job
from planner.presets import get_model
from planner.report import layout_label
from planner.search.search import search
from planner.seed_runs import SEED_RUNS

GIB = 2.0**30


def paper_layout(world: int, mbs: int) -> Layouts:
    """Data parallelism over every rank with ZeRO-1, one micro-batch per step."""
    return Layouts.one(dp=world, mbs=mbs, sharding="zero1")


def main() -> int:
    console = Console(width=160, highlight=False)
    table = Table(title="protein-3.5b on the seed systems (global batch = 8 sequences per rank, seq 512, bf16)", title_justify="left")
    for col in ("system", "nodes", "ranks", "planner's layout", "step", "MFU", "mem GiB", "paper's layout (dp+zero1, mbs 8)", "searched", "time"):
        table.add_column(col, no_wrap=col in ("planner's layout",))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(SEED_RUNS))
        for run in SEED_RUNS:
            progress.update(task, description=f"planning {run.machine}")
            model, machine = get_model(run.model), load_machine(run.machine)
            world = run.nodes * machine.devices_per_node
            job = make_job(model, machine, world, run.micro_batch * world, None, None, None)
            result = search(model, machine, job, run.nodes, top_k=1)
            ev, lay = result.evaluation, result.layouts
            paper = evaluate(model, machine, job, paper_layout(world, run.micro_batch))
            fit = "" if paper.memory.fits[0] else " (does not fit)"
            table.add_row(
                run.machine, f"{run.nodes:,}", f"{world:,}", layout_label(lay, 0), f"{ev.step_time_s[0]:.3f} s",
                f"{ev.mfu[0]:.1%}", f"{ev.memory.total[0] / GIB:.1f}",
                f"{paper.step_time_s[0]:.3f} s, MFU {paper.mfu[0]:.1%}{fit}",
                f"{result.total_layouts:,}", f"{result.seconds:.2f} s",
            )
            progress.advance(task)
    console.print(table)
    console.print("Predictions of the analytical cost model (see `exaplan validate --published` for its error on published runs).")
    console.print("Next: `exaplan plan --model protein-3.5b --machine frontier --nodes 2048 -o plan.yaml` and `exaplan explain plan.yaml`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
