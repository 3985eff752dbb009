"""One rank's start inside a job script: `python -m launch.rank --rank-log-dir DIR [...] -- ARGS` sends
this process's output to DIR/rank-N.out, raises its open-file limit to the hard limit, binds it
to its cores where no launcher did (torchrun), gives it its own MIOpen cache, says which
interpreter and code it runs (sys.prefix: the staged copy or not), then replaces itself with
`python -m cli ARGS` (the same process: signals and the exit code reach the scheduler as they
are); with `--entry E` (exaplan launch --framework) it runs the framework's entry point E with
ARGS instead, torch.distributed's rank variables exported from the launcher's. No torch and
nothing of exaplan imported here.

With `--command` (the tail of `exaplan calibrate --arrival --launcher "srun ... python -m
launch.rank --command --"`) the words after `--` are a whole command that the launcher was
given: `PYTHON -m cli ARGS` (what calibrate --arrival appends) runs as this interpreter's
`-m cli ARGS` (the staged copy, or the container's python3), anything else as it is. Without
--rank-log-dir the output stays with the launcher (calibrate --arrival keeps a log per step).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
from pathlib import Path

# (rank, local rank) variables of each launcher, in the order runtime/launch.py reads them.
RANK_VARS = (("RANK", "LOCAL_RANK"), ("SLURM_PROCID", "SLURM_LOCALID"), ("PALS_RANKID", "PALS_LOCAL_RANKID"),
             ("PMI_RANK", "MPI_LOCALRANKID"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"))


def rank_of(env: dict[str, str]) -> tuple[int, int]:
    for rank, local in RANK_VARS:
        if rank in env:
            return int(env[rank]), int(env.get(local, 0))
    return 0, 0


# (world size, local world size) of each launcher, in the order of RANK_VARS.
SIZE_VARS = (("WORLD_SIZE", "LOCAL_WORLD_SIZE"), ("SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"), ("PALS_SIZE", "PALS_LOCAL_SIZE"),
             ("PMI_SIZE", "MPI_LOCALNRANKS"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"))


def torch_env(env: dict[str, str]) -> dict[str, str]:
    """torch.distributed's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) from the
    launcher's, for a framework's entry point that reads only those (Megatron, torchtitan,
    DeepSpeed under srun or mpiexec: ALCF's and CSCS's recipes export them the same way);
    what is already set stays."""
    out = {}
    for (rank, local), (size, local_size) in zip(RANK_VARS, SIZE_VARS):
        if rank in env:
            out = {"RANK": env[rank], "LOCAL_RANK": env.get(local, "0")}
            if size in env:
                out["WORLD_SIZE"] = env[size]
            if local_size in env:
                out["LOCAL_WORLD_SIZE"] = env[local_size].split("(")[0]  # Slurm: "4(x2)"
            break
    return {k: v for k, v in out.items() if k not in env}


def _cores(cpu_set: str) -> set[int]:
    cores: set[int] = set()
    for part in cpu_set.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m launch.rank")
    ap.add_argument("--rank-log-dir", help="folder of the per-rank logs (default: output to the launcher)")
    ap.add_argument("--bind-cpus", help="cores of each local rank, ';'-separated cpulists (torchrun)")
    ap.add_argument("--miopen-cache", help="node-local MIOpen cache folder (one per rank below it)")
    ap.add_argument("--command", action="store_true",
                    help="the words after -- are a whole command (PYTHON -m cli ARGS: this interpreter's)")
    ap.add_argument("--entry", help="run this framework entry point instead of exaplan: a .py script, or a module "
                                    "(run with -m), with the words after -- as its arguments")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of exaplan")
    ns = ap.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if ns.command and not args:
        ap.error("--command needs a command after --")
    rank, local = rank_of(dict(os.environ))
    if ns.rank_log_dir:
        logs = Path(ns.rank_log_dir)
        logs.mkdir(parents=True, exist_ok=True)
        fd = os.open(logs / f"rank-{rank}.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    _raise_nofile()
    if ns.bind_cpus:
        sets = ns.bind_cpus.split(";")
        try:
            os.sched_setaffinity(0, _cores(sets[local % len(sets)]))
        except (OSError, AttributeError) as e:
            print(f"exaplan launch: warning: cannot bind rank {rank} to cores {sets[local % len(sets)]}: {e}",
                  flush=True)
    if ns.miopen_cache:
        cache = Path(ns.miopen_cache) / f"rank-{local}"
        cache.mkdir(parents=True, exist_ok=True)
        os.environ["MIOPEN_USER_DB_PATH"] = os.environ["MIOPEN_CUSTOM_CACHE_DIR"] = str(cache)
    code = Path(__file__).resolve().parents[1]
    print(f"exaplan launch: rank {rank} (local {local}) on {socket.gethostname()}: sys.prefix={sys.prefix} "
          f"code={code} open files={resource.getrlimit(resource.RLIMIT_NOFILE)[0]}", flush=True)
    if ns.entry:
        os.environ.update(torch_env(dict(os.environ)))
        target = [ns.entry] if ns.entry.endswith(".py") else ["-m", ns.entry]
        os.execv(sys.executable, [sys.executable, *target, *args])
    if ns.command and args[1:3] != ["-m", "cli"]:
        os.execvp(args[0], args)
    if ns.command:
        args = args[3:]
    os.execv(sys.executable, [sys.executable, "-m", "cli", *args])


if __name__ == "__main__":
    main()
