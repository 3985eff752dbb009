"""`exaplan capacity`: a thin alias of `exaplan whatif` for one machine (the old options,
defaults and output): time to train against node count; the fewest nodes that meet a deadline."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from cli.common import (MACHINE_HELP, MODEL_HELP, add_json_option, add_set_option, add_workload_options, command_line,
                        console, print_json)
from planner.schema.errors import PlanError


def add_parser(sub) -> None:
    c = sub.add_parser("capacity", help="alias of whatif for one machine: time-to-train against node count",
                       description="An alias of `exaplan whatif` for one machine, with capacity's old defaults: 8 "
                                   "sequences per rank (weak scaling, as in the seed runs; dpo: 4 pairs) unless "
                                   "--global-batch, and powers of two up to the machine's size. `exaplan whatif` "
                                   "compares machines at one global batch, with node-hours, energy and intervals.")
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
    from machine_models import load_framework, load_machine
    from machine_models.uncertainty import uncertainty_of
    from planner.capacity import rows_from_points, smallest_meeting
    from planner.whatif import run_whatif

    machine = load_machine(args.machine)
    counts = node_counts(args.nodes, machine)
    per_rank = None if args.global_batch is not None else (4 if args.workload == "dpo" else 8)
    result = run_whatif(model=args.model, machine=args.machine, nodes=counts, tokens=args.tokens,
                        deadline_days=args.deadline_days, global_batch=args.global_batch, batch_per_rank=per_rank,
                        framework=args.framework, workload=args.workload, reference=args.reference,
                        seq_len=args.seq_len, precision=args.precision, overrides=args.overrides,
                        command=command_line(), workers=1, compiled=args.compile)
    rows = rows_from_points(sorted(result.points, key=lambda p: counts.index(p.nodes)), args.workload)
    best = smallest_meeting(rows, args.deadline_days) if args.deadline_days else None
    u = uncertainty_of(machine, load_framework(args.framework, compiled=args.compile))
    if args.json:
        print_json(dict(rows=[_row_json(r, u) for r in rows], deadline_days=args.deadline_days,
                        fewest_nodes=best.nodes if best else None, uncertainty=u.as_json()))
        return 0
    _print(args, result, rows, best, u)
    return 0


def _row_json(r, u) -> dict:
    out = asdict(r)
    if r.days is not None:
        out["intervals"] = {"step_time_s": u.time_interval(r.step_time_s), "days": u.time_interval(r.days),
                            "tokens_per_s": u.rate_interval(r.tokens_per_s), "mfu": u.rate_interval(r.mfu)}
    return out


def _print(args, result, rows, best, u) -> None:
    from planner.report import capacity_table, uncertainty_line

    out = console()
    p = result.points[0]
    out.print(capacity_table(rows, p.model, p.machine, args.tokens, best, u))
    out.print(uncertainty_line(u))
    if args.deadline_days:
        if best:
            out.print(f"fewest nodes that train {args.tokens:.3g} tokens within {args.deadline_days:g} days: "
                      f"[b]{best.nodes}[/b] ({best.days:.2f} days, {best.layout})")
        else:
            out.print(f"no node count tried meets {args.deadline_days:g} days")
    out.print("[dim]capacity is an alias of `exaplan whatif` (more machines, node-hours, energy, --vary)[/dim]")
