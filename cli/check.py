"""`exaplan check`: build ranks of a plan at its full size on this machine, before it is queued."""

from __future__ import annotations

import argparse

from cli.common import add_json_option, console, print_json


def add_parser(sub) -> None:
    x = sub.add_parser(
        "check", help="build ranks of a plan at full size on a fake process group",
        description="For each chosen rank: torch's fake process group of the plan's whole world (no traffic), the "
                    "plan's device mesh, and the model parallelised on the meta device by the runtime's own code, "
                    "in the order `exaplan run` uses. Reports the parameters the rank holds against the planner's "
                    "count. Exit 1 when a rank fails to build or disagrees with the planner, 2 for bad input. "
                    "Not yet: a training step under fake tensors and torch's memory by category.")
    x.add_argument("plan", help="plan file (YAML or JSON)")
    x.add_argument("--ranks", default="first,last",
                   help="comma-separated: first, last, stages (the first rank of each pipeline stage) or rank numbers "
                        "(default first,last)")
    add_json_option(x, "print one JSON object per rank checked, as a list")


def run(args: argparse.Namespace) -> int:
    import contextlib

    from planner.cost.memory import rank_parameters
    from planner.schema.plan import load_plan
    from runtime.check import check_rank, ranks_of

    plan = load_plan(args.plan)
    ranks = ranks_of(plan, args.ranks)
    results, failed = [], []
    out = None if args.json else console()
    for rank in ranks:
        status = contextlib.nullcontext() if out is None else out.status(f"building rank {rank:,} of {plan.world_size:,} ...")
        try:
            with status:
                results.append(check_rank(plan, rank, rank_parameters))
        except Exception as err:  # the runtime's own error, reported for this rank
            failed.append((rank, f"{type(err).__name__}: {err}"))
    if args.json:
        print_json([r.as_json() for r in results] + [{"rank": r, "error": e} for r, e in failed])
    else:
        _table(out, plan, results, failed)
    return 1 if failed or not all(r.agrees for r in results) else 0


def _table(out, plan, results, failed) -> None:
    from rich.table import Table

    table = Table(title=f"{plan.model.name}: {plan.world_size:,} ranks ({plan.nodes:,} x {plan.ranks_per_node}), "
                        f"built on a fake process group")
    for name in ("rank", "pp rank", "parameters held", "planner", "error", "build s", ""):
        table.add_column(name, justify="right" if name not in ("",) else "left")
    for r in results:
        table.add_row(f"{r.rank:,}", str(r.pp_rank), f"{r.parameters:,}", f"{r.predicted_parameters:,}",
                      f"{r.parameter_error:+.1%}", f"{r.seconds:.1f}", "agrees" if r.agrees else "DISAGREES")
    out.print(table)
    for rank, error in failed:
        out.print(f"rank {rank:,} failed to build: {error}")
