"""`exaplan run PLAN`: train the protein LM with a plan (the options: runtime/options.py)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from runtime.options import DESCRIPTION, EPILOG, add_run_arguments

    r = sub.add_parser("run", help="train the protein LM with a plan (torch.distributed; `exaplan run --help`)",
                       description=DESCRIPTION, epilog=EPILOG)
    add_run_arguments(r)


def run(args: argparse.Namespace) -> int:
    """Under a launcher: run as one rank. Otherwise check what can be checked, prepare the
    data once, and start the plan's ranks through torchrun (each runs `runtime.trainer`
    with the same options)."""
    from runtime import launch
    from runtime.options import check_before_launch, check_run_args

    plan = check_run_args(args)
    if launch.detect() is not None:
        from runtime import trainer

        return trainer.run_rank(args)
    check_before_launch(args, plan)
    return launch.spawn_local(plan, args.argv[args.argv.index("run") + 1:], out=args.out)
