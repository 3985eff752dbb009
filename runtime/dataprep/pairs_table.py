"""Reading the input tables of `exaplan data pairs` (runtime/dataprep/pairs.py): CSV/TSV (plain or gzip)
with a header line, the split rule, score and sequence parsing, and dropped-row counting; the
shipped GB1 table (`gb1_sample_path`) and `read_scored_sequences`, the rows of one split as
`build_pairs` sees them (for correlating a model's likelihood with the measured score)."""

from __future__ import annotations

import csv
import gzip
import io
import math
import os
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np

from planner.schema.errors import PlanError
from runtime.dataprep.fasta import HashingRaw, is_gzip
from runtime.dataprep.prepare import split_of

SPLITS = ("train", "validation", "test")
SPLIT_VALUES = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
                "val": "validation", "test": "test"}
MISSING_SCORES = frozenset({"", "na", "nan", "n/a", "none", "null"})
DEFAULT_SEQUENCE_COLS = ("sequence", "seq", "x")
DEFAULT_SCORE_COLS = ("score", "fitness", "y")
DEFAULT_SPLIT_COL = "set"
DROP_REASONS = ("invalid_character", "empty_sequence", "too_long", "missing_score", "duplicate")
_MAX_EXAMPLES = 5       # dropped rows listed per reason


class ScoredSequences(NamedTuple):
    sequences: list[str]
    scores: np.ndarray      # float64, same order


def gb1_sample_path() -> Path:
    """The shipped GB1 sample: 6,000 rows of the Olson et al. 2014 double-mutant scan (from the
    mavenn 1.1.4 wheel, MIT; see runtime/dataprep/samples/ATTRIBUTION.md). Columns set,dist,
    input_ct,selected_ct,y,x: x the 55-residue sequence, y the measured fitness (log enrichment)."""
    path = Path(__file__).resolve().parent / "samples" / "gb1_sample.csv.gz"
    if not path.is_file():
        raise PlanError(f"shipped sample missing: {path} (package data not installed?)")
    return path


class Table:
    """One delimited file: `header`, `rows()` -> (line number, fields); afterwards `sha256`."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise PlanError(f"{self.path}: no such file", field="input")
        if os.path.isdir(self.path):
            raise PlanError(f"{self.path}: is a directory, not a CSV/TSV file", field="input")
        self.size = os.path.getsize(self.path)
        if self.size == 0:
            raise PlanError(f"{self.path}: empty file (no header line)", field="input")
        try:
            self.gzip = is_gzip(self.path)
        except OSError as err:
            raise PlanError(f"{self.path}: cannot open: {err.strerror or err}", field="input") from None
        self.sha256 = ""
        head = self._head()
        first = head.split("\n", 1)[0].strip("\r")
        if not first.strip():
            raise PlanError(f"{self.path}: empty file (no header line)", field="input")
        self.delimiter = self._delimiter(head)
        self.header = [c.strip() for c in next(csv.reader([first], delimiter=self.delimiter))]

    def _errors(self, lineno: int):
        what = "truncated or corrupt gzip data" if self.gzip else "read error"
        return lambda err: PlanError(f"{self.path}: {what} near line {lineno}: {err}", field="input")

    def _head(self, limit: int = 1 << 16) -> str:
        try:
            with open(self.path, "rb") as raw:
                stream = gzip.GzipFile(fileobj=raw, mode="rb") if self.gzip else raw
                data = stream.read(limit)
        except (EOFError, zlib.error, OSError) as err:
            raise self._errors(1)(err) from None
        try:
            return data.decode("utf-8-sig", "strict" if len(data) < limit else "ignore")
        except UnicodeDecodeError as err:
            raise PlanError(f"{self.path}: not UTF-8 text ({err.reason} at byte {err.start})", field="input") from None

    def _delimiter(self, head: str) -> str:
        name = self.path.lower()
        name = name[:-3] if name.endswith(".gz") else name
        if name.endswith(".csv"):
            return ","
        if name.endswith((".tsv", ".tab")):
            return "\t"
        try:
            return csv.Sniffer().sniff(head, delimiters=",\t;").delimiter
        except csv.Error:
            first = head.split("\n", 1)[0]
            return "\t" if "\t" in first else ","

    def column(self, name: str, option: str) -> int:
        """Index of column `name` (exact, else case-insensitive); PlanError naming `option`."""
        if name in self.header:
            return self.header.index(name)
        folded = [c.lower() for c in self.header]
        if name.lower() in folded:
            return folded.index(name.lower())
        raise PlanError(f"column {name!r} not found in {self.path}; columns present: "
                        f"{', '.join(map(repr, self.header))}", field=option)

    def find(self, names: tuple[str, ...]) -> str | None:
        folded = {c.lower(): c for c in self.header}
        return next((folded[n] for n in names if n in folded), None)

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        raw = HashingRaw(self.path)
        lineno = 1
        try:
            buffered = io.BufferedReader(raw, 1 << 18)
            stream = gzip.GzipFile(fileobj=buffered, mode="rb") if self.gzip else buffered
            text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
            reader = csv.reader(text, delimiter=self.delimiter)
            try:
                next(reader)            # the header, parsed in __init__
                for row in reader:
                    lineno = reader.line_num
                    if row and (len(row) > 1 or row[0].strip()):
                        yield lineno, row
            except csv.Error as err:
                raise PlanError(f"{self.path} line {reader.line_num}: {err}", field="input") from None
            except UnicodeDecodeError as err:
                raise PlanError(f"{self.path} near line {lineno + 1}: not UTF-8 text ({err.reason})",
                                field="input") from None
            except (EOFError, zlib.error, OSError) as err:
                raise self._errors(lineno + 1)(err) from None
            raw.drain()
            self.sha256 = raw.sha256.hexdigest()
        finally:
            raw.close()


def cell(row: list[str], i: int, lineno: int, table: Table) -> str:
    if i >= len(row):
        raise PlanError(f"{table.path} line {lineno}: {len(row)} field(s), the header has {len(table.header)} "
                        f"(delimiter {table.delimiter!r})", field="input")
    return row[i]


def parse_sequence(value: str) -> tuple[str, str | None, str]:
    """(normalised sequence, drop reason or None, detail). Upper-cased; one terminal '*' dropped."""
    seq = value.strip().upper()
    if seq.endswith("*"):
        seq = seq[:-1]
    if not seq:
        return seq, "empty_sequence", "no residues"
    if not (seq.isascii() and seq.isalpha()):
        pos, char = next((i, c) for i, c in enumerate(seq) if not ("A" <= c <= "Z"))
        return seq, "invalid_character", f"character {char!r} at residue {pos + 1}"
    return seq, None, ""


def parse_score(value: str, lineno: int, column: str, option: str, table: Table) -> float | None:
    text = value.strip()
    if text.lower() in MISSING_SCORES:
        return None
    try:
        score = float(text)
    except ValueError:
        score = math.nan
    if not math.isfinite(score):
        raise PlanError(f"{table.path} line {lineno}: score {value!r} in column {column!r} is not a finite number",
                        field=option)
    return score


class Splitter:
    """Split of a row: the split column's value, else the hash rule."""

    def __init__(self, table: Table, split_col: str | None, val_fraction: float, seed: int):
        if split_col is None:
            split_col = table.find((DEFAULT_SPLIT_COL,))
        elif split_col.lower() == "none":
            split_col = None
        self.name = None if split_col is None else table.header[table.column(split_col, "--split-col")]
        self.index = None if split_col is None else table.column(split_col, "--split-col")
        self.table, self.val_fraction, self.seed = table, val_fraction, seed
        self._cache: dict[str, str] = {}

    @property
    def rule(self) -> str:
        if self.name is not None:
            return (f"column {self.name!r}: training/train -> train, validation/valid/val -> validation, "
                    "test -> test")
        return ("hash: validation if blake2b-64('{seed}\\0{sequence}') / 2**64 < val_fraction, else train "
                "(sequence: the chosen one for explicit pairs)")

    def __call__(self, row: list[str], lineno: int, sequence: str) -> str:
        if self.index is None:
            return "validation" if split_of(sequence, self.seed, self.val_fraction) == "val" else "train"
        value = cell(row, self.index, lineno, self.table)
        split = self._cache.get(value)
        if split is None:
            split = SPLIT_VALUES.get(value.strip().lower())
            if split is not None:
                self._cache[value] = split
        if split is None:
            raise PlanError(f"{self.table.path} line {lineno}: split {value!r} in column {self.name!r} is not one "
                            "of training/train, validation/valid/val, test", field="--split-col")
        return split


def check_number(name: str, value, lo: float, *, integer: bool, hi: float | None = None,
                  hi_open: bool = False) -> Any:
    ok = isinstance(value, int) and not isinstance(value, bool) if integer else (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
    if ok:
        ok = value >= lo and (hi is None or (value < hi if hi_open else value <= hi))
    if not ok:
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}{')' if hi_open else ']'}"
        raise PlanError(f"must be {'an integer' if integer else 'a number'} {rng}, got {value!r}", field=name)
    return value


class Drops:
    def __init__(self):
        self.counts: Counter[str] = Counter({r: 0 for r in DROP_REASONS})
        self.per_split: dict[str, Counter[str]] = {s: Counter() for s in SPLITS}
        self.examples: list[dict[str, Any]] = []

    def add(self, reason: str, split: str, lineno: int, detail: str) -> None:
        self.counts[reason] += 1
        self.per_split[split][reason] += 1
        if self.counts[reason] <= _MAX_EXAMPLES:
            self.examples.append({"line": lineno, "reason": reason, "detail": detail})


def read_scored(table: Table, sequence_col: str, score_col: str, splitter: Splitter,
                 max_len: int | None) -> tuple[dict[str, tuple[list[str], list[float]]], Counter, Drops]:
    si, vi = table.column(sequence_col, "--sequence-col"), table.column(score_col, "--score-col")
    score_name = table.header[vi]
    kept: dict[str, tuple[list[str], list[float]]] = {s: ([], []) for s in SPLITS}
    rows: Counter[str] = Counter({s: 0 for s in SPLITS})
    drops = Drops()
    seen: set[str] = set()
    need = max(si, vi, splitter.index or 0)
    for lineno, row in table.rows():
        if len(row) <= need:
            cell(row, need, lineno, table)        # raises
        raw_score = row[vi]
        try:
            score = float(raw_score)
            if score != score:      # NaN: missing
                score = None
            elif score in (math.inf, -math.inf):
                raise ValueError
        except ValueError:
            score = parse_score(raw_score, lineno, score_name, "--score-col", table)
        seq = row[si].strip().upper()
        if seq.isalpha() and seq.isascii():     # the usual case, checked fast
            reason = None
        else:
            seq, reason, detail = parse_sequence(seq)
        split = splitter(row, lineno, seq)
        rows[split] += 1
        if reason is None and max_len is not None and len(seq) > max_len:
            reason, detail = "too_long", f"{len(seq)} residues > max_len {max_len}"
        if reason is None and score is None:
            reason, detail = "missing_score", f"score {cell(row, vi, lineno, table)!r}"
        if reason is None and seq in seen:
            reason, detail = "duplicate", "sequence already seen earlier in the file"
        if reason is not None:
            drops.add(reason, split, lineno, detail)
            continue
        seen.add(seq)
        kept[split][0].append(seq)
        kept[split][1].append(score)
    n = sum(rows.values())
    if n == 0:
        raise PlanError(f"{table.path}: no data rows after the header", field="input")
    if not seen:
        first = drops.examples[0]
        reasons = ", ".join(f"{k} {v:,}" for k, v in drops.counts.items() if v)
        raise PlanError(f"{table.path}: none of its {n:,} rows is usable ({reasons}); first: line {first['line']}: "
                        f"{first['reason']}: {first['detail']}", field="--sequence-col")
    return kept, rows, drops


def split_name(split: str) -> str:
    """'train', 'validation' or 'test' for a split name or alias (val, valid, training)."""
    name = SPLIT_VALUES.get(str(split).strip().lower())
    if name is None:
        raise PlanError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}", field="split")
    return name


def read_scored_sequences(path: str | os.PathLike | None = None, sequence_col: str | None = None,
                          score_col: str | None = None, split: str = "validation", *, split_col: str | None = None,
                          val_fraction: float = 0.1, seed: int = 0, max_len: int | None = None) -> ScoredSequences:
    """Sequences and scores of one split of a scored table (default: the shipped GB1 sample),
    with exactly the split rule and row filters of `build_pairs` (so the same seed, split
    column and val_fraction give the sequences the pairs of that split were built from), in
    file order. split 'all' gives every kept row."""
    table = Table(gb1_sample_path() if path is None else path)
    sequence_col = sequence_col or table.find(DEFAULT_SEQUENCE_COLS)
    score_col = score_col or table.find(DEFAULT_SCORE_COLS)
    if sequence_col is None or score_col is None:
        raise PlanError(f"name the column; columns present: {', '.join(map(repr, table.header))}",
                        field="--sequence-col" if sequence_col is None else "--score-col")
    if max_len is not None:
        check_number("max_len", max_len, 1, integer=True)
    wanted = list(SPLITS) if split == "all" else [split_name(split)]
    kept, _, _ = read_scored(table, sequence_col, score_col, Splitter(table, split_col, val_fraction, seed), max_len)
    seqs = [q for s in wanted for q in kept[s][0]]
    scores = np.asarray([x for s in wanted for x in kept[s][1]], dtype=np.float64)
    return ScoredSequences(seqs, scores)
