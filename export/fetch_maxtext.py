"""Unpack MaxText's own config and mesh code where export/check_maxtext.py finds it:
`python -m export.fetch_maxtext [--dest DIR]`.

MaxText 0.2.5 is one pure-Python wheel (py3-none-any) whose metadata says Requires-Python >=
3.12 and whose base install has no dependencies (all in its tpu/cuda12 extras). Its config
loader (maxtext/configs/pyconfig.py, types.py) and mesh helpers (maxtext/utils/max_utils.py,
maxtext_utils.py) run on Python 3.11 with the jax and flax of exaplan's own environment. So the
wheel is downloaded for Python 3.12, not installed: its maxtext/ package is unpacked into
.venv/frameworks/maxtext-0.2.5/, and the modules that its import chain needs beyond the venv
are installed beside it, pinned, without their dependencies (--no-deps, with the constraints
file, into .venv/frameworks/maxtext-0.2.5/deps): none of them pulls torch.

Idempotent: what is already unpacked at the pinned versions is left as it is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from export.base import FETCH_MARKER, fetch_marker

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ROOT / ".venv" / "frameworks"
MAXTEXT = "0.2.5"
DEST = FRAMEWORKS / f"maxtext-{MAXTEXT}"
# What `from maxtext.configs import pyconfig` and `from maxtext.utils import maxtext_utils`
# import beyond exaplan's environment (jax 0.10, flax, optax, orbax, numpy, pydantic, yaml are
# there), found by importing them: omegaconf (the YAML loader), pathwaysutils (elastic_utils),
# fastapi/starlette/uvicorn (pathwaysutils' profiler), transformers + regex (tokenizer ids in
# utils/globals), grain + array_record + cloudpickle (input pipeline types), portpicker, drjax,
# jaxtyping + wadler_lindig, qwix and aqtp (quantization layers).
PACKAGES = ("omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3", "pathwaysutils==0.1.13", "fastapi==0.165.0",
            "starlette==1.10.0", "annotated-doc==0.0.7", "uvicorn==0.54.0", "transformers==5.24.0",
            "regex==2026.11.19", "grain==0.2.18", "cloudpickle==3.1.3", "portpicker==1.6.0", "array-record==0.8.6",
            "drjax==0.2.1", "jaxtyping==0.3.11", "wadler-lindig==0.1.8", "qwix==0.1.8", "aqtp==0.9.0")
MARKER = FETCH_MARKER


def ready(dest: Path = DEST) -> bool:
    mark = fetch_marker(dest)
    return (mark.get("maxtext") == MAXTEXT and mark.get("packages") == list(PACKAGES)
            and (dest / "maxtext/configs/base.yml").is_file() and (dest / "deps").is_dir())


def fetch(dest: Path = DEST) -> str:
    """Download the maxtext wheel for Python 3.12, unpack its maxtext/ package, install the pins."""
    if ready(dest):
        return f"maxtext {MAXTEXT} already unpacked in {dest}"
    t0 = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dest = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="exaplan-maxtext-") as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.12", f"maxtext=={MAXTEXT}", "-d", tmp, "-q"], check=True)
            wheels = sorted(Path(tmp).glob("maxtext-*.whl"))
            if len(wheels) != 1:
                raise SystemExit(f"pip download left {len(wheels)} maxtext wheels in {tmp}")
            with zipfile.ZipFile(wheels[0]) as z:
                z.extractall(tmp_dest, [n for n in z.namelist() if n.startswith("maxtext/")])
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(tmp_dest / "deps"),
                        "-c", str(ROOT / "constraints.txt"), "-q", *PACKAGES], check=True)
        (tmp_dest / MARKER).write_text(json.dumps({"maxtext": MAXTEXT, "packages": list(PACKAGES)}, indent=1) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp_dest.rename(dest)
    except BaseException:
        shutil.rmtree(tmp_dest, ignore_errors=True)
        raise
    return f"maxtext {MAXTEXT} unpacked in {dest} with {len(PACKAGES)} pinned packages ({time.monotonic() - t0:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.fetch_maxtext", description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=DEST, help=f"folder to unpack into (default {DEST})")
    args = p.parse_args(argv)
    print(fetch(args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
