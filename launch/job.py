"""What a job script is made from (`Job`), checked: the scheduler against the machine file, the
plan's ranks per node against the machine, the walltime, the account, the container image, and
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
    container: Path | None = None
    command_line: str = ""
    notes: list[str] = field(default_factory=list)
    # calibrate --arrival: the command runs ONCE, in the batch script's shell on the first node,
    # and starts every rank itself through --launcher (script.py's _arrival)
    runs_once: bool = False

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


def check_container(settings: LaunchSettings, image: str | None, machine: str) -> Path | None:
    if image is None:
        return None
    if settings.container is None:
        raise PlanError(f"machine {machine!r} names no container runtime (launch.container)", field="--container")
    path = Path(image).expanduser().resolve()
    if not path.is_file():
        raise PlanError(f"no container image file at {image}", field="--container")
    return path


def check_env(env: dict[str, str], source: str) -> dict[str, str]:
    """The environment, refused whole if any name is not allowed (the message names them)."""
    problems = [f"{source}.{k}: {p}" for k, p in ((k, env_name_problem(k)) for k in env) if p]
    if problems:
        raise PlanError("; ".join(problems), field=source)
    return dict(env)


def stage_kind(mode: str, container: Path | None, prefix: Path) -> str:
    """What staging packs: "off", "venv" (a tarball of the venv) or "conda" (conda-pack)."""
    if mode not in ("auto", "off"):
        raise PlanError(f"{mode!r}: auto or off", field="--stage-env")
    if mode == "off" or container is not None:
        return "off"  # a container image is the environment already
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
