"""`exaplan launch`: job scripts that run plans (and calibrate-on-arrival) on real systems.

    job.py         the inputs of a script (Job), each checked: bad input is a PlanError naming the field
    schedulers.py  what differs between Slurm, PBS Pro and torchrun
    script.py      the script, in numbered sections, every value shell-quoted
    rank.py        `python -m launch.rank`: one rank's log, limits, binding, then `python -m cli ...`
                   (--command: the tail of calibrate --arrival's --launcher)

Everything machine-specific comes from the machine file's `launch:` section
(planner/schema/launch.py). Imports: planner/schema/ and machine_models/ only (no torch).
"""

from __future__ import annotations

from pathlib import Path

from launch import job as _job
from launch.job import Job
from planner.schema.errors import PlanError
from planner.schema.launch import SchedulerKind
from planner.schema.specs import MachineModel


def _common(machine: MachineModel, o, ranks_per_node: int, nodes: int) -> dict:
    """The checks every script shares; `o` holds the command's options."""
    settings = _job.launch_settings(machine)
    scheduler = _job.scheduler_of(settings, o.scheduler, machine.name)
    _job.check_ranks(settings, machine, ranks_per_node)
    walltime = o.walltime or settings.default_walltime
    walltime_s = _job.walltime_seconds(walltime)
    account = _job.check_account(settings, o.account, scheduler, machine.name)
    queue = _job.header_value(o.queue or settings.default_queue, "--queue")
    container = _job.check_container(settings, o.container, machine.name, scheduler)
    uenv, uenv_view = _job.check_uenv(settings, getattr(o, "uenv", None), getattr(o, "uenv_view", None), container,
                                      scheduler, machine.name)
    prefix = _job.python_prefix()
    stage = _job.stage_kind(o.stage_env, container, prefix)
    env = _job.check_env(settings.env, "machine.launch.env")
    script = Path(o.output).resolve()
    return dict(machine=machine, settings=settings, scheduler=scheduler, nodes=nodes, ranks_per_node=ranks_per_node,
                walltime=walltime, walltime_s=walltime_s, account=account, queue=queue, script=script,
                stage=stage, python_prefix=prefix, container=container, uenv=uenv, uenv_view=uenv_view, env=env,
                command_line=getattr(o, "command_line", ""))


def plan_job(plan, machine: MachineModel, o) -> Job:
    """The job that trains `plan` (already loaded and hash-checked) on `machine`."""
    fields = _common(machine, o, plan.ranks_per_node, plan.nodes)
    fields["env"].update(_job.check_env(plan.collectives.env, "plan.collectives.env"))
    out = Path(o.out or f"runs/{plan.model.name}-{machine.name}-{plan.nodes}n").resolve()
    args = ["run", str(Path(o.plan).resolve()), "--out", str(out), *o.run_args]
    name = _job_name(f"exaplan-{plan.model.name}")
    return Job(out=out, name=name, exaplan_args=args, resumable=True, **fields)


def framework_job(plan, machine: MachineModel, o, target: str, entry: str, argv: list[str]) -> Job:
    """The job that runs `plan` in a framework: the same script (header, binding, environment,
    staging, signals) around the framework's own entry point, each rank `entry argv` with the
    launcher's rank variables exported as torch.distributed's (launch/rank.py). The framework
    keeps its own checkpoints, so there is no exaplan requeue: the scheduler's signal reaches
    the ranks (Megatron's --exit-signal-handler saves on it)."""
    if not entry or any(c in entry for c in "\n\0"):
        raise PlanError("give the framework's entry point: a .py script (pretrain_gpt.py) or a module "
                        "(torchtitan.train)", field="--entry")
    if entry.endswith(".py"):  # the ranks start in the code's folder: a script by its absolute path
        entry = str(Path(entry).expanduser().resolve())
    fields = _common(machine, o, plan.ranks_per_node, plan.nodes)
    fields["env"].update(_job.check_env(plan.collectives.env, "plan.collectives.env"))
    out = Path(o.out or f"runs/{plan.model.name}-{machine.name}-{plan.nodes}n-{target}").resolve()
    notes = [f"{target}: each rank runs {entry} with the exported arguments; its checkpoints, logs and "
             f"resumption are the framework's own (give them with --run-args)"]
    return Job(out=out, name=_job_name(f"{target}-{plan.model.name}"), exaplan_args=[*argv, *o.run_args],
               resumable=False, notes=notes, entry=entry, **fields)


def calibrate_job(machine: MachineModel, machine_ref: str, o) -> Job:
    """The calibrate-on-arrival job: `exaplan calibrate --arrival` ONCE, from the batch script on
    the first node, which starts the measurement and every run of its sweep on all N nodes
    through `--launcher` (the scheduler's srun / mpiexec line; torchrun on one node only)."""
    if o.nodes is None or o.nodes <= 0:
        raise PlanError("give the nodes to calibrate on (a positive number)", field="--nodes")
    if o.layouts <= 0:
        raise PlanError("must be a positive number of layouts", field="--layouts")
    settings = _job.launch_settings(machine)
    fields = _common(machine, o, settings.ranks_per_node, o.nodes)
    if fields["scheduler"] == SchedulerKind.torchrun and o.nodes > 1:
        others = [k.value for k in settings.schedulers if k != SchedulerKind.torchrun]
        raise PlanError(f"calibrate on arrival runs once, from the first node, and starts the ranks of every step on "
                        f"all nodes through srun or mpiexec; a torchrun script runs on each node separately, so it "
                        f"can calibrate one node only: use --nodes 1, or "
                        + (f"--scheduler {' or '.join(others)}" if others else "a machine with Slurm or PBS"),
                        field="--scheduler")
    out = Path(o.out or f"calibration-{machine.name}").resolve()
    base = str(Path(machine_ref).resolve()) if Path(machine_ref).is_file() else machine_ref
    args = ["calibrate", "--arrival", "--out", str(out), "--ranks", str(settings.ranks_per_node), "--nodes",
            str(o.nodes), "--layouts", str(o.layouts), "--base", base]
    notes = [f"calibrate on arrival: the fitted machine is {out}/fitted.yaml (then: exaplan plan --machine "
             f"{out}/fitted.yaml ...)"]
    return Job(out=out, name=_job_name(f"exaplan-calibrate-{machine.name}"), exaplan_args=args, resumable=False,
               notes=notes, runs_once=True, **fields)


def _job_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:60]


def write_script(job: Job, force: bool = False) -> str:
    """Render and write the script atomically, executable (planner.schema.files.write_new: an
    existing script replaced only with `force`, never through a symlink); returns its text."""
    from launch.script import render
    from planner.schema.files import write_new

    text = render(job)
    write_new(job.script, text, what="the job script", force=force, mode=0o755)
    if job.scheduler != SchedulerKind.torchrun:
        # The scheduler opens the job's output file (#SBATCH --output / #PBS -o, in OUT/logs) before
        # the script runs, so before its `mkdir -p "${OUT}/logs"`: Slurm fails a job whose output
        # folder is missing (JobLaunchFailure) and PBS loses the output. Made here, with the script.
        (job.out / "logs").mkdir(parents=True, exist_ok=True)
    return text


def submit_hint(job: Job) -> str:
    if job.scheduler == SchedulerKind.slurm:
        return f"sbatch {job.script}"
    if job.scheduler == SchedulerKind.pbs:
        return f"qsub {job.script}"
    if job.nodes == 1:
        return f"bash {job.script}"
    return (f"MASTER_ADDR=<first node> bash {job.script}   (on every node; in a Slurm job: srun --nodes={job.nodes} "
            f"--ntasks-per-node=1 bash {job.script})")


__all__ = ["Job", "calibrate_job", "framework_job", "plan_job", "submit_hint", "write_script"]
