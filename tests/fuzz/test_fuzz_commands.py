"""Fuzzing the planning commands (plan, estimate, whatif, capacity) through their options and
--set over every field of the model and the machine: exit 0 or 2, never a traceback, and no
plan file when the command fails."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fuzz_harness import FUZZ, call, count, dotted_fields, numbers, yaml_values
from machine_models import load_machine
from planner.inputs import load_model

BASE = ["--model", "protein-tiny", "--machine", "dgx-h100"]
FIELDS = ([f"model.{f}" for f in dotted_fields(load_model("protein-tiny").model_dump(mode="json"))]
          + [f"machine.{f}" for f in dotted_fields(load_machine("dgx-h100").model_dump(mode="json"))]
          + ["model.nope", "machine.overlap.nope", "job.seq_len", "machine", "model.", "machine.nic_gbps"])
PLAN_OPTIONS = ["--nodes", "--global-batch", "--seq-len", "--token-budget", "--top", "--draws", "--tp", "--pp", "--dp",
                "--cp", "--mbs", "--vpp", "--shard-group"]
CHOICES = {"--precision": ["bf16", "fp16", "fp32", "fp8"], "--workload": ["pretrain", "dpo", "x"],
           "--framework": ["exaplan", "megatron", "deepspeed", "nope"], "--shard": ["none", "zero1", "hsdp", "fsdp"],
           "--recompute": ["none", "full", "x"], "--schedule": ["gpipe", "1f1b", "interleaved-1f1b"],
           "--reference": ["in-step", "precomputed"]}


def _options(names):
    """A few options, each with a hostile number or one of its choices."""
    numeric = st.tuples(st.sampled_from(names), numbers).map(lambda t: [f"{t[0]}={t[1]}"])
    choice = st.sampled_from(sorted(CHOICES)).flatmap(lambda o: st.sampled_from(CHOICES[o]).map(lambda v: [o, v]))
    return st.lists(numeric | choice, min_size=1, max_size=3).map(lambda xs: [a for x in xs for a in x])


@FUZZ
@given(opts=_options(PLAN_OPTIONS))
def test_plan_options(opts):
    count("plan options")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "p.yaml"
        rc, _, _ = call(["plan", *BASE, "--draws=20", "--top=1", *opts, "-o", out], outputs=[out])
        assert rc == 2 or out.exists()


@FUZZ
@given(field=st.sampled_from(FIELDS), value=yaml_values, nodes=st.sampled_from(["1", "2"]))
def test_plan_set_every_field(field, value, nodes):
    count("plan --set")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "p.json"
        rc, _, _ = call(["plan", *BASE, "--nodes", nodes, "--draws=10", "--top=1", "--set", f"{field}={value}",
                         "-o", out], outputs=[out])
        assert rc == 2 or out.exists()


@FUZZ
@given(opts=_options(["--nodes", "--global-batch", "--seq-len", "--token-budget", "--tp", "--pp", "--dp", "--cp",
                      "--mbs", "--vpp"]), field=st.sampled_from(FIELDS), value=yaml_values)
def test_estimate(opts, field, value):
    count("estimate")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "p.yaml"
        call(["estimate", *BASE, "--nodes=1", "--dp=8", "--mbs=1", "--global-batch=8", *opts,
              "--set", f"{field}={value}", "-o", out], outputs=[out])


WHATIF_OPTIONS = ["--tokens", "--deadline-days", "--knee", "--global-batch", "--batch-per-rank", "--seq-len"]
VARY = st.sampled_from(FIELDS).flatmap(lambda f: (numbers | st.sampled_from(["x0.5,x2", "1,2", "x0", "xnan", ","]))
                                       .map(lambda v: f"--vary={f.partition('.')[2] or f}={v}"))


@FUZZ
@given(opts=_options(WHATIF_OPTIONS), nodes=numbers | st.sampled_from(["1:2", "2:1", "1:1e30", "1,2", "0:4", ":", "1:2:4"]),
       vary=st.lists(VARY, max_size=2), alias=st.booleans())
def test_whatif_and_capacity(opts, nodes, vary, alias):
    count("whatif/capacity")
    with tempfile.TemporaryDirectory() as d:
        csv = Path(d) / "w.csv"
        cmd = ["capacity", *BASE, "--tokens=1e9"] if alias else ["whatif", *BASE, f"--nodes={nodes}", "--csv", csv]
        call([*cmd, *opts, *([] if alias else vary)], outputs=[] if alias else [csv])
