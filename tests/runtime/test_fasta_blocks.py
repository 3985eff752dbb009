"""The block reader behind `prepare` (runtime/dataprep/blocks.py) gives what the reference
line-by-line reader (FastaFile.records) gives: the same records kept, in the same splits and
order, the same skipped records with their lines and details, the same errors; at any block
size, through the long-record path, and with worker processes."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

import runtime.dataprep.blocks as blocks
from planner.schema.errors import PlanError
from runtime.dataprep.fasta import FastaFile
from runtime.dataprep.prepare import prepare, split_of

LETTERS = "ACDEFGHIKLMNPQRSTVWYBZJXUOacdefghiklmnpqrstvwy"


def _record(rng: random.Random) -> bytes:
    """One FASTA record, often with something unusual about it."""
    kind = rng.random()
    rid = f"sp|P{rng.randrange(10**6):06d}|{rng.choice(['X', 'é', 'Y_Z'])}"
    header = rng.choice([f">{rid} desc {rng.random():.3f}", f">{rid}", f">{rid}\tdesc", f">{rid} \r", "> lead",
                         ">", ">\t", f">{rid}*star"])
    seq = "".join(rng.choice(LETTERS) for _ in range(rng.choice([0, 1, 5, 40, 59, 60, 61, 200, rng.randrange(400)])))
    if kind < 0.08:
        seq += "*"
    elif kind < 0.12:
        seq = seq[:3] + "*" + seq[3:]
    elif kind < 0.15:
        seq = seq[:2] + rng.choice(["1", "-", ".", "\x01", "\x02", "\x00", ">", "é"]) + seq[2:]
    elif kind < 0.17:
        seq += "**"
    wrap = rng.choice([10, 60, 61, 1000])
    lines = [seq[i:i + wrap] for i in range(0, len(seq), wrap)]
    if kind > 0.95:
        lines.insert(rng.randrange(len(lines) + 1), "; a comment")
    if kind > 0.9 and kind <= 0.95:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(["", "   ", "\r"]))
    nl = rng.choice(["\n", "\r\n"])
    return (header + nl + nl.join(lines) + (nl if lines else "")).encode("utf-8")


def _fasta(rng: random.Random, records: int) -> bytes:
    data = b"".join(_record(rng) for _ in range(records))
    if rng.random() < 0.3:
        data = b"\n\n; comment first\n" + data
    if rng.random() < 0.3:
        data = data.rstrip(b"\r\n")  # no newline at the end
    return data


def _reference(path: Path, max_len: int, val_fraction: float, seed: int):
    """(kept records per split in order, skipped [(line, id, reason, detail)]) line by line."""
    kept, skipped = {"train": [], "val": []}, []
    for rec in FastaFile(str(path)).records(max_len):
        if rec.skip:
            skipped.append((rec.line, rec.id, rec.skip, rec.detail))
        else:
            kept[split_of(rec.id, seed, val_fraction)].append(rec.tokens)
    return kept, skipped


def _read_back(out: Path):
    manifest = json.loads((out / "manifest.json").read_text())
    kept = {}
    for split, info in manifest["splits"].items():
        data = b"".join((out / s["file"]).read_bytes() for s in info["shards"])
        index = np.fromfile(out / info["index"], dtype=[("shard", "<u4"), ("length", "<u4"), ("offset", "<u8")])
        starts = np.concatenate(([0], np.cumsum([s["tokens"] for s in info["shards"]])))
        kept[split] = [data[starts[s] + o:starts[s] + o + n] for s, n, o in index.tolist()]
    return manifest, kept


@pytest.mark.parametrize("case", range(24))
def test_blocks_read_what_the_line_reader_reads(tmp_path, monkeypatch, case):
    rng = random.Random(case)
    block = rng.choice([64, 200, 1000, 1 << 16])
    monkeypatch.setattr(blocks, "BLOCK_BYTES", block)
    monkeypatch.setattr(blocks, "LONG_BYTES", rng.choice([2, 8]) * block)
    data = _fasta(rng, rng.choice([1, 3, 30, 300]))
    path = tmp_path / ("in.fa.gz" if case % 3 == 0 else "in.fa")
    path.write_bytes(gzip.compress(data, mtime=0) if case % 3 == 0 else data)
    max_len, val, seed = rng.choice([30, 60, 1024]), rng.choice([0.0, 0.3]), rng.randrange(5)
    try:
        want_kept, want_skipped = _reference(path, max_len, val, seed)
        want_error = None
    except PlanError as err:
        want_error = str(err)
    out = tmp_path / "out"
    try:
        prepare([str(path)], str(out), max_len=max_len, val_fraction=val, seed=seed, progress=False,
                workers=1 + case % 2)
    except PlanError as err:
        # the same error, or the reference's records are all unusable (prepare's own refusal)
        assert want_error == str(err) or (want_error is None and not any(want_kept.values())) \
            or "nucleotide" in str(err), (str(err), want_error)
        return
    assert want_error is None
    manifest, got_kept = _read_back(out)
    assert got_kept == want_kept
    got_examples = [(e["line"], e["id"], e["reason"], e["detail"]) for e in manifest["skipped_examples"]]
    assert got_examples == want_skipped[:20]
    assert sum(manifest["skipped"].values()) == len(want_skipped)
    assert manifest["sources"][0]["records"] == len(want_skipped) + sum(map(len, want_kept.values()))


def test_the_random_files_reach_every_path(monkeypatch):
    """The cases above are not all plain: their files take the long-record path and many blocks,
    and hold records of every skip reason."""
    calls = {"long": 0, "blocks": 0}
    real_long, real_parse = blocks._stream_long, blocks.parse_block
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 64)
    monkeypatch.setattr(blocks, "LONG_BYTES", 128)

    def long(*a, **k):
        calls["long"] += 1
        return real_long(*a, **k)

    monkeypatch.setattr(blocks, "_stream_long", long)
    data = _fasta(random.Random(3), 300)
    chunks = iter([data[i:i + 64] for i in range(0, len(data), 64)] + [b""])
    for item in blocks.read_blocks(lambda n: next(chunks, b""), "x", 60):
        if not isinstance(item, blocks.Streamed):
            calls["blocks"] += 1
            real_parse(item[0], "x", 60, 0, None, item[1])
    assert calls["long"] > 0 and calls["blocks"] > 10
    reasons = set()
    for case in range(24):
        for rec in _records_of(_fasta(random.Random(case), 30)):
            reasons.add(rec.skip)
    assert reasons >= {None, "empty_sequence", "invalid_character", "too_long", "missing_id"}, reasons


def _records_of(data: bytes):
    from runtime.dataprep.fasta import LineParser

    parser, out = LineParser("x", 60), []
    for line in data.splitlines(keepends=True):
        rec = parser.line(line)
        if rec is not None:
            out.append(rec)
    last = parser.end()
    return out + ([last] if last is not None else [])
