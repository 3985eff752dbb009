"""`make demo`: plan the protein LM for the five seed systems at the scale of the seed paper.

For each system: search every legal layout for protein-3.5b with the paper's global batch
(8 sequences per rank) on exaplan's runtime, print the chosen layout, and predict the layout
the paper ran (Megatron-DeepSpeed, data parallel + ZeRO-1, micro-batch 8, SEED_ACCUMULATION
micro-batches per step) beside the rate the paper published, with the prediction's interval.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from machine_models import load_framework, load_machine
from machine_models.uncertainty import uncertainty_of
from planner.cost.layout import Layouts
from planner.cost.step import evaluate
from planner.inputs import make_job
from planner.presets import get_model
from planner.report import layout_label
from planner.search.search import search
from planner.seed_runs import SEED_ACCUMULATION, SEED_RUNS, SeedRun

GIB = 2.0**30
COLUMNS = ("system", "nodes", "ranks", "planner's layout (exaplan)", "step", "MFU", "mem GiB",
           f"paper's layout (deepspeed, dp+zero1, mbs 8 x {SEED_ACCUMULATION}): TFLOP/s per rank", "published",
           "searched", "time")


def paper_layout(world: int, mbs: int, gas: int = 1) -> Layouts:
    """Data parallelism over every rank with ZeRO-1, `gas` micro-batches per step."""
    return Layouts.one(dp=world, mbs=mbs, gas=gas, sharding="zero1")


def paper_prediction(run: SeedRun, gas: int = SEED_ACCUMULATION):
    """(Evaluation, Uncertainty) of the paper's layout on its machine, with its framework."""
    model, framework = get_model(run.model), load_framework(run.framework)
    machine = framework.applied_to(load_machine(run.machine))
    world = run.nodes * machine.devices_per_node
    job = make_job(model, machine, world, run.micro_batch * gas * world, None, None, None, framework=framework)
    return evaluate(model, machine, job, paper_layout(world, run.micro_batch, gas)), uncertainty_of(machine, framework)


def _row(run: SeedRun) -> list[str]:
    model, machine = get_model(run.model), load_machine(run.machine)
    world = run.nodes * machine.devices_per_node
    job = make_job(model, machine, world, run.micro_batch * world, None, None, None)
    result = search(model, machine, job, run.nodes, top_k=1)
    ev, lay = result.evaluation, result.layouts
    paper, u = paper_prediction(run)
    rate = float(paper.model_tflops_per_device[0])
    lo, hi = u.rate_interval(rate)
    label = "" if u.fitted else " unfitted"
    fit = "" if paper.memory.fits[0] else " (does not fit)"
    published = "-" if run.published_tflops_per_rank is None else f"{run.published_tflops_per_rank:g}"
    return [run.machine, f"{run.nodes:,}", f"{world:,}", layout_label(lay, 0), f"{ev.step_time_s[0]:.3f} s",
            f"{ev.mfu[0]:.1%}", f"{ev.memory.total[0] / GIB:.1f}", f"{rate:.0f} ({lo:.0f}-{hi:.0f}){label}{fit}",
            published, f"{result.total_layouts:,}", f"{result.seconds:.2f} s"]


def main() -> int:
    console = Console(width=180, highlight=False)
    table = Table(title="protein-3.5b on the seed systems (global batch = 8 sequences per rank, seq 512, bf16)",
                  title_justify="left")
    for col in COLUMNS:
        table.add_column(col, no_wrap=col.startswith("planner's"))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(SEED_RUNS))
        for run in SEED_RUNS:
            progress.update(task, description=f"planning {run.machine}")
            table.add_row(*_row(run))
            progress.advance(task)
    console.print(table)
    console.print("Predictions of the analytical cost model, with the interval from the leave-one-out errors of the "
                  "published-run fit (`exaplan validate --published --loo`); 'unfitted': no published rows of that "
                  "device kind or framework, a stated +/-30%. Published: MProt-DPO (SC24) Table 3, sustained.")
    console.print("Next: `exaplan plan --model protein-3.5b --machine frontier --nodes 2048 -o plan.yaml` and "
                  "`exaplan explain plan.yaml`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
