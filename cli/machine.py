"""`exaplan machine`: a complete, commented machine file from a preset (`show`), from a preset
with your changes (`new --like NAME --set FIELD=VALUE -o FILE`), or from what a node of the new
cluster tells about itself (`detect -o FILE`). The work is in machine_models/describe.py and
machine_models/detect.py."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from cli.common import MACHINE_HELP, add_force_option

WHAT = "the machine file"

EPILOG = """examples:
  exaplan machine show dgx-h100                     # every field of the preset, commented
  exaplan machine new --like dgx-h100 --set devices_per_node=4 --set nics_per_node=4 \\
      --set nic_gbit_s=200 -o my-cluster.yaml
  exaplan plan --model protein-7b --machine my-cluster.yaml --nodes 32
  exaplan machine detect -o my-cluster.yaml         # on a node of the new cluster, inside a job
"""
SHOW_EPILOG = """examples:
  exaplan machine show dgx-h100                     # the preset, complete
  exaplan machine show frontier > frontier-full.yaml
  exaplan machine show my-cluster.yaml              # a file of your own, completed from its device kind
  exaplan machine show local                        # this computer, as `--machine local` sees it
"""
NEW_EPILOG = """examples:
  exaplan machine new --like dgx-h100 --set devices_per_node=4 --set nics_per_node=4 \\
      --set nic_gbit_s=200 -o my-cluster.yaml       # 4 x H100 80GB, 4 x 200 Gb/s InfiniBand
  exaplan machine new --like dgx-h100 --set nodes=32 --set launch.default_scheduler=torchrun \\
      --set launch.account_required=true --name my-h100 -o my-h100.yaml
  exaplan machine new --like frontier --set launch.env.NCCL_NET_GDR_LEVEL=3 -o frontier-gdr.yaml
  exaplan machine new --like dgx-a100-80gb --set peak_tflops.bf16=280 --set overlap.dp=0.6 -o mine.yaml

Each figure you set is marked in the file: `devices_per_node: 4  # set by you (was 8, dgx-h100)`.
Where devices_per_node changes, launch.ranks_per_node (and gpus_per_node, where it was one per
device) follow it unless you set them.
"""
DETECT_EPILOG = """examples:
  srun -N 1 --gpus-per-node=4 exaplan machine detect -o my-cluster.yaml
  exaplan machine detect -o my-cluster.yaml --like dgx-h100 --force
  exaplan machine detect -o here.yaml               # no GPU: a CPU machine like `local`

What it reads: nvidia-smi (GPU name, memory; `topo -m`: NVLinks), rocm-smi, xpu-smi; lscpu -J
(sockets, cores, NUMA); /sys/class/infiniband/*/ports/*/rate (or ibv_devinfo -v) and
/sys/class/net/*/speed; SLURM_JOB_ID / PBS_JOBID. What it cannot measure (latencies, the
efficiencies, the peaks) comes from --like (default: the preset of the same device kind) and is
marked `# unknown: measure with exaplan calibrate --arrival`; what no node can see (the fabric,
the node count) is marked `set it for your cluster`. What it could not find is said on stderr.
Inside a job, hold the whole node: nvidia-smi lists only the GPUs the job was given.
"""


def add_parser(sub) -> None:
    m = sub.add_parser("machine", help="write a complete machine file: a preset's (show), a preset with your "
                                       "changes (new), or this node's (detect)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Describe a machine in one command: every MachineModel field written out with "
                                   "a comment from its description, the device kind's figures included, so the "
                                   "file stands alone and `--machine FILE` reads it back as the same machine.")
    actions = m.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = actions.add_parser("show", help="print a preset (or a machine file) as a complete, commented file",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SHOW_EPILOG,
                           description="Print every field of a machine, with its launch: and power: sections, each "
                                       "under a line of its description; figures the device kind gives are written "
                                       "out and marked. The output loads back as the same machine.")
    s.add_argument("machine", help=MACHINE_HELP)
    n = actions.add_parser("new", help="write a machine file like a preset, with --set changes marked",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=NEW_EPILOG,
                           description="Write a complete machine file like the preset --like, with each --set "
                                       "FIELD=VALUE applied (any field, by dotted path, the launch: section "
                                       "included) and marked; validated before it is written.")
    n.add_argument("--like", required=True, metavar="NAME", help=f"the machine to start from: {MACHINE_HELP}")
    n.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a field by its dotted path, repeatable: devices_per_node=4, nic_gbit_s=200, "
                        "peak_tflops.bf16=900, launch.default_scheduler=slurm, launch.env.NCCL_IB_TIMEOUT=22 "
                        "(the value is read as YAML: numbers, true/false, [a, b]); `exaplan schema machine` "
                        "lists the fields")
    n.add_argument("--name", help="the machine's name (default: the output file's name without .yaml)")
    _add_output(n)
    d = actions.add_parser("detect", help="write this node's machine file: GPUs, CPUs, NICs and scheduler detected",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=DETECT_EPILOG,
                           description="Run on a node of a new cluster: read the GPUs (kind, count, memory, links), "
                                       "CPUs, NICs and their speed and the scheduler, and write a complete machine "
                                       "file with them, the rest from --like, every figure not measured marked.")
    d.add_argument("--like", metavar="NAME", help="the machine the figures not detected come from (default: the "
                                                  "preset of the detected device kind; `local` without a GPU)")
    d.add_argument("--name", help="the machine's name (default: the output file's name without .yaml)")
    _add_output(d)


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the machine file to write")
    add_force_option(p, WHAT)


def run(args: argparse.Namespace) -> int:
    if args.action == "show":
        from machine_models.describe import show_text

        sys.stdout.write(show_text(args.machine))
        return 0
    from planner.schema.files import check_target, write_new

    check_target(args.output, WHAT, args.force)  # before any work: a refusal costs nothing
    made = _new(args) if args.action == "new" else _detect(args)
    write_new(args.output, made.text, what=WHAT, force=args.force)
    verb = "detected" if args.action == "detect" else "changed"
    print(f"wrote {args.output}: {made.machine.name}, {made.machine.devices_per_node} x {made.machine.device_name} "
          f"per node, {made.machine.nics_per_node} x {made.machine.nic_gbit_s:g} Gb/s NICs")
    for line in made.changes:
        print(f"  {verb}: {line}")
    print(f"plan on it: exaplan plan --model protein-7b --machine {args.output} --nodes {min(2, made.machine.nodes)}")
    return 0


def _new(args: argparse.Namespace):
    from machine_models.describe import new_text
    from planner.inputs import parse_override

    overrides = [parse_override(text) for text in args.set]
    return new_text(args.like, overrides, name=args.name, file_name=args.output)


def _detect(args: argparse.Namespace):
    from machine_models import load_machine
    from machine_models.detect import detected_machine, probe_node

    if args.like:
        load_machine(args.like)  # an unknown preset is refused before the node is probed
    node = probe_node()
    made = detected_machine(node, args.like, args.name or Path(args.output).stem,
                            datetime.date.today().isoformat())
    for line in node.missing:
        print(f"exaplan machine detect: not found: {line}", file=sys.stderr)
    for line in node.notes:
        print(f"exaplan machine detect: note: {line}", file=sys.stderr)
    unknown = sum("# unknown:" in line for line in made.text.splitlines() if not line.lstrip().startswith("#"))
    print(f"exaplan machine detect: {unknown} figures not measured are marked in {args.output} "
          "(# unknown: ...)", file=sys.stderr)
    return made
