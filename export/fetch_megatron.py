"""Unpack Megatron's own argument and config code where export/check_megatron.py finds it:
`python -m export.fetch_megatron [--dest DIR] [--fork GIT_DIR]`.

Megatron-LM's training package (megatron/training: parse_args, validate_args,
core_transformer_config_from_args) ships in the megatron-core wheel from 0.19 on, whose tag is
cp312 (Requires-Python >= 3.12); its Python files run on 3.11 as well (the one binary,
megatron/core/datasets/helpers_cpp*.so, is not imported by the argument code). So the wheel is
downloaded, not installed: pip fetches it for Python 3.12 and its megatron/ package is
unpacked into .venv/frameworks/megatron-core-0.19.2/, which the check puts first on sys.path.

`--fork GIT_DIR` also unpacks the Megatron-DeepSpeed fork that the MProt-DPO runs used
(ramanathanlab/Megatron-DeepSpeed, not on any package index) from a local clone of it, at the
pinned commit, into .venv/frameworks/megatron-deepspeed-<commit>/, and installs the two small
packages its argument code imports (six, regex), pinned, with the constraints file.

Idempotent: what is already unpacked at the pinned version is left as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from export.base import FETCH_MARKER, fetch_marker

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ROOT / ".venv" / "frameworks"

MEGATRON_CORE = "0.19.2"
CORE_DIR = FRAMEWORKS / f"megatron-core-{MEGATRON_CORE}"

# The branch of ramanathanlab/Megatron-DeepSpeed whose run_alcf_scaling_*.sh and
# ds_configs/*.json are the MProt-DPO scaling runs (dpo_training.py), its head commit.
FORK_REPO = "ramanathanlab/Megatron-DeepSpeed"
FORK_BRANCH = "aurora"
FORK_COMMIT = "f2da6e31d9258461593aeaacf6a5773ae02322ef"
FORK_DIR = FRAMEWORKS / f"megatron-deepspeed-{FORK_COMMIT[:7]}"
# What the fork's megatron/arguments.py imports beyond torch and deepspeed (megatron/tokenizer
# imports regex; megatron/data six), pinned; transformers it imports for a tokenizer class only
# (check_megatron puts a placeholder in its place).
FORK_PACKAGES = ("six==1.17.0", "regex==2026.11.15")

MARKER = FETCH_MARKER


def core_ready(dest: Path = CORE_DIR) -> bool:
    return fetch_marker(dest).get("megatron-core") == MEGATRON_CORE and (dest / "megatron/training/arguments.py").is_file()


def fork_ready(dest: Path = FORK_DIR) -> bool:
    return fetch_marker(dest).get("commit") == FORK_COMMIT and (dest / "megatron/arguments.py").is_file()


def fetch_core(dest: Path = CORE_DIR) -> str:
    """Download the megatron-core wheel for Python 3.12 and unpack its megatron/ package."""
    if core_ready(dest):
        return f"megatron-core {MEGATRON_CORE} already unpacked in {dest}"
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="exaplan-megatron-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
               f"megatron-core=={MEGATRON_CORE}", "-d", tmp, "-q"]
        subprocess.run(cmd, check=True)
        wheels = sorted(Path(tmp).glob("megatron_core-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"pip download left {len(wheels)} megatron-core wheels in {tmp}")
        wheel = wheels[0]
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=_parent(dest)))
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.startswith("megatron/")]
                zf.extractall(staging, members)
            (staging / MARKER).write_text(json.dumps({
                "megatron-core": MEGATRON_CORE, "wheel": wheel.name,
                "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), "files": len(members)}, indent=1) + "\n")
            _replace(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return f"unpacked {wheel.name} ({len(members)} files) into {dest} in {time.monotonic() - t0:.1f} s"


def fetch_fork(git_dir: Path, dest: Path = FORK_DIR, install: bool = True) -> str:
    """Unpack the fork's megatron/ and tools/ at FORK_COMMIT from a local clone (`git archive`)."""
    messages = []
    if install:
        constraints = ROOT / "constraints.txt"
        cmd = [sys.executable, "-m", "pip", "install", "-q", *FORK_PACKAGES] + (["-c", str(constraints)] if constraints.is_file() else [])
        subprocess.run(cmd, check=True)
        messages.append(f"installed {', '.join(FORK_PACKAGES)}")
    if fork_ready(dest):
        return "; ".join(messages + [f"{FORK_REPO} {FORK_COMMIT[:7]} already unpacked in {dest}"])
    t0 = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=_parent(dest)))
    try:
        archive = subprocess.run(["git", f"--git-dir={_git_dir(git_dir)}", "archive", "--format=tar", FORK_COMMIT,
                                  "megatron", "tools"], check=True, capture_output=True).stdout
        with tempfile.TemporaryFile() as f:
            f.write(archive)
            f.seek(0)
            with tarfile.open(fileobj=f) as tf:
                tf.extractall(staging, filter="data")
        (staging / MARKER).write_text(json.dumps({"repo": FORK_REPO, "branch": FORK_BRANCH, "commit": FORK_COMMIT}, indent=1) + "\n")
        _replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return "; ".join(messages + [f"unpacked {FORK_REPO} {FORK_COMMIT[:7]} (megatron/, tools/) into {dest} "
                                 f"in {time.monotonic() - t0:.1f} s"])


def _git_dir(path: Path) -> Path:
    """A bare repository, or the .git of a work tree."""
    return path / ".git" if (path / ".git").exists() else path


def _parent(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.parent


def _replace(staging: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.fetch_megatron", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dest", type=Path, default=CORE_DIR, help=f"where to unpack megatron-core (default {CORE_DIR})")
    p.add_argument("--fork", type=Path, metavar="GIT_DIR",
                   help=f"a local clone of {FORK_REPO} (git clone https://github.com/{FORK_REPO}): also unpack "
                        f"commit {FORK_COMMIT[:7]} (branch {FORK_BRANCH}) into {FORK_DIR}")
    p.add_argument("--fork-dest", type=Path, default=FORK_DIR, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    print(fetch_core(args.dest))
    if args.fork is not None:
        print(fetch_fork(args.fork, args.fork_dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
