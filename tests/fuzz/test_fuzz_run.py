"""Fuzzing `exaplan run`'s options: whatever they hold, the command ends with exit 0 or 2,
never a traceback, and leaves no output folder. The plan is a 2-node plan, which this
machine refuses after the options are checked (runtime/preflight.py), so no example starts
a rank: every example exercises the option parsing and checks without training."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_harness import FUZZ, call, count, numbers, texts

NUMERIC = ["--steps", "--seed", "--lr", "--warmup", "--val-every", "--val-batches", "--ckpt-every", "--log-every",
           "--beta", "--label-smoothing", "--val-pairs"]
PATHS = ["--data", "--init", "--pairs", "--reference"]
FLAGS = ["--resume", "--compile", "--log-samples", "--precompute-reference"]
CHOICES = [["--io-mode", "real"], ["--io-mode", "synthetic"], ["--io-mode", "io-only"], ["--io-mode", "nope"]]


@pytest.fixture(scope="module")
def two_node_plan():
    with tempfile.TemporaryDirectory() as d:
        plan = Path(d) / "plan.yaml"
        rc, _, err = call(["plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--nodes", "2", "--top", "1",
                           "--draws", "0", "-o", plan], outputs=[])
        assert rc == 0 and plan.exists(), err
        yield plan


def _options():
    numeric = st.tuples(st.sampled_from(NUMERIC), numbers).map(lambda t: [f"{t[0]}={t[1]}"])
    path = st.tuples(st.sampled_from(PATHS), texts).map(lambda t: [f"{t[0]}={t[1]}"])
    flag = st.sampled_from(FLAGS).map(lambda f: [f])
    choice = st.sampled_from(CHOICES)
    return st.lists(numeric | path | flag | choice, min_size=1, max_size=4).map(lambda xs: [a for x in xs for a in x])


@FUZZ
@given(opts=_options())
def test_run_options(two_node_plan, opts):
    count("run options")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        rc, _, err = call(["run", two_node_plan, *opts, "--out", out], outputs=[out])
        assert rc == 2, err  # the options, or else the 2-node plan on this machine
        assert not out.exists()
