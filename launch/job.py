"""What a job script is made from (`Job`), checked: the scheduler against the machine file, the
plan's ranks per node against the machine, the walltime, the account, the container (image or EDF),
the uenv, and
every environment variable name against the allow-list. Bad input raises PlanError naming the
field; nothing is written before every check has passed.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from planner.schema.errors import PlanError
from planner.schema.launch import LaunchSettings, SchedulerKind, env_name_problem, header_value_problem
from planner.schema.specs import MachineModel

_WALLTIME_RE = re.compile(r"^(\d{1,3}):([0-5]\d):([0-5]\d)$")
# The source of exaplan that a staged environment carries beside the interpreter.
SOURCE_PACKAGES = ("planner", "runtime", "calibration", "cli", "machine_models", "launch")
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Job:
    """One job script's inputs, all checked."""

    machine: MachineModel
    settings: LaunchSettings
    scheduler: SchedulerKind
    nodes: int
    ranks_per_node: int
    walltime: str
    walltime_s: int
    account: str | None
    queue: str | None
    out: Path
    script: Path
    name: str
    exaplan_args: list[str]  # after `python -m cli`: ["run", PLAN, "--out", OUT, ...]
    resumable: bool  # a training run: requeue on exit 85 and continue with --resume
    env: dict[str, str]
    stage: str  # "off", "venv" or "conda"
    python_prefix: Path  # the environment to run (and to stage)
    container: str | None = None  # image or EDF: absolute path, or an EDF name (launch.job.check_container)
    uenv: str | None = None  # srun --uenv (a label such as prgenv-gnu/24.7:v3, or a SquashFS path)
    uenv_view: str | None = None  # srun --view
    command_line: str = ""
    notes: list[str] = field(default_factory=list)
    # calibrate --arrival: the command runs ONCE, in the batch script's shell on the first node,
    # and starts every rank itself through --launcher (script.py's _arrival)
    runs_once: bool = False
    # a framework's run (`exaplan launch --framework F --entry E`): each rank runs this entry point
    # (a .py script, or a module run with -m) with exaplan_args as its arguments, not `python -m cli`
    entry: str | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


def launch_settings(machine: MachineModel) -> LaunchSettings:
    if machine.launch is None:
        raise PlanError(f"machine {machine.name!r} has no launch: section (schedulers, ranks per node, binding, "
                        "environment); add one to its YAML (see machine_models/frontier.yaml)", field="machine.launch")
    return machine.launch


def scheduler_of(settings: LaunchSettings, name: str | None, machine: str) -> SchedulerKind:
    if name is None:
        return settings.default_scheduler
    try:
        kind = SchedulerKind(name)
    except ValueError:
        raise PlanError(f"unknown scheduler {name!r}; one of: {', '.join(k.value for k in SchedulerKind)}",
                        field="--scheduler") from None
    if kind not in settings.schedulers:
        allowed = ", ".join(k.value for k in settings.schedulers)
        raise PlanError(f"machine {machine!r} does not run {kind.value} (its launch.schedulers: {allowed})",
                        field="--scheduler")
    return kind


def walltime_seconds(text: str) -> int:
    m = _WALLTIME_RE.match(text or "")
    if not m:
        raise PlanError(f"{text!r} is not HH:MM:SS (e.g. 02:00:00)", field="--walltime")
    seconds = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
    if seconds <= 0:
        raise PlanError("must be longer than 00:00:00", field="--walltime")
    return seconds


def header_value(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    problem = header_value_problem(value)
    if problem:
        raise PlanError(problem, field=what)
    return value


def check_account(settings: LaunchSettings, account: str | None, scheduler: SchedulerKind, machine: str) -> str | None:
    account = header_value(account, "--account")
    if account is None and settings.account_required and scheduler != SchedulerKind.torchrun:
        raise PlanError(f"machine {machine!r} needs an account (project) for every job (launch.account_required)",
                        field="--account")
    return account


_EDF_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def check_container(settings: LaunchSettings, image: str | None, machine: str, scheduler: SchedulerKind) -> str | None:
    """The container as the script names it: an image file's absolute path (apptainer, singularity), or an EDF's
    absolute path or its name in the EDF search path (edf: `srun --environment=`)."""
    if image is None:
        return None
    c = settings.container
    if c is None:
        raise PlanError(f"machine {machine!r} names no container runtime (launch.container)", field="--container")
    if c.launcher_option:
        if scheduler != SchedulerKind.slurm:
            raise PlanError(f"machine {machine!r} runs containers through srun --environment (launch.container.runtime "
                            f"{c.runtime}): use --scheduler slurm", field="--container")
        if "/" not in image and not image.endswith(".toml"):
            if not _EDF_NAME_RE.match(image):
                raise PlanError(f"{image!r} is neither an EDF file nor an EDF name (letters, digits, _ . + -)",
                                field="--container")
            return image  # a name from the EDF search path (~/.edf or EDF_PATH) of the machine that runs the job
    path = Path(image).expanduser().resolve()
    if not path.is_file():
        what = "Environment Definition File (EDF)" if c.launcher_option else "container image file"
        raise PlanError(f"no {what} at {image}", field="--container")
    return str(path)


def check_uenv(settings: LaunchSettings, uenv: str | None, view: str | None, container: str | None,
               scheduler: SchedulerKind, machine: str) -> tuple[str | None, str | None]:
    """The uenv (label or SquashFS path, as srun --uenv takes it) and its view, or (None, None). The values go
    into `#SBATCH --uenv=`/`--view=` lines, which no shell quotes: the header alphabet only."""
    if uenv is None:
        if view is not None:
            raise PlanError("a view needs a uenv (--uenv IMAGE)", field="--uenv-view")
        return None, None
    if settings.uenv is None or not settings.uenv.allowed:
        raise PlanError(f"machine {machine!r} offers no uenv (launch.uenv.allowed)", field="--uenv")
    if container is not None:
        raise PlanError("give --container or --uenv, not both (a uenv is mounted on the host, not in a container)",
                        field="--uenv")
    if scheduler != SchedulerKind.slurm:
        raise PlanError("a uenv is mounted by Slurm (srun --uenv): use --scheduler slurm", field="--uenv")
    view = view or settings.uenv.default_view
    header_value(uenv, "--uenv")
    header_value(view, "--uenv-view")
    return uenv, view


def check_env(env: dict[str, str], source: str) -> dict[str, str]:
    """The environment, refused whole if any name is not allowed (the message names them)."""
    problems = [f"{source}.{k}: {p}" for k, p in ((k, env_name_problem(k)) for k in env) if p]
    if problems:
        raise PlanError("; ".join(problems), field=source)
    return dict(env)


def stage_kind(mode: str, container: str | None, prefix: Path) -> str:
    """What staging packs: "off", "venv" (a tarball of the venv) or "conda" (conda-pack)."""
    if mode not in ("auto", "off"):
        raise PlanError(f"{mode!r}: auto or off", field="--stage-env")
    if mode == "off" or container is not None:
        return "off"  # a container is the environment already: its python3 runs the ranks
    if (prefix / "conda-meta").is_dir():
        return "conda"
    if (prefix / "pyvenv.cfg").is_file():
        return "venv"
    raise PlanError(f"{prefix} is neither a venv nor a conda environment: nothing to pack (use --stage-env off)",
                    field="--stage-env")


def python_prefix() -> Path:
    return Path(sys.prefix).resolve()


def check_ranks(settings: LaunchSettings, machine: MachineModel, ranks_per_node: int) -> None:
    if settings.ranks_per_node != ranks_per_node:
        raise PlanError(f"the plan puts {ranks_per_node} ranks on each node; machine {machine.name!r} starts "
                        f"{settings.ranks_per_node} (launch.ranks_per_node)", field="ranks_per_node")
