"""FASTA -> memory-mapped token shards (`prepare`): the preparation half of the training data.

The directory layout and its format constants are in runtime/dataprep/shards.py, the loader
in runtime/loader.py. `prepare` streams its inputs (plain or gzip, any size) and writes into
a temporary directory next to `out_dir`, renamed into place only when everything succeeded:
on error (PlanError) nothing is left behind. The train/val split hashes each record's id with
the seed, so a record lands in the same split whatever the file order.
"""


from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.schema.errors import PlanError
from planner.schema.vocab import BOS_ID, PAD_ID, TOKEN_TO_ID, TOKENS, VOCAB_SIZE
from runtime.dataprep.atomic import discard, fresh_dir, install, makedirs
from runtime.dataprep.blocks import ReadFailed, Streamed, parse_block, read_blocks, split_threshold
from runtime.dataprep.fasta import SKIP_REASONS, FastaFile
from runtime.dataprep.shards import (DEFAULT_SHARD_TOKENS, FORMAT, FORMAT_VERSION, INDEX_DTYPE, MANIFEST, SPLITS,
                                     TOKEN_DTYPE, check_int)

_FLUSH_BYTES = 1 << 18              # write buffer per split (256 KiB)
_MAX_EXAMPLES = 20                  # skipped records listed by id in the manifest
# Nucleotide letters (as token ids): a file of (nearly) only these is DNA/RNA, not protein.
_NUCLEOTIDE_IDS = bytes(TOKEN_TO_ID[c] for c in "ACGTUN")
_NUCLEOTIDE_MIN_RESIDUES = 1000
_NUCLEOTIDE_FRACTION = 0.95


def sample_fasta_path() -> Path:
    """The shipped sample: 3,103 UniProtKB sequences (see runtime/dataprep/samples/ATTRIBUTION.md)."""
    path = Path(__file__).resolve().parent / "samples" / "uniprot_sample.fasta.gz"
    if not path.is_file():
        raise PlanError(f"shipped sample missing: {path} (package data not installed?)")
    return path


def split_of(record_id: str, seed: int, val_fraction: float) -> str:
    """'val' or 'train' from a hash of (seed, record id): independent of file order."""
    if val_fraction <= 0:
        return "train"
    digest = hashlib.blake2b(f"{seed}\0{record_id}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "little") < val_fraction * 2.0**64 else "train"


# ----------------------------------------------------------------------------- prepare


@dataclass
class PrepareReport:
    out_dir: str
    sequences: int                      # kept, all splits
    residues: int
    tokens: int                         # residues + 2 per sequence
    skipped: dict[str, int]             # reason -> records (every reason listed, 0 included)
    splits: dict[str, dict[str, int]]   # split -> sequences, residues, tokens
    sources: list[dict[str, Any]]       # path, bytes, sha256, gzip, records, sequences, skipped
    skipped_examples: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def records(self) -> int:
        return self.sequences + sum(self.skipped.values())

    def summary(self) -> str:
        skipped = ", ".join(f"{k} {v:,}" for k, v in self.skipped.items() if v) or "none"
        split = ", ".join(f"{k} {v['sequences']:,}" for k, v in self.splits.items())
        return (f"{self.out_dir}: {self.sequences:,} sequences, {self.residues:,} residues "
                f"({split}); skipped: {skipped}; {self.seconds:.1f} s")


class _SplitWriter:
    """Appends token sequences to size-capped shard files and their index entries: a new shard
    whenever the next sequence would not fit in the current one."""

    def __init__(self, directory: str, name: str, shard_tokens: int):
        self.dir, self.name, self.shard_tokens = directory, name, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._file = None
        self._pos = 0
        self._index_file = open(os.path.join(directory, f"{name}.index"), "wb")
        self.sequences = self.residues = self.tokens = 0

    def add_many(self, tokens: bytes | memoryview, lengths: np.ndarray) -> None:
        """Append sequences given back to back (`lengths` tokens each), in order."""
        m = len(lengths)
        if not m:
            return
        cum = np.cumsum(lengths)
        before = cum - lengths
        cap = self.shard_tokens
        i = 0
        while i < m:
            if self._file is None or self._pos + int(lengths[i]) > cap:
                self._new_shard()
            # records i..j-1 fit in what is left of this shard
            j = max(int(np.searchsorted(cum, cap - self._pos + int(before[i]), side="right")), i + 1)
            lo, hi = int(before[i]), int(cum[j - 1])
            self._file.write(tokens[lo:hi])
            index = np.empty(j - i, dtype=INDEX_DTYPE)
            index["shard"], index["length"] = len(self.shards) - 1, lengths[i:j]
            index["offset"] = before[i:j] - lo + self._pos
            index.tofile(self._index_file)
            self._pos += hi - lo
            self.shards[-1]["tokens"] = self._pos
            i = j
        self.sequences += m
        self.tokens += int(cum[-1])
        self.residues += int(cum[-1]) - 2 * m

    def _new_shard(self) -> None:
        if self._file is not None:
            self._file.close()
        fname = f"{self.name}-{len(self.shards):05d}.tokens"
        self._file = open(os.path.join(self.dir, fname), "wb", buffering=_FLUSH_BYTES)
        self.shards.append({"file": fname, "tokens": 0})
        self._pos = 0

    def close(self) -> dict[str, Any]:
        if self._file is not None:
            self._file.close()
        self._index_file.close()
        return {"sequences": self.sequences, "residues": self.residues, "tokens": self.tokens,
                "shards": self.shards, "index": f"{self.name}.index"}

    def abort(self) -> None:
        for f in (self._file, self._index_file):
            if f is not None:
                f.close()


def prepare(fasta_paths: list[str], out_dir: str, *, max_len: int = 1024, val_fraction: float = 0.05,
            seed: int = 0, progress: bool = True, overwrite: bool = False,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int = 1) -> PrepareReport:
    """Tokenise FASTA files (plain or .gz) into memory-mapped shards under `out_dir`.

    Records are `<bos> residues <eos>`; lower case is upper-cased and one terminal '*' is
    dropped. Records with a character outside A-Z, more than `max_len` residues, no
    residues, or no id are skipped and counted per reason. PlanError (and nothing written)
    for: a missing, empty or non-FASTA file, unreadable gzip, a file in which every record
    is skipped, a file of nucleotide sequences, or `out_dir` existing without `overwrite`.
    `workers` > 1 parses blocks in that many forked processes (runtime/dataprep/blocks.py);
    the output is the same whatever their number.
    """
    paths, out, max_len, seed, shard_tokens = _check_inputs(fasta_paths, out_dir, max_len, val_fraction, seed,
                                                            overwrite, shard_tokens)
    workers = check_int("workers", workers, 1)
    files = [FastaFile(p) for p in paths]     # checks existence and emptiness up front

    t0 = time.perf_counter()
    parent = os.path.dirname(out)
    created: list[str] = []
    tmp = None
    writers: dict[str, _SplitWriter] = {}
    bar = _progress_bar() if progress else None
    try:
        created = makedirs(parent)
        tmp = fresh_dir(parent, f".{os.path.basename(out)}.tmp-")
        writers = {s: _SplitWriter(tmp, s, shard_tokens) for s in SPLITS}
        skipped: Counter[str] = Counter({r: 0 for r in SKIP_REASONS})
        examples: list[dict[str, Any]] = []
        sources: list[dict[str, Any]] = []
        for ff in files:
            if bar is not None:
                bar_task = bar.add_task(os.path.basename(ff.path), total=ff.size)
                ff.on_bytes = lambda n, t=bar_task: bar.advance(t, n)
            sources.append(_tokenise_file(ff, writers, max_len, seed, val_fraction, skipped, examples, workers))
        splits = {s: w.close() for s, w in writers.items()}
        total = {k: sum(splits[s][k] for s in SPLITS) for k in ("sequences", "residues", "tokens")}
        manifest = _manifest(total, splits, skipped, examples, sources, max_len, val_fraction, seed)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
        install(tmp, out)
    except BaseException as err:
        for w in writers.values():
            w.abort()
        discard(tmp, created)
        if isinstance(err, OSError):        # disk full, permissions, ...
            raise PlanError(f"{out}: cannot write the prepared data: {err}") from err
        raise
    finally:
        if bar is not None:
            bar.stop()
    return PrepareReport(
        out_dir=out, sequences=total["sequences"], residues=total["residues"], tokens=total["tokens"],
        skipped=dict(skipped), splits={s: {k: splits[s][k] for k in ("sequences", "residues", "tokens")} for s in SPLITS},
        sources=sources, skipped_examples=examples, seconds=time.perf_counter() - t0)


def _check_inputs(fasta_paths, out_dir, max_len, val_fraction, seed, overwrite, shard_tokens
                  ) -> tuple[list[str], str, int, int, int]:
    """prepare's arguments checked: (paths, absolute out_dir, max_len, seed, shard_tokens)."""
    if isinstance(fasta_paths, (str, os.PathLike)):
        fasta_paths = [fasta_paths]
    paths = [os.fspath(p) for p in fasta_paths]
    if not paths:
        raise PlanError("no FASTA files given")
    max_len = check_int("max_len", max_len, 1)
    seed = check_int("seed", seed, 0)
    shard_tokens = check_int("shard_tokens", shard_tokens, max_len + 2)
    if not isinstance(val_fraction, (int, float)) or not 0.0 <= val_fraction < 1.0:
        raise PlanError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    seen: dict[str, str] = {}
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            raise PlanError(f"{p}: listed twice (same file as {seen[real]})")
        seen[real] = p
    out = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out) and not overwrite:
        raise PlanError(f"{out}: already exists (give --force to replace it)")
    if os.path.exists(out) and not os.path.isfile(os.path.join(out, MANIFEST)):
        raise PlanError(f"{out}: exists and is not a prepared data directory; refusing to replace it")
    return paths, out, max_len, seed, shard_tokens


def _tokenise_file(ff: FastaFile, writers: dict[str, _SplitWriter], max_len: int, seed: int, val_fraction: float,
                   skipped: Counter[str], examples: list[dict[str, Any]], workers: int = 1) -> dict[str, Any]:
    """Add one file's records to the split writers, count its skipped ones into `skipped`
    (and the first few into `examples`); its entry of the manifest's sources. PlanError when
    no record is usable or the file holds nucleotide sequences."""
    src_skipped: Counter[str] = Counter()
    kept = residues = nucleotides = 0
    first_bad = None
    line = 0  # lines of the file before the current item
    seen_header = False

    def example(at: int, rid: str, reason: str, detail: str) -> None:
        nonlocal first_bad
        ex = {"file": ff.path, "line": line + at, "id": rid, "reason": reason, "detail": detail}
        first_bad = first_bad or ex
        if len(examples) < _MAX_EXAMPLES:
            examples.append(ex)

    for item in _parsed(ff, max_len, seed, val_fraction, workers):
        if isinstance(item, Streamed):
            rec = item.record
            if rec is not None and rec.skip is not None:
                src_skipped[rec.skip] += 1
                example(rec.line, rec.id, rec.skip, rec.detail)
            elif rec is not None:
                tokens = rec.tokens
                writers[split_of(rec.id, seed, val_fraction)].add_many(tokens, np.array([len(tokens)], np.int64))
                kept += 1
                residues += rec.residues
                nucleotides += rec.residues - len(tokens[1:-1].translate(None, _NUCLEOTIDE_IDS))
            seen_header = seen_header or item.seen_header
            line += item.lines
            continue
        for split, part in item.splits.items():
            writers[split].add_many(part.tokens, part.lengths)
        kept += item.kept
        residues += item.residues
        nucleotides += item.nucleotides
        for reason, count in item.skipped.items():
            if count:
                src_skipped[reason] += count
        for at, rid, reason, detail in item.examples:
            example(at, rid, reason, detail)
        seen_header = seen_header or item.seen_header
        line += item.lines
    if not seen_header:
        raise PlanError(f"{ff.path}: no FASTA records (no line starts with '>')")
    records = kept + sum(src_skipped.values())
    if kept == 0:
        reasons = ", ".join(f"{k} {v:,}" for k, v in src_skipped.items())
        raise PlanError(
            f"{ff.path}: none of its {records:,} records is usable ({reasons}); first: record "
            f"{first_bad['id']!r} (line {first_bad['line']}): {first_bad['detail']}")
    if residues >= _NUCLEOTIDE_MIN_RESIDUES and nucleotides >= _NUCLEOTIDE_FRACTION * residues:
        raise PlanError(
            f"{ff.path}: {nucleotides / residues:.0%} of residues are A/C/G/T/U/N: these look like "
            "nucleotide sequences, not protein")
    skipped.update(src_skipped)
    return {"path": os.path.abspath(ff.path), "name": os.path.basename(ff.path),
            "bytes": ff.size, "sha256": ff.sha256, "gzip": ff.compressed,
            "records": records, "sequences": kept, "residues": residues,
            "skipped": {k: v for k, v in src_skipped.items() if v}}


def _parsed(ff: FastaFile, max_len: int, seed: int, val_fraction: float, workers: int):
    """The file's blocks parsed (BlockResult) and its long records (Streamed), in file order;
    with workers > 1 the blocks are parsed in forked processes, a few ahead of the writer."""
    bound = split_threshold(val_fraction)
    lines_done = 0
    try:
        with ff.stream() as read:
            blocks = read_blocks(read, ff.path, max_len)
            if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
                for item in blocks:
                    if isinstance(item, Streamed):
                        yield item
                    else:
                        result = parse_block(item[0], ff.path, max_len, seed, bound, item[1])
                        yield result
                        lines_done += result.lines
                        continue
                    lines_done += item.lines
                return
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                pending: deque = deque()
                failed = None
                try:
                    for item in blocks:
                        pending.append(item if isinstance(item, Streamed) else
                                       pool.submit(parse_block, item[0], ff.path, max_len, seed, bound, item[1]))
                        while len(pending) > 2 * workers:
                            done = _result(pending.popleft())
                            lines_done += done.lines
                            yield done
                except ReadFailed as err:  # what was read before it comes first
                    failed = err
                while pending:
                    done = _result(pending.popleft())
                    lines_done += done.lines
                    yield done
                if failed is not None:
                    raise failed
    except ReadFailed as failed:
        raise ff.read_error(failed.err, lines_done + failed.lines) from None


def _result(item):
    return item if isinstance(item, Streamed) else item.result()


def _manifest(total: dict[str, int], splits: dict[str, dict[str, Any]], skipped: Counter[str],
              examples: list[dict[str, Any]], sources: list[dict[str, Any]], max_len: int, val_fraction: float,
              seed: int) -> dict[str, Any]:
    return {
        "format": FORMAT, "version": FORMAT_VERSION,
        "vocabulary": {"tokens": list(TOKENS), "size": VOCAB_SIZE, "pad_id": PAD_ID, "bos_id": BOS_ID,
                       "eos_id": TOKEN_TO_ID["<eos>"]},
        "token_dtype": np.dtype(TOKEN_DTYPE).str,
        "index_dtype": [[name, INDEX_DTYPE.fields[name][0].str] for name in INDEX_DTYPE.names],
        "max_len": max_len, "val_fraction": val_fraction, "seed": seed,
        "split_rule": "val if blake2b-64('{seed}\\0{record id}') / 2**64 < val_fraction",
        "record_format": "<bos> residues <eos>; upper-cased; one terminal '*' dropped",
        **total,
        "splits": splits,
        "skipped": dict(skipped),
        "skipped_examples": examples,
        "sources": sources,
    }


def _progress_bar():
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn(), console=Console(stderr=True), transient=False)
    bar.start()
    return bar


