"""What differs between schedulers, as data and small functions: the header, the job id and
first host, the command that runs once per node, the command that starts the ranks with their
binding, how the staged environment reaches the nodes, and how a job is requeued.

Slurm gets `--signal=USR1@grace` (the ranks save a checkpoint and exit 85) and `--requeue`;
PBS Pro has no such option, so the script runs a watchdog that sends SIGTERM to mpiexec
(which forwards it to the ranks) `grace` seconds before the walltime ends.
"""

from __future__ import annotations

import shlex

from launch.job import Job
from planner.schema.launch import SchedulerKind, cpu_set_cores, header_value_problem

q = shlex.quote
RANK_EXIT_WAIT_S = 60  # srun --wait: how long the other ranks may run on after the first has ended


def _safe(value: str) -> bool:
    return header_value_problem(value) is None


def cpu_mask(cpu_set: str) -> str:
    """A cpulist as the hex mask srun's --cpu-bind=mask_cpu takes ("49-55" -> "0xfe000000000000")."""
    return hex(sum(1 << c for c in cpu_set_cores(cpu_set)))


def header(job: Job) -> list[str]:
    if job.scheduler == SchedulerKind.slurm:
        return _slurm_header(job)
    if job.scheduler == SchedulerKind.pbs:
        return _pbs_header(job)
    return []


def _slurm_header(job: Job) -> list[str]:
    s = job.settings
    lines = [f"--job-name={job.name}", f"--nodes={job.nodes}", f"--ntasks-per-node={job.ranks_per_node}"]
    if s.cpus_per_rank:
        lines.append(f"--cpus-per-task={s.cpus_per_rank}")
    if s.gpus_per_node:
        lines.append(f"--gpus-per-node={s.gpus_per_node}")
    lines.append(f"--time={job.walltime}")
    if job.account:
        lines.append(f"--account={job.account}")
    if job.queue:
        lines.append(f"--partition={job.queue}")
    if job.resumable:
        lines += [f"--signal=USR1@{s.signal_grace_s}", "--requeue", "--open-mode=append"]
    log = str(job.out / "logs" / "job-%j.out")
    if _safe(log):
        lines.append(f"--output={log}")
    lines += [f"--{k}={v}" for k, v in s.slurm_options.items()]
    if job.uenv:  # the batch shell gets the uenv too, and every srun inherits it (CSCS docs, "uenv in Slurm")
        lines.append(f"--uenv={job.uenv}")
        if job.uenv_view:
            lines.append(f"--view={job.uenv_view}")
    return [f"#SBATCH {line}" for line in lines]


def _pbs_header(job: Job) -> list[str]:
    s = job.settings
    lines = [f"-N {job.name}", f"-l select={job.nodes}", f"-l walltime={job.walltime}"]
    lines += [f"-l {k}={v}" for k, v in s.pbs_resources.items()]
    if job.account:
        lines.append(f"-A {job.account}")
    if job.queue:
        lines.append(f"-q {job.queue}")
    lines.append("-j oe")
    log = str(job.out / "logs" / "job.out")
    if _safe(log):
        lines.append(f"-o {log}")
    if job.resumable:
        lines.append("-r y")
    return [f"#PBS {line}" for line in lines]


def job_vars(job: Job) -> list[str]:
    """JOB_ID and MASTER_ADDR (the rendezvous: the job's first host)."""
    if job.scheduler == SchedulerKind.slurm:
        return ['JOB_ID="${SLURM_JOB_ID:?not inside a Slurm job (submit with sbatch)}"', *_slurm_first_node()]
    if job.scheduler == SchedulerKind.pbs:
        return ['JOB_ID="${PBS_JOBID:?not inside a PBS job (submit with qsub)}"',
                'MASTER_ADDR="$(head -n 1 "${PBS_NODEFILE}")"']
    # torchrun: the same rendezvous id on every node; the first node from MASTER_ADDR, else from the
    # allocation this script runs in (`srun bash job.sh` in a Slurm job, one per node; a PBS node file)
    lines = ['JOB_ID="${EXAPLAN_JOB_ID:-${SLURM_JOB_ID:-${PBS_JOBID:-torchrun}}}"']
    if job.nodes == 1:
        return lines + ['MASTER_ADDR="${MASTER_ADDR:-localhost}"']
    return lines + [
        'if [ -z "${MASTER_ADDR:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then',
        *["    " + line for line in _slurm_first_node()],
        'elif [ -z "${MASTER_ADDR:-}" ] && [ -n "${PBS_NODEFILE:-}" ]; then',
        '    MASTER_ADDR="$(head -n 1 "${PBS_NODEFILE}")"',
        "fi",
        'MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the first node (run this script on every node)}"']


def _slurm_first_node() -> list[str]:
    """MASTER_ADDR: the address of the job's first node as Slurm reaches it (its NodeAddr), which is its
    name unless the site gives the node another address (a name of the node list need not resolve)."""
    # sed, not head: head stops reading at the first line, and scontrol, still writing a long node list, would
    # die of SIGPIPE, which `set -o pipefail` turns into the script's end
    return ['FIRST_NODE="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | sed -n 1p)"',
            'MASTER_ADDR="$(scontrol show node -o "${FIRST_NODE}" 2>/dev/null | sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\')" || MASTER_ADDR=""',
            'MASTER_ADDR="${MASTER_ADDR:-${FIRST_NODE}}"']


def per_node(job: Job) -> str:
    """A command prefix that runs what follows once on every node of the job."""
    if job.scheduler == SchedulerKind.slurm:
        return f"srun --nodes={job.nodes} --ntasks-per-node=1"
    if job.scheduler == SchedulerKind.pbs:
        return f"mpiexec -n {job.nodes} --ppn 1"
    return ""  # torchrun: this script runs on every node


def broadcast(job: Job) -> list[str]:
    """Lines that give each node the tarball as NODE_TAR (Slurm: sbcast onto node-local storage;
    PBS and torchrun: each node reads the one file once)."""
    if job.scheduler == SchedulerKind.slurm:
        return ['NODE_TAR="${LOCAL_SCRATCH}/exaplan-${JOB_ID}.tar"',
                'sbcast --force "${STAGE_TAR}" "${NODE_TAR}"']
    return ['NODE_TAR="${STAGE_TAR}"']


def launcher(job: Job) -> list[str]:
    """The command (as shell words) that starts every rank; the rank command follows it."""
    s = job.settings
    if job.scheduler == SchedulerKind.slurm:
        # --wait: once one rank has ended, the others get RANK_EXIT_WAIT_S, then srun ends them: a rank
        # that is refused (a busy --out: only rank 0 takes the lock) or dies leaves the others blocked in
        # the rendezvous or a collective until the walltime otherwise. The ranks of a run that ends or
        # stops for a requeue leave together (a barrier before each exit: runtime/trainer.py).
        words = ["srun", f"--nodes={job.nodes}", f"--ntasks-per-node={job.ranks_per_node}",
                 f"--wait={RANK_EXIT_WAIT_S}"]
        if s.cpus_per_rank:
            words.append(f"--cpus-per-task={s.cpus_per_rank}")
        if s.cpu_sets:
            words.append("--cpu-bind=" + q("mask_cpu:" + ",".join(cpu_mask(c) for c in s.cpu_sets)))
        if job.container is not None and s.container is not None and s.container.launcher_option:
            words.append("--environment=" + q(job.container))  # CSCS Container Engine: the EDF
        if job.uenv:
            words.append("--uenv=" + q(job.uenv))
            if job.uenv_view:
                words.append("--view=" + q(job.uenv_view))
        return words
    if job.scheduler == SchedulerKind.pbs:
        words = ["mpiexec", "--envall", "-n", str(job.world_size), "--ppn", str(job.ranks_per_node)]
        if s.cpu_sets:
            words += ["--cpu-bind", q("list:" + ":".join(s.cpu_sets))]
        return words
    # torchrun's c10d rendezvous on the first node: the agents of all nodes meet there (the one on that
    # host serves the store) and agree the node ranks, so no node needs to be told its NODE_RANK
    return ['"${PY}"', "-m", "torch.distributed.run", f"--nnodes={job.nodes}",
            f"--nproc-per-node={job.ranks_per_node}", "--rdzv-backend=c10d",
            '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"', '--rdzv-id="${JOB_ID}"', "--max-restarts=0"]


def arrival_launcher(job: Job) -> list[str]:
    """The launcher that `calibrate --arrival` puts in front of each of its steps (a program and its
    arguments follow): srun / mpiexec as for a training run; torchrun (one node only:
    launch.calibrate_job) standalone with --no-python, since arrival's command starts with the
    interpreter."""
    if job.scheduler == SchedulerKind.torchrun:
        return ['"${PY}"', "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={job.ranks_per_node}", "--max-restarts=0", "--no-python"]
    return launcher(job)


def launcher_runs_python(job: Job) -> bool:
    """torchrun is itself Python: it is followed by `-m launch.rank`, not by the interpreter."""
    return job.scheduler == SchedulerKind.torchrun


def requeue(job: Job) -> list[str]:
    if job.scheduler == SchedulerKind.slurm:
        return ['scontrol requeue "${JOB_ID}"']
    if job.scheduler == SchedulerKind.pbs:
        return [f"qsub {q(str(job.script))}"]
    return ['echo "exaplan: run this script again (on every node) to continue from the checkpoint"']


def watchdog(job: Job) -> bool:
    """Whether the script itself signals the ranks before the walltime (PBS has no --signal)."""
    return job.resumable and job.scheduler == SchedulerKind.pbs
