"""Preference pairs (chosen, rejected) for DPO, from a table of scored sequences or of pairs.

Input: a CSV or TSV file (plain or gzip; the delimiter comes from the extension, .csv or
.tsv/.tab, else it is sniffed) with a header line. Either

- scored sequences (`sequence_col`, `score_col`; a higher score is preferred): within each
  split, every sequence is paired with up to `pairs_per_sequence` partners drawn at random
  (numpy PCG64, `seed`) among the sequences of the same split whose score differs from its
  own by at least `margin`; the higher-scoring one is `chosen`. Pairs never cross splits.
  Rows are dropped and counted when the sequence has a letter outside the protein alphabet
  (planner/schema/vocab.py: A-Z), is empty or longer than `max_len`, the score is missing (empty,
  NA, NaN), or the sequence was already seen earlier in the file (the first row wins, so a
  sequence is in one split only and no pair has two identical sequences); or
- explicit pairs (`chosen_col`, `rejected_col`, optional score columns): taken as they are
  (no pairing, no margin); a bad letter, an empty sequence, identical chosen and rejected,
  a chosen score below the rejected score are errors naming the line; pairs longer than
  `max_len` and repeated pairs are dropped and counted.

Splits: the column `split_col` (default: a column named `set` when there is one) with values
training/train, validation/valid/val, test (any case); without one, a hash of (seed, sequence)
puts `val_fraction` of the sequences in validation (the chosen sequence for explicit pairs).

Output directory (written into a temporary directory next to it and renamed into place, so
on error nothing is left):

    manifest.json    {"format": "exaplan-pairs", "version": 1, "source", "columns", "margin",
                     "seed", "max_len", "counts", "score_stats", "created_by", ...}
    train.tsv, validation.tsv, test.tsv
                     header `chosen<TAB>rejected<TAB>chosen_score<TAB>rejected_score`, one pair
                     a line, uppercase one-letter sequences, scores empty when unknown; lines in
                     a seeded random order (the first N lines are a random subset)

Readers: `read_pairs(dir, split)`, `load_manifest(dir)`. Bad input raises PlanError (the CLI
prints it and exits 2). No torch here. Reading the input table, the shipped GB1 sample
(`gb1_sample_path`) and, for correlating a model's likelihood with the measured score,
`read_scored_sequences(path, ...)`: runtime/dataprep/pairs_table.py; the report,
`describe_pairs(dir)`: runtime/dataprep/pairs_report.py; the command line: cli/data.py.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np

from planner.schema.errors import PlanError
from runtime.dataprep.atomic import discard, fresh_dir, install, makedirs
from runtime.dataprep.pairs_table import (DEFAULT_SCORE_COLS, DEFAULT_SEQUENCE_COLS, SPLITS, Drops, Splitter, Table,
                                          cell, check_number, gb1_sample_path, parse_score, parse_sequence,
                                          read_scored, split_name)

FORMAT = "exaplan-pairs"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
COLUMNS = ("chosen", "rejected", "chosen_score", "rejected_score")
HEADER = "\t".join(COLUMNS)


class Pair(NamedTuple):
    chosen: str
    rejected: str
    chosen_score: float | None
    rejected_score: float | None


# ----------------------------------------------------------------------------- pairing


def _pair_split(scores: np.ndarray, margin: float, k: int, rng: np.random.Generator
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """Indices (chosen, rejected) of up to k pairs per sequence with score gap >= margin (and
    > 0), partners drawn uniformly among the qualifying sequences; unordered duplicates removed,
    order shuffled. Also the count of draws dropped as identical (same index: never, kept for
    the report's honesty)."""
    n = len(scores)
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    if margin > 0:
        lo = np.searchsorted(s, scores - margin, side="right")     # sorted[:lo] <= score - margin
        hi = np.searchsorted(s, scores + margin, side="left")      # sorted[hi:] >= score + margin
    else:
        lo = np.searchsorted(s, scores, side="left")
        hi = np.searchsorted(s, scores, side="right")
    valid = lo + (n - hi)
    anchors = np.flatnonzero(valid > 0)
    if anchors.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    r = rng.integers(0, valid[anchors][:, None], size=(anchors.size, k))
    lo_a, hi_a = lo[anchors][:, None], hi[anchors][:, None]
    partner = order[np.where(r < lo_a, r, hi_a + (r - lo_a))].ravel()
    anchor = np.repeat(anchors, k)
    same = anchor == partner
    identical = int(same.sum())
    a, b = anchor[~same], partner[~same]
    key = np.unique(np.minimum(a, b) * n + np.maximum(a, b))
    a, b = key // n, key % n
    swap = scores[a] < scores[b]
    chosen, rejected = np.where(swap, b, a), np.where(swap, a, b)
    ok = (scores[chosen] - scores[rejected] >= margin) & (scores[chosen] > scores[rejected])   # float edges
    chosen, rejected = chosen[ok], rejected[ok]
    perm = rng.permutation(len(chosen))
    return chosen[perm], rejected[perm], identical


def _stats(values: np.ndarray) -> dict[str, float] | None:
    if values.size == 0:
        return None
    return {"min": float(values.min()), "median": float(np.median(values)), "max": float(values.max()),
            "mean": float(values.mean())}


def _fmt_score(x: float | None) -> str:
    return "" if x is None else repr(float(x))


class _Indexed:
    """The pairs of one split as indices into its sequences (scored mode: no Pair objects)."""

    def __init__(self, seqs: list[str], scores: np.ndarray, chosen: np.ndarray, rejected: np.ndarray):
        self.seqs, self.scores = seqs, scores
        self.chosen, self.rejected = chosen.tolist(), rejected.tolist()

    def __len__(self) -> int:
        return len(self.chosen)

    def chunks(self, size: int = 65536) -> Iterator[str]:
        seqs, text = self.seqs, [repr(x) for x in self.scores.tolist()]
        for i in range(0, len(self.chosen), size):
            yield "".join(f"{seqs[c]}\t{seqs[r]}\t{text[c]}\t{text[r]}\n"
                          for c, r in zip(self.chosen[i:i + size], self.rejected[i:i + size]))


def _chunks(pairs: _Indexed | list[Pair], size: int = 65536) -> Iterator[str]:
    if isinstance(pairs, _Indexed):
        yield from pairs.chunks(size)
        return
    for i in range(0, len(pairs), size):
        yield "".join(f"{p.chosen}\t{p.rejected}\t{_fmt_score(p.chosen_score)}\t{_fmt_score(p.rejected_score)}\n"
                      for p in pairs[i:i + size])


# ----------------------------------------------------------------------------- build


class _Built(NamedTuple):
    """The pairs of every split and what the manifest says about them."""
    pairs: dict[str, _Indexed | list[Pair]]
    rows: Counter           # rows read per split
    drops: Drops
    columns: dict[str, str | None]
    diffs: dict[str, np.ndarray]                    # chosen - rejected score per pair
    score_stats: dict[str, dict[str, float] | None]
    sequences: dict[str, int]                       # distinct sequences per split
    identical: int                                  # pairs dropped for identical sequences


def build_pairs(path: str | os.PathLike | None = None, out_dir: str | os.PathLike = "pairs", *,
                sequence_col: str | None = None, score_col: str | None = None,
                chosen_col: str | None = None, rejected_col: str | None = None,
                chosen_score_col: str | None = None, rejected_score_col: str | None = None,
                split_col: str | None = None, val_fraction: float = 0.1, margin: float | None = None,
                pairs_per_sequence: int = 2, max_pairs: int | None = None, seed: int = 0,
                max_len: int = 1024, overwrite: bool = False) -> dict[str, Any]:
    """Build a pairs directory `out_dir` from `path` (default: the shipped GB1 sample) and
    return the report (a dict: the manifest plus out_dir, seconds and dropped-row examples).

    Scored mode (default; `sequence_col`/`score_col` default to the first column named
    sequence/seq/x and score/fitness/y) or explicit mode (`chosen_col` and `rejected_col`).
    `margin` (scored mode only, default 0.5): minimum score difference of a pair.
    `pairs_per_sequence`: partners drawn per sequence; `max_pairs`: at most this many pairs
    in each split (a seeded random subset). PlanError and nothing written on bad input."""
    t0 = time.perf_counter()
    explicit, margin, k = _check_options(sequence_col, score_col, chosen_col, rejected_col, chosen_score_col,
                                         rejected_score_col, margin, pairs_per_sequence, max_pairs, seed, max_len,
                                         val_fraction)
    out = os.path.abspath(os.fspath(out_dir))
    _check_out(out, overwrite)
    table = Table(gb1_sample_path() if path is None else path)
    splitter = Splitter(table, split_col, val_fraction, seed)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x9A125])))
    if explicit:
        built = _explicit_pairs(table, chosen_col, rejected_col, chosen_score_col, rejected_score_col, splitter,
                                max_len, max_pairs, rng)
    else:
        built = _scored_pairs(table, sequence_col, score_col, splitter, max_len, margin, k, max_pairs, rng)
    _check_train(built.pairs, built.sequences, built.rows, built.score_stats, margin, explicit, table)
    manifest = _manifest(built, table, splitter, explicit, margin, k, max_pairs, seed, max_len, val_fraction)
    _write(out, manifest, built.pairs, overwrite)
    return {**manifest, "out_dir": out, "dropped_examples": built.drops.examples,
            "seconds": round(time.perf_counter() - t0, 3)}


def _check_options(sequence_col, score_col, chosen_col, rejected_col, chosen_score_col, rejected_score_col,
                   margin, pairs_per_sequence, max_pairs, seed, max_len, val_fraction) -> tuple[bool, float | None, int]:
    """build_pairs' options checked: (explicit mode?, the margin, pairs per sequence)."""
    explicit = chosen_col is not None or rejected_col is not None
    if explicit and (chosen_col is None or rejected_col is None):
        raise PlanError("explicit pairs need both --chosen-col and --rejected-col",
                        field="--rejected-col" if rejected_col is None else "--chosen-col")
    if explicit and (sequence_col is not None or score_col is not None):
        raise PlanError("give either --sequence-col/--score-col (pairs built from scores) or "
                        "--chosen-col/--rejected-col (explicit pairs), not both", field="--chosen-col")
    if not explicit and (chosen_score_col is not None or rejected_score_col is not None):
        raise PlanError("score columns of explicit pairs need --chosen-col and --rejected-col", field="--chosen-col")
    if explicit and margin is not None:
        raise PlanError("applies only when pairs are built from scored sequences (explicit pairs are taken "
                        "as they are)", field="--margin")
    if not explicit:
        margin = 0.5 if margin is None else check_number("--margin", margin, 0, integer=False)
    k = check_number("--pairs-per-sequence", pairs_per_sequence, 1, integer=True)
    if max_pairs is not None:
        check_number("--max-pairs", max_pairs, 1, integer=True)
    check_number("--seed", seed, 0, integer=True)
    check_number("--max-len", max_len, 1, integer=True)
    check_number("--val-fraction", val_fraction, 0, integer=False, hi=1, hi_open=True)
    return explicit, margin, k


def _explicit_pairs(table: Table, chosen_col: str, rejected_col: str, chosen_score_col: str | None,
                    rejected_score_col: str | None, splitter: Splitter, max_len: int, max_pairs: int | None,
                    rng: np.random.Generator) -> _Built:
    pairs, rows, drops, columns = _read_explicit(table, chosen_col, rejected_col, chosen_score_col,
                                                 rejected_score_col, splitter, max_len)
    for s in SPLITS:        # seeded order; max_pairs: the first ones, a random subset
        pairs[s] = [pairs[s][i] for i in rng.permutation(len(pairs[s]))[:max_pairs]]
    diffs = {s: np.array([p.chosen_score - p.rejected_score for p in pairs[s]
                          if p.chosen_score is not None and p.rejected_score is not None]) for s in SPLITS}
    score_stats = {s: _stats(np.array([x for p in pairs[s] for x in (p.chosen_score, p.rejected_score)
                                       if x is not None])) for s in SPLITS}
    sequences = {s: len({q for p in pairs[s] for q in (p.chosen, p.rejected)}) for s in SPLITS}
    return _Built(pairs, rows, drops, columns, diffs, score_stats, sequences, 0)


def _scored_pairs(table: Table, sequence_col: str | None, score_col: str | None, splitter: Splitter,
                  max_len: int, margin: float, k: int, max_pairs: int | None, rng: np.random.Generator) -> _Built:
    sequence_col = sequence_col or table.find(DEFAULT_SEQUENCE_COLS)
    score_col = score_col or table.find(DEFAULT_SCORE_COLS)
    if sequence_col is None or score_col is None:
        option, names = (("--sequence-col", DEFAULT_SEQUENCE_COLS) if sequence_col is None
                         else ("--score-col", DEFAULT_SCORE_COLS))
        raise PlanError(f"no column named {'/'.join(names)} in {table.path}; name one of the columns present: "
                        f"{', '.join(map(repr, table.header))}", field=option)
    kept, rows, drops = read_scored(table, sequence_col, score_col, splitter, max_len)
    columns = {"sequence": table.header[table.column(sequence_col, "--sequence-col")],
               "score": table.header[table.column(score_col, "--score-col")], "split": splitter.name}
    pairs, diffs, score_stats, sequences, identical = {}, {}, {}, {}, 0
    for s in SPLITS:
        seqs, sc = kept[s][0], np.asarray(kept[s][1], dtype=np.float64)
        chosen, rejected, same = _pair_split(sc, margin, k, rng)
        identical += same
        if max_pairs is not None and len(chosen) > max_pairs:
            chosen, rejected = chosen[:max_pairs], rejected[:max_pairs]     # already shuffled
        pairs[s] = _Indexed(seqs, sc, chosen, rejected)
        diffs[s] = sc[chosen] - sc[rejected]
        score_stats[s] = _stats(sc)
        sequences[s] = len(seqs)
    return _Built(pairs, rows, drops, columns, diffs, score_stats, sequences, identical)


def _manifest(built: _Built, table: Table, splitter: Splitter, explicit: bool, margin: float | None, k: int,
              max_pairs: int | None, seed: int, max_len: int, val_fraction: float) -> dict[str, Any]:
    rows, drops, columns = built.rows, built.drops, built.columns
    source = {"path": os.path.abspath(table.path), "sha256": table.sha256, "rows": sum(rows.values()),
              "bytes": table.size, "gzip": table.gzip, "delimiter": table.delimiter}
    return {
        "format": FORMAT, "version": FORMAT_VERSION, "source": source, "columns": columns,
        "mode": "explicit" if explicit else "scored",
        "margin": margin, "seed": seed, "max_len": max_len,
        "pairs_per_sequence": None if explicit else k, "max_pairs": max_pairs,
        "split_rule": splitter.rule, "val_fraction": val_fraction if splitter.name is None else None,
        "counts": {s: len(built.pairs[s]) for s in SPLITS},
        "rows": {"read": sum(rows.values()), "per_split": dict(rows),
                 "kept": {s: rows[s] - sum(drops.per_split[s].values()) for s in SPLITS},
                 "dropped": dict(drops.counts),
                 "dropped_per_split": {s: dict(drops.per_split[s]) for s in SPLITS}},
        "sequences": built.sequences,
        "score_stats": built.score_stats,
        "difference_stats": {s: _stats(built.diffs[s]) for s in SPLITS},
        "identical_pairs_dropped": built.identical,
        "files": {s: f"{s}.tsv" for s in SPLITS},
        "file_columns": list(COLUMNS),
        "created_by": _command(table.path, explicit, columns, splitter, margin, k, max_pairs, seed, max_len,
                               val_fraction),
    }


def _read_explicit(table: Table, chosen_col: str, rejected_col: str, chosen_score_col: str | None,
                   rejected_score_col: str | None, splitter: Splitter, max_len: int):
    ci, ri = table.column(chosen_col, "--chosen-col"), table.column(rejected_col, "--rejected-col")
    csi = None if chosen_score_col is None else table.column(chosen_score_col, "--chosen-score-col")
    rsi = None if rejected_score_col is None else table.column(rejected_score_col, "--rejected-score-col")
    columns = {"chosen": table.header[ci], "rejected": table.header[ri],
               "chosen_score": None if csi is None else table.header[csi],
               "rejected_score": None if rsi is None else table.header[rsi], "split": splitter.name}
    pairs: dict[str, list[Pair]] = {s: [] for s in SPLITS}
    rows: Counter[str] = Counter({s: 0 for s in SPLITS})
    drops = Drops()
    seen: set[tuple[str, str]] = set()
    for lineno, row in table.rows():
        seqs = []
        for i, option in ((ci, "--chosen-col"), (ri, "--rejected-col")):
            seq, reason, detail = parse_sequence(cell(row, i, lineno, table))
            if reason is not None:
                raise PlanError(f"{table.path} line {lineno}: {reason.replace('_', ' ')} in column "
                                f"{table.header[i]!r}: {detail}", field=option)
            seqs.append(seq)
        chosen, rejected = seqs
        if chosen == rejected:
            raise PlanError(f"{table.path} line {lineno}: chosen and rejected sequences are identical",
                            field="--rejected-col")
        cs = None if csi is None else parse_score(cell(row, csi, lineno, table), lineno, table.header[csi],
                                             "--chosen-score-col", table)
        rs = None if rsi is None else parse_score(cell(row, rsi, lineno, table), lineno, table.header[rsi],
                                             "--rejected-score-col", table)
        if cs is not None and rs is not None and cs < rs:
            raise PlanError(f"{table.path} line {lineno}: chosen score {cs!r} is below the rejected score {rs!r}",
                            field="--chosen-score-col")
        split = splitter(row, lineno, chosen)
        rows[split] += 1
        if max(len(chosen), len(rejected)) > max_len:
            drops.add("too_long", split, lineno, f"{max(len(chosen), len(rejected))} residues > max_len {max_len}")
            continue
        if (chosen, rejected) in seen:
            drops.add("duplicate", split, lineno, "pair already seen earlier in the file")
            continue
        seen.add((chosen, rejected))
        pairs[split].append(Pair(chosen, rejected, cs, rs))
    if sum(rows.values()) == 0:
        raise PlanError(f"{table.path}: no data rows after the header", field="input")
    return pairs, rows, drops, columns


def _check_train(pairs, sequences, rows, score_stats, margin, explicit, table) -> None:
    if pairs["train"]:
        return
    if rows["train"] == 0:
        raise PlanError(f"{table.path}: no rows in split 'train' (rows per split: "
                        f"{', '.join(f'{s} {n:,}' for s, n in rows.items())})", field="--split-col")
    if explicit:
        raise PlanError(f"{table.path}: no usable pair in split 'train' (all {rows['train']:,} dropped)",
                        field="--max-len")
    if sequences["train"] < 2:
        raise PlanError(f"{table.path}: split 'train' has {sequences['train']} usable sequence(s); a pair needs two",
                        field="--sequence-col")
    widest = max((st["max"] - st["min"] for st in score_stats.values() if st), default=0.0)
    st = score_stats["train"]
    raise PlanError(f"no two sequences of split 'train' differ in score by at least the margin {margin:g} "
                    f"(largest difference found: {st['max'] - st['min']:.4g} in train, {widest:.4g} in any split); "
                    "lower --margin", field="--margin")


def _command(path, explicit, columns, splitter, margin, k, max_pairs, seed, max_len, val_fraction) -> str:
    args = ["exaplan", "data", "pairs", os.path.abspath(path)]
    if explicit:
        args += ["--chosen-col", columns["chosen"], "--rejected-col", columns["rejected"]]
        for key in ("chosen_score", "rejected_score"):
            if columns[key] is not None:
                args += [f"--{key.replace('_', '-')}-col", columns[key]]
    else:
        args += ["--sequence-col", columns["sequence"], "--score-col", columns["score"], "--margin", f"{margin:g}",
                 "--pairs-per-sequence", str(k)]
    args += ["--split-col", splitter.name or "none"]
    if splitter.name is None:
        args += ["--val-fraction", f"{val_fraction:g}"]
    if max_pairs is not None:
        args += ["--max-pairs", str(max_pairs)]
    args += ["--seed", str(seed), "--max-len", str(max_len), "-o", "DIR"]     # DIR: where the manifest is
    return shlex.join(args)


def _check_out(out: str, overwrite: bool) -> None:
    if not os.path.exists(out):
        return
    if not overwrite:
        raise PlanError(f"{out}: already exists (give --force to replace it)", field="--out")
    try:
        ok = load_manifest(out)["format"] == FORMAT
    except PlanError:
        ok = False
    if not ok:
        raise PlanError(f"{out}: exists and is not a pairs directory; refusing to replace it", field="--out")


def _write(out: str, manifest: dict[str, Any], pairs: dict[str, _Indexed | list[Pair]], overwrite: bool) -> None:
    _check_out(out, overwrite)
    parent = os.path.dirname(out)
    created: list[str] = []
    tmp = None
    try:
        created = makedirs(parent)
        tmp = fresh_dir(parent, f".{os.path.basename(out)}.tmp-")
        for s in SPLITS:
            with open(os.path.join(tmp, f"{s}.tsv"), "w", encoding="ascii", newline="\n") as f:
                f.write(HEADER + "\n")
                for chunk in _chunks(pairs[s]):
                    f.write(chunk)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
        install(tmp, out)
    except BaseException as err:
        discard(tmp, created)
        if isinstance(err, OSError):
            raise PlanError(f"{out}: cannot write the pairs: {err}", field="--out") from err
        raise


# ----------------------------------------------------------------------------- readers


def load_manifest(pairs_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a pairs directory (checks format and version)."""
    path = Path(pairs_dir) / MANIFEST
    if not path.is_file():
        raise PlanError(f"{pairs_dir}: not a pairs directory (no {MANIFEST}; run `exaplan data pairs` first)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:
        raise PlanError(f"{path}: unreadable manifest: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise PlanError(f"{path}: not an {FORMAT} v{FORMAT_VERSION} manifest")
    return manifest


def read_pairs(pairs_dir: str | os.PathLike, split: str = "train") -> list[Pair]:
    """The pairs of one split ('train', 'validation' or 'test'; aliases val, valid, training),
    in file order."""
    manifest = load_manifest(pairs_dir)
    split = split_name(split)
    path = Path(pairs_dir) / manifest.get("files", {}).get(split, f"{split}.tsv")
    if not path.is_file():
        raise PlanError(f"{path}: missing (the manifest lists {manifest['counts'].get(split, 0)} {split} pairs)")
    out: list[Pair] = []
    with open(path, encoding="ascii") as f:
        header = f.readline().rstrip("\n")
        if header != HEADER:
            raise PlanError(f"{path}: header {header!r}, expected {HEADER!r}")
        for lineno, line in enumerate(f, 2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 4 or not fields[0] or not fields[1]:
                raise PlanError(f"{path} line {lineno}: expected 4 tab-separated fields (two sequences, two scores)")
            try:
                cs = float(fields[2]) if fields[2] else None
                rs = float(fields[3]) if fields[3] else None
            except ValueError:
                raise PlanError(f"{path} line {lineno}: score is not a number") from None
            out.append(Pair(fields[0], fields[1], cs, rs))
    expected = manifest["counts"].get(split)
    if expected is not None and expected != len(out):
        raise PlanError(f"{path}: {len(out)} pairs, the manifest says {expected} (truncated or edited?)")
    return out


__all__ = ["FORMAT", "FORMAT_VERSION", "Pair", "SPLITS", "build_pairs", "load_manifest", "read_pairs"]
