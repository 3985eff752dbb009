"""How well a trained model ranks protein variants: held-out pair accuracy and the Spearman
correlation between its sequence log-likelihood and measured fitness.

    python -m runtime.dpo_eval RUN [RUN ...] [--pairs DIR] [--table CSV] [--split validation] [--json]

RUN: a run folder of `exaplan run` (its plan.yaml and latest checkpoint), or a checkpoint
folder with --plan. For each model, in one process on the CPU:

    pair accuracy   the fraction of the pairs of --pairs DIR (split --split) whose chosen
                    sequence gets the higher log-likelihood (the model alone, no reference);
    Spearman        rank correlation between the log-likelihood (sum over the residues and
                    <eos> of log p, as runtime/dpo.py computes it) and the measured score of
                    the --split sequences of --table (default: the shipped GB1 sample, the
                    split rule of `exaplan data pairs`, so that with the same seed these are
                    the sequences the held-out pairs were built from).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from planner.schema.errors import PlanError
from planner.schema.vocab import PAD_ID
from runtime.dataprep.fasta import encode


def load_model(run: str | Path, plan_path: str | Path | None = None):
    """(ProteinLM with the checkpoint's weights, eval mode, on the CPU; the checkpoint used)."""
    from planner.schema.plan import load_plan
    from runtime import checkpoint
    from runtime.dpo import resolve_checkpoint
    from runtime.model import ProteinLM

    run = Path(run)
    plan_path = Path(plan_path) if plan_path else run / "plan.yaml"
    if not plan_path.is_file():
        raise PlanError(f"{run}: no plan.yaml (a run folder of `exaplan run`); give the model's plan with --plan",
                        field="--plan")
    spec = load_plan(plan_path).model
    ckpt = resolve_checkpoint(run)
    model = ProteinLM(spec)
    checkpoint.load(ckpt, [model], None, restore_rng=False)
    model.setup_rope()
    return model.eval(), ckpt


@torch.no_grad()
def log_likelihoods(model, sequences: list[str], batch_size: int = 512) -> np.ndarray:
    """Sum of log p over the residues and <eos> of each `<bos> residues <eos>` sequence."""
    from runtime.dpo_objective import sequence_logps

    limit = model.spec.seq_len + 1
    out = np.empty(len(sequences), dtype=np.float64)
    for start in range(0, len(sequences), batch_size):
        toks = [encode(s) for s in sequences[start:start + batch_size]]
        width = max(len(t) for t in toks)
        if width > limit:
            raise PlanError(f"a sequence of {width - 2} residues is longer than the model's seq_len {limit - 1} allows")
        batch = np.full((len(toks), width), PAD_ID, dtype=np.int64)
        for i, t in enumerate(toks):
            batch[i, :len(t)] = t
        batch = torch.from_numpy(batch)
        out[start:start + len(toks)] = sequence_logps(model(batch[:, :-1]), batch[:, 1:]).double().numpy()
    return out


def pair_accuracy(model, pairs_dir: str | Path, split: str = "validation") -> tuple[float, int]:
    """(fraction of pairs whose chosen sequence is the more likely one, number of pairs)."""
    from runtime.dpo_pairs import read_pairs

    pairs = read_pairs(pairs_dir, split)
    if not pairs:
        raise PlanError(f"{pairs_dir}: no {split} pairs", field="--pairs")
    chosen = log_likelihoods(model, [c for c, _ in pairs])
    rejected = log_likelihoods(model, [r for _, r in pairs])
    return float(np.mean(chosen > rejected)), len(pairs)


def fitness_spearman(model, table: str | Path | None = None, split: str = "validation") -> tuple[float, int]:
    """(Spearman rho of log-likelihood against the measured score, number of sequences)."""
    from scipy.stats import spearmanr

    from runtime.dataprep.pairs_table import read_scored_sequences

    scored = read_scored_sequences(table, split=split)
    if len(scored.sequences) < 3:
        raise PlanError(f"{table or 'the GB1 sample'}: fewer than 3 {split} sequences", field="--table")
    rho = spearmanr(log_likelihoods(model, scored.sequences), scored.scores).statistic
    return float(rho), len(scored.sequences)


def evaluate(run: str | Path, pairs_dir: str | Path | None = None, table: str | Path | None = None,
             split: str = "validation", plan_path: str | Path | None = None) -> dict:
    """Pair accuracy (when pairs_dir is given) and fitness Spearman of one run's model."""
    model, ckpt = load_model(run, plan_path)
    out: dict = {"run": str(run), "checkpoint": str(ckpt), "split": split}
    if pairs_dir is not None:
        out["pair_accuracy"], out["pairs"] = pair_accuracy(model, pairs_dir, split)
    out["spearman"], out["sequences"] = fitness_spearman(model, table, split)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.dpo_eval", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run folders (plan.yaml + checkpoints/) or checkpoints")
    ap.add_argument("--plan", help="the model's plan, for a RUN without plan.yaml")
    ap.add_argument("--pairs", help="pairs directory (`exaplan data pairs`) for the pair accuracy")
    ap.add_argument("--table", help="scored CSV/TSV for the Spearman correlation (default: the shipped GB1 sample)")
    ap.add_argument("--split", default="validation", help="split of the pairs and of the table (default validation)")
    ap.add_argument("--json", action="store_true", help="one JSON object per run")
    args = ap.parse_args(argv)
    try:
        results = [evaluate(r, args.pairs, args.table, args.split, args.plan) for r in args.runs]
    except PlanError as e:
        print(f"dpo_eval: error: {e}", file=sys.stderr)
        return 2
    for r in results:
        if args.json:
            print(json.dumps(r))
            continue
        acc = f"pair accuracy {r['pair_accuracy']:.3f} ({r['pairs']} pairs)  " if "pair_accuracy" in r else ""
        print(f"{r['run']}: {acc}Spearman {r['spearman']:+.3f} ({r['sequences']} sequences, {r['split']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
