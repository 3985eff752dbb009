"""The `launch:` section of a machine file: how jobs start on that machine (`exaplan launch`).

Everything site-specific that a job script needs lives here, as data: the schedulers the site
runs, ranks per node, the cores each local rank is bound to, the environment of the collective
library and the fabric, modules, node-local scratch, whether an account is required, the
container runtime (a rank wrapper such as Apptainer, or a launcher option such as CSCS's EDF), user
environments (uenv), the collective library's network plugin, the MIOpen cache. No code branches
on machine names: a user's own machine file with this section gets job scripts unchanged.

Environment names, from a machine file or a plan, must start with one of ENV_PREFIXES (the
allow-list, shared with anything else that writes an environment into a script); the names in
REFUSED_ENV_NAMES and every PYTHON* and LD_* name are refused whatever their prefix, since they
change which code runs; values are printable ASCII without shell quoting characters, at most
ENV_VALUE_MAX long (`env_problems`, checked when a machine file or a plan is loaded).

This module is not part of a plan file: `MachineModel.launch` is excluded from a plan's dump
(and its content hash), so plans stay the planner's contract and the launch settings are read
from the machine file when a job is written.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Prefixes of the environment variables a plan or a machine file may set in a job script.
ENV_PREFIXES = (
    "NCCL_", "RCCL_", "OFI_NCCL_", "CCL_", "FI_", "UCX_", "ZE_", "ZES_", "TORCH_", "PYTORCH_", "OMP_", "KMP_",
    "MIOPEN_", "HSA_", "HIP_", "ROCR_", "AMD_", "CUDA_", "CUDNN_", "GLOO_", "MPICH_", "I_MPI_", "PALS_",
    "SYCL_", "ONEAPI_", "IPEX_", "CXI_", "NVIDIA_", "MALLOC_", "TOKENIZERS_",
)
# Names refused whatever their prefix: they decide which libraries and which code are loaded.
REFUSED_ENV_NAMES = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PATH", "BASH_ENV", "ENV", "IFS"})
REFUSED_ENV_PREFIXES = ("PYTHON", "LD_")
_ENV_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Values that go into scheduler header lines (#SBATCH, #PBS), which no shell quotes: account,
# queue, option values. Letters, digits and a few separators; no spaces, quotes or `$`.
HEADER_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:=+@/%-]+$")
_CPU_SET_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def env_name_problem(name: str) -> str | None:
    """Why an environment variable name may not enter a job script, or None when it may."""
    if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
        return f"{name!r} is not an environment variable name (capitals, digits and _)"
    if name in REFUSED_ENV_NAMES or name.startswith(REFUSED_ENV_PREFIXES):
        return f"{name} is refused (it changes which libraries or which code run)"
    if not name.startswith(ENV_PREFIXES):
        return f"{name} is not on the allow-list of prefixes ({', '.join(ENV_PREFIXES)})"
    return None


# Values: printable ASCII, at most ENV_VALUE_MAX characters, and none of the characters that
# mean something to a shell even inside double quotes (` $ \ " '): a value is data.
ENV_VALUE_MAX = 256
_ENV_VALUE_RE = re.compile(r"""^[ !#%&()*+,\-./0-9:;<=>?@A-Z\[\]^_a-z{|}~]*$""")
ENV_MAX_NAMES = 64


def env_value_problem(name: str, value) -> str | None:
    """Why an environment variable's value may not enter a job script or a rank, or None."""
    if not isinstance(value, str):
        return f"{name}: the value must be a string, got {type(value).__name__}"
    if len(value) > ENV_VALUE_MAX:
        return f"{name}: the value has {len(value)} characters, at most {ENV_VALUE_MAX}"
    if not _ENV_VALUE_RE.match(value):
        return (f"{name}: the value {value[:40]!r} may hold only printable ASCII without quotes, backslashes, "
                "$ or backticks")
    return None


def env_problems(env: dict) -> list[str]:
    """Every reason the environment `env` (names and values) may not be set: the one check of
    a plan's `collectives.env` and of a machine file's `launch.env`."""
    if len(env) > ENV_MAX_NAMES:
        return [f"{len(env)} variables, at most {ENV_MAX_NAMES}"]
    problems = [env_name_problem(k) for k in env]
    problems += [env_value_problem(k, v) for k, v in env.items()]
    return [p for p in problems if p]


def header_value_problem(value: str) -> str | None:
    """Why a value may not go into a scheduler header line, or None when it may."""
    if not HEADER_VALUE_RE.match(value):
        return f"{value!r} may hold only letters, digits and _ . , : = + @ / % -"
    return None


def cpu_set_cores(cpu_set: str) -> list[int]:
    """The cores of a Linux cpulist ("1-7", "49-55,113-119")."""
    cores: list[int] = []
    for part in cpu_set.split(","):
        lo, _, hi = part.partition("-")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SchedulerKind(str, Enum):
    pbs = "pbs"  # PBS Pro with mpiexec (Cray PALS on Aurora)
    slurm = "slurm"  # sbatch + srun
    torchrun = "torchrun"  # any machine: the script runs once per node, torchrun starts the ranks


class ContainerSettings(_Section):
    """How ranks run inside a container (`--container X`). Two kinds of runtime, as data:

    - apptainer, singularity: a command that wraps each rank (`<runtime> exec --bind ... IMAGE.sif python3 ...`);
      X is an image file.
    - edf: a container engine driven by an option of the scheduler's launcher (CSCS's Container Engine on Alps:
      `srun --environment=X`); X is an Environment Definition File (TOML) by path, or by name from the EDF
      search path. The image, mounts, working directory and hooks live in the EDF, so binds and options
      are refused here. Slurm only.
    """

    runtime: Literal["apptainer", "singularity", "edf"] = Field(
        description="apptainer / singularity: `<runtime> exec` wraps each rank; edf: `srun --environment=EDF`.")
    binds: list[str] = Field(default_factory=list, description="Host paths bound into the container (`--bind`; "
                                                               "not with edf: mounts are in the EDF).")
    options: list[str] = Field(default_factory=list, description="Further options of `<runtime> exec` (not with edf).")

    @model_validator(mode="after")
    def _edf_has_no_binds(self) -> "ContainerSettings":
        if self.runtime == "edf" and (self.binds or self.options):
            raise ValueError("runtime edf: the mounts and options belong in the EDF file (mounts = [...]), "
                             "not in binds/options")
        return self

    @property
    def launcher_option(self) -> bool:
        """Whether the container is an option of the launcher (srun --environment) rather than a rank wrapper."""
        return self.runtime == "edf"


class UenvSettings(_Section):
    """User environments (CSCS uenv: a SquashFS software stack mounted by Slurm, `srun --uenv=IMAGE --view=VIEW`)."""

    allowed: bool = Field(False, description="The site's Slurm takes --uenv/--view (`exaplan launch --uenv`).")
    default_view: str | None = Field(None, description="The view loaded when --uenv-view is not given (--view).")

    @field_validator("default_view")
    @classmethod
    def _view_safe(cls, view: str | None) -> str | None:
        if view is not None and header_value_problem(view):
            raise ValueError(f"default_view: {header_value_problem(view)}")
        return view


HeaderOptions = Annotated[dict[str, str], Field(default_factory=dict)]


class LaunchSettings(_Section):
    """How jobs start on this machine. Each figure of a preset cites its source in the YAML."""

    schedulers: list[SchedulerKind] = Field(min_length=1, description="Schedulers `exaplan launch` may write for.")
    default_scheduler: SchedulerKind = Field(description="The scheduler used when --scheduler is not given.")
    ranks_per_node: int = Field(gt=0, description="Ranks started on each node (= devices_per_node: a GPU, tile or GCD).")
    account_required: bool = Field(False, description="The site refuses jobs without an account/project (--account).")
    default_queue: str | None = Field(None, description="Queue (PBS) or partition (Slurm) when --queue is not given.")
    default_walltime: str = Field("01:00:00", description="HH:MM:SS when --walltime is not given.")
    cpus_per_rank: int | None = Field(None, gt=0, description="Cores per rank (srun --cpus-per-task, OMP_NUM_THREADS).")
    cpu_sets: list[str] = Field(
        default_factory=list, description="Cores of each local rank, in local-rank order (Linux cpulists, e.g. '49-55'): "
                                          "srun --cpu-bind=mask_cpu:..., mpiexec --cpu-bind list:..., or set by the rank "
                                          "itself under torchrun. Empty: no binding.")
    gpus_per_node: int | None = Field(None, gt=0, description="GPUs to request per node (#SBATCH --gpus-per-node).")
    slurm_options: HeaderOptions = Field(description="Further #SBATCH options, name: value (e.g. constraint: nvme).")
    pbs_resources: HeaderOptions = Field(description="Further #PBS -l resources, name: value (e.g. filesystems: flare).")
    modules: list[str] = Field(default_factory=list, description="`module load` these, in order.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the library and fabric (allow-listed names).")
    local_scratch: str = Field("/tmp", description="Node-local storage for the staged environment ({user}, {job} expand).")
    container: ContainerSettings | None = Field(None, description="Container runtime for --container.")
    uenv: UenvSettings | None = Field(None, description="User environments for --uenv (None: not offered).")
    collective_plugin_dir: str | None = Field(
        None, description="Library folder of the collective library's network plugin (aws-ofi-rccl / aws-ofi-nccl), "
                          "prepended to LD_LIBRARY_PATH by the script.")
    miopen_cache_dir: str | None = Field(
        None, description="Node-local MIOpen cache (MIOPEN_USER_DB_PATH, MIOPEN_CUSTOM_CACHE_DIR; one per rank below it; "
                          "{user}, {job} expand).")
    ib_hca: str | None = Field(None, description="InfiniBand HCAs for NCCL (NCCL_IB_HCA) and UCX (UCX_NET_DEVICES).")
    socket_ifname: str | None = Field(None, description="Interfaces for bootstrap sockets (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).")
    signal_grace_s: int = Field(120, gt=0, description="Seconds before the walltime ends when the ranks are told to save and exit.")
    max_requeues: int = Field(10, ge=0, description="Requeues after a walltime checkpoint before the job gives up.")

    @field_validator("env")
    @classmethod
    def _allowed_env(cls, env: dict[str, str]) -> dict[str, str]:
        problems = env_problems(env)
        if problems:
            raise ValueError("; ".join(problems))
        return env

    @field_validator("slurm_options", "pbs_resources")
    @classmethod
    def _header_safe(cls, options: dict[str, str]) -> dict[str, str]:
        for name, value in options.items():
            if not re.match(r"^[a-z][a-z0-9_-]*$", name):
                raise ValueError(f"{name!r}: option names are lower-case letters, digits, _ and -")
            problem = header_value_problem(str(value))
            if problem:
                raise ValueError(f"{name}: {problem}")
        return options

    @field_validator("cpu_sets")
    @classmethod
    def _cpu_lists(cls, sets: list[str]) -> list[str]:
        bad = [s for s in sets if not _CPU_SET_RE.match(s)]
        if bad:
            raise ValueError(f"not Linux cpulists (e.g. '1-7' or '1-7,65-71'): {bad}")
        return sets

    @model_validator(mode="after")
    def _consistent(self) -> "LaunchSettings":
        if self.default_scheduler not in self.schedulers:
            raise ValueError(f"default_scheduler {self.default_scheduler.value} is not among schedulers")
        if self.cpu_sets and len(self.cpu_sets) != self.ranks_per_node:
            raise ValueError(f"cpu_sets: {len(self.cpu_sets)} sets for {self.ranks_per_node} ranks per node")
        if self.default_queue is not None and header_value_problem(self.default_queue):
            raise ValueError(f"default_queue: {header_value_problem(self.default_queue)}")
        return self
