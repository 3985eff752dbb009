"""Fuzzing the bounds on what a command reads (issue 51, part 4): documents nested to any
depth in any shape (flow and block YAML, JSON, mixed), and special files (devices, FIFOs,
directories, links to devices, binary, empty and over-size files) given to every command that
reads a file: exit 0 or 2, never a traceback, nothing written; over MAX_NESTING levels or a
special file, always 2 with the reason. A SIGALRM guard turns a hang (a FIFO opened for
reading) into a failure instead of a stuck suite."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzz_harness import FUZZ, call, count
from planner.inputs import load_model
from planner.schema.files import MAX_INPUT_BYTES, MAX_NESTING

ROOT = Path(__file__).resolve().parents[2]
PLAN_TEXT = (ROOT / "plans" / "gpu" / "demo_1gpu.yaml").read_text()
MODEL_TEXT = yaml.safe_dump(load_model("protein-tiny").model_dump(mode="json"))


def nested(shape: str, depth: int) -> str:
    """A value nested `depth` collections deep, as YAML (flow or block) or JSON."""
    if shape == "flow-list":
        return "[" * depth + "]" * depth
    if shape == "flow-map":
        return "{a: " * depth + "1" + "}" * depth
    if shape == "json":
        return '{"a": ' * depth + "1" + "}" * depth
    if shape == "mixed":
        opens = "".join("[" if i % 2 else '{"a": ' for i in range(depth))
        return opens + "1" + "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    if shape == "block-seq":
        return "- " * depth + "x"
    # block-map: one key per line, each indented under the last (2 d^2 bytes: capped at 1,200 levels)
    depth = min(depth, 1200)
    return "\n".join("  " * i + "a:" for i in range(depth)) + " 1" if depth else "1"


SHAPES = ["flow-list", "flow-map", "json", "mixed", "block-seq", "block-map"]
DEPTHS = st.sampled_from([0, 1, MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 900, 999, 1000, 1001, 3000]) | \
    st.integers(0, 1500)


def _document(shape: str, depth: int, where: str) -> str:
    """The nested value as a whole file, or under a field of a real model / plan."""
    value = nested(shape, depth)
    if where == "whole":
        return value
    base = MODEL_TEXT if where == "in-model" else PLAN_TEXT
    if shape.startswith("block"):  # a block value starts on the next line, indented
        value = "\n" + "\n".join("  " + line for line in value.splitlines())
    return base + f"\nextra: {value}\n"


@contextlib.contextmanager
def alarm(seconds: int):
    def hung(signum, frame):
        raise AssertionError(f"a command hung for {seconds} s reading its input")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _argvs(f: Path, d: Path) -> dict[str, tuple[list, list]]:
    """Per reader: (argv, the outputs it must not write on failure)."""
    out, script, fitted = d / "p.yaml", d / "job.sh", d / "fitted.yaml"
    return {
        "plan --model": (["plan", "--model", f, "--machine", "dgx-h100", "--draws=0", "--top=1", "-o", out], [out]),
        "plan --machine": (["plan", "--model", "protein-tiny", "--machine", f, "--draws=0", "--top=1", "-o", out],
                           [out]),
        "explain": (["explain", f], []),
        "launch": (["launch", f, "--scheduler=torchrun", "--stage-env=off", "-o", script], [script]),
        "check": (["check", f, "--no-step"], []),
        "validate --kernels": (["validate", "--kernels", f], []),
        "calibrate --from-runs": (["calibrate", "--from-runs", f.parent, "-o", fitted], [fitted]),
    }


READERS = sorted(_argvs(Path("x"), Path("y")))


def _place(reader: str, d: Path, name: str = "input.yaml") -> Path:
    """Where the reader's file goes: a run folder's summary.json for calibrate --from-runs."""
    if reader == "calibrate --from-runs":
        run = d / "run"
        run.mkdir()
        (run / "plan.yaml").write_text(PLAN_TEXT)
        return run / "summary.json"
    return d / name


@FUZZ
@given(shape=st.sampled_from(SHAPES), depth=DEPTHS, where=st.sampled_from(["whole", "in-model", "in-plan"]),
       reader=st.sampled_from(READERS))
def test_nesting_depth(shape, depth, where, reader):
    count("nesting depth")
    if shape == "block-seq" and where != "whole":
        where = "whole"  # a block sequence under a key needs its own indentation: the whole file
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        f = _place(reader, d)
        f.write_text(_document(shape, depth, where))
        argv, outputs = _argvs(f, d)[reader]
        with alarm(120):
            rc, _, err = call(argv, outputs=outputs)
        json_reader = reader in ("validate --kernels", "calibrate --from-runs")
        if depth > MAX_NESTING + 1 and not (json_reader and shape.startswith("block")):
            # (the whole file, or one level more under `extra:`; block YAML is no JSON at all)
            assert rc == 2 and "nested" in err, err


SPECIAL = ["/dev/zero", "/dev/urandom", "/dev/null", "fifo", "directory", "link-to-/dev/zero", "binary", "empty",
           "over-size", "not-utf8"]


def _special(kind: str, f: Path, data: bytes) -> Path:
    """Make `f` the special file `kind` (or return the device itself)."""
    if kind.startswith("/dev/"):
        return Path(kind)
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "directory":
        f.mkdir()
    elif kind == "link-to-/dev/zero":
        f.symlink_to("/dev/zero")
    elif kind == "binary":
        f.write_bytes(data + b"\0")
    elif kind == "empty":
        f.write_bytes(b"")
    elif kind == "over-size":
        with open(f, "wb") as h:  # sparse: nothing is written but its size
            h.truncate(MAX_INPUT_BYTES + 1)
    else:
        f.write_bytes(b"name: x\n" + data + b"\xc3\x28\n")
    return f


@FUZZ
@given(kind=st.sampled_from(SPECIAL), reader=st.sampled_from(READERS), data=st.binary(max_size=200))
def test_special_files(kind, reader, data):
    count("special files")
    if kind.startswith("/dev/") and not Path(kind).exists():
        return
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        f = _place(reader, d, "input.json")
        if kind.startswith("/dev/") and reader == "calibrate --from-runs":
            f.symlink_to(kind)  # a run folder whose summary.json is the device
        else:
            f = _special(kind, f, data) if not kind.startswith("/dev/") else Path(kind)
        argv, outputs = _argvs(f, d)[reader]
        with alarm(60):
            rc, _, err = call(argv, outputs=outputs)
        assert rc == 2, err
