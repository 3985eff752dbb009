"""`exaplan data`: prepare FASTA into token shards (`prepare`), describe a prepared directory
(`info`), the shipped sample's path (`sample`), and DPO preference pairs from a scored table
(`pairs`). The work is in runtime/dataprep/ (prepare.py, cache.py, pairs.py)."""

from __future__ import annotations

import argparse
import json
import os

from cli.common import print_json
from planner.schema.errors import PlanError


def add_parser(sub) -> None:
    d = sub.add_parser("data", help="prepare FASTA into token shards; DPO pairs (`exaplan data --help`)",
                       description="Data for `exaplan run`: token shards from protein FASTA, and (chosen, rejected) "
                                   "preference pairs for DPO.")
    actions = d.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("prepare", help="tokenise FASTA files (plain or .gz) into a prepared directory",
                           description="Stream FASTA (plain or gzip, larger than memory) into uint8 token shards and "
                                       "an index, with a deterministic train/validation split by record id.")
    p.add_argument("fasta", nargs="*", help="FASTA files (default: the shipped UniProt sample)")
    p.add_argument("-o", "--out", required=True, help="output directory (written atomically)")
    p.add_argument("--max-len", type=int, default=1024, help="longest sequence kept, in residues (default 1024)")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="validation share, by record id hash (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/validation split (default 0)")
    p.add_argument("--force", "--overwrite", dest="overwrite", action="store_true",
                   help="replace an existing prepared directory (--overwrite: the same)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes that parse the FASTA blocks (default 1; 0: one per core); the output is the "
                        "same whatever N. A gzip file is decompressed by one process: the others parse")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    i = actions.add_parser("info", help="describe a prepared directory")
    i.add_argument("dir")
    i.add_argument("--json", action="store_true", help="print the manifest")
    s = actions.add_parser("sample", help="print the path of the shipped UniProt sample FASTA")
    s.add_argument("--json", action="store_true", help="print the path as JSON")
    add_pairs_parser(actions)


def run(args: argparse.Namespace) -> int:
    from runtime.dataprep.cache import describe, prepared_manifest
    from runtime.dataprep.prepare import prepare, sample_fasta_path

    if args.action == "pairs":
        return run_pairs(args)
    if args.action == "sample":
        path = str(sample_fasta_path())
        if args.json:
            print_json(dict(path=path))
        else:
            print(path)
        return 0
    if args.action == "info":
        print(json.dumps(prepared_manifest(args.dir), indent=1) if args.json else describe(args.dir))
        return 0
    if args.workers < 0:
        raise PlanError(f"must be 0 (one per core) or more, got {args.workers}", field="workers")
    workers = args.workers or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    from runtime.dataprep.blocks import keep_freed_memory

    keep_freed_memory()
    rep = prepare(args.fasta or [str(sample_fasta_path())], args.out, max_len=args.max_len,
                  val_fraction=args.val_fraction, seed=args.seed, progress=not args.no_progress,
                  overwrite=args.overwrite, workers=workers)
    if args.json:
        print(json.dumps({**rep.__dict__}, indent=1))
    else:
        print(rep.summary())
        for ex in rep.skipped_examples[:5]:
            print(f"  skipped {os.path.basename(ex['file'])}:{ex['line']} {ex['id']!r}: {ex['reason']} ({ex['detail']})")
    return 0


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

Output DIR (atomic; --force replaces an existing pairs directory):
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
    """The `pairs` action of `exaplan data` (sub: argparse subparsers)."""
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
    p.add_argument("--force", "--overwrite", dest="overwrite", action="store_true",
                   help="replace an existing pairs directory (--overwrite: the same)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_pairs(args) -> int:
    from runtime.dataprep.pairs import build_pairs
    from runtime.dataprep.pairs_report import format_report

    rep = build_pairs(args.table, args.out, sequence_col=args.sequence_col, score_col=args.score_col,
                      chosen_col=args.chosen_col, rejected_col=args.rejected_col,
                      chosen_score_col=args.chosen_score_col, rejected_score_col=args.rejected_score_col,
                      split_col=args.split_col, val_fraction=args.val_fraction, margin=args.margin,
                      pairs_per_sequence=args.pairs_per_sequence, max_pairs=args.max_pairs, seed=args.seed,
                      max_len=args.max_len, overwrite=args.overwrite)
    print(json.dumps(rep, indent=1) if args.json else format_report(rep))
    return 0
