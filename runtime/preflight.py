"""What `exaplan run` checks before it prepares data, creates the output folder or starts a
rank: every option (numbers finite and within bounds, paths that exist), whether torch can be
imported, and whether the plan's world fits this machine. Each refusal is one PlanError
naming the option (exit 2 in cli/main.py), so nothing is half-started or left behind.

No torch here at import time: `require_torch` is the one place that tries it.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from planner.schema.errors import PlanError

INSTALL_HINT = ("pip install torch==2.13.0 -e '.[runtime]' (from the repository; torch first so that pip takes "
                "the CPU build on a machine without a GPU), or `make demo`, which builds .venv with it")

# (option, attribute, lowest, highest), both allowed: integers.
_INTS = (
    ("--steps", "steps", 1, 10**9),
    ("--warmup", "warmup", 0, 10**9),
    ("--seed", "seed", 0, 2**63 - 1),
    ("--val-every", "val_every", 0, 10**9),
    ("--val-batches", "val_batches", 1, 10**6),
    ("--ckpt-every", "ckpt_every", 0, 10**9),
    ("--log-every", "log_every", 1, 10**9),
    ("--val-pairs", "val_pairs", 0, 10**9),
)
# (option, attribute, lower bound (excluded), upper bound (allowed)): floats; None = the default.
_FLOATS = (
    ("--lr", "lr", 0.0, 10.0),
    ("--beta", "beta", 0.0, 1e4),
)
MAX_PATH_CHARS = 4096


def check_options(args) -> None:
    """The numbers and paths of `exaplan run`'s options; raises PlanError naming the first bad one."""
    for flag, attr, low, high in _INTS:
        value = getattr(args, attr, None)
        if value is None:
            continue
        if not low <= value <= high:
            raise PlanError(f"must be an integer from {low:,} to {high:,}, got {value}", field=flag)
    for flag, attr, low, high in _FLOATS:
        value = getattr(args, attr, None)
        if value is None:
            continue
        if not (math.isfinite(value) and low < value <= high):
            raise PlanError(f"must be a finite number above {low:g} and at most {high:g}, got {value}", field=flag)
    eps = getattr(args, "label_smoothing", None)
    if eps is not None and not (math.isfinite(eps) and 0 <= eps < 0.5):
        raise PlanError(f"must be in [0, 0.5), got {eps}", field="--label-smoothing")
    _check_paths(args)


def _check_paths(args) -> None:
    for flag, attr in (("plan", "plan"), ("--out", "out"), ("--data", "data"), ("--pairs", "pairs"),
                       ("--init", "init"), ("--reference", "reference")):
        value = getattr(args, attr, None)
        if value is not None and (len(str(value)) > MAX_PATH_CHARS or "\0" in str(value)):
            raise PlanError(f"not a usable path ({len(str(value)):,} characters)", field=flag)
    if not str(args.out).strip():  # Path("") is the current directory: a run would write over ./plan.yaml
        raise PlanError("an empty path: give the run's output folder", field="--out")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise PlanError(f"{out} exists and is not a directory", field="--out")
    parent = _nearest_existing(out)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PlanError(f"cannot create or write {out}: {parent} is not a writable directory", field="--out")
    if args.data:
        text = str(args.data)
        paths = [text] if os.path.exists(text) else [p.strip() for p in text.split(",") if p.strip()]
        if not paths:
            raise PlanError("no FASTA files given", field="--data")
        for p in paths:
            if not os.path.exists(p):
                raise PlanError(f"{p}: no such file or directory", field="--data")
            if not os.access(p, os.R_OK):
                raise PlanError(f"{p}: not readable", field="--data")
    if getattr(args, "pairs", None) and not os.path.isdir(args.pairs):
        raise PlanError(f"{args.pairs}: no such directory", field="--pairs")
    # --init and --reference: runtime/dpo.check_args resolves the checkpoint (also before anything starts).


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def require_torch() -> None:
    """PlanError (exit 2, no traceback) with how to install it when torch cannot be found.
    Found, not imported: this process never uses torch (the ranks do), and importing it here
    put about a second before every run's first step (make bench-runtime)."""
    import importlib.util

    try:
        missing = sys.modules.get("torch", False) is None or importlib.util.find_spec("torch") is None
        why = "not installed"
    except (ImportError, ValueError) as e:
        missing, why = True, f"{type(e).__name__}: {e}"
    if missing:
        raise PlanError(f"needs torch, which cannot be imported here ({why}). Install the runtime "
                        f"extra: {INSTALL_HINT}", field="torch") from None


def host_memory_gib() -> float | None:
    """This host's physical memory (GiB), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# A CPU rank per core is the plan; up to this many per core still runs (slowly: tests and the
# local validation oversubscribe 2 cores with 4 ranks); beyond it the plan is for another machine.
MAX_RANKS_PER_CORE = 8


def check_fits_this_machine(plan, gpus: int | None = None, memory_gib: float | None = None) -> None:
    """Refuse a plan that `exaplan run` cannot start here (it starts one node's ranks through
    torchrun): several nodes, more ranks than GPUs (or far more than cores on a CPU), or more
    predicted memory than the host has. `gpus`: the visible GPUs (None: count them only if
    torch is already imported; 0 on a CPU). `memory_gib`: a device's memory as the plan's
    layout predicts it again (default: the plan's own figure)."""
    if plan.nodes != 1:
        raise PlanError(f"this plan spans {plan.nodes} nodes ({plan.world_size} ranks): start it on every node with "
                        f"srun, mpiexec or torchrun (each process then runs as one rank), or `exaplan launch`",
                        field="nodes")
    ranks = plan.ranks_per_node
    if gpus is None:
        gpus = _visible_gpus()
    if gpus:
        if ranks > gpus:
            raise PlanError(f"the plan starts {ranks} ranks on this node, one per device, but {gpus} GPUs are "
                            f"visible here", field="ranks_per_node")
        return
    cores = usable_cores()
    if ranks > MAX_RANKS_PER_CORE * cores:
        raise PlanError(f"the plan starts {ranks} ranks on this node, more than {MAX_RANKS_PER_CORE} per core of "
                        f"the {cores} here: it was made for another machine (plan for `--machine local`)",
                        field="ranks_per_node")
    host = host_memory_gib()
    each = max(plan.prediction.memory_gib_per_device, memory_gib or 0.0)
    need = each * ranks
    if host is not None and need > host:
        raise PlanError(f"the plan's {ranks} ranks need {need:,.1f} GiB predicted "
                        f"({each:,.2f} each); this host has {host:,.1f} GiB", field="memory")


def _visible_gpus() -> int:
    """GPUs the ranks will see: torch's count once torch is imported; before that (exaplan run
    starts torchrun without importing torch) the NVIDIA device files /dev/nvidiaN, narrowed by
    CUDA_VISIBLE_DEVICES where it is set."""
    import glob
    import re

    torch = sys.modules.get("torch")
    if torch is None:
        found = len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if found and visible is not None:
            found = min(found, len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")]))
        return found
    try:
        if torch.cuda.is_available():
            return torch.cuda.device_count()
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return torch.xpu.device_count()
    except Exception:  # noqa: BLE001 (a broken driver: count none, run on the CPU)
        return 0
    return 0
