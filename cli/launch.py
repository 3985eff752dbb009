"""`exaplan launch PLAN -o job.sh`: a job script that runs the plan on a supercomputer (Slurm,
PBS Pro or torchrun), and `exaplan launch --calibrate --machine M --nodes N -o calib.sh`: a job
that calibrates a new machine on arrival. The work is in launch/."""

from __future__ import annotations

import argparse
import sys

from cli.common import add_force_option, command_line
from planner.schema.errors import PlanError
from planner.schema.files import check_target

EPILOG = """examples:
  exaplan plan --model protein-3.5b --machine frontier --nodes 64 -o plan.yaml
  exaplan launch plan.yaml --account BIF148 --walltime 02:00:00 -o job.sh && sbatch job.sh
  exaplan launch plan.yaml --scheduler pbs --account MyProject --queue prod -o job.sh && qsub job.sh
  exaplan launch plan.yaml --scheduler torchrun -o job.sh      (then on every node: MASTER_ADDR=host0 bash job.sh)
  exaplan launch --calibrate --machine lumi --nodes 2 --account project_465000000 -o calib.sh
  exaplan launch plan.yaml -o job.sh --run-args="--steps 5000 --ckpt-every 500"   (options of exaplan run)
  exaplan launch alps-plan.yaml --account a-g34 --container ~/.edf/pytorch.toml -o job.sh   (Alps: srun --environment)
  exaplan launch alps-plan.yaml --account a-g34 --uenv pytorch/v2.6.0:v1 --uenv-view default -o job.sh
"""


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="write a job script that runs a plan (or calibrates a machine) on a cluster",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Write one job script for Slurm, PBS Pro or torchrun from a plan and the machine "
                                   "file's launch: section: scheduler header, binding, the library and fabric "
                                   "environment, raised open-file limit, the environment staged on node-local "
                                   "storage, per-rank logs, a checkpoint before the walltime and a requeue that "
                                   "resumes.")
    p.add_argument("plan", nargs="?", help="plan file (`exaplan plan ... -o plan.yaml`)")
    p.add_argument("--scheduler", help="pbs, slurm or torchrun (default: the machine file's default_scheduler)")
    p.add_argument("--machine", help="machine preset or YAML with a launch: section (default: the plan's machine)")
    p.add_argument("--account", help="account/project to charge")
    p.add_argument("--queue", help="queue (PBS) or partition (Slurm)")
    p.add_argument("--walltime", help="HH:MM:SS (default: the machine file's default_walltime)")
    p.add_argument("--out", help="output folder of the run (default runs/MODEL-MACHINE-Nn)")
    p.add_argument("--stage-env", default="auto", help="auto: pack this Python environment once and run from "
                                                      "node-local copies; off: run from where it is")
    p.add_argument("--container", metavar="IMAGE", help="run the ranks in this container with its python3 (staging "
                                                          "off): an image (.sif) for apptainer/singularity; on a "
                                                          "machine with launch.container.runtime edf (Alps) an EDF "
                                                          "file (.toml) or an EDF name (srun --environment=)")
    p.add_argument("--uenv", metavar="IMAGE", help="mount this uenv on every node (srun --uenv=IMAGE, e.g. "
                                                   "prgenv-gnu/24.7:v3; machines whose launch.uenv.allowed)")
    p.add_argument("--uenv-view", metavar="VIEW", help="the uenv's view (srun --view=; default launch.uenv.default_view)")
    p.add_argument("--calibrate", action="store_true", help="a calibrate-on-arrival job instead of a training run")
    p.add_argument("--nodes", type=int, help="nodes to calibrate on (--calibrate; calibrate --arrival runs "
                                                 "once from the first node through srun/mpiexec; torchrun: 1 node)")
    p.add_argument("--layouts", type=int, default=4, help="layouts of the validation sweep (--calibrate; default 4)")
    p.add_argument("--framework", metavar="TARGET", help="run the plan in a framework instead of exaplan's runtime: "
                   "megatron, megatron-deepspeed, deepspeed, torchtitan or maxtext (exaplan export's targets); the "
                   "plan is exported beside the script (--export-dir) and each rank runs --entry with its arguments")
    p.add_argument("--entry", metavar="SCRIPT", help="the framework's entry point (--framework): a .py script "
                   "(Megatron-LM's pretrain_gpt.py, your DeepSpeed train.py) or a module run with -m (torchtitan.train, "
                   "maxtext.trainers.pre_train.train)")
    p.add_argument("--export-dir", metavar="DIR", help="where --framework writes the exported files (default: "
                   "beside the job script, SCRIPT-TARGET/)")
    p.add_argument("--check", action="store_true",
                   help="pre-flight: run the plan's first and last rank at full size on a fake process group (exaplan "
                        "check: a training step under fake tensors, torch's memory against the planner's and the "
                        "device's) before writing the script; a failed check writes nothing and exits 1")
    p.add_argument("-o", "--output", required=True, help="the job script to write")
    add_force_option(p, "the job script (-o)")
    p.add_argument("--ignore-memory", action="store_true",
                   help="write the script even though the plan is predicted not to fit in device memory (a "
                        "warning is printed); without it such a plan is refused")
    p.add_argument("--run-args", default="", metavar='"OPTIONS"',
                   help='options of `exaplan run`, one quoted string: --run-args="--steps 5000 --ckpt-every 500" '
                        "(checked by exaplan run's own parser now; the plan and --out are launch's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a field of the machine file's launch: section, repeatable: "
                        "machine.launch.ranks_per_node=4, machine.launch.cpus_per_rank=16, "
                        "machine.launch.default_queue=gpu (the plan's own figures cannot change: make a new plan)")


def run(args: argparse.Namespace) -> int:
    import launch

    import shlex

    check_target(args.output, "the job script (-o)", args.force)  # before anything else is read or written
    try:
        args.run_args = shlex.split(args.run_args)
    except ValueError as e:
        raise PlanError(f"not shell words: {e}", field="--run-args") from None
    args.command_line = command_line()
    if args.calibrate:
        if args.plan or args.run_args:
            raise PlanError("--calibrate takes no plan and no run options", field="--calibrate")
        if args.check:
            raise PlanError("--check runs a plan's ranks: a --calibrate job has none", field="--check")
        if not args.machine:
            raise PlanError("--calibrate needs the machine to calibrate", field="--machine")
        machine = _machine(args.machine, args.overrides)
        if args.nodes is not None and args.nodes > machine.nodes:
            raise PlanError(f"{args.nodes:,} nodes asked for; {machine.name} has {machine.nodes:,} (machine.nodes)",
                            field="--nodes")
        job = launch.calibrate_job(machine, args.machine, args)
    else:
        if not args.plan:
            raise PlanError("give a plan file (or --calibrate)", field="plan")
        from planner.schema.plan import load_plan

        plan = load_plan(args.plan)
        if args.nodes is not None and args.nodes != plan.nodes:
            raise PlanError(f"the plan runs on {plan.nodes} nodes; a plan's node count is fixed (make a plan for "
                            f"{args.nodes} nodes with exaplan plan --nodes {args.nodes})", field="--nodes")
        machine = _machine(args.machine or plan.provenance.machine_file or plan.machine.name, args.overrides,
                           recorded=not args.machine and plan.provenance.machine_file is not None)
        _check_memory(plan, args.ignore_memory)
        if args.framework and args.check:
            raise PlanError("checks exaplan's own runtime at full size, not a framework's: run `exaplan check PLAN` "
                            "for the layout, or drop --check", field="--check")
        if args.framework:
            return _framework(args, plan, machine)
        if args.entry:
            raise PlanError("--entry runs a framework's entry point: give --framework too", field="--entry")
        from runtime.options import check_launch_run_args

        check_launch_run_args(args.run_args, args.plan)
        job = launch.plan_job(plan, machine, args)
        if args.check and not _preflight(plan):
            return 1
    launch.write_script(job, args.force)
    print(f"wrote {job.script}: {job.scheduler.value}, {job.nodes} node(s) x {job.ranks_per_node} ranks, "
          f"walltime {job.walltime}, staging {job.stage}")
    print(f"submit: {launch.submit_hint(job)}")
    return 0


def _machine(ref: str, overrides: list[str], recorded: bool = False):
    """The machine file (a preset or a YAML path: --machine, else the one the plan records, else
    the plan's preset) with --set applied, launch section included."""
    from pathlib import Path

    from machine_models import load_machine
    from planner.inputs import apply_overrides, check_overrides, parse_override

    if recorded and not Path(ref).is_file():
        raise PlanError(f"the plan was made from the machine file {ref}, which is no longer there: give --machine",
                        field="--machine")
    parsed = [parse_override(o) for o in overrides]
    check_overrides(parsed, ("machine",))
    for key, _ in parsed:
        if not key.startswith("machine.launch."):
            raise PlanError("launch changes the machine file's launch: section only (machine.launch.FIELD=VALUE); "
                            "the plan's figures are fixed: make a new plan", field=key)
    machine = load_machine(ref)
    if not parsed:
        return machine
    if machine.launch is None:
        raise PlanError(f"machine {machine.name!r} has no launch: section to change", field=parsed[0][0])
    launch = apply_overrides(machine.launch, "launch", [(k.removeprefix("machine."), v) for k, v in parsed])
    return machine.model_copy(update={"launch": launch})


def _check_memory(plan, ignore: bool) -> None:
    """A plan predicted not to fit in device memory, or whose layout predicted again does not
    (a hand-edited file), is refused (or, with --ignore-memory, a warning): it would run out
    of memory after its time in the queue."""
    from cli.common import repredicted_memory_gib

    p = plan.prediction
    try:
        repredicted_memory_gib(plan)
        problem = None if p.fits else (
            f"the plan is predicted at {p.memory_gib_per_device:,.1f} GiB a device, over the "
            f"{plan.machine.device_memory_gib:,.0f} GiB of {plan.machine.device_name}: it would run out of memory")
    except PlanError as e:
        problem = str(e).removeprefix(f"{e.field}: ")
    if problem is None:
        return
    if not ignore:
        raise PlanError(f"{problem} (make a plan that fits, or give --ignore-memory)", field="prediction.fits")
    print(f"warning: {problem}; writing the script anyway (--ignore-memory)", file=sys.stderr)


def _preflight(plan) -> bool:
    """--check: the plan's first and last rank at full size (cli/check.py); the report printed."""
    from cli.check import check_plan, passed, report
    from cli.common import console
    from runtime.check import ranks_of

    out = console()
    results, failed = check_plan(plan, ranks_of(plan, "first,last"), out=out)
    report(out, plan, results, failed)
    if not passed(results, failed):
        out.print("pre-flight check failed: no job script written (exaplan check for the details)")
        return False
    return True


def _framework(args: argparse.Namespace, plan, machine) -> int:
    """Export the plan for --framework beside the script, then write the job around --entry
    (checked before anything is written)."""
    from pathlib import Path

    import launch
    from export import export_plan, write_export

    from export.targets import TARGETS

    if args.framework not in TARGETS:
        raise PlanError(f"unknown framework {args.framework!r}; exaplan export's targets: {', '.join(TARGETS)}",
                        field="--framework")
    exported = export_plan(plan, args.framework)
    script = Path(args.output)
    folder = Path(args.export_dir) if args.export_dir else script.with_name(f"{script.stem}-{args.framework}")
    entry = args.entry or exported.entry_in(folder)
    if not entry:
        raise PlanError(f"{args.framework} has no usual entry point: give --entry (your training script)", field="--entry")
    job = launch.framework_job(plan, machine, args, args.framework, entry, exported.argv_in(folder))
    write_export(exported, folder, args.plan, args.force)
    launch.write_script(job)
    print(f"wrote {folder}/ ({args.framework}) and {job.script}: {job.scheduler.value}, {job.nodes} node(s) x "
          f"{job.ranks_per_node} ranks running {entry}, walltime {job.walltime}, staging {job.stage}")
    for note in exported.notes + job.notes:
        print(f"note: {note}")
    print(f"submit: {launch.submit_hint(job)}")
    return 0
