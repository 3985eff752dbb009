"""`exaplan schema`: the JSON schema of the specs and the plan file."""

from __future__ import annotations

import argparse

from cli.common import print_json


def add_parser(sub) -> None:
    s = sub.add_parser("schema", help="print the JSON schema of the specs and the plan",
                       description="Print the JSON schema (always JSON) of the model, machine and job specs and of "
                                   "the plan file, with a description of every field.")
    s.add_argument("which", nargs="?", choices=["model", "machine", "job", "plan", "all"], default="all")


def run(args: argparse.Namespace) -> int:
    from planner.schema.plan import Plan
    from planner.schema.specs import MachineModel, ModelSpec, TrainingJob

    classes = {"model": ModelSpec, "machine": MachineModel, "job": TrainingJob, "plan": Plan}
    chosen = classes if args.which == "all" else {args.which: classes[args.which]}
    out = {k: c.model_json_schema() for k, c in chosen.items()}
    print_json(out if args.which == "all" else out[args.which])
    return 0
