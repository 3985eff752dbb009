"""`make demo`: plan the protein LM for the five seed systems at the scale of the seed paper.

For each system: search every legal layout for the paper's job (protein-3.5b, DPO with the
reference model in the step, 8 pairs x SEED_ACCUMULATION micro-steps per rank) on exaplan's
runtime, print the chosen layout, and predict the layout the paper ran (Megatron-DeepSpeed,
data parallel + ZeRO-1, 8 pairs per micro-step) beside the rate the paper published, counted
as SEED_FLOP_COUNT says (planner/seed_runs.py), with the prediction's interval.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from machine_models import load_framework, load_machine
from machine_models.uncertainty import Uncertainty, uncertainty_of
from planner.cost import flops
from planner.cost.layout import Layouts
from planner.cost.step import Evaluation, evaluate
from planner.inputs import make_job
from planner.presets import get_model
from planner.report import layout_label
from planner.search.search import search
from planner.schema.specs import FrameworkProfile, MachineModel, TrainingJob
from planner.seed_runs import SEED_ACCUMULATION, SEED_FLOP_COUNT, SEED_RUNS, SeedRun

GIB = 2.0**30
COLUMNS = ("system", "nodes", "ranks", "planner's layout (exaplan)", "step", "MFU", "mem GiB",
           f"paper's layout (deepspeed, dp+zero1, 8 pairs x {SEED_ACCUMULATION}): TFLOP/s per rank", "published",
           "searched", "time")


def paper_layout(world: int, mbs: int, gas: int = 1) -> Layouts:
    """Data parallelism over every rank with ZeRO-1, `gas` micro-batches per step."""
    return Layouts.one(dp=world, mbs=mbs, gas=gas, sharding="zero1")


@dataclass(frozen=True)
class PaperPrediction:
    """The paper's layout and step on its machine, predicted with its framework's profile."""

    evaluation: Evaluation
    uncertainty: Uncertainty
    rate: float  # TFLOP/s per rank under SEED_FLOP_COUNT: what the published rate is set against
    rate_with_reference: float  # the same step, the reference model's forward counted too

    @property
    def interval(self) -> tuple[float, float]:
        return self.uncertainty.rate_interval(self.rate)


def paper_job(run: SeedRun, machine: MachineModel, framework: FrameworkProfile | None,
              gas: int = SEED_ACCUMULATION) -> TrainingJob:
    """The paper's job: `micro_batch` pairs per micro-step on every rank, `gas` micro-steps."""
    world = run.nodes * machine.devices_per_node
    return make_job(get_model(run.model), machine, world, run.micro_batch * gas * world, None, None, None,
                    workload=run.workload, framework=framework)


def paper_prediction(run: SeedRun, gas: int = SEED_ACCUMULATION) -> PaperPrediction:
    """The paper's layout and step on its machine, with its framework (planner/seed_runs.py)."""
    model, framework = get_model(run.model), load_framework(run.framework)
    machine = framework.applied_to(load_machine(run.machine))
    world = run.nodes * machine.devices_per_node
    job = paper_job(run, machine, framework, gas)
    ev = evaluate(model, machine, job, paper_layout(world, run.micro_batch, gas))
    per_rank_s = float(ev.step_time_s[0]) * world * 1e12
    counts = flops.step_flops(model, job)
    return PaperPrediction(ev, uncertainty_of(machine, framework), counts[SEED_FLOP_COUNT] / per_rank_s,
                           counts["executed"] / per_rank_s)


def _row(run: SeedRun) -> list[str]:
    model, machine = get_model(run.model), load_machine(run.machine)
    world = run.nodes * machine.devices_per_node
    result = search(model, machine, paper_job(run, machine, None), run.nodes, top_k=1)
    ev, lay = result.evaluation, result.layouts
    paper = paper_prediction(run)
    lo, hi = paper.interval
    label = "" if paper.uncertainty.fitted else " unfitted"
    fit = "" if paper.evaluation.memory.fits[0] else " (does not fit)"
    published = "-" if run.published_tflops_per_rank is None else f"{run.published_tflops_per_rank:g}"
    return [run.machine, f"{run.nodes:,}", f"{world:,}", layout_label(lay, 0), f"{ev.step_time_s[0]:.3f} s",
            f"{ev.mfu[0]:.1%}", f"{ev.memory.total[0] / GIB:.1f}", f"{paper.rate:.0f} ({lo:.0f}-{hi:.0f}){label}{fit}",
            published, f"{result.total_layouts:,}", f"{result.seconds:.2f} s"]


def main() -> int:
    console = Console(width=180, highlight=False)
    per_rank = SEED_RUNS[0].micro_batch * SEED_ACCUMULATION
    table = Table(title=f"protein-3.5b DPO on the seed systems (global batch = {per_rank} pairs per rank, "
                        "reference model in the step, seq 512, bf16)",
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
                  "device kind or framework, a stated +/-30%. Published: MProt-DPO (SC24) Table 3, sustained. The "
                  "paper's rate counts the policy's FLOPs over the whole step (the reference's forward timed, not "
                  "counted); the planner's MFU counts both models' FLOPs.")
    console.print("Next: `exaplan plan --model protein-3.5b --machine frontier --nodes 2048 -o plan.yaml` and "
                  "`exaplan explain plan.yaml`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
