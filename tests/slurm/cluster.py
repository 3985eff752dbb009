"""A private Slurm on this machine for the tests (tests/slurm/): munged on its own socket, one
slurmctld and one or two slurmd (`slurmd -N nodeK`, each on its own port and spool folder), all
state, spool, logs and keys in one temporary folder, SLURM_CONF pointing at it. Nothing of the
system's Slurm or munge (/etc/slurm, /run/munge) is used or touched.

    cluster = SlurmCluster(folder, nodes=2).start()   # waits until sinfo shows the nodes idle
    cluster.env                                       # os.environ + SLURM_CONF, for sbatch/srun/...
    cluster.stop()                                    # scancel everything, kill the daemons

`stop()` runs from the pytest fixture's finalizer and from atexit; it is idempotent. Debian 12
packages Slurm 22.05 (slurm-wlm, slurmctld, slurmd, munge): `make test-slurm` installs them.
Run as root (SlurmUser=root, slurmd needs it); proctrack/linuxproc and task/none: no cgroups.
cred_expire=10: a requeued job waits cred_expire + a little before it may start again (120 s by
default, which would make each requeue test wait two minutes).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "sinfo", "squeue", "scontrol", "sbcast")


def missing() -> str | None:
    """Why a private Slurm cannot start here, or None."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm slurmctld slurmd munge; make test-slurm)"
    if os.geteuid() != 0:
        return "slurmd must run as root (the private Slurm runs SlurmUser=root)"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SlurmCluster:
    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2, name: str = "exaplantest"):
        self.root = Path(root)
        self.nodes = nodes
        self.cpus = cpus
        self.name = name
        self.node_names = [f"node{i + 1}" for i in range(nodes)]
        self.procs: dict[str, int] = {}  # daemon -> pid (read from its pid file)
        self.stopped = False
        self.conf = self.root / "etc" / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        for k in [k for k in self.env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del self.env[k]

    # --- set-up --------------------------------------------------------------------------------

    def _write_config(self) -> None:
        r = self.root
        for d in ("etc", "munge", "state", "log", "run", *(f"spool/{n}" for n in self.node_names)):
            (r / d).mkdir(parents=True, exist_ok=True)
        ctld_port, *node_ports = free_ports(1 + self.nodes)
        self.node_ports = dict(zip(self.node_names, node_ports))
        nodes = "\n".join(
            f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname=localhost Port={p} CPUs={self.cpus} "
            f"RealMemory=1000 State=UNKNOWN" for n, p in self.node_ports.items())
        self.conf.write_text(f"""\
# a private Slurm for exaplan's tests (tests/slurm/cluster.py)
ClusterName={self.name}
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket},cred_expire=10
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
LaunchParameters=use_interactive_step
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=5
UnkillableStepTimeout=60
JobRequeue=1
MaxJobCount=1000
{nodes}
PartitionName=debug Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        (r / "etc" / "cgroup.conf").write_text("# not used: proctrack/linuxproc, task/none\nCgroupPlugin=autodetect\n"
                                               "IgnoreSystemd=yes\n")

    def _munge(self) -> None:
        m = self.root / "munge"
        key = m / "munge.key"
        if not key.exists():
            subprocess.run(["dd", "if=/dev/urandom", f"of={key}", "bs=1024", "count=1"], check=True,
                           capture_output=True)
            key.chmod(0o400)
        subprocess.run([_which("munged"), "--force", f"--socket={self.socket}", f"--key-file={key}",
                        f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"],
                       check=True, capture_output=True, timeout=30)
        self.procs["munged"] = self._pid(m / "munged.pid")

    def _pid(self, path: Path, timeout: float = 20) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                return int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                time.sleep(0.1)
        raise RuntimeError(f"no pid file {path}:\n{self.logs()}")

    def start(self, timeout: float = 60) -> "SlurmCluster":
        atexit.register(self.stop)
        try:
            self._write_config()
            self._munge()
            run = self.root / "run"
            subprocess.run([_which("slurmctld"), "-f", str(self.conf)], check=True, env=self.env, capture_output=True,
                           timeout=30)
            self.procs["slurmctld"] = self._pid(run / "slurmctld.pid")
            for n in self.node_names:
                subprocess.run([_which("slurmd"), "-f", str(self.conf), "-N", n], check=True, env=self.env,
                               capture_output=True, timeout=30)
                self.procs[f"slurmd-{n}"] = self._pid(run / f"slurmd-{n}.pid")
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_idle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        states = ""
        while time.monotonic() < end:
            p = self.cmd("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = p.stdout
            got = dict(line.split() for line in states.splitlines() if len(line.split()) == 2)
            if all(got.get(n) == "idle" for n in self.node_names):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the nodes are not idle after {timeout} s: {states!r}\n{self.logs()}")

    # --- use -----------------------------------------------------------------------------------

    def cmd(self, *args: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        p = subprocess.run(list(args), capture_output=True, text=True, env=kw.pop("env", self.env), timeout=timeout,
                           **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def sbatch(self, script: Path, *options: str, env: dict | None = None) -> str:
        p = self.cmd("sbatch", "--parsable", *options, str(script), cwd=str(script.parent),
                     env=env or self.env)
        return p.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """scontrol show job's fields (JobState, Restarts, ExitCode, ...); {} once the job is forgotten."""
        p = self.cmd("scontrol", "show", "job", "-o", job_id, check=False)
        fields = {}
        for word in p.stdout.split():
            if "=" in word:
                k, v = word.split("=", 1)
                fields.setdefault(k, v)
        return fields

    def wait(self, job_id: str, timeout: float = 600, done=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                            "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                                                            "DEADLINE", "PREEMPTED")) -> dict[str, str]:
        end = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < end:
            info = self.job(job_id)
            if info.get("JobState") in done:
                return info
            time.sleep(1)
        raise TimeoutError(f"job {job_id} not done after {timeout} s: {info}\n{self.logs()}")

    def node_log(self, node: str) -> str:
        path = self.root / "log" / f"slurmd-{node}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self, tail: int = 30) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")) + [self.root / "munge" / "munged.log"]:
            if f.exists():
                lines = f.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # --- tear-down -----------------------------------------------------------------------------

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if "slurmctld" in self.procs:
            for job in self.cmd("squeue", "-h", "-o", "%i", check=False, timeout=30).stdout.split():
                self.end_job(job, wait=20)
        for name in sorted(self.procs, key=lambda n: ("munged" in n, "slurmctld" in n)):  # slurmd, ctld, munged
            self._kill(self.procs[name])
        self.procs.clear()
        for pid in self.job_processes():  # slurmstepd and the ranks outlive slurmd: every process of this Slurm
            self._kill(pid, wait=2)

    def end_job(self, job_id: str, wait: float = 60) -> None:
        """End a job for good: not requeued again (an exaplan script requeues on exit 85), cancelled."""
        self.cmd("scontrol", "update", f"JobId={job_id}", "Requeue=0", check=False)
        self.cmd("scancel", "--signal=KILL", "--full", job_id, check=False)
        self.cmd("scancel", job_id, check=False)
        end = time.monotonic() + wait
        while time.monotonic() < end and self.job(job_id).get("JobState") in ("PENDING", "RUNNING", "COMPLETING",
                                                                              "REQUEUED", "CONFIGURING"):
            time.sleep(0.5)

    def job_processes(self) -> list[int]:
        """Processes whose environment names this Slurm's SLURM_CONF (slurmd passes it on to slurmstepd, and
        sbatch exports it to the job): only what this cluster started."""
        mark, found = f"SLURM_CONF={self.conf}".encode(), []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                try:
                    if mark in (proc / "environ").read_bytes().split(b"\0"):
                        found.append(int(proc.name))
                except OSError:
                    pass
        return found

    @staticmethod
    def _kill(pid: int, wait: float = 10) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
