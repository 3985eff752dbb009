"""runtime/dataprep (FASTA preparation, the shipped sample, ensure_prepared, `exaplan data`) and
runtime/loader.py (the data-parallel loader)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from planner.schema.errors import PlanError
from planner.schema.vocab import BOS_ID, EOS_ID, PAD_ID, TOKEN_TO_ID
from runtime.dataprep.fasta import decode, encode
from runtime.dataprep.prepare import prepare, sample_fasta_path, split_of
from runtime.dataprep.shards import INDEX_DTYPE
from runtime.loader import Loader, SyntheticLoader, TokenDataset, build_loader, measure_io, split_batch

AA = "ACDEFGHIKLMNPQRSTVWY"


def rand_seq(rng: random.Random, lo: int = 20, hi: int = 200) -> str:
    return "".join(rng.choice(AA) for _ in range(rng.randint(lo, hi)))


def write_fasta(path: Path, records, wrap: int = 60, gz: bool = False) -> Path:
    lines = []
    for rid, seq in records:
        lines.append(f">{rid} some description\n")
        lines += [seq[i:i + wrap] + "\n" for i in range(0, len(seq), wrap)]
    data = "".join(lines).encode()
    if gz:
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
            g.write(data)
    else:
        path.write_bytes(data)
    return path


def all_sequences(out: Path) -> list[str]:
    return [ds.sequence(i) for split in ("train", "val") for ds in [TokenDataset(out, split)] for i in range(len(ds))]


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample") / "prepared"
    prepare([str(sample_fasta_path())], str(out), progress=False)
    return out


# ----------------------------------------------------------------------------- tokenisation


def test_encode_decode_round_trip():
    toks = encode("mkV*")
    assert toks.dtype == np.uint8
    assert toks.tolist() == [BOS_ID, TOKEN_TO_ID["M"], TOKEN_TO_ID["K"], TOKEN_TO_ID["V"], EOS_ID]
    assert decode(toks) == "MKV"
    letters = "ACDEFGHIKLMNPQRSTVWYBZJXUO"
    assert decode(encode(letters.lower())) == letters
    assert [TOKEN_TO_ID[c] for c in letters] == encode(letters).tolist()[1:-1]
    for bad in ("MK1V", "MK-V", "M*KV"):
        with pytest.raises(PlanError, match="not in the protein alphabet"):
            encode(bad)


def test_prepare_round_trip_and_manifest_counts(tmp_path):
    rng = random.Random(1)
    good = {f"sp|P{i:05d}|X": rand_seq(rng) for i in range(40)}
    text = []
    for i, (rid, seq) in enumerate(good.items()):
        if i % 4 == 0:          # lower case, terminal stop, CRLF, blank lines, wrapping
            text.append(f">{rid} desc\r\n{seq[:30].lower()}\r\n\r\n{seq[30:]}*\r\n")
        else:
            text.append(f">{rid}\n" + "".join(seq[j:j + 60] + "\n" for j in range(0, len(seq), 60)))
    text.append(">bad_letter1 x\nMKV1LLA\n")
    text.append(">bad_letter2\nMKV-LLA\n")
    text.append(">too_long\n" + "M" * 301 + "\n")
    text.append(">empty_seq\n")
    text.append(">\nMKVL\n")
    src = tmp_path / "in.fasta"
    src.write_text("".join(text))
    out = tmp_path / "out"
    rep = prepare([str(src)], str(out), max_len=300, val_fraction=0.25, seed=3, progress=False)

    residues = sum(len(s) for s in good.values())
    assert rep.sequences == 40 and rep.residues == residues and rep.tokens == residues + 80
    assert rep.skipped == {"empty_sequence": 1, "invalid_character": 2, "too_long": 1, "missing_id": 1}
    assert rep.records == 45
    bad = {e["id"]: e["detail"] for e in rep.skipped_examples}
    assert bad["bad_letter1"] == "character '1' at residue 4" and "'-'" in bad["bad_letter2"]
    assert sum(s["sequences"] for s in rep.splits.values()) == 40 and rep.splits["val"]["sequences"] > 0

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sequences"] == 40 and manifest["residues"] == residues
    assert manifest["skipped"] == rep.skipped
    assert manifest["vocabulary"]["size"] == 31 and manifest["vocabulary"]["tokens"][:2] == ["<pad>", "<bos>"]
    assert manifest["sources"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert manifest["sources"][0]["records"] == 45 and manifest["sources"][0]["gzip"] is False
    for split in ("train", "val"):
        assert manifest["splits"][split]["sequences"] == rep.splits[split]["sequences"]
        ds = TokenDataset(out, split)
        assert (out / f"{split}.index").stat().st_size == len(ds) * INDEX_DTYPE.itemsize
        for i in range(len(ds)):
            t = ds[i]
            assert t[0] == BOS_ID and t[-1] == EOS_ID and len(t) == ds.lengths[i]
    assert sorted(all_sequences(out)) == sorted(good.values())
    assert not leftovers(tmp_path)
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask      # not a 0700 temporary directory


def test_split_is_deterministic_and_order_independent(tmp_path):
    rng = random.Random(2)
    recs = [(f"id{i}", rand_seq(rng)) for i in range(300)]
    write_fasta(tmp_path / "a.fa", recs)
    shuffled = recs[:]
    random.Random(5).shuffle(shuffled)
    write_fasta(tmp_path / "b1.fa", shuffled[:100])
    write_fasta(tmp_path / "b2.fa", shuffled[100:], wrap=17)
    prepare([str(tmp_path / "a.fa")], str(tmp_path / "A"), val_fraction=0.2, seed=7, progress=False)
    prepare([str(tmp_path / "b1.fa"), str(tmp_path / "b2.fa")], str(tmp_path / "B"), val_fraction=0.2, seed=7,
            progress=False)
    val_a, val_b = ({ds.sequence(i) for i in range(len(ds))} for ds in (TokenDataset(tmp_path / d, "val") for d in "AB"))
    expected = {seq for rid, seq in recs if split_of(rid, 7, 0.2) == "val"}
    assert val_a == val_b == expected
    assert 30 < len(val_a) < 90
    assert {rid for rid, _ in recs if split_of(rid, 8, 0.2) == "val"} != {rid for rid, _ in recs if split_of(rid, 7, 0.2) == "val"}


# ----------------------------------------------------------------------------- bad input


def _gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


_OK = ">ok1\nMKVLAAGHIK\n"
BAD_INPUTS = {
    "empty file": (b"", "empty file"),
    "whitespace only": (b"\n\n  \n", "no FASTA records"),
    "not fasta (text)": (b"hello world\nthis is not a protein file\n", "not a FASTA file"),
    "sequence before header": (b"MKVLAA\n" + _OK.encode(), "sequence data before the first '>'"),
    "binary garbage": (bytes(range(256)) * 8, "not a FASTA file"),
    "every record has a bad letter": (b">r1\nMK1V\n>r2\nMKV2\n", "none of its 2 records.*'r1'.*'1'"),
    "every record too long": (b">r1\n" + b"M" * 50 + b"\n", "none of its 1 records.*too_long"),
    "every record empty (truncated)": (b">r1\n>r2 desc\n", "none of its 2 records.*empty_sequence"),
    "truncated gzip": (_gzip_bytes((_OK * 2000).encode())[:-12], "truncated or corrupt gzip"),
    "garbled gzip": (b"\x1f\x8b" + bytes(range(200)), "truncated or corrupt gzip"),
    "empty gzip": (_gzip_bytes(b""), "no FASTA records"),
    "nucleotides": (b"".join(b">n%d\n" % i + b"ACGTTGCAAC" * 3 + b"\n" for i in range(40)), "nucleotide"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_plan_error_and_leaves_nothing(tmp_path, case):
    data, message = BAD_INPUTS[case]
    good = write_fasta(tmp_path / "good.fa", [("g1", "MKVLAAGHIKLL")])
    bad = tmp_path / "bad.fa"
    bad.write_bytes(data)
    out = tmp_path / "nested" / "out"
    with pytest.raises(PlanError, match=message):
        prepare([str(good), str(bad)], str(out), max_len=40, progress=False)
    assert not out.exists() and not (tmp_path / "nested").exists()
    assert not leftovers(tmp_path)


def test_other_plan_errors(tmp_path):
    good = write_fasta(tmp_path / "good.fa", [("g1", "MKVLAAGHIKLL")])
    with pytest.raises(PlanError, match="no such file"):
        prepare([str(tmp_path / "missing.fa")], str(tmp_path / "o"), progress=False)
    with pytest.raises(PlanError, match="no FASTA files"):
        prepare([], str(tmp_path / "o"), progress=False)
    with pytest.raises(PlanError, match="listed twice"):
        prepare([str(good), str(good)], str(tmp_path / "o"), progress=False)
    with pytest.raises(PlanError, match="val_fraction"):
        prepare([str(good)], str(tmp_path / "o"), val_fraction=1.0, progress=False)
    assert not (tmp_path / "o").exists()
    # An existing output is kept unless overwrite=True; a non-prepared directory is never replaced.
    out = tmp_path / "o"
    prepare([str(good)], str(out), progress=False)
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(PlanError, match="already exists"):
        prepare([str(good)], str(out), progress=False)
    assert (out / "manifest.json").read_bytes() == before
    write_fasta(good, [("g1", "MKVLAAGHIKLL"), ("g2", "MKKKKK")])
    assert prepare([str(good)], str(out), progress=False, overwrite=True).sequences == 2
    assert len(all_sequences(out)) == 2
    (tmp_path / "notdata").mkdir()
    with pytest.raises(PlanError, match="not a prepared data directory"):
        prepare([str(good)], str(tmp_path / "notdata"), progress=False, overwrite=True)
    with pytest.raises(PlanError, match="not a prepared data directory"):
        TokenDataset(tmp_path / "notdata")
    with pytest.raises(PlanError, match="unknown split"):
        TokenDataset(out, "test")
    assert not leftovers(tmp_path)


def test_gzip_and_plain_give_identical_shards(tmp_path):
    rng = random.Random(3)
    recs = [(f"r{i}", rand_seq(rng)) for i in range(200)]
    write_fasta(tmp_path / "x.fa", recs)
    write_fasta(tmp_path / "x.fa.gz", recs, gz=True)
    a, b = tmp_path / "plain", tmp_path / "gz"
    prepare([str(tmp_path / "x.fa")], str(a), progress=False)
    prepare([str(tmp_path / "x.fa.gz")], str(b), progress=False)
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    for name in files:
        if name != "manifest.json":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert ma.pop("sources")[0]["gzip"] is False and mb.pop("sources")[0]["gzip"] is True
    assert ma == mb


def test_small_shards_read_back_the_same(tmp_path):
    rng = random.Random(4)
    recs = [(f"r{i}", rand_seq(rng)) for i in range(100)]
    write_fasta(tmp_path / "x.fa", recs)
    prepare([str(tmp_path / "x.fa")], str(tmp_path / "one"), progress=False)
    prepare([str(tmp_path / "x.fa")], str(tmp_path / "many"), max_len=200, shard_tokens=1000, progress=False)
    manifest = json.loads((tmp_path / "many" / "manifest.json").read_text())
    assert len(manifest["splits"]["train"]["shards"]) > 5
    assert all(s["tokens"] <= 1000 for s in manifest["splits"]["train"]["shards"])
    assert all_sequences(tmp_path / "one") == all_sequences(tmp_path / "many")


def test_streaming_keeps_memory_small(tmp_path, monkeypatch):
    """A multi-MB gzip FASTA is prepared with a Python heap peak far below its size: memory is
    bounded by the block size (runtime/dataprep/blocks.py; a few copies of a block), not by the
    file's; at 128 KiB blocks the 5 MB file needs under 2.5 MB."""
    import runtime.dataprep.blocks as blocks

    monkeypatch.setattr(blocks, "BLOCK_BYTES", 128 << 10)
    rng = np.random.default_rng(0)
    letters = np.frombuffer(AA.encode(), dtype=np.uint8)
    src = tmp_path / "big.fa.gz"
    n, size = 0, 0
    with open(src, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1, mtime=0) as g:
        while size < 5_000_000:
            lens = rng.integers(50, 500, size=2000)
            body = letters[rng.integers(0, 20, size=int(lens.sum()))].tobytes()
            parts, pos = [], 0
            for ln in lens:
                seq = body[pos: pos + ln]
                pos += ln
                parts.append(b">s%d\n" % n + b"\n".join(seq[i: i + 60] for i in range(0, ln, 60)) + b"\n")
                n += 1
            chunk = b"".join(parts)
            g.write(chunk)
            size += len(chunk)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        rep = prepare([str(src)], str(tmp_path / "out"), progress=False)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rep.sequences == n and rep.skipped["too_long"] == 0
    assert size > 5_000_000 and peak < 2_500_000, (size, peak)   # a few blocks, whatever the size
    assert seconds < 20


# ----------------------------------------------------------------------------- shipped sample


def test_shipped_sample_prepares_fast(tmp_path):
    path = sample_fasta_path()
    assert path.name == "uniprot_sample.fasta.gz" and path.stat().st_size < 1_000_000
    assert (path.parent / "ATTRIBUTION.md").is_file()
    t0 = time.perf_counter()
    rep = prepare([str(path)], str(tmp_path / "s"), progress=False)
    assert time.perf_counter() - t0 < 10
    assert rep.sequences == 3103 and rep.residues == 1_120_132 and sum(rep.skipped.values()) == 0
    assert rep.splits["train"]["sequences"] + rep.splits["val"]["sequences"] == 3103
    assert 0.03 < rep.splits["val"]["sequences"] / 3103 < 0.08
    assert rep.sources[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- loader


def _take(loader, calls):
    return [loader.next_microbatch() for _ in range(calls)]


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_dp_ranks_are_disjoint_and_union_is_the_global_batch(sample_dir, mode):
    ds = TokenDataset(sample_dir, "train")
    mb, global_batch, steps = 2, 8, 3
    single = Loader(ds, 128, mb, 0, 1, seed=11, mode=mode, grad_accumulation=global_batch // mb)
    ref = torch.cat(_take(single, steps * single.grad_accumulation)).view(steps, global_batch, -1)
    for dp in (2, 4):
        ranks = [Loader(ds, 128, mb, r, dp, seed=11, mode=mode, grad_accumulation=global_batch // (mb * dp)) for r in range(dp)]
        for step in range(steps):
            rows, indices = [], []
            for loader in ranks:
                for _ in range(loader.grad_accumulation):
                    rows.append(loader.next_microbatch())
                    indices.append(loader.last_indices)
            flat = np.concatenate(indices)
            assert len(set(flat.tolist())) == global_batch                       # disjoint
            assert sorted(flat.tolist()) == list(range(step * global_batch, (step + 1) * global_batch))
            assert torch.equal(torch.cat(rows), ref[step])                      # union = global batch
        assert len({json.dumps(lo.state_dict(), sort_keys=True) for lo in ranks}) == 1  # rank-independent


def test_resume_reproduces_the_continuation(sample_dir):
    ds = TokenDataset(sample_dir, "train")
    a = Loader(ds, 256, 3, 1, 2, seed=5, grad_accumulation=2)
    _take(a, 5)                                 # stops in the middle of a step
    state = a.state_dict()
    cont = _take(a, 7)
    b = Loader(TokenDataset(sample_dir, "train"), 256, 3, 1, 2, seed=5, grad_accumulation=2)
    b.load_state_dict(json.loads(json.dumps(state)))     # survives JSON
    assert all(torch.equal(x, y) for x, y in zip(cont, _take(b, 7)))
    # A mid-step state cannot change the layout.
    c = Loader(ds, 256, 3, 0, 1, seed=5, grad_accumulation=4)
    with pytest.raises(PlanError, match="middle of a step"):
        c.load_state_dict(state)
    with pytest.raises(PlanError, match="another sample stream"):
        Loader(ds, 256, 3, 1, 2, seed=6, grad_accumulation=2).load_state_dict(state)


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_resume_from_dp2_on_dp1_same_global_batch(sample_dir, mode):
    ds = TokenDataset(sample_dir, "train")
    mb, global_batch = 2, 8
    ranks = [Loader(ds, 200, mb, r, 2, seed=9, mode=mode, grad_accumulation=2) for r in range(2)]
    for loader in ranks:
        _take(loader, 2 * 3)                    # 3 steps
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict() and state["sample"] == 3 * global_batch
    expected = [torch.cat([torch.cat(_take(lo, 2)) for lo in ranks]) for _ in range(4)]   # steps 4..7 on dp 2
    one = Loader(ds, 200, mb, 0, 1, seed=9, mode=mode, grad_accumulation=4)
    one.load_state_dict(state)
    got = [torch.cat(_take(one, 4)) for _ in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(expected, got))
    # ... and with another micro-batch size too (same global batch).
    other = Loader(ds, 200, 4, 0, 1, seed=9, mode=mode, grad_accumulation=2)
    other.load_state_dict(state)
    assert all(torch.equal(x, torch.cat(_take(other, 2))) for x in expected)


def test_epochs_cover_every_sample_and_reshuffle(sample_dir):
    ds = TokenDataset(sample_dir, "val")
    loader = Loader(ds, 1, 1, 0, 1, seed=0, mode="pad")        # seq_len 1: the first 2 tokens
    n = loader.samples_per_epoch
    assert n == len(ds)
    pad = Loader(ds, 2000, 1, 0, 1, seed=0, mode="pad")
    epoch0 = sorted(decode(pad.sample(g)) for g in range(n))
    epoch1 = [decode(pad.sample(g)) for g in range(n, 2 * n)]
    assert epoch0 == sorted(ds.sequence(i) for i in range(n)) == sorted(epoch1)
    assert [decode(pad.sample(g)) for g in range(n)] != epoch1                 # reshuffled
    assert Loader(ds, 2000, 1, 0, 1, seed=1, mode="pad").sample(0).tolist() != pad.sample(0).tolist() or \
        Loader(ds, 2000, 1, 0, 1, seed=1, mode="pad").sample(1).tolist() != pad.sample(1).tolist()


def test_pack_windows_tile_the_shuffled_stream(sample_dir):
    ds = TokenDataset(sample_dir, "val")
    L = 100
    loader = Loader(ds, L, 4, 0, 1, seed=3)
    assert loader.samples_per_epoch == (ds.num_tokens - 1) // L
    order, _cum, windows = loader._epoch(0)
    stream = np.concatenate([ds[int(i)] for i in order]).astype(np.int64)
    by_window = {int(w): loader.sample(j) for j, w in enumerate(windows)}
    for w, sample in by_window.items():
        assert np.array_equal(sample, stream[w * L: w * L + L + 1])
        assert PAD_ID not in sample
    assert sum(int((s == BOS_ID).sum()) for s in by_window.values()) >= len(ds) - 1
    inputs, targets = split_batch(loader.next_microbatch())
    assert inputs.shape == targets.shape == (4, L) and torch.equal(inputs[:, 1:], targets[:, :-1])


def test_pad_mode_targets_ignore_pad(sample_dir):
    ds = TokenDataset(sample_dir, "train")
    loader = Loader(ds, 1100, 4, 0, 1, seed=0, mode="pad")
    batch = loader.next_microbatch()
    assert batch.dtype == torch.int64 and batch.shape == (4, 1101)
    inputs, targets = split_batch(batch)
    for row, g in zip(batch, loader.last_indices):
        n = int((row != PAD_ID).sum())
        assert row[0] == BOS_ID and row[n - 1] == EOS_ID and (row[n:] == PAD_ID).all()
        assert decode(row) in {ds.sequence(i) for i in loader._epoch(0)[0][g: g + 1]}
    logits = torch.randn(*targets.shape, 31)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_ID)
    keep = targets.flatten() != PAD_ID
    assert torch.allclose(loss, F.cross_entropy(logits.flatten(0, 1)[keep], targets.flatten()[keep]))
    short = Loader(ds, 8, 2, 0, 1, seed=0, mode="pad").next_microbatch()       # cut to seq_len + 1
    assert short.shape == (2, 9) and (short[:, 0] == BOS_ID).all() and (short != PAD_ID).all()


def test_io_modes_and_measure_io(sample_dir):
    real = build_loader("real", sample_dir, seq_len=64, micro_batch=4, dp_rank=0, dp_size=1, seed=0)
    stats = measure_io(real, 5)                 # 5 micro-batches
    assert stats["samples"] == 20 and stats["tokens"] == 20 * 64
    assert stats["samples_per_s"] > 0 and stats["tokens_per_s"] == pytest.approx(stats["samples_per_s"] * 64)
    assert real.state_dict()["sample"] == 20
    assert isinstance(build_loader("io-only", sample_dir, seq_len=64, micro_batch=4, dp_rank=0, dp_size=1, seed=0), Loader)
    syn = build_loader("synthetic", None, seq_len=64, micro_batch=4, dp_rank=1, dp_size=2, seed=0, grad_accumulation=2)
    assert isinstance(syn, SyntheticLoader)
    first = syn.next_microbatch()
    assert first.shape == (4, 65) and first is syn.next_microbatch() and (first[:, 0] == BOS_ID).all()
    assert int(first.max()) < 31
    assert measure_io(syn, 6)["samples"] == 4 * 6 and syn.state_dict()["sample"] == 16 * 4
    with pytest.raises(PlanError, match="io_mode"):
        build_loader("fast", sample_dir, seq_len=64, micro_batch=4, dp_rank=0, dp_size=1, seed=0)
    with pytest.raises(PlanError, match="dp_rank"):
        Loader(TokenDataset(sample_dir), 64, 4, 2, 2, seed=0)
    with pytest.raises(PlanError, match="fewer than one packed sample"):
        Loader(TokenDataset(sample_dir, "val"), 10**7, 1, 0, 1, seed=0)


# ----------------------------------------------------------------------------- trainer / CLI helpers


def test_ensure_prepared(tmp_path, monkeypatch):
    import runtime.dataprep.cache as data

    sample = data.ensure_prepared(None, tmp_path / "cache_sample")
    assert TokenDataset(sample, "validation").split == "val" and len(TokenDataset(sample)) + len(
        TokenDataset(sample, "val")) == 3103
    assert data.ensure_prepared(str(sample), tmp_path / "unused") == sample           # a prepared directory
    assert not (tmp_path / "unused").exists()

    rng = random.Random(6)
    a = write_fasta(tmp_path / "a.fa", [(f"a{i}", rand_seq(rng)) for i in range(30)])
    b = write_fasta(tmp_path / "b.fa.gz", [(f"b{i}", rand_seq(rng)) for i in range(30)], gz=True)
    cache = tmp_path / "run" / "data"
    got = data.ensure_prepared(f"{a},{b}", cache, progress=False)
    assert got == cache.resolve() and TokenDataset(got).manifest["sequences"] == 60
    stamp = (cache / "manifest.json").stat().st_mtime_ns
    assert data.ensure_prepared([str(a), str(b)], cache, progress=False) == got         # reused, not redone
    assert (cache / "manifest.json").stat().st_mtime_ns == stamp
    assert data.ensure_prepared([str(a), str(b)], cache, rank=3, timeout_s=1) == got   # nothing to wait for
    write_fasta(a, [(f"a{i}", rand_seq(rng)) for i in range(10)])                     # the input changed
    with pytest.raises(PlanError, match="waited"):
        data.ensure_prepared([str(a), str(b)], cache, rank=1, timeout_s=0.2, poll_s=0.05)
    data.ensure_prepared([str(a), str(b)], cache, progress=False)
    assert TokenDataset(cache).manifest["sequences"] == 40

    # Under torch.distributed a failure on rank 0 reaches the waiting ranks (same nonce).
    monkeypatch.setattr(data, "_broadcast_nonce", lambda: "n1")
    bad = tmp_path / "bad.fa"
    bad.write_text("not fasta\n")
    with pytest.raises(PlanError, match="not a FASTA file"):
        data.ensure_prepared(str(bad), tmp_path / "run2" / "data", rank=0, progress=False)
    with pytest.raises(PlanError, match="rank 0 could not prepare the data: .*not a FASTA file"):
        data.ensure_prepared(str(bad), tmp_path / "run2" / "data", rank=2, timeout_s=5, poll_s=0.05)
    monkeypatch.setattr(data, "_broadcast_nonce", lambda: "n2")                           # a stale marker is ignored
    with pytest.raises(PlanError, match="waited"):
        data.ensure_prepared(str(bad), tmp_path / "run2" / "data", rank=2, timeout_s=0.2, poll_s=0.05)


def test_cli(tmp_path, capsys):
    from cli.main import main as exaplan

    def main(argv):
        return exaplan(["data", *argv])

    out = tmp_path / "p"
    assert main(["prepare", "--no-progress", "-o", str(out), "--val-fraction", "0.1"]) == 0
    assert "3,103 sequences" in capsys.readouterr().out
    assert main(["info", str(out)]) == 0
    assert "val" in capsys.readouterr().out
    assert main(["sample"]) == 0
    assert capsys.readouterr().out.strip() == str(sample_fasta_path())
    assert main(["prepare", "--no-progress", "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
