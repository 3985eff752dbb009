"""runtime.dataprep.pairs: DPO preference pairs from the shipped GB1 sample, explicit pair files, CSV/TSV/
gzip input, and bad input through the real CLI (exit 2, a message naming the field, nothing
written)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from planner.schema.errors import PlanError
from runtime.dataprep.pairs_report import describe_pairs
from runtime.dataprep.pairs import FORMAT, HEADER, SPLITS, Pair, build_pairs, load_manifest, read_pairs
from runtime.dataprep.pairs_table import gb1_sample_path, read_scored_sequences

ROOT = Path(__file__).resolve().parents[2]
FILES = ("manifest.json", "train.tsv", "validation.tsv", "test.tsv")


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
            g.write(text.encode())
    else:
        path.write_text(text)
    return path


def gb1_rows() -> list[list[str]]:
    with gzip.open(gb1_sample_path(), "rt", newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def gb1(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gb1") / "pairs"
    return out, build_pairs(None, out)


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["data", "pairs", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


# --- the shipped sample --------------------------------------------------------------------------


def test_shipped_gb1_sample():
    path = gb1_sample_path()
    assert path.stat().st_size < 300_000
    rows = gb1_rows()
    assert rows[0] == ["set", "dist", "input_ct", "selected_ct", "y", "x"]
    sets = {r[0] for r in rows[1:]}
    assert sets == {"training", "validation", "test"}
    assert len(rows) - 1 == 6000
    assert all(len(r[5]) == 55 for r in rows[1:])
    attribution = (ROOT / "runtime" / "dataprep" / "samples" / "ATTRIBUTION.md").read_text()
    assert "gb1_sample.csv.gz" in attribution and "Olson" in attribution and "MIT" in attribution


def test_gb1_pairs(gb1):
    out, rep = gb1
    m = load_manifest(out)
    assert m["format"] == FORMAT and m["version"] == 1
    assert m["columns"] == {"sequence": "x", "score": "y", "split": "set"}
    assert m["source"]["rows"] == 6000 and len(m["source"]["sha256"]) == 64
    assert m["counts"]["train"] > 0 and m["counts"]["validation"] > 0 and m["counts"]["test"] > 0
    assert rep["counts"] == m["counts"] and rep["rows"]["read"] == 6000
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    pairs = {s: read_pairs(out, s) for s in SPLITS}
    for s in SPLITS:
        assert len(pairs[s]) == m["counts"][s]
        assert (out / f"{s}.tsv").read_text().split("\n", 1)[0] == HEADER
        for p in pairs[s]:
            assert isinstance(p, Pair) and p.chosen != p.rejected
            assert p.chosen_score - p.rejected_score >= m["margin"] == 0.5
            assert p.chosen.isupper() and p.chosen.isalpha() and len(p.chosen) == 55
        diffs = [p.chosen_score - p.rejected_score for p in pairs[s]]
        assert min(diffs) == pytest.approx(m["difference_stats"][s]["min"])
    # no leakage: no sequence of a validation (or test) pair is in the train split, nor in a train pair
    train_split = set(read_scored_sequences(None, "x", "y", "train").sequences)
    assert len(train_split) == 4800
    train_pairs = {q for p in pairs["train"] for q in (p.chosen, p.rejected)}
    for s in ("validation", "test"):
        held_out = {q for p in pairs[s] for q in (p.chosen, p.rejected)}
        assert held_out and not held_out & train_split and not held_out & train_pairs
    # aliases and the describe text
    assert read_pairs(out, "val") == pairs["validation"]
    assert "validation" in describe_pairs(out) and "margin 0.5" in describe_pairs(out)


def test_deterministic_and_seeded(gb1, tmp_path):
    out, _ = gb1
    build_pairs(None, tmp_path / "same")
    for name in FILES:
        assert (tmp_path / "same" / name).read_bytes() == (out / name).read_bytes(), name
    build_pairs(None, tmp_path / "other", seed=1)
    assert (tmp_path / "other" / "train.tsv").read_bytes() != (out / "train.tsv").read_bytes()
    assert json.loads((tmp_path / "other" / "manifest.json").read_text())["seed"] == 1


def test_options_margin_pairs_per_sequence_max_pairs(gb1, tmp_path):
    _, rep = gb1
    more = build_pairs(None, tmp_path / "k4", pairs_per_sequence=4, margin=2.0)
    assert more["counts"]["train"] > rep["counts"]["train"]
    assert all(p.chosen_score - p.rejected_score >= 2.0 for p in read_pairs(tmp_path / "k4", "train"))
    capped = build_pairs(None, tmp_path / "cap", max_pairs=100)
    assert capped["counts"] == {"train": 100, "validation": 100, "test": 100}
    zero = build_pairs(None, tmp_path / "zero", margin=0)
    assert all(p.chosen_score > p.rejected_score for p in read_pairs(tmp_path / "zero", "validation"))
    assert zero["identical_pairs_dropped"] == 0


def test_read_scored_sequences_matches_the_split():
    val = read_scored_sequences(None, "x", "y", split="validation")
    assert len(val.sequences) == 600 == len(val.scores)
    rows = [r for r in gb1_rows()[1:] if r[0] == "validation"]
    assert val.sequences == [r[5] for r in rows]
    assert val.scores.tolist() == [float(r[4]) for r in rows]
    assert len(read_scored_sequences(None, split="all").sequences) == 6000


def test_cli_default_input_and_json(capsys, tmp_path):
    rc, out, err = run(capsys, "-o", tmp_path / "p", "--json")
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["source"]["path"] == str(gb1_sample_path()) and rep["counts"]["train"] > 0
    rc, out, err = run(capsys, "-o", tmp_path / "q")
    assert rc == 0 and "validation" in out and "rows dropped: none" in out and "pairs" in out
    rc, out, err = run(capsys, "-o", tmp_path / "q", "--overwrite", "--seed", "3")
    assert rc == 0 and load_manifest(tmp_path / "q")["seed"] == 3


def test_cli_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cli", "data", "pairs", "-o", str(tmp_path / "p")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "train" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "cli", "data", "pairs", "-o", str(tmp_path / "x"),
                           "--score-col", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--score-col" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()
    proc = subprocess.run([sys.executable, "-m", "cli", "data", "pairs", "--help"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "chosen_score" in proc.stdout and "GB1" in proc.stdout


# --- other inputs ----------------------------------------------------------------------------------


def test_tsv_gzip_and_sniffed_inputs_give_the_same_pairs(gb1, tmp_path):
    out, _ = gb1
    rows = gb1_rows()
    buf = io.StringIO()
    csv.writer(buf, delimiter="\t", lineterminator="\n").writerows(rows)
    for name in ("gb1.tsv.gz", "gb1.tsv", "gb1.txt"):
        path = write(tmp_path / name, buf.getvalue())
        rep = build_pairs(path, tmp_path / f"out-{name}")
        assert rep["source"]["delimiter"] == "\t" and rep["source"]["gzip"] == name.endswith(".gz")
        for s in SPLITS:
            assert (tmp_path / f"out-{name}" / f"{s}.tsv").read_bytes() == (out / f"{s}.tsv").read_bytes()


def test_hash_split_and_dropped_rows(tmp_path):
    import random

    rng = random.Random(0)
    lines = ["sequence,score"]
    for i in range(400):
        lines.append(f"{''.join(rng.choice('ACDEFGHIKLMNPQRSTVWY') for _ in range(30))},{rng.gauss(0, 2):.3f}")
    lines[5] = lines[5].lower()                             # lower case: kept, upper-cased
    lines += ["ACDE1FG,1.0", "ACD-EF,2.0",                   # bad letters: dropped
              "A" * 50 + ",3.0",                            # too long (max_len 40)
              lines[1].split(",")[0] + ",9.0",              # duplicate of row 1
              "ACDEFGH,", "ACDEFGHK,NaN"]                   # missing scores
    path = write(tmp_path / "scored.csv", "\n".join(lines) + "\n")
    rep = build_pairs(path, tmp_path / "out", max_len=40, val_fraction=0.2, seed=5)
    assert rep["columns"] == {"sequence": "sequence", "score": "score", "split": None}
    assert rep["rows"]["read"] == 406
    assert rep["rows"]["dropped"] == {"invalid_character": 2, "empty_sequence": 0, "too_long": 1,
                                      "missing_score": 2, "duplicate": 1}
    assert rep["counts"]["test"] == 0 and rep["counts"]["validation"] > 0
    assert 40 < rep["sequences"]["validation"] < 130                  # ~20% of 400 by hash
    train = set(read_scored_sequences(path, split="train", val_fraction=0.2, seed=5, max_len=40).sequences)
    val = {q for p in read_pairs(tmp_path / "out", "validation") for q in (p.chosen, p.rejected)}
    assert val and not val & train
    assert lines[5].upper().split(",")[0] in train | val | set(
        read_scored_sequences(path, split="validation", val_fraction=0.2, seed=5).sequences)


def test_explicit_pair_file(tmp_path):
    text = ("chosen\trejected\tgood\tbad\tsplit\n"
            "ACDEFG\tACDEFA\t2.5\t1.0\ttrain\n"
            "acdefh\tACDEFI\t\t0.5\tTraining\n"              # lower case, unknown chosen score
            "ACDEFK\tACDEFL\t3\t3\tval\n"
            "ACDEFM\tACDEFN\t1\t0\ttest\n"
            "ACDEFG\tACDEFA\t2.5\t1.0\ttrain\n"               # repeated pair: dropped
            + "A" * 30 + "\tACDEF\t1\t0\ttrain\n")            # too long: dropped
    path = write(tmp_path / "pairs.tsv.gz", text)
    rep = build_pairs(path, tmp_path / "out", chosen_col="chosen", rejected_col="rejected",
                      chosen_score_col="good", rejected_score_col="bad", split_col="split", max_len=20)
    assert rep["mode"] == "explicit" and rep["margin"] is None
    assert rep["counts"] == {"train": 2, "validation": 1, "test": 1}
    assert rep["rows"]["dropped"]["duplicate"] == 1 and rep["rows"]["dropped"]["too_long"] == 1
    assert sorted(read_pairs(tmp_path / "out", "train")) == [Pair("ACDEFG", "ACDEFA", 2.5, 1.0),
                                                            Pair("ACDEFH", "ACDEFI", None, 0.5)]
    assert read_pairs(tmp_path / "out", "validation") == [Pair("ACDEFK", "ACDEFL", 3.0, 3.0)]
    # no split column, no scores: hash split by the chosen sequence, empty score fields
    plain = "c,r\n" + "".join(f"{'ACDEFGHIKL'[:5 + i % 5]}{'W' * (i // 5)},MKV{'Y' * i}\n" for i in range(60))
    rep = build_pairs(write(tmp_path / "plain.csv", plain), tmp_path / "plain", chosen_col="c", rejected_col="r",
                      val_fraction=0.3)
    assert rep["counts"]["train"] + rep["counts"]["validation"] == 60 and rep["counts"]["validation"] > 0
    assert all(p.chosen_score is None and p.rejected_score is None for p in read_pairs(tmp_path / "plain", "train"))
    assert (tmp_path / "plain" / "train.tsv").read_text().split("\n")[1].endswith("\t\t")


# --- bad input: exit 2, the field named, nothing written ----------------------------------------

BAD = [
    # (file name, content, extra args, field in the message, words in the message)
    ("missing.csv", "seq,score\nACDE,1\nACDF,3\n", ["--score-col", "fitness"], "--score-col",
     ["'fitness'", "'seq'", "'score'"]),
    ("missing_seq.csv", "name,score\nACDE,1\n", [], "--sequence-col", ["'name'"]),
    ("missing_pair_col.tsv", "a\tb\nACD\tACE\n", ["--chosen-col", "a", "--rejected-col", "z"], "--rejected-col",
     ["'z'", "'a'", "'b'"]),
    ("nonnumeric.csv", "seq,score\nACDE,1\nACDF,abc\n", [], "--score-col", ["line 3", "'abc'"]),
    ("infinite.csv", "seq,score\nACDE,1\nACDF,inf\n", [], "--score-col", ["line 3", "'inf'"]),
    ("identical.tsv", "a\tb\nACD\tACE\nACD\tacd\n", ["--chosen-col", "a", "--rejected-col", "b"], "--rejected-col",
     ["line 3", "identical"]),
    ("badletter.tsv", "a\tb\nACD\tAC1E\n", ["--chosen-col", "a", "--rejected-col", "b"], "--rejected-col",
     ["line 2", "'1'"]),
    ("allbad.csv", "seq,score\nAC1E,1\nAC-F,3\n", [], "--sequence-col", ["none of its 2 rows", "invalid_character"]),
    ("margin.csv", "seq,score,set\nACDE,1,train\nACDF,1.25,train\nACDG,0.9,train\n", [], "--margin",
     ["margin 0.5", "0.35"]),
    ("empty.csv", "", [], "input", ["empty file"]),
    ("header_only.csv", "seq,score\n", [], "input", ["no data rows"]),
    ("badsplit.csv", "seq,score,set\nACDE,1,train\nACDF,3,holdout\n", [], "--split-col", ["line 3", "'holdout'"]),
    ("short_row.csv", "seq,score,set\nACDE,1,train\nACDF\n", [], "input", ["line 3"]),
    ("no_train.csv", "seq,score,set\nACDE,1,test\nACDF,3,test\n", [], "--split-col", ["'train'"]),
    ("below.tsv", "a\tb\tsa\tsb\nACD\tACE\t1\t2\n",
     ["--chosen-col", "a", "--rejected-col", "b", "--chosen-score-col", "sa", "--rejected-score-col", "sb"],
     "--chosen-score-col", ["line 2", "below"]),
]


@pytest.mark.parametrize("name,content,extra,field,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exit_2(capsys, tmp_path, name, content, extra, field, words):
    path = write(tmp_path / name, content)
    out = tmp_path / "out" / "pairs"
    rc, stdout, err = run(capsys, path, "-o", out, *extra)
    assert rc == 2, (stdout, err)
    assert f"{field}:" in err and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    assert not out.exists() and not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == [name]          # no temporary directory left behind


def test_bad_options_and_existing_output(capsys, tmp_path):
    for args, field in ((["--margin", "-1"], "--margin"), (["--pairs-per-sequence", "0"], "--pairs-per-sequence"),
                        (["--max-len", "0"], "--max-len"), (["--val-fraction", "1"], "--val-fraction"),
                        (["--chosen-col", "x"], "--rejected-col")):
        rc, _, err = run(capsys, "-o", tmp_path / "p", *args)
        assert rc == 2 and f"{field}:" in err, err
    assert not (tmp_path / "p").exists()
    (tmp_path / "exists").mkdir()
    rc, _, err = run(capsys, "-o", tmp_path / "exists")
    assert rc == 2 and "--out:" in err and "already exists" in err
    rc, _, err = run(capsys, "-o", tmp_path / "exists", "--overwrite")
    assert rc == 2 and "not a pairs directory" in err
    with pytest.raises(PlanError, match="not a pairs directory"):
        read_pairs(tmp_path / "exists")
