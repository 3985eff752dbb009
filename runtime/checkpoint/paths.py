"""Where checkpoints live on disk: the step folders (`step-00000123/`), the markers of a
complete one, finding them (`list_checkpoints`, `latest`, `resolve`) and pruning old ones."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from planner.schema.errors import PlanError

COMPLETE = "COMPLETE"
META = "meta.json"
RNG_DIR = "rng"
OPTIM_DIR = "optimizer"
TMP_SUFFIX = ".tmp"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    return f"step-{int(step):08d}"


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint folder name (`step-00000123` -> 123), None for other names."""
    m = _STEP_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return checkpoint_step(path) is not None and (path / COMPLETE).is_file() and (path / META).is_file()


def list_checkpoints(dir: str | Path) -> list[Path]:
    """The complete checkpoints under `dir`, oldest step first (`.tmp` folders ignored)."""
    dir = Path(dir)
    if not dir.is_dir():
        return []
    found = [p for p in dir.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: checkpoint_step(p))


def latest(dir: str | Path) -> Path | None:
    """The newest complete checkpoint under `dir` (highest step), or None."""
    found = list_checkpoints(dir)
    return found[-1] if found else None


def resolve(path: str | Path) -> Path:
    """A checkpoint folder, or a folder of checkpoints (its latest); PlanError if none."""
    path = Path(path)
    if not path.exists():
        raise PlanError(f"no checkpoint at {path}", field="checkpoint")
    if checkpoint_step(path) is None and not path.name.endswith(TMP_SUFFIX):
        found = latest(path)
        if found is None:
            partial = sorted(p.name for p in path.iterdir() if p.name.startswith("step-")) if path.is_dir() else []
            extra = f" (only incomplete ones: {', '.join(partial)})" if partial else ""
            raise PlanError(f"no complete checkpoint in {path}{extra}", field="checkpoint")
        return found
    if not is_complete(path):
        why = ("an interrupted save (a .tmp folder)" if path.name.endswith(TMP_SUFFIX)
               else f"it has no {COMPLETE} marker: the save did not finish")
        newest = latest(path.parent)
        hint = f"; the latest complete checkpoint is {newest}" if newest else ""
        raise PlanError(f"incomplete checkpoint {path}: {why}{hint}", field="checkpoint")
    return path


def prune(dir: Path, keep: int, current: Path) -> None:
    """Keep `current` and the newest keep-1 other complete checkpoints; remove older ones and
    leftovers of interrupted saves of earlier steps."""
    step = checkpoint_step(current)
    others = [p for p in list_checkpoints(dir) if p != current]
    for p in others[: max(len(others) - (keep - 1), 0)]:
        shutil.rmtree(p, ignore_errors=True)
    for p in dir.iterdir():
        name = p.name
        if name.endswith(TMP_SUFFIX) or name.endswith(".old"):
            s = checkpoint_step(p.with_name(name.rsplit(".", 1)[0]))
            if s is not None and s <= step and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
