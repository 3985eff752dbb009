"""A framework profile's CPU figures, fitted from its own runs on this machine
(`exaplan validate --local --backend jax --refit`).

The torch runtime's figures on a CPU are the local machine's own (machine_models/loader.py,
`exaplan calibrate`). Another runtime on the same CPU reaches other figures: XLA fuses the
elementwise work that torch runs op by op, compiles the whole step (no per-operator Python
cost, no DTensor dispatch) and runs the collectives of one process's devices in memory. So
the jax profile carries `cpu_figures` (planner/schema/figures.py names) that replace the
machine's on a CPU workstation (figures.framework_machine). They are fitted here by the same
least squares as `exaplan calibrate --from-runs` (calibration/fit_runs.py) on the runs of one
local validation, starting from the machine's own figures, and checked by leave-one-layout-
out: each layout predicted by a fit to the others.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from calibration.fit_runs import MeasuredRun, layout_of, leave_one_layout_out, load_runs, refit_from_runs, step_errors
from machine_models.frameworks import FRAMEWORKS_FILE
from planner.schema.errors import PlanError
from planner.schema.figures import figures_of, with_figures

# What differs between runtimes on one CPU (module doc): matmul efficiency, the attention
# core (fused by XLA), per-operator cost, copies around the data-parallel collectives (FSDP2's
# copy-in/out), the reduce-scatter / all-gather, the optimizer's memory traffic.
CPU_FIGURES = ("peak_fraction", "attention_efficiency_factor", "op_overhead_us", "dp_buffer_copies",
               "rs_ag_efficiency", "optimizer_bytes_per_param")
# Not fitted but known: XLA has no DTensor dispatch (tensor parallelism is compiled in).
FIXED = {"dtensor_op_overhead_us": 0.0}


def _runs_without_profile_figures(run_dirs: Sequence[Path]) -> list[MeasuredRun]:
    """The runs, their plans' profiles stripped of CPU figures: the fit varies the machine's."""
    runs = load_runs(run_dirs)
    if len({layout_of(r) for r in runs}) < 3:
        raise PlanError("needs runs of at least 3 layouts", field="runs")
    for r in runs:
        r.plan.job.framework.cpu_figures = {}
    return runs


def _stats(errors: dict[str, float]) -> dict[str, float]:
    a = np.abs(list(errors.values()))
    return {"median_abs": float(np.median(a)), "max_abs": float(np.max(a))}


def fit_cpu_figures(run_dirs: Sequence[Path], figures: Sequence[str] = CPU_FIGURES) -> dict[str, Any]:
    """The CPU figures fitted to every run, the errors before (the machine's own figures) and
    after, and the leave-one-layout-out errors (each layout's runs predicted by a fit to the
    other layouts'). Returns {figures, before, fit, loo, *_stats}."""
    runs = _runs_without_profile_figures([Path(d) for d in run_dirs])
    machine = runs[0].plan.machine
    fixed = {k: v for k, v in FIXED.items() if k not in figures}
    base = with_figures(machine, fixed)
    fitted = refit_from_runs(None, base, figures, runs=runs)
    loo = leave_one_layout_out(runs, base, figures)
    names = [*figures, *fixed]
    out = {"figures": figures_of(fitted, names), "machine_figures": figures_of(machine, names),
           "before": step_errors(runs, machine), "fit": step_errors(runs, fitted), "loo": loo}
    for key in ("before", "fit", "loo"):
        out[f"{key}_stats"] = _stats(out[key])
    return out


def save_cpu_figures(framework: str, result: dict[str, Any], command: str, path: Path = FRAMEWORKS_FILE) -> None:
    """Rewrite `framework`'s `cpu_figures:` line in frameworks.yaml (and the `# cpu fit:`
    comment above it); every other line stays as it is."""
    from calibration.fit_measurements import atomic_write

    text = Path(path).read_text()
    block = re.search(rf"^{re.escape(framework)}:\n((?:[ #].*\n|\n)*)", text, re.M)
    if block is None:
        raise PlanError(f"{path}: no profile {framework!r}", field="framework")
    body = block.group(1)
    line = re.search(r"^(  # cpu fit:.*\n)?  cpu_figures:.*\n", body, re.M)
    if line is None:
        raise PlanError(f"{path}: profile {framework!r} has no `cpu_figures:` line to rewrite", field="framework")
    loo = result["loo_stats"]
    figures = ", ".join(f"{k}: {0.0 if abs(v) < 1e-9 else v:.4g}" for k, v in result["figures"].items())  # fits at a bound
    new = (f"  # cpu fit: `{command}`, {_dt.date.today().isoformat()}; {len(result['loo'])} runs, leave-one-layout-out "
           f"median {loo['median_abs']:.1%}, max {loo['max_abs']:.1%}\n  cpu_figures: {{{figures}}}\n")
    body = body[:line.start()] + new + body[line.end():]
    atomic_write(Path(path), text[:block.start(1)] + body + text[block.end(1):])
