"""`exaplan export PLAN --to TARGET -o DIR`: the plan in a framework's own terms (Megatron-LM,
Megatron-DeepSpeed, DeepSpeed, torchtitan, MaxText). The work is in export/."""

from __future__ import annotations

import argparse

from cli.common import add_force_option
from planner.schema.errors import PlanError

EPILOG = """examples:
  exaplan plan --model protein-3.5b --machine aurora --nodes 3200 --framework deepspeed --workload dpo \\
      --global-batch 2457600 -o aurora-dpo.yaml
  exaplan export aurora-dpo.yaml --to megatron-deepspeed -o export/aurora
  exaplan export plan.yaml --to torchtitan -o export/titan --check     (checked by torchtitan's own config code)
  exaplan plan --model protein-7b --machine dgx-h100 --nodes 16 --framework megatron --export export/megatron

targets (docs/frameworks/):
  megatron            Megatron-LM / Megatron-Core training arguments: args.txt and args.sh (a bash array)
  megatron-deepspeed  Megatron-DeepSpeed's arguments and its ds_config.json
  deepspeed           ds_config.json for your own model under deepspeed.initialize
  torchtitan          torchtitan 0.3.0 command-line overrides (--section.field value)
  maxtext             MaxText key=value overrides of configs/base.yml (YAML)
"""


def add_parser(sub) -> None:
    from export.targets import TARGETS

    p = sub.add_parser("export", help="write a plan as a framework's own config (Megatron, DeepSpeed, torchtitan, MaxText)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Write what a training framework reads from a plan: every layout decision under the "
                                   "framework's own names, the model's shape, the batch split and the collective "
                                   "library's environment (env.sh). What the framework cannot express (a schedule, "
                                   "sharding or recompute it lacks) is refused naming the plan's field, exit 2.")
    p.add_argument("plan", help="plan file (`exaplan plan ... -o plan.yaml`)")
    p.add_argument("--to", required=True, metavar="TARGET", help=f"the framework: {', '.join(TARGETS)}")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="folder to write: new, empty, or with --force an earlier export of the same target (replaced)")
    p.add_argument("--check", action="store_true",
                   help="then validate the files with the framework's own config code (needs it installed: "
                        "pip install -e '.[frameworks]'; docs/frameworks/ say what each check covers)")
    add_force_option(p, "an earlier export of the same target in DIR")


def run(args: argparse.Namespace) -> int:
    from planner.schema.plan import load_plan

    plan = load_plan(args.plan)
    write(plan, args.to, args.output, args.plan, check=args.check, force=args.force)
    return 0


def write(plan, target: str, output: str, plan_path: str | None, check: bool = False, force: bool = False) -> None:
    """Export, optionally check, then write (a failed check writes nothing) and report."""
    from export import export_plan, write_export

    exported = export_plan(plan, target)
    from export.base import check_folder

    check_folder(exported, output, force)  # before the framework's own check, which takes a while
    if check:
        from export.check import check_export

        derived = check_export(exported, plan)
        if derived != exported.derived:
            raise PlanError(f"{target} derives {derived} from the files, the plan says {exported.derived}", field="to")
    paths = write_export(exported, output, plan_path, force)
    d = exported.derived
    print(f"wrote {len(paths)} files to {output} for {target}: tp {d.tp}, pp {d.pp}"
          + (f" x {d.vpp} virtual" if d.vpp > 1 else "") + f", cp {d.cp}, dp {d.dp}; micro-batch {d.micro_batch} x "
          f"{d.accumulation} accumulation x dp = global batch {d.global_batch}" + ("; checked by its own code" if check else ""))
    for note in exported.notes:
        print(f"note: {note}")
