"""`exaplan data prepare|info|sample|pairs`: `main(argv) -> int`; and the report table of
`exaplan data pairs`. PlanError propagates (the exaplan CLI prints it, exit 2). Preparing:
runtime/dataprep/prepare.py; pairs: runtime/dataprep/pairs.py."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from runtime.dataprep.cache import describe, prepared_manifest
from runtime.dataprep.pairs import FORMAT, FORMAT_VERSION, SPLITS, build_pairs, load_manifest
from runtime.dataprep.prepare import prepare, sample_fasta_path


def main(argv: list[str] | None = None) -> int:
    """`exaplan data prepare|info|sample|pairs`: PlanError propagates (the exaplan CLI prints it, exit 2)."""
    import argparse

    ap = argparse.ArgumentParser(prog="exaplan data", description="Protein FASTA -> token shards for `exaplan run`.")
    sub = ap.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="tokenise FASTA files (plain or .gz) into a prepared directory")
    p.add_argument("fasta", nargs="*", help="FASTA files (default: the shipped UniProt sample)")
    p.add_argument("-o", "--out", required=True, help="output directory (written atomically)")
    p.add_argument("--max-len", type=int, default=1024, help="longest sequence kept, in residues (default 1024)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="validation share, by record id hash (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/validation split (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prepared directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    i = sub.add_parser("info", help="describe a prepared directory")
    i.add_argument("dir")
    i.add_argument("--json", action="store_true", help="print the manifest")
    sub.add_parser("sample", help="print the path of the shipped UniProt sample FASTA")
    add_pairs_parser(sub)   # `exaplan data pairs`: DPO preference pairs (runtime/dataprep/pairs.py)
    args = ap.parse_args(argv)
    if args.action == "pairs":
        return run_pairs(args)
    if args.action == "sample":
        print(sample_fasta_path())
        return 0
    if args.action == "info":
        if args.json:
            print(json.dumps(prepared_manifest(args.dir), indent=1))
        else:
            print(describe(args.dir))
        return 0
    rep = prepare(args.fasta or [str(sample_fasta_path())], args.out, max_len=args.max_len,
                  val_fraction=args.val_fraction, seed=args.seed, progress=not args.no_progress,
                  overwrite=args.overwrite)
    if args.json:
        print(json.dumps({**rep.__dict__}, indent=1))
    else:
        print(rep.summary())
        for ex in rep.skipped_examples[:5]:
            print(f"  skipped {os.path.basename(ex['file'])}:{ex['line']} {ex['id']!r}: {ex['reason']} ({ex['detail']})")
    return 0


# ----------------------------------------------------------------------------- reports


def _num(x: float | None, width: int = 9) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.3g}"


def format_report(rep: dict[str, Any]) -> str:
    """The report of `build_pairs` (or a manifest) as a table."""
    src, rows = rep["source"], rep["rows"]
    cols = ", ".join(f"{k} {v!r}" for k, v in rep["columns"].items() if v is not None)
    how = (f"margin {rep['margin']:g}, up to {rep['pairs_per_sequence']} partner(s) per sequence"
           if rep["mode"] == "scored" else "explicit pairs (no margin)")
    if rep.get("max_pairs"):
        how += f", at most {rep['max_pairs']:,} pairs per split"
    lines = [f"{src['path']} ({src['rows']:,} rows, sha256 {src['sha256'][:16]}...)"
             + (f" -> {rep['out_dir']}" if "out_dir" in rep else ""),
             f"columns: {cols}; {how}; seed {rep['seed']}; max_len {rep['max_len']}",
             f"split rule: {rep['split_rule']}" + (f" (val_fraction {rep['val_fraction']:g})"
                                                   if rep.get("val_fraction") is not None else ""),
             "",
             f"{'split':<11}{'rows':>10}{'dropped':>9}{'sequences':>11}{'pairs':>11}"
             f"{'diff min':>10}{'median':>9}{'max':>9}"]
    total = Counter()
    for s in SPLITS:
        d = rep["difference_stats"][s] or {}
        dropped = sum(rows["dropped_per_split"][s].values())
        lines.append(f"{s:<11}{rows['per_split'][s]:>10,}{dropped:>9,}{rep['sequences'][s]:>11,}"
                     f"{rep['counts'][s]:>11,}{_num(d.get('min'), 10)}{_num(d.get('median'))}{_num(d.get('max'))}")
        total.update(rows=rows["per_split"][s], dropped=dropped, sequences=rep["sequences"][s], pairs=rep["counts"][s])
    lines.append(f"{'total':<11}{total['rows']:>10,}{total['dropped']:>9,}{total['sequences']:>11,}{total['pairs']:>11,}")
    lines.append("")
    dropped = ", ".join(f"{k} {v:,}" for k, v in rows["dropped"].items() if v) or "none"
    lines.append(f"rows dropped: {dropped}")
    for ex in rep.get("dropped_examples", [])[:8]:
        lines.append(f"  line {ex['line']}: {ex['reason']} ({ex['detail']})")
    lines.append(f"pairs dropped for identical sequences: {rep['identical_pairs_dropped']:,}"
                 + (" (duplicate sequences are dropped before pairing)" if rep["mode"] == "scored" else ""))
    if rep["counts"]["validation"] == 0:
        lines.append("note: no validation pairs")
    if "seconds" in rep:
        lines.append(f"{rep['seconds']:.1f} s")
    return "\n".join(lines)


def describe_pairs(pairs_dir: str | os.PathLike) -> str:
    """A few lines about a pairs directory."""
    m = load_manifest(pairs_dir)
    return f"{os.path.abspath(pairs_dir)}: {FORMAT} v{FORMAT_VERSION}\n" + format_report(m)


# ----------------------------------------------------------------------------- CLI

HELP = """\
Build (chosen, rejected) preference pairs for DPO from a CSV/TSV table (plain or .gz).

Scored sequences (default): --sequence-col and --score-col (higher score = preferred; default
columns sequence/seq/x and score/fitness/y). Within each split every sequence gets up to
--pairs-per-sequence partners, drawn at random (--seed) among the sequences of the same split
whose score differs by at least --margin; pairs never cross splits. Rows with letters outside
A-Z, longer than --max-len, without a score, or repeating an earlier sequence are dropped and
counted. Explicit pairs: --chosen-col/--rejected-col (optional score columns) are taken as
they are. Splits: --split-col (default: a column named `set`; values training/train,
validation/valid/val, test), else a hash of the sequence puts --val-fraction in validation.

Output DIR (atomic; --overwrite replaces an existing pairs directory):
  manifest.json                 format exaplan-pairs v1: source (path, sha256, rows), columns,
                                margin, seed, max_len, counts per split, score_stats, created_by
  train.tsv validation.tsv test.tsv
                                chosen<TAB>rejected<TAB>chosen_score<TAB>rejected_score
Python: runtime.dataprep.pairs.read_pairs(DIR, "train") -> [Pair(chosen, rejected, chosen_score, rejected_score)].

Example, the shipped GB1 sample (Olson et al. 2014 double mutants, via mavenn; the default input):
  exaplan data pairs -o gb1pairs
  exaplan data pairs gb1_data.csv.gz --sequence-col x --score-col y --margin 1 -o gb1pairs
"""


def add_pairs_parser(sub) -> None:
    """The `pairs` subcommand of `exaplan data` (sub: argparse subparsers)."""
    import argparse

    p = sub.add_parser("pairs", help="build DPO preference pairs from a scored CSV/TSV (default: shipped GB1 sample)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", nargs="?", help="CSV/TSV file, plain or .gz (default: the shipped GB1 sample)")
    p.add_argument("-o", "--out", required=True, help="output directory (written atomically)")
    p.add_argument("--sequence-col", help="column of sequences (default: sequence, seq or x)")
    p.add_argument("--score-col", help="column of scores, higher is preferred (default: score, fitness or y)")
    p.add_argument("--chosen-col", help="explicit pairs: column of the chosen sequences")
    p.add_argument("--rejected-col", help="explicit pairs: column of the rejected sequences")
    p.add_argument("--chosen-score-col", help="explicit pairs: optional score column of the chosen sequence")
    p.add_argument("--rejected-score-col", help="explicit pairs: optional score column of the rejected sequence")
    p.add_argument("--split-col", help="split column (default: `set` if present; `none`: hash split)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="validation share of the hash split, by sequence (default 0.1)")
    p.add_argument("--margin", type=float, help="minimum score difference of a built pair (default 0.5)")
    p.add_argument("--pairs-per-sequence", type=int, default=2, help="partners drawn per sequence (default 2)")
    p.add_argument("--max-pairs", type=int, help="at most this many pairs per split (a seeded random subset)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling and the hash split (default 0)")
    p.add_argument("--max-len", type=int, default=1024, help="longest sequence kept, in residues (default 1024)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing pairs directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_pairs(args) -> int:
    rep = build_pairs(args.table, args.out, sequence_col=args.sequence_col, score_col=args.score_col,
                      chosen_col=args.chosen_col, rejected_col=args.rejected_col,
                      chosen_score_col=args.chosen_score_col, rejected_score_col=args.rejected_score_col,
                      split_col=args.split_col, val_fraction=args.val_fraction, margin=args.margin,
                      pairs_per_sequence=args.pairs_per_sequence, max_pairs=args.max_pairs, seed=args.seed,
                      max_len=args.max_len, overwrite=args.overwrite)
    print(json.dumps(rep, indent=1) if args.json else format_report(rep))
    return 0


__all__ = ["add_pairs_parser", "describe_pairs", "format_report", "main", "run_pairs"]
