"""The job script, assembled from checked inputs (`Job`) in numbered sections: header, job
variables, modules and environment, start-up limits, environment staging, the ranks, requeue.

Every value from a plan or a machine file is shell-quoted (`shlex.quote`) or, in scheduler
header lines that no shell reads, restricted to a safe alphabet (launch/job.py); environment
names pass the allow-list of planner/schema/launch.py. The start-up lessons of the seed runs are
built in: `ulimit -n` raised to the hard limit and a warning when the listen backlog
(/proc/sys/net/core/somaxconn) is below the rank count (the TCP store takes one connection per
rank); the Python environment packed once and unpacked on node-local storage, so that ranks
import nothing from the parallel file system; per-rank logs (OUT/logs/rank-N.out); a
checkpoint before the walltime ends and a requeue that continues with --resume.
"""

from __future__ import annotations

import re
import shlex

from launch import schedulers
from launch.job import SOURCE_PACKAGES, Job, REPO_ROOT

q = shlex.quote
EXIT_REQUEUE = 85  # `exaplan run` saved a checkpoint on the walltime signal (runtime/options.py)


def expand(template: str) -> str:
    """A path template as one shell word: {user} and {job} expand at run time, the rest is quoted."""
    parts = re.split(r"(\{user\}|\{job\})", template)
    words = {"{user}": '"${USER:-exaplan}"', "{job}": '"${JOB_ID}"'}
    return "".join(words.get(p, q(p) if p else "") for p in parts) or "''"


def render(job: Job) -> str:
    sections = [_top(job), _variables(job), _environment(job), _limits(job), _staging(job), _ranks(job),
                _after(job)]
    return "\n".join(line for section in sections for line in section) + "\n"


def _top(job: Job) -> list[str]:
    lines = ["#!/bin/bash", *schedulers.header(job),
             f"# exaplan launch: {job.scheduler.value} job for machine {_comment(job.machine.name)}, "
             f"{job.nodes} node(s) x {job.ranks_per_node} ranks",
             f"# written by: {_comment(job.command_line)}"]
    lines += [f"# {_comment(note)}" for note in job.notes]
    return lines + ["set -euo pipefail", ""]


def _comment(text: str) -> str:
    return " ".join(str(text).split())  # one line: a newline would end the comment


def _variables(job: Job) -> list[str]:
    lines = ["# 1. The job", *schedulers.job_vars(job),
             f"OUT={q(str(job.out))}",
             f'MASTER_PORT="${{MASTER_PORT:-29500}}"',
             f"WORLD_SIZE_PLANNED={job.world_size}",
             *(["# shellcheck disable=SC2034  # the ranks run the container's python3, not ${PY}"]
               if job.container is not None and not job.runs_once else []),
             f"PY={q(str(job.python_prefix / 'bin' / 'python'))}",
             f"CODE={q(str(REPO_ROOT))}",
             'mkdir -p "${OUT}/logs"',
             "export MASTER_ADDR MASTER_PORT JOB_ID", ""]
    return lines


def _environment(job: Job) -> list[str]:
    s = job.settings
    lines = ["# 2. Modules and the environment of the collective library and the fabric (machine file, then plan)"]
    lines += [f"module load {q(m)}" for m in s.modules]
    env: dict[str, str] = {}
    if s.cpus_per_rank:
        env["OMP_NUM_THREADS"] = str(s.cpus_per_rank)
    if s.ib_hca:
        env["NCCL_IB_HCA"] = s.ib_hca
        ucx = ucx_net_devices(s.ib_hca)
        if ucx:
            env["UCX_NET_DEVICES"] = ucx
    if s.socket_ifname:
        env.update(NCCL_SOCKET_IFNAME=s.socket_ifname, GLOO_SOCKET_IFNAME=s.socket_ifname)
    env.update(job.env)
    lines += [f"export {name}={q(value)}" for name, value in env.items()]
    if s.collective_plugin_dir:
        lines.append(f'export LD_LIBRARY_PATH={q(s.collective_plugin_dir)}"${{LD_LIBRARY_PATH:+:${{LD_LIBRARY_PATH}}}}"')
    return lines + [""]


def _limits(job: Job) -> list[str]:
    return [
        "# 3. Start-up limits: one socket per rank on the TCP store's host",
        'ulimit -n "$(ulimit -Hn)" 2>/dev/null || echo "exaplan: warning: could not raise ulimit -n" >&2',
        "somaxconn=$(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo 0)",
        'if [ "${somaxconn}" -lt "${WORLD_SIZE_PLANNED}" ]; then',
        '    echo "exaplan: warning: /proc/sys/net/core/somaxconn is ${somaxconn}, below the ${WORLD_SIZE_PLANNED} ranks' +
        ' that connect to the TCP store at once; start-up may stall (ask the site to raise it)" >&2',
        "fi", ""]


def _staging(job: Job) -> list[str]:
    if job.container is not None:
        runtime = job.settings.container.runtime
        return [f"# 4. Environment staging: off inside a container ({runtime}): the ranks run the container's "
                "python3,", "#    which must hold exaplan's dependencies; ${CODE} and ${OUT} must be visible in it"
                + (" (the EDF's mounts)" if job.settings.container.launcher_option else " (bound)"), ""]
    if job.stage == "off":
        return ["# 4. Environment staging: off (ranks run from ${PY})", ""]
    prefix = job.python_prefix
    pack_dir = (job.out / "stage")
    pack = ([f"    tar -cf \"${{STAGE_TAR}}.part\" -C {q(str(prefix.parent))} {q(prefix.name)} -C {q(str(REPO_ROOT))} "
             + " ".join(SOURCE_PACKAGES)] if job.stage == "venv" else
            [f'    conda-pack -p {q(str(prefix))} -o "${{STAGE_TAR}}.env.tar.gz" --force',
             f'    tar -cf "${{STAGE_TAR}}.part" -C "$(dirname "${{STAGE_TAR}}")" "$(basename "${{STAGE_TAR}}").env.tar.gz" '
             f"-C {q(str(REPO_ROOT))} " + " ".join(SOURCE_PACKAGES)])
    unpack = 'set -e; mkdir -p "$1"; tar -xf "$2" -C "$1"'
    if job.stage == "conda":
        unpack += '; mkdir -p "$1/env"; tar -xzf "$1"/*.env.tar.gz -C "$1/env"; "$1/env/bin/conda-unpack"'
    python = f'"${{STAGE_DIR}}/{prefix.name}/bin/python"' if job.stage == "venv" else '"${STAGE_DIR}/env/bin/python"'
    return [
        f"# 4. Environment staging ({job.stage}): pack {prefix} and exaplan's code once, unpack it on every node's",
        "#    local storage, run from there: no rank imports from the parallel file system",
        *(["#    (the uenv is mounted on every node by srun --uenv: a venv made on the uenv's python links into it)"]
          if job.uenv else []),
        f"LOCAL_SCRATCH={expand(job.settings.local_scratch)}",
        'LOCAL_SCRATCH="${EXAPLAN_LOCAL_SCRATCH:-${LOCAL_SCRATCH}}"',
        'STAGE_DIR="${LOCAL_SCRATCH}/exaplan-${JOB_ID}"',
        f"STAGE_TAR={q(str(pack_dir / (job.stage + '-env.tar')))}",
        'STAGE_TAR="${EXAPLAN_STAGE_TAR:-${STAGE_TAR}}"',
        'if [ ! -s "${STAGE_TAR}" ]; then',
        '    mkdir -p "$(dirname "${STAGE_TAR}")"',
        '    echo "exaplan: packing the environment into ${STAGE_TAR} (once: later jobs reuse it; delete it to repack)"',
        *pack,
        '    mv "${STAGE_TAR}.part" "${STAGE_TAR}"',
        "fi",
        *schedulers.broadcast(job),
        "# shellcheck disable=SC2016  # $1 and $2 expand in the per-node shell",
        f"{schedulers.per_node(job)} bash -c {q(unpack)} exaplan-stage \"${{STAGE_DIR}}\" \"${{NODE_TAR}}\"".lstrip(),
        f"PY={python}",
        'CODE="${STAGE_DIR}"',
        'echo "exaplan: staged on every node: ${STAGE_DIR}"', ""]


def _rank_command(job: Job) -> list[str]:
    """python -m launch.rank [options] -- <exaplan arguments>, as shell words."""
    s = job.settings
    words = [] if schedulers.launcher_runs_python(job) else ['"${PY}"']
    words += ["-m", "launch.rank", "--rank-log-dir", '"${OUT}/logs"']
    if s.cpu_sets and job.scheduler.value == "torchrun":
        words += ["--bind-cpus", q(";".join(s.cpu_sets))]
    if s.miopen_cache_dir:
        words += ["--miopen-cache", expand(s.miopen_cache_dir)]
    if job.entry:
        words += ["--entry", q(job.entry)]
    return words + ["--"] + [q(a) for a in job.exaplan_args]


def ucx_net_devices(hca: str) -> str | None:
    """UCX_NET_DEVICES for an NCCL_IB_HCA value, in UCX's device:port form (mlx5_0 -> mlx5_0:1),
    or None where NCCL's value is a prefix (mlx5: every HCA) or an exclusion (^...), which UCX
    cannot express: UCX then uses every device, as it does by default."""
    text = hca.removeprefix("=")
    if text.startswith("^"):
        return None
    devices = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        if not re.fullmatch(r"[A-Za-z0-9]+_\d+(:\d+)?", item):
            return None
        devices.append(item if ":" in item else f"{item}:1")
    return ",".join(devices) or None


GPU_FLAGS = {"nccl": "--nv", "rccl": "--rocm"}  # apptainer/singularity exec: the host's driver and devices


def _container_gpu_flags(job: Job) -> list[str]:
    """apptainer's and singularity's GPU option for the machine's devices (NVIDIA --nv, AMD --rocm):
    without it the container sees no GPU. Intel GPUs need none (/dev/dri is bound with /dev)."""
    flag = GPU_FLAGS.get(job.machine.collective_library.value)
    return [flag] if flag and flag not in job.settings.container.options else []


def _container(job: Job, rank: list[str]) -> list[str]:
    """The rank command in the container: the container's python3 runs it (staging is off in a container).
    apptainer / singularity wrap it (`exec --bind CODE,OUT,... --pwd CODE IMAGE`); with an EDF the container is
    srun's --environment (schedulers.launcher) and its mounts are the EDF's, so only the working directory is
    set here: an EDF's workdir (default: the image's) is not the folder srun was started in."""
    if job.container is None:
        return rank
    c = job.settings.container
    if c.launcher_option:
        python = ["python3"] if rank[0] == '"${PY}"' else []
        return ["env", '--chdir="${CODE}"', *python, *rank[1:]]
    binds = ",".join(['"${CODE}"', '"${OUT}"'] + [q(b) for b in c.binds])
    python = ["python3"] if rank[0] == '"${PY}"' else []
    return [c.runtime, "exec", *_container_gpu_flags(job), "--bind", binds, "--pwd", '"${CODE}"',
            *[q(o) for o in c.options], q(str(job.container)), *python, *rank[1:]]


def _wrap(words: list[str], width: int = 100) -> str:
    """Shell words on continued lines of about `width` characters."""
    lines, line = [], ""
    for word in words:
        if line and len(line) + len(word) + 1 > width:
            lines.append(line)
            line = "   "
        line = f"{line} {word}" if line else word
    return " \\\n".join(lines + [line])


def _arrival(job: Job) -> list[str]:
    """calibrate --arrival, once, in this shell (the first node): its --launcher is the scheduler's
    launch command, then the rank wrapper in --command mode (binding, open files, MIOpen cache,
    the staged or container interpreter), to which arrival appends `PYTHON -m cli ...`."""
    s = job.settings
    rank = ['"${PY}"', "-m", "launch.rank"]
    if s.cpu_sets and job.scheduler.value == "torchrun":
        rank += ["--bind-cpus", q(";".join(s.cpu_sets))]
    if s.miopen_cache_dir:
        rank += ["--miopen-cache", expand(s.miopen_cache_dir)]
    words = [*schedulers.arrival_launcher(job), *_container(job, rank + ["--command", "--"])]
    command = ['"${PY}"', "-m", "cli", *[q(a) for a in job.exaplan_args], "--launcher", '"${LAUNCHER_LINE}"']
    return [f"# 5. Calibrate on arrival: ONCE, from this shell on the job's first node; it starts the measurement and",
            "#    every run of its sweep on all nodes through LAUNCHER (the scheduler's launch command and the rank",
            "#    wrapper), each step's output in ${OUT}/logs/measure.log or ${OUT}/runs/LAYOUT/run.log",
            _wrap(["LAUNCHER=(" + words[0], *map(_array_word, words[1:])]) + ")",
            "# calibrate --arrival splits --launcher as a shell would: the words joined with shlex",
            'LAUNCHER_LINE="$("${PY}" -c \'import shlex, sys; print(shlex.join(sys.argv[1:]))\' "${LAUNCHER[@]}")"',
            'cd "${CODE}"',
            'echo "exaplan: calibrate on arrival over ${WORLD_SIZE_PLANNED} ranks through: ${LAUNCHER_LINE}"',
            "set +e", _wrap(command) + " &", "LAUNCHER_PID=$!",
            "# The scheduler's signals, forwarded to calibrate --arrival",
            "trap 'kill -s TERM \"${LAUNCHER_PID}\" 2>/dev/null || true' TERM USR1",
            'while :; do wait "${LAUNCHER_PID}"; rc=$?; kill -0 "${LAUNCHER_PID}" 2>/dev/null || break; done',
            "set -e", 'echo "exaplan: calibrate on arrival finished with exit code ${rc}"', ""]


def _array_word(word: str) -> str:
    """A word in a bash array: a bare comma (--cpu-bind=mask_cpu:0x1,0x2) quoted, for shellcheck (SC2054)."""
    return f"'{word}'" if "," in word and not set(word) & set("'\"$\\") else word


def _ranks(job: Job) -> list[str]:
    if job.runs_once:
        return _arrival(job)
    resume = ['RESUME=()',
              'if compgen -G "${OUT}/checkpoints/step-*/COMPLETE" >/dev/null; then RESUME=(--resume); fi'] \
        if job.resumable else ['RESUME=()']
    command = [*schedulers.launcher(job), *_container(job, _rank_command(job)), '${RESUME[@]+"${RESUME[@]}"}']
    lines = ["# 5. The ranks: one process per device, each logging to ${OUT}/logs/rank-N.out", *resume,
             'cd "${CODE}"',
             'echo "exaplan: starting ${WORLD_SIZE_PLANNED} ranks; rendezvous ${MASTER_ADDR}:${MASTER_PORT}"',
             "set +e", _wrap(command) + " &", "LAUNCHER_PID=$!"]
    if job.resumable:
        lines += ["# The scheduler's signals, forwarded: the ranks save a checkpoint and exit 85. SIGTERM to this",
                  "# shell is a cancel (scancel, qdel): the checkpoint is saved but the job is not requeued",
                  "CANCELLED=0",
                  "trap 'kill -s TERM \"${LAUNCHER_PID}\" 2>/dev/null || true' USR1",
                  "trap 'CANCELLED=1; kill -s TERM \"${LAUNCHER_PID}\" 2>/dev/null || true' TERM"]
    else:
        lines += ["# The scheduler's signals, forwarded to the ranks",
                  "trap 'kill -s TERM \"${LAUNCHER_PID}\" 2>/dev/null || true' TERM USR1"]
    if schedulers.watchdog(job):
        delay = max(1, job.walltime_s - job.settings.signal_grace_s)
        lines += [f"# PBS has no --signal: a watchdog tells the ranks to save {job.settings.signal_grace_s} s before "
                  "the walltime",
                  f"( trap 'kill \"${{nap}}\" 2>/dev/null; exit 0' TERM; sleep {delay} & nap=$!; wait \"${{nap}}\" && "
                  'echo "exaplan: walltime near: asking the ranks to checkpoint" && kill -s TERM "${LAUNCHER_PID}" ) &',
                  "WATCHDOG_PID=$!"]
    # wait returns >128 when a trap interrupts it; a launcher that ended meanwhile is waited for
    # once more, for its own exit code (85 after a checkpoint), which bash keeps until then
    lines += ['while :; do wait "${LAUNCHER_PID}"; rc=$?; kill -0 "${LAUNCHER_PID}" 2>/dev/null || break; done',
              'if [ "${rc}" -gt 128 ]; then wait "${LAUNCHER_PID}" 2>/dev/null; last=$?; '
              'if [ "${last}" -ne 127 ]; then rc=${last}; fi; fi']
    if schedulers.watchdog(job):
        lines.append('kill "${WATCHDOG_PID}" 2>/dev/null || true')
    return lines + ["set -e", 'echo "exaplan: ranks finished with exit code ${rc}"',
                    'tail -n 5 "${OUT}/logs/rank-0.out" 2>/dev/null || true', ""]


def _after(job: Job) -> list[str]:
    if not job.resumable:
        return ["# 6. Done", 'exit "${rc}"']
    limit = job.settings.max_requeues
    return [
        f"# 6. Requeue: exit {EXIT_REQUEUE} means a checkpoint was saved before the walltime; the next job resumes.",
        "#    A cancelled job is not requeued; any other end starts the next job of this --out with a fresh count",
        f'if [ "${{rc}}" -eq {EXIT_REQUEUE} ] && [ "${{CANCELLED}}" -eq 0 ]; then',
        '    requeues=$(( $(cat "${OUT}/logs/requeues" 2>/dev/null || echo 0) + 1 ))',
        f'    if [ "${{requeues}}" -le {limit} ]; then',
        '        echo "${requeues}" > "${OUT}/logs/requeues"',
        f'        echo "exaplan: checkpoint saved before the walltime; requeue ${{requeues}} of {limit} (continues with --resume)"',
        *["        " + line for line in schedulers.requeue(job)],
        "    else",
        '        rm -f "${OUT}/logs/requeues"',
        f'        echo "exaplan: {limit} requeues done; resubmit this script to continue" >&2',
        "    fi",
        "else",
        '    rm -f "${OUT}/logs/requeues"',
        f'    if [ "${{rc}}" -eq {EXIT_REQUEUE} ]; then',
        '        echo "exaplan: cancelled: the checkpoint is saved, the job is not requeued; resubmit this script to continue" >&2',
        "    fi",
        "fi",
        'exit "${rc}"']
