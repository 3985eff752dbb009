"""`exaplan list`: the model and machine presets."""

from __future__ import annotations

import argparse

from cli.common import add_json_option, console, print_json


def add_parser(sub) -> None:
    ls = sub.add_parser("list", help="list model and machine presets",
                        description="The model presets (with their size and shape) and the machine presets.")
    add_json_option(ls, "print the names as JSON")


def run(args: argparse.Namespace) -> int:
    from machine_models import list_machines
    from planner.cost.flops import total_params
    from planner.presets import MODEL_PRESETS

    if args.json:
        print_json(dict(models=list(MODEL_PRESETS), machines=list_machines()))
        return 0
    out = console()
    for name, m in MODEL_PRESETS.items():
        out.print(f"model   {name:15s} {total_params(m) / 1e6:9.1f} M parameters, {m.layers} x {m.hidden}, "
                  f"heads {m.heads}/{m.kv_heads}, seq {m.seq_len}")
    for name in list_machines():
        out.print(f"machine {name}")
    return 0
