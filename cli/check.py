"""`exaplan check`: ranks of a plan at its full size on this machine, before it is queued."""

from __future__ import annotations

import argparse

from cli.common import add_json_option, console, print_json

def add_parser(sub) -> None:
    x = sub.add_parser(
        "check", help="run ranks of a plan at full size on a fake process group: memory and collectives",
        description="For each chosen rank: torch's fake process group of the plan's whole world (no traffic), the "
                    "plan's device mesh, the model parallelised on the meta device by the runtime's own code in the "
                    "order `exaplan run` uses, and two training steps under fake tensors (nothing allocated): "
                    "forward and backward (through the pipeline schedule when pp > 1), clip and AdamW. The second "
                    "step is measured: torch's MemTracker gives the peak memory by category, beside the planner's "
                    "figure for the same rank; every collective is recorded by op, mesh dimension, group size and "
                    "bytes, beside the plan's communicator table. Verdict: torch's peak plus the planner's reserve "
                    "against the device's memory. Exit 1 when a rank fails to build or step, disagrees with the "
                    "planner (parameters beyond 3%, memory beyond 10%) or does not fit where the planner says it "
                    "does; 2 for bad input. DPO plans step as `exaplan run` does, their reference model "
                    "built and run on synthetic pairs. About 5-15 s a rank for the committed plans.")
    x.add_argument("plan", help="plan file (YAML or JSON)")
    x.add_argument("--ranks", default="first,last",
                   help="comma-separated: first, last, stages (the first rank of each pipeline stage) or rank numbers "
                        "(default first,last)")
    x.add_argument("--no-step", action="store_true",
                   help="build the ranks and count their parameters only (no training step, no memory)")
    add_json_option(x, "print one JSON object per rank checked, as a list (rank, torch_peak_memory_gib, "
                       "predicted_memory_gib, predicted_total_gib, the categories of both, collectives, verdicts)")


def run(args: argparse.Namespace) -> int:
    from planner.schema.plan import load_plan

    plan = load_plan(args.plan)
    from runtime.check import ranks_of

    ranks = ranks_of(plan, args.ranks)
    out = None if args.json else console()
    results, failed = check_plan(plan, ranks, step=not args.no_step, out=out)
    if args.json:
        print_json([r.as_json() for r in results] + [{"rank": r, "error": e} for r, e in failed])
    else:
        report(out, plan, results, failed)
    return 0 if passed(results, failed) else 1


def check_plan(plan, ranks: list[int], step: bool = True, out=None):
    """(the RankChecks of `ranks`, [(rank, the runtime's error)] for those that failed to build
    or step); `out`: a console for a progress line."""
    import contextlib

    from planner.cost.memory import rank_parameters
    from planner.cost.rank import rank_memory
    from runtime.check import check_rank

    from runtime.check import torch_runtime_note

    predict, note = rank_memory, torch_runtime_note(plan)
    if note:  # the planner's figures for the same layout run as exaplan's torch runtime runs it
        from machine_models.frameworks import as_exaplan_runtime

        ours = as_exaplan_runtime(plan)
        predict = lambda _plan, pp_rank: rank_memory(ours, pp_rank)  # noqa: E731
    results, failed = [], []
    for i, rank in enumerate(ranks):
        status = contextlib.nullcontext() if out is None else out.status(
            f"rank {rank:,} of {plan.world_size:,} ({i + 1}/{len(ranks)}): building and stepping on a fake group ...")
        try:
            with status:
                results.append(check_rank(plan, rank, rank_parameters, predict if step else None, step=step))
                results[-1].note = results[-1].note or note
        except Exception as err:  # the runtime's own error, reported for this rank
            failed.append((rank, f"{type(err).__name__}: {_first_line(err)}"))
    return results, failed


def passed(results, failed) -> bool:
    return not failed and all(r.passed for r in results)


def _first_line(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text[:400] + (" ..." if len(text) > 400 else "")


def report(out, plan, results, failed) -> None:
    from rich.table import Table

    world = f"{plan.model.name}: {plan.world_size:,} ranks ({plan.nodes:,} x {plan.ranks_per_node}) on a fake process group"
    table = Table(title=world)
    heads = ["rank", "pp", "params held", "planner", "torch peak GiB", "planner GiB", "error", "+ reserve",
             f"of {plan.machine.device_memory_gib:g} GiB", "s", ""]
    for name in heads:
        table.add_column(name, justify="left" if name == "" else "right")
    for r in results:
        gib = (lambda v: "-" if v is None else f"{v:.2f}")
        table.add_row(f"{r.rank:,}", str(r.pp_rank), f"{r.parameters:,}", f"{r.predicted_parameters:,}",
                      gib(r.torch_peak_memory_gib), gib(r.predicted_memory_gib),
                      "-" if r.memory_error is None else f"{r.memory_error:+.1%}",
                      gib(None if r.torch_peak_memory_gib is None else r.torch_peak_memory_gib + r.reserve_gib),
                      "-" if r.fits is None else ("fits" if r.fits else "DOES NOT FIT"), f"{r.seconds:.1f}",
                      r.verdict if r.passed else r.verdict.upper())
    out.print(table)
    stepped = [r for r in results if r.stepped]
    if stepped:
        out.print(_categories(stepped))
        if plan.collectives.communicators or any(r.collectives for r in stepped):
            out.print(_collectives(plan, stepped))
    for note in sorted({r.note for r in results if r.note}):
        out.print(f"note: {note}")
    for rank, error in failed:
        out.print(f"rank {rank:,} failed: {error}")


def _categories(results):
    from rich.table import Table

    from runtime.check import CATEGORIES

    t = Table(title="memory at the step's peak by category, GiB: torch's MemTracker / the planner")
    t.add_column("rank", justify="right")
    for c in CATEGORIES:
        t.add_column(c, justify="right")
    for r in results:
        t.add_row(f"{r.rank:,}", *(f"{r.torch_memory_gib.get(c, 0):.2f} / {r.predicted_gib.get(c, 0):.2f}"
                                   for c in CATEGORIES))
    return t


def _collectives(plan, results):
    from rich.table import Table

    from runtime.check import COMMUNICATOR_OF, communicator_bytes

    t = Table(title="collectives of one step (op x calls, bytes a call): measured / the plan's communicator table")
    for name in ("rank", "communicator", "collectives", "bytes measured", "plan", "error"):
        t.add_column(name, justify="left" if name == "collectives" else "right")
    for r in results:
        for comm, (moved, planned) in communicator_bytes(plan, r).items():
            calls = ", ".join(f"{c.op} {c.count}x{c.bytes / 1e6:.1f} MB" for c in r.collectives
                              if COMMUNICATOR_OF.get(c.mesh_dim, c.mesh_dim) == comm and c.total_bytes >= 1e6)
            error = "-" if not planned else f"{moved / planned - 1:+.1%}"
            t.add_row(f"{r.rank:,}", comm, calls or "-", f"{moved / 1e9:.3f} GB",
                      "-" if planned is None else f"{planned / 1e9:.3f} GB", error)
    return t
