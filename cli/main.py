"""`exaplan`: the parser of every subcommand and the dispatch to it.

Bad input: one message naming the field or the reason on stderr, exit code 2, nothing
written (every subcommand raises PlanError for it; argparse's own usage errors exit 2 too).
"""

from __future__ import annotations

import argparse
import sys

from cli import calibrate, capacity, check, data, estimate, explain, export, launch, machine, plan, presets, run, schema, validate, whatif
from planner.schema.errors import PlanError

# In the order `exaplan --help` lists them.
SUBCOMMANDS = {"plan": plan, "estimate": estimate, "explain": explain, "schema": schema, "validate": validate,
               "calibrate": calibrate, "whatif": whatif, "capacity": capacity, "run": run, "check": check, "export": export, "launch": launch, "data": data, "list": presets,
               "machine": machine}

EPILOG = """examples:
  exaplan plan --model protein-3.5b --machine aurora --nodes 3200
  exaplan plan --model protein-70b --machine frontier --nodes 64 --global-batch 512 --top 10 -o plan.yaml
  exaplan plan --model protein-7b --machine dgx-h100 --nodes 16 --set machine.nic_gbit_s=800   # what if NICs were 2x?
  exaplan estimate --model protein-3.5b --machine frontier --nodes 8 --tp 1 --pp 1 --dp 64 --mbs 8 \\
      --global-batch 512 --shard zero1 --recompute none
  exaplan explain plan.yaml
  exaplan whatif --model protein-3.5b --machine aurora,frontier --nodes 16:2048 --tokens 1e12 --deadline-days 7
  exaplan run plan.yaml --steps 200 --out runs/small          (exaplan run --help)
  exaplan export plan.yaml --to megatron -o export/megatron   (exaplan export --help)
  exaplan data prepare uniprot.fasta.gz -o data/uniprot       (exaplan data --help)
  exaplan validate --published
  exaplan schema plan
"""


def build_parser() -> argparse.ArgumentParser:
    from planner import __version__

    ap = argparse.ArgumentParser(
        prog="exaplan", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Config compiler for large-scale training of protein language models: searches every legal "
                    "parallel layout (data, tensor+sequence, pipeline, context, ZeRO/FSDP/HSDP sharding, "
                    "micro-batching, recompute, collective algorithms) with an analytical cost model and writes a "
                    "plan file; runs plans with torch.distributed; calibrates and validates its predictions.")
    ap.add_argument("--version", action="version", version=f"exaplan {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return ap


def _lone_double_dash(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The flag given `--X=--`, if any. argparse (3.11, 3.12) drops that `--` as the end of
    options and hands a one-value option an empty list instead of a string."""
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    for action in sub._actions:
        if not action.option_strings or action.nargs is not None:
            continue
        value = getattr(args, action.dest, None)
        if isinstance(action, argparse._AppendAction):
            if isinstance(value, list) and [] in value:
                return action.option_strings[-1]
        elif value == [] and action.default != []:
            return action.option_strings[-1]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    flag = _lone_double_dash(ap, args)
    if flag:
        print(f"exaplan {args.command}: error: {flag}: give it a value ('--' alone ends the options)", file=sys.stderr)
        return 2
    args.argv = argv  # `run` hands its own arguments on to the ranks it starts
    try:
        return SUBCOMMANDS[args.command].run(args)
    except PlanError as e:
        print(f"exaplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
