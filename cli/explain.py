"""`exaplan explain`: a readable report of a plan file (its hash checked)."""

from __future__ import annotations

import argparse

from cli.common import add_json_option, console, print_json


def add_parser(sub) -> None:
    x = sub.add_parser("explain", help="readable report of a plan file",
                       description="Check a plan file (schema, consistency, content hash) and print what it says: "
                                   "mesh and rank placement, batch, sharding, pipeline stages, collectives and their "
                                   "environment, the prediction and the command that regenerates it.")
    x.add_argument("plan", help="plan file (YAML or JSON)")
    add_json_option(x, "print the checked plan as JSON")


def run(args: argparse.Namespace) -> int:
    from planner.report import explain_plan
    from planner.schema.plan import load_plan

    plan = load_plan(args.plan)
    if args.json:
        print_json(plan.model_dump(mode="json"))
        return 0
    explain_plan(plan, console())
    return 0
