"""Fuzzing the commands that read files: model and machine YAML files, plan files (explain,
launch), FASTA files (data prepare), pairs tables (data pairs), run folders (calibrate
--from-runs), and the argument parsing of schema, list and validate: exit 0 or 2, never a
traceback, nothing half-written."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import tempfile
from functools import lru_cache
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzz_harness import FUZZ, call, count, dotted_fields, numbers, set_dotted, texts, yaml_values
from machine_models import load_machine
from planner.inputs import load_model
from planner.schema.plan import load_plan

MODEL = load_model("protein-tiny").model_dump(mode="json")
MACHINE = load_machine("dgx-h100").model_dump(mode="json")


def _value(v):
    try:
        return yaml.safe_load(v)
    except yaml.YAMLError:
        return v


def _mutated(base: dict, fields: list[str]):
    """`base` with one field set to a hostile value, deleted, or an unknown field added."""
    return st.tuples(st.sampled_from(fields), yaml_values, st.sampled_from(["set", "delete", "unknown"])).map(
        lambda t: _apply(base, *t))


def _apply(base, field, value, how):
    data = copy.deepcopy(base)
    if how == "delete":
        data.pop(field.split(".")[0], None)
    elif how == "unknown":
        data[f"{field}_x"] = 1
    else:
        set_dotted(data, field, _value(value))
    return data


@FUZZ
@given(model=_mutated(MODEL, dotted_fields(MODEL)) | st.just(None), machine=_mutated(MACHINE, dotted_fields(MACHINE)),
       raw=st.none() | texts | st.binary(max_size=60))
def test_model_and_machine_files(model, machine, raw):
    count("spec files")
    with tempfile.TemporaryDirectory() as d:
        mf, cf, out = Path(d) / "m.yaml", Path(d) / "c.yaml", Path(d) / "p.yaml"
        if raw is None:
            mf.write_text(yaml.safe_dump(model if model is not None else MODEL))
        else:
            (mf.write_bytes if isinstance(raw, bytes) else mf.write_text)(raw)
        cf.write_text(yaml.safe_dump(machine))
        call(["plan", "--model", mf, "--machine", cf, "--draws=10", "--top=1", "-o", out], outputs=[out])


@lru_cache(maxsize=1)
def _plan_text() -> str:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "p.yaml"
        rc, _, err = call(["plan", "--model", "protein-tiny", "--machine", "dgx-h100", "--draws=10", "-o", out])
        assert rc == 0, err
        return out.read_text()


@FUZZ
@given(field=st.sampled_from(sorted(dotted_fields(yaml.safe_load(_plan_text())) + ["collectives.env.LD_PRELOAD",
                                    "collectives.env.NCCL_ALGO", "collectives.env.PYTHONPATH", "collectives.env.MY"])),
       value=yaml_values, reseal=st.booleans(), launch=st.booleans())
def test_plan_files_explain_and_launch(field, value, reseal, launch):
    count("plan files")
    data = yaml.safe_load(_plan_text())
    set_dotted(data, field, _value(value))
    with tempfile.TemporaryDirectory() as d:
        path, script = Path(d) / "plan.yaml", Path(d) / "job.sh"
        if reseal:  # a tamperer recomputes the hash: the plan's own checks must still hold
            data["provenance"]["content_hash"] = ""
            canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
            data["provenance"]["content_hash"] = hashlib.sha256(canonical.encode()).hexdigest()
        text = yaml.safe_dump(data)
        path.write_text(text)
        if launch:
            rc, _, _ = call(["launch", path, "--scheduler=torchrun", "--stage-env=off", "-o", script], outputs=[script])
        else:
            rc, _, _ = call(["explain", path])
        if rc == 0:
            env = load_plan(path).collectives.env
            assert not [k for k in env if k.startswith(("LD_", "PYTHON")) or k == "PATH"]


FASTA_LINES = st.lists(st.sampled_from([">p1 a protein", ">", "MKTAYIAKQR", "mktayiakqr", "ACDEFGHIKLMNPQRSTVWY" * 20,
                                        "XBZUO*", "", " ", "1234", ">\u00e9\u4e2d", "M" * 5000]) | texts, max_size=12)


@FUZZ
@given(lines=FASTA_LINES, gz=st.sampled_from(["plain", "gzip", "broken-gzip"]),
       opts=st.lists(st.sampled_from(["--max-len", "--val-fraction", "--seed"]).flatmap(
           lambda o: numbers.map(lambda v: f"{o}={v}")), max_size=2))
def test_data_prepare_fasta(lines, gz, opts):
    count("data prepare")
    with tempfile.TemporaryDirectory() as d:
        text = "\n".join(lines).encode("utf-8", "surrogatepass")
        f = Path(d) / ("s.fasta.gz" if gz != "plain" else "s.fasta")
        f.write_bytes(gzip.compress(text) if gz == "gzip" else (gzip.compress(text)[:12] if gz == "broken-gzip" else text))
        out = Path(d) / "out"
        rc, _, _ = call(["data", "prepare", f, "-o", out, "--no-progress", *opts], outputs=[out])
        assert rc == 2 or out.is_dir()


COLUMNS = ["sequence", "score", "seq", "fitness", "chosen", "rejected", "set", "x", "y", ""]
CELLS = st.sampled_from(["MKTAYIAKQR", "MKTAYIAKQA", "1.0", "-3", "nan", "inf", "", "train", "test", "\"", "a,b"]) | numbers


@FUZZ
@given(cols=st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=4), rows=st.lists(st.lists(CELLS, max_size=5),
       max_size=8), sep=st.sampled_from([",", "\t"]), opts=st.lists(st.sampled_from(
           ["--margin", "--val-fraction", "--max-pairs", "--pairs-per-sequence", "--max-len", "--seed"]).flatmap(
           lambda o: numbers.map(lambda v: f"{o}={v}")), max_size=2))
def test_data_pairs_tables(cols, rows, sep, opts):
    count("data pairs")
    with tempfile.TemporaryDirectory() as d:
        t = Path(d) / ("t.tsv" if sep == "\t" else "t.csv")
        t.write_text("\n".join(sep.join(r) for r in [cols, *rows]) + "\n", encoding="utf-8", errors="surrogatepass")
        out = Path(d) / "out"
        call(["data", "pairs", t, "-o", out, *opts], outputs=[out])


@FUZZ
@given(summary=st.none() | texts | st.dictionaries(st.sampled_from(["measured_step_time_s", "peak_memory_gib", "x"]),
                                                   numbers | st.none(), max_size=3).map(json.dumps),
       metrics=st.none() | texts, plan=st.sampled_from(["good", "garbage", "none"]))
def test_calibrate_from_runs(summary, metrics, plan):
    count("calibrate --from-runs")
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        run.mkdir()
        if summary is not None:
            (run / "summary.json").write_text(summary)
        if metrics is not None:
            (run / "metrics.jsonl").write_text(metrics)
        if plan != "none":
            (run / "plan.yaml").write_text(_plan_text() if plan == "good" else "{not: [a plan")
        out = Path(d) / "fitted.yaml"
        call(["calibrate", "--from-runs", run, "-o", out], outputs=[out])


@FUZZ
@given(cmd=st.sampled_from(["schema", "list", "validate"]), args=st.lists(
    st.sampled_from(["model", "machine", "job", "plan", "--devices", "--json", "--loo", "--refit", "--ranks",
                     "--steps", "--repeats", "--search-unstated", "--model", "x"]) | numbers | texts, max_size=4))
def test_schema_list_validate_arguments(cmd, args):
    count("schema/list/validate")
    if cmd == "validate":
        from cli.main import build_parser
        try:
            ns = build_parser().parse_args([cmd, *args])
        except SystemExit as e:
            assert e.code in (0, 2)
            return
        if ns.local or ns.published:
            return  # parsed: running them measures this machine or refits (not a fuzz's business)
    call([cmd, *args])
