"""`exaplan capacity`: time to train against node count; the fewest nodes that meet a deadline."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from cli.common import (MACHINE_HELP, MODEL_HELP, add_json_option, add_set_option, add_workload_options, console,
                        job_for, load_specs, print_json)
from planner.schema.errors import PlanError


def add_parser(sub) -> None:
    c = sub.add_parser("capacity", help="time-to-train against node count; the fewest nodes that meet a deadline",
                       description="Search the best layout at each node count and report tokens/s and days to train "
                                   "the token budget; with --deadline-days, the fewest nodes that meet it.")
    c.add_argument("--model", required=True, help=MODEL_HELP)
    c.add_argument("--machine", required=True, help=MACHINE_HELP)
    c.add_argument("--tokens", type=float, required=True, help="tokens to train on")
    c.add_argument("--deadline-days", type=float, help="report the fewest nodes that finish within this many days")
    c.add_argument("--nodes", help="comma-separated node counts (default: powers of two up to the machine's size)")
    c.add_argument("--global-batch", type=int, help="hold this global batch at every size (default: 8 sequences per "
                                                      "rank, i.e. weak scaling as in the seed runs; dpo: 4 pairs)")
    c.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    c.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    add_workload_options(c)
    add_set_option(c)
    add_json_option(c)


def node_counts(text: str | None, machine) -> list[int]:
    """--nodes as a list (default: powers of two up to the machine's size)."""
    from planner.capacity import default_node_counts

    if not text:
        return default_node_counts(machine)
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"expected comma-separated integers, got {text!r}", field="nodes") from None
    bad = [n for n in counts if n <= 0 or n > machine.nodes]
    if not counts or bad:
        raise PlanError(f"node counts must be between 1 and {machine.nodes} ({machine.name}); got {bad or 'none'}",
                        field="nodes")
    return counts


def run(args: argparse.Namespace) -> int:
    from machine_models import load_framework
    from machine_models.uncertainty import uncertainty_of
    from planner.capacity import smallest_meeting, sweep

    if args.tokens <= 0:
        raise PlanError("must be positive", field="tokens")
    if args.deadline_days is not None and args.deadline_days <= 0:
        raise PlanError("must be positive", field="deadline-days")
    model, machine = load_specs(args)
    counts = node_counts(args.nodes, machine)

    def make_job(world: int):
        return job_for(args, model, machine, world, token_budget=args.tokens)

    if args.json:
        rows = sweep(model, machine, make_job, counts)
    else:
        rows = _sweep_with_progress(model, machine, make_job, counts)
    best = smallest_meeting(rows, args.deadline_days) if args.deadline_days else None
    u = uncertainty_of(machine, load_framework(args.framework))
    if args.json:
        print_json(dict(rows=[_row_json(r, u) for r in rows], deadline_days=args.deadline_days,
                        fewest_nodes=best.nodes if best else None, uncertainty=u.as_json()))
        return 0
    _print(args, model, machine, rows, best, u)
    return 0


def _row_json(r, u) -> dict:
    out = asdict(r)
    if r.days is not None:
        out["intervals"] = {"step_time_s": u.time_interval(r.step_time_s), "days": u.time_interval(r.days),
                            "tokens_per_s": u.rate_interval(r.tokens_per_s), "mfu": u.rate_interval(r.mfu)}
    return out


def _sweep_with_progress(model, machine, make_job, counts):
    from rich.progress import Progress

    from planner.capacity import sweep

    rows = []
    with Progress(console=console(), transient=True) as progress:
        task = progress.add_task("searching", total=len(counts))
        for n in counts:
            progress.update(task, description=f"searching {n} nodes")
            rows += sweep(model, machine, make_job, [n])
            progress.advance(task)
    return rows


def _print(args, model, machine, rows, best, u) -> None:
    from planner.report import capacity_table, uncertainty_line

    out = console()
    out.print(capacity_table(rows, model.name, machine.name, args.tokens, best, u))
    out.print(uncertainty_line(u))
    if args.deadline_days:
        if best:
            out.print(f"fewest nodes that train {args.tokens:.3g} tokens within {args.deadline_days:g} days: "
                      f"[b]{best.nodes}[/b] ({best.days:.2f} days, {best.layout})")
        else:
            out.print(f"no node count tried meets {args.deadline_days:g} days")
