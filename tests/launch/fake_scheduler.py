"""Stand-ins for a cluster's commands, so that generated job scripts run on this machine:
`srun` (SLURM_* variables), `mpiexec` (Cray PALS style: PALS_RANKID, PALS_LOCAL_RANKID,
PALS_LOCAL_SIZE, PMI_RANK, PMI_SIZE), `sbcast` (a copy), `scontrol` (hostnames; requeue is
recorded in $FAKE_LOG), `qsub` (recorded in $FAKE_LOG).

srun takes CSCS's `--environment=EDF` (Container Engine) and `--uenv=IMAGE --view=VIEW` and ignores them
(recorded in $FAKE_LOG): no container starts, the ranks run on this machine as they are.

Every "node" is this machine. The launchers apply the CPU binding they are given (srun
--cpu-bind=mask_cpu:..., mpiexec --cpu-bind list:...), forward SIGTERM/SIGUSR1 to the ranks,
and exit with the highest exit code of their ranks. With FAKE_SIGNAL_AT_STEP=k and
FAKE_METRICS=PATH, srun sends SIGUSR1 to every rank once PATH records step k, as Slurm's
--signal does near the walltime.

Usage: fake_scheduler.py COMMAND ARGS... (the shims on PATH call it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time


def _log(text: str) -> None:
    path = os.environ.get("FAKE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def _cores(spec: str) -> list[set[int]]:
    """Per local rank: srun mask_cpu:0x1,0x2 or mpiexec list:0:1-3."""
    if spec.startswith("mask_cpu:"):
        return [{i for i in range(256) if int(m, 16) >> i & 1} for m in spec[9:].split(",")]
    if spec.startswith("list:"):
        out = []
        for part in spec[5:].split(":"):
            cores = set()
            for r in part.split(","):
                lo, _, hi = r.partition("-")
                cores.update(range(int(lo), int(hi or lo) + 1))
            out.append(cores)
        return out
    return []


def _parse(args: list[str], with_value: set[str]) -> tuple[dict[str, str], list[str]]:
    opts, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        if "=" in a:
            k, v = a.split("=", 1)
            opts[k] = v
        elif a in with_value:
            opts[a] = args[i + 1]
            i += 1
        else:
            opts[a] = ""
        i += 1
    return opts, args[i:]


def _spawn(command: list[str], envs: list[dict[str, str]], binds: list[set[int]]) -> int:
    procs = []
    ncpu = os.cpu_count() or 1
    for k, extra in enumerate(envs):
        cores = binds[int(extra["_LOCAL"]) % len(binds)] if binds else None
        cores = {c for c in cores if c < ncpu} if cores else None
        env = {**os.environ, **{k2: v for k2, v in extra.items() if not k2.startswith("_")}}
        procs.append(subprocess.Popen(command, env=env,
                                      preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores else None))

    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGUSR1, forward)
    _signal_at_step(procs)
    return max(p.wait() for p in procs)


def _signal_at_step(procs) -> None:
    step, metrics = os.environ.get("FAKE_SIGNAL_AT_STEP"), os.environ.get("FAKE_METRICS")
    if not (step and metrics) or os.environ.get("SLURM_STEP_ONCE_PER_NODE"):
        return
    while any(p.poll() is None for p in procs):
        try:
            with open(metrics) as f:
                steps = [json.loads(line).get("step", -1) for line in f if line.strip()]
        except (OSError, ValueError):
            steps = []
        if steps and max(steps) >= int(step):
            _log(f"signal USR1 at step {max(steps)}")
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGUSR1)
            return
        time.sleep(0.2)


def srun(args: list[str]) -> int:
    opts, command = _parse(args, {"-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "-c", "--cpus-per-task",
                                  "--cpu-bind", "--environment", "--uenv", "--view"})
    for name in ("--environment", "--uenv", "--view"):  # CSCS's container engine and uenv: accepted, ignored
        if name in opts:
            _log(f"srun {name}={opts[name]}")
    nodes = int(opts.get("--nodes", opts.get("-N", "1")))
    per_node = int(opts.get("--ntasks-per-node", "1"))
    binds = _cores(opts.get("--cpu-bind", ""))
    world = nodes * per_node
    envs = [{"SLURM_PROCID": str(r), "SLURM_NTASKS": str(world), "SLURM_LOCALID": str(r % per_node),
             "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_NODEID": str(r // per_node), "SLURM_NNODES": str(nodes),
             "_LOCAL": str(r % per_node)} for r in range(world)]
    if per_node == 1:
        os.environ["SLURM_STEP_ONCE_PER_NODE"] = "1"
    return _spawn(command, envs, binds)


def mpiexec(args: list[str]) -> int:
    opts, command = _parse(args, {"-n", "--np", "--ppn", "--cpu-bind", "--depth", "-d"})
    world = int(opts.get("-n", opts.get("--np", "1")))
    per_node = int(opts.get("--ppn", str(world)))
    binds = _cores(opts.get("--cpu-bind", ""))
    envs = [{"PALS_RANKID": str(r), "PALS_LOCAL_RANKID": str(r % per_node), "PALS_LOCAL_SIZE": str(per_node),
             "PALS_NODEID": str(r // per_node), "PMI_RANK": str(r), "PMI_SIZE": str(world), "PMI_LOCAL_RANK": str(r % per_node),
             "_LOCAL": str(r % per_node)} for r in range(world)]
    return _spawn(command, envs, binds)


def sbcast(args: list[str]) -> int:
    _, rest = _parse(args, set())
    shutil.copyfile(rest[0], rest[1])
    return 0


def scontrol(args: list[str]) -> int:
    if args[:2] == ["show", "hostnames"]:
        print("localhost")
        return 0
    _log("scontrol " + " ".join(args))
    return 0


def qsub(args: list[str]) -> int:
    _log("qsub " + " ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit({"srun": srun, "mpiexec": mpiexec, "sbcast": sbcast, "scontrol": scontrol, "qsub": qsub}[sys.argv[1]](
        sys.argv[2:]))
