"""`exaplan run PLAN`: train the protein LM with a plan (the options: runtime/options.py)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from runtime.options import DESCRIPTION, EPILOG, add_run_arguments

    r = sub.add_parser("run", help="train the protein LM with a plan (torch.distributed; `exaplan run --help`)",
                       description=DESCRIPTION, epilog=EPILOG)
    add_run_arguments(r)


def run(args: argparse.Namespace) -> int:
    """Check every option, that torch imports and (on a workstation) that the plan fits this
    machine, before anything is prepared or created (runtime/preflight.py). Under a launcher:
    run as one rank. Otherwise take the --out lock, prepare the data once, and start the
    plan's ranks through torchrun (each runs `runtime.trainer` with the same options).
    --backend jax (or a plan made for it): jaxrt/launch.py, in this process."""
    from runtime import launch, preflight
    from runtime.options import check_run_args

    from cli.common import repredicted_memory_gib

    preflight.check_options(args)
    plan = check_run_args(args)
    memory_gib = repredicted_memory_gib(plan)  # a hand-edited plan that no longer fits: refused here, not OOM later
    if (args.backend or getattr(plan, "backend", None) or "torch") == "jax":
        from jaxrt.launch import start

        return start(args, plan)
    preflight.require_torch()
    if launch.detect() is not None:
        from runtime import trainer

        return trainer.run_rank(args)
    preflight.check_fits_this_machine(plan, memory_gib=memory_gib)
    return launch.start_locally(plan, args, args.argv[args.argv.index("run") + 1:])
