"""What the JAX backend checks before JAX starts (no JAX imported here): that it is
installed, that it runs the plan's layout, the steps, the checkpoints in --out."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from planner.schema.errors import PlanError
from planner.schema.plan import Plan

STEP_PREFIX = "step"  # OUT/checkpoints/step_00000123/ (orbax's step folders, jaxrt/checkpoint.py)
ATTENTION_ENV = "EXAPLAN_JAX_ATTENTION"  # the attention kernel, where chosen (jaxrt/model.py)
ATTENTION_CHOICES = ("xla", "cudnn")


def require_jax() -> None:
    missing = [m for m in ("jax", "flax", "optax", "orbax.checkpoint") if missing_module(m)]
    if missing:
        raise PlanError(f"the JAX backend needs {', '.join(missing)}: pip install -e '.[jax]' (docs/guide/backends.md)",
                        field="backend")


def missing_module(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


def unsupported(plan: Plan) -> list[str]:
    """What in the plan the JAX backend does not run, one phrase each (empty: it runs it)."""
    out = []
    if plan.mesh.pp > 1:
        out.append(f"pipeline parallelism (pp = {plan.mesh.pp})")
    if plan.mesh.cp > 1:
        out.append(f"context parallelism (cp = {plan.mesh.cp})")
    if plan.job.precision.value == "fp16":
        out.append("fp16 (no loss scaling here: use bf16 or fp32)")
    if plan.job.workload.value != "pretrain":
        out.append(f"the {plan.job.workload.value} workload (pretraining only)")
    return out


def check_runs(plan: Plan) -> None:
    """Refuse, naming the layout, a plan the JAX backend does not run."""
    problems = unsupported(plan)
    if problems:
        raise PlanError(f"the JAX backend does not run {'; '.join(problems)}: run this plan with --backend torch, or "
                        f"plan for JAX (`exaplan plan ... --backend jax` searches only the layouts it runs)",
                        field="backend")


def latest_step(ckpt_dir: Path) -> int | None:
    """The last complete step saved in `ckpt_dir`, or None (no directory, or none saved):
    orbax renames a step's folder into place only when it is complete."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return None
    n = len(STEP_PREFIX) + 1
    steps = [int(p.name[n:]) for p in ckpt_dir.iterdir()
             if p.is_dir() and p.name.startswith(STEP_PREFIX + "_") and p.name[n:].isdigit()]
    return max(steps, default=None)


def attention_choice() -> str | None:
    """The attention kernel EXAPLAN_JAX_ATTENTION asks for (xla or cudnn), None where unset;
    refused, naming it, otherwise (`exaplan run` asks before JAX starts; jaxrt/model.py again)."""
    choice = os.environ.get(ATTENTION_ENV, "").strip().lower()
    if choice and choice not in ATTENTION_CHOICES:
        raise PlanError(f"{ATTENTION_ENV}={choice!r}: expected {' or '.join(ATTENTION_CHOICES)}")
    return choice or None


def check_before_start(args, plan: Plan) -> None:
    """What can be refused before JAX starts: the layout, the steps, the checkpoints, the
    attention kernel asked for."""
    check_runs(plan)
    attention_choice()
    if args.steps <= 0:
        raise PlanError("must be a positive number of steps", field="steps")
    if args.io_mode == "io-only":
        raise PlanError("io-only measures the torch runtime's loader: use --backend torch", field="--io-mode")
    ckpts = Path(args.out) / "checkpoints"
    if args.resume and latest_step(ckpts) is None:
        raise PlanError(f"no complete JAX checkpoint in {ckpts} to resume from", field="--resume")
    if not args.resume and latest_step(ckpts) is not None:
        raise PlanError(f"{ckpts} already holds checkpoints: pass --resume to continue, or choose another --out",
                        field="--out")
