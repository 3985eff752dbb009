"""Starting the ranks of a plan: under a launcher, or by starting torchrun ourselves.

Under torchrun, Slurm (srun), PBS/PALS or mpiexec each process is one rank and reads its
rank, world size and local rank from that launcher's environment; the rendezvous address is
the first host of the job. On a workstation or CI machine, `exaplan run` starts the plan's
ranks itself through torchrun (torch's elastic launcher).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from planner.schema.errors import PlanError
from planner.schema.plan import Plan


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    launcher: str
    master_addr: str
    master_port: int


def _first_host() -> str:
    """The job's first host, for the rendezvous (Slurm node list, PBS node file)."""
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist:
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
            return out.stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            return nodelist.split(",")[0].split("[")[0]
    nodefile = os.environ.get("PBS_NODEFILE")
    if nodefile and os.path.exists(nodefile):
        with open(nodefile) as f:
            return f.readline().strip() or "localhost"
    return "localhost"


def detect() -> RankEnv | None:
    """This process's rank from the launcher's environment, or None when not launched."""
    env = os.environ
    candidates = (
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
        ("pals", "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
        ("mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    )
    for name, r, w, lr, lw in candidates:
        if r in env and w in env:
            local_world = env.get(lw)
            try:
                local_world_n = int(local_world.split("(")[0]) if local_world else None
            except ValueError:
                local_world_n = None
            return RankEnv(int(env[r]), int(env[w]), int(env.get(lr, 0)), local_world_n, name, _first_host(),
                           int(env.get("MASTER_PORT", "29500")))
    return None


def check_world(plan: Plan, renv: RankEnv) -> None:
    """Refuse a plan whose world size or ranks per node disagree with what is running."""
    if renv.world_size != plan.world_size:
        raise PlanError(f"the plan needs {plan.world_size} ranks ({plan.nodes} nodes x {plan.ranks_per_node}); "
                        f"{renv.launcher} started {renv.world_size}", field="world size")
    if renv.local_world_size is not None and renv.local_world_size != plan.ranks_per_node:
        raise PlanError(f"the plan puts {plan.ranks_per_node} ranks on each node; {renv.launcher} started "
                        f"{renv.local_world_size} on this one", field="ranks_per_node")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_locally(plan: Plan, args, trainer_args: list[str]) -> int:
    """`exaplan run` on a workstation, after every option and the plan were checked
    (runtime/preflight.py): take the --out lock (runtime/runlock.py), prepare the data once,
    start the ranks. A refusal on the way (a busy --out, bad data, no checkpoint to resume)
    removes --out again when this call created it, so nothing is left behind."""
    import shutil

    from runtime.options import check_before_launch, check_out_of_a_new_segment
    from runtime.runlock import OWNER_ENV, RunLock

    check_out_of_a_new_segment(args)
    out = Path(args.out)
    created = not out.exists()
    lock = RunLock(out, getattr(args, "argv", None))
    try:
        lock.acquire()
        check_before_launch(args, plan)
    except BaseException:
        lock.release()
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    try:
        return spawn_local(plan, trainer_args, out=out, env={OWNER_ENV: f"{socket.gethostname()}:{os.getpid()}"})
    finally:
        lock.release()


def spawn_local(plan: Plan, trainer_args: list[str], out: str | Path | None = None, env: dict | None = None) -> int:
    """Start the plan's ranks on this machine through torchrun; returns the exit code.

    SIGUSR1 and SIGTERM sent to this process go on to the ranks (runtime/walltime.py), which
    save and exit; their exit becomes EXIT_REQUEUE (85) when rank 0 recorded the stop in
    OUT/stopped.json (torchrun itself reports any non-zero exit of a rank as 1). SIGINT and
    SIGHUP go on as SIGTERM (the ranks save) and the exit code is 130 / 129. torchrun runs in
    its own session (a terminal's Ctrl-C reaches this process only, which decides) and dies
    with this process (parent-death signal); its ranks then stop on their own (ParentWatchdog)."""
    from runtime.options import EXIT_REQUEUE
    from runtime.startup import raise_nofile_limit
    from runtime.walltime import LOCAL_LAUNCHER_ENV, STOPPED_FILE, Forwarder, launcher_preexec

    if plan.nodes != 1:
        raise PlanError(f"this plan spans {plan.nodes} nodes: start it on every node with srun, mpiexec or torchrun "
                        f"(each process then runs as one rank)", field="nodes")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(plan.ranks_per_node),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
           "-m", "runtime.trainer", *trainer_args]
    env = {**os.environ, **(env or {})}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // plan.ranks_per_node)))
    # torchrun keeps SIGTERM ignored (it would otherwise kill the ranks 30 s later, mid-save).
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGINT,SIGHUP,SIGQUIT"
    env[LOCAL_LAUNCHER_ENV] = "1"  # a signal-stopped rank exits 0: no ChildFailedError traceback
    raise_nofile_limit()  # inherited by torchrun and the ranks
    stopped = Path(out) / STOPPED_FILE if out is not None else None
    if stopped is not None:
        stopped.unlink(missing_ok=True)  # a previous segment's
    with Forwarder() as fwd:
        fwd.proc = subprocess.Popen(cmd, env=env, preexec_fn=launcher_preexec, start_new_session=True)
        code = fwd.proc.wait()
    return fwd.exit_code(code, stopped is not None and stopped.exists(), EXIT_REQUEUE)


def device_and_backend() -> tuple[str, str]:
    """(device type, process-group backend): CUDA (also AMD via ROCm) -> nccl (RCCL),
    Intel XPU -> xccl, CPU -> gloo."""
    import torch

    if torch.cuda.is_available():
        return "cuda", "nccl"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu", "xccl"
    return "cpu", "gloo"


def init_distributed(plan: Plan, renv: RankEnv):
    """Set the plan's collective environment, start the process group, pin the device and
    give each CPU rank its share of the cores. Returns the torch.device."""
    import torch
    import torch.distributed as dist

    check_world(plan, renv)
    for key, value in plan.collectives.env.items():
        os.environ[key] = value  # before the process group (and the library) starts
    os.environ.setdefault("MASTER_ADDR", renv.master_addr)
    os.environ.setdefault("MASTER_PORT", str(renv.master_port))
    device_type, backend = device_and_backend()
    if device_type == "cuda":
        torch.cuda.set_device(renv.local_rank)
        device = torch.device("cuda", renv.local_rank)
    elif device_type == "xpu":
        torch.xpu.set_device(renv.local_rank)
        device = torch.device("xpu", renv.local_rank)
    else:
        device = torch.device("cpu")
        local = renv.local_world_size or plan.ranks_per_node
        torch.set_num_threads(max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) // local))
    if not dist.is_initialized():
        from runtime.startup import destroy_group_at_exit, warn_somaxconn

        warn_somaxconn(renv.rank, renv.world_size)  # every rank connects to the store at once
        dist.init_process_group(backend=backend, rank=renv.rank, world_size=renv.world_size)
        destroy_group_at_exit()
    return device
