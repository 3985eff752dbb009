"""The options of one training run (`exaplan run PLAN ...`), declared once: the command line
shows them (`exaplan run --help`) and every rank that torchrun starts reads them again
(`python -m runtime.trainer ...`). No torch here: checking the options must not start it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.schema.errors import PlanError

# The exit code of a run stopped by the scheduler's signal (SIGUSR1 or SIGTERM) after saving a
# complete checkpoint: the job script requeues and continues with --resume (runtime/walltime.py).
EXIT_REQUEUE = 85

DESCRIPTION = ("Train the protein LM as the plan says. On a workstation this starts the plan's ranks through "
               "torchrun; under torchrun, srun, mpiexec or PBS/PALS every process runs as one rank. Writes "
               "metrics.jsonl, TensorBoard events, checkpoints, summary.json (measured against predicted) and "
               "logs/rank-N.log (each rank's stdout and stderr) in --out.")

EPILOG = (f"Walltime: on SIGUSR1 or SIGTERM every rank finishes its optimizer step, the ranks agree, save a complete "
          f"checkpoint, record why they stopped (metrics.jsonl, summary.json, OUT/stopped.json) and exit with "
          f"{EXIT_REQUEUE} (EXIT_REQUEUE): requeue the job with --resume to continue (e.g. Slurm "
          f"`--signal=USR1@120`). On a workstation SIGINT (Ctrl-C) and SIGHUP stop the ranks the same way (a second "
          f"Ctrl-C kills them); if `exaplan run` itself is killed, its ranks save and stop on their own (SIGKILL "
          f"after EXAPLAN_ORPHAN_GRACE_S, 120 s). --out is locked while a run writes to it (a second run is refused, "
          f"a stale lock taken over). Exit codes: 0 done, 2 bad input (nothing started, nothing written), "
          f"{EXIT_REQUEUE} stopped by SIGUSR1/SIGTERM after a checkpoint (requeue with --resume), 130 stopped by "
          f"SIGINT, 129 by SIGHUP (after a checkpoint), other: failed (1: a rank failed or was killed).")


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """The run's options, on `ap`."""
    ap.add_argument("plan", help="plan file (`exaplan plan ... -o plan.yaml`)")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    ap.add_argument("--backend", choices=["torch", "jax"], default=None,
                    help="the runtime: torch (torch.distributed, every layout) or jax (jaxrt/: a jit-compiled step on "
                         "a jax.sharding.Mesh; no pipeline or context parallelism, no DPO); default: the plan's "
                         "`backend`, else torch")
    ap.add_argument("--data", help="FASTA file(s, comma-separated) or a prepared directory (default: the shipped "
                                   "UniProt sample)")
    ap.add_argument("--out", default="runs/latest", help="output directory (metrics, checkpoints, summary)")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out/checkpoints")
    ap.add_argument("--io-mode", choices=["real", "synthetic", "io-only"], default="real",
                    help="real data; one batch reused (no loading); or the loader alone without compute")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the data order (default 0)")
    ap.add_argument("--lr", type=float, default=3e-4, help="peak learning rate of AdamW (default 3e-4)")
    ap.add_argument("--warmup", type=int, default=10, help="linear warm-up steps, then cosine decay to 10%% (default 10)")
    ap.add_argument("--val-every", type=int, default=50, help="validation loss every N steps (0: only at the end)")
    ap.add_argument("--val-batches", type=int, default=4, help="batches per validation (default 4)")
    ap.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps (0: only at the end)")
    ap.add_argument("--no-final-checkpoint", action="store_true",
                    help="write no checkpoint at the end (benchmarks, throwaway runs: a 3B model's weights and "
                         "AdamW state are about 50 GB); --ckpt-every still applies")
    ap.add_argument("--log-every", type=int, default=10, help="print a line every N steps (default 10)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block (the plan may ask for it too)")
    ap.add_argument("--log-samples", action="store_true",
                    help="record the global sample numbers of every step in metrics.jsonl (to check resumption)")
    ap.add_argument("--init", metavar="CKPT_DIR", help="start from the model weights of a checkpoint (a checkpoint, "
                    "a folder of them or a run folder; not its optimizer or data state; any layout)")
    dpo = ap.add_argument_group("DPO (plans with job.workload: dpo; see runtime/dpo.py)")
    dpo.add_argument("--pairs", metavar="DIR", help="preference pairs (`exaplan data pairs`): train/validation.tsv")
    dpo.add_argument("--beta", type=float, help="DPO temperature beta (default 0.1)")
    dpo.add_argument("--label-smoothing", type=float, help="label smoothing eps (conservative DPO; default 0)")
    dpo.add_argument("--reference", metavar="CKPT_DIR", help="reference model weights (default: the initial policy)")
    dpo.add_argument("--precompute-reference", action="store_true",
                     help="reference log-probs of every pair computed once (OUT/reference_logps.npz), no reference "
                          "model in memory during training")
    dpo.add_argument("--val-pairs", type=int, default=0, help="validate on the first N validation pairs (0: all)")


def parse_run_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of one rank (usage errors exit 2, as argparse does)."""
    ap = argparse.ArgumentParser(prog="exaplan run", description=DESCRIPTION, epilog=EPILOG)
    add_run_arguments(ap)
    return ap.parse_args(argv)


class _Refusing(argparse.ArgumentParser):
    """A parser whose usage errors are PlanErrors (for options read by another command)."""

    def error(self, message: str):
        raise PlanError(message, field=self.prog)


def check_launch_run_args(words: list[str], plan_path: str) -> None:
    """`exaplan launch --run-args`: the options the job's `exaplan run` will get, parsed by its
    own parser and their numbers checked now, so that a job is never queued to die on its
    first line. The plan and --out are launch's own (one each)."""
    from runtime.preflight import _FLOATS, _INTS

    ap = _Refusing(prog="--run-args", add_help=False)
    add_run_arguments(ap)
    ap.set_defaults(out=None)
    if any(w in ("-h", "--help") for w in words):
        raise PlanError("--help is no option of a run: see `exaplan run --help`", field="--run-args")
    args = ap.parse_args([plan_path, *words])
    if args.out is not None:
        raise PlanError("the run's output folder is launch's own --out (give it there, once)", field="--run-args")
    for flag, attr, low, high in _INTS:
        value = getattr(args, attr, None)
        if value is not None and not low <= value <= high:
            raise PlanError(f"{flag} must be an integer from {low:,} to {high:,}, got {value}", field="--run-args")
    for flag, attr, low, high in _FLOATS:
        value = getattr(args, attr, None)
        if value is not None and not (value == value and low < value <= high):
            raise PlanError(f"{flag} must be a finite number above {low:g} and at most {high:g}, got {value}",
                            field="--run-args")


def check_run_args(args: argparse.Namespace):
    """The plan, read and checked against the options (the DPO options against the plan's
    workload), so that bad input is refused with exit code 2 before any rank starts.
    Returns the plan."""
    from planner.schema.plan import load_plan
    from runtime.preflight import check_options

    check_options(args)
    plan = load_plan(args.plan)
    if plan.job.workload.value == "dpo" or args.init or args.pairs or args.reference or args.precompute_reference \
            or args.beta is not None or args.label_smoothing is not None:  # (runtime.dpo imports torch: only then)
        from runtime import dpo

        dpo.check_args(args, plan)
    return plan


RESULT_FILES = ("summary.json", "metrics.jsonl")  # what a run writes in --out that a second run would replace


def check_no_earlier_results(args: argparse.Namespace) -> None:
    """A run never replaces another's results: without --resume, an --out holding summary.json
    or metrics.jsonl is refused (by the launcher, before it takes the lock: a rank cannot tell
    an earlier run's files from those its own rank 0 has just begun)."""
    earlier = [n for n in RESULT_FILES if (Path(args.out) / n).exists()]
    if not args.resume and earlier:
        raise PlanError(f"{args.out} holds an earlier run's results ({', '.join(earlier)}): choose another --out "
                        "(or remove them); a run never replaces another's", field="--out")


def check_out_of_a_new_segment(args: argparse.Namespace) -> None:
    """What the one process that owns --out (the local launcher; rank 0 under srun, mpiexec or a
    job's torchrun, holding the lock, before it writes) refuses: an earlier run's results
    without --resume, and a --resume of a run that is finished (its checkpoint at --steps), which
    would only rewrite summary.json."""
    from runtime.checkpoint.paths import checkpoint_step, latest

    check_no_earlier_results(args)
    if not args.resume:
        return
    found = latest(Path(args.out) / "checkpoints")
    step = checkpoint_step(found) if found is not None else None
    if step is not None and step >= args.steps:
        raise PlanError(f"{args.out} holds a finished run: its checkpoint {found.name} is at step {step:,} and "
                        f"--steps is {args.steps:,}, so nothing is left to resume (raise --steps to train on, or "
                        "choose another --out)", field="--steps")


def check_before_launch(args: argparse.Namespace, plan=None) -> None:
    """What can be refused before any rank starts: steps, the output folder, the data (the
    pretraining sequences, prepared here once; a dpo plan trains on --pairs, which the
    trainer checks)."""
    from runtime import checkpoint
    from runtime.dataprep.cache import ensure_prepared

    if args.steps <= 0:
        raise PlanError("must be a positive number of steps", field="steps")
    ckpts = Path(args.out) / "checkpoints"
    if args.resume and checkpoint.latest(ckpts) is None:
        raise PlanError(f"no complete checkpoint in {ckpts} to resume from", field="--resume")
    if not args.resume and checkpoint.latest(ckpts) is not None:
        raise PlanError(f"{ckpts} already holds checkpoints: pass --resume to continue, or choose another --out",
                        field="--out")
    if plan is None or plan.job.workload.value != "dpo":
        ensure_prepared(args.data, Path(args.out) / "data", rank=0)
