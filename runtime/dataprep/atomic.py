"""Writing an output directory atomically: into a fresh temporary directory next to it, then
renamed into place (replacing an existing one only once the new one is complete); on error
the temporary directory and the parents created for it are removed. Used by prepare.py and
pairs.py."""

from __future__ import annotations

import os
import secrets
import shutil

from planner.schema.errors import PlanError


def fresh_dir(parent: str, prefix: str) -> str:
    """A new empty directory with the usual permissions (tempfile.mkdtemp's are 0700)."""
    for _ in range(100):
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise PlanError(f"{parent}: cannot create a temporary directory")


def makedirs(path: str) -> list[str]:
    """os.makedirs, returning the directories it created (outermost first)."""
    missing = []
    p = path
    while p and not os.path.exists(p):
        missing.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=True)
    return list(reversed(missing))


def discard(tmp: str | None, created: list[str]) -> None:
    """After a failed write: remove the temporary directory and the parents it created."""
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    for d in reversed(created):
        try:
            os.rmdir(d)
        except OSError:
            pass


def install(tmp: str, out: str) -> None:
    """Rename the finished `tmp` to `out`; an existing `out` is replaced only after the rename
    succeeded (restored if it failed)."""
    if not os.path.exists(out):
        os.rename(tmp, out)
        return
    old = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.old-{secrets.token_hex(4)}")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
