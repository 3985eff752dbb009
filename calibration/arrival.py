"""Calibrate on arrival: a new machine's trustworthy model in one job
(`exaplan calibrate --arrival --out DIR [--layouts K] [--steps S] [--nodes N]`).

1. **measure**: `exaplan calibrate --ranks R [--base B] [--quick] -o DIR/measured.yaml`
   (matmuls, memory, the optimizer step, collectives between the ranks: calibration/measure.py);
2. **sweep**: K layouts (`pick_layouts`: DDP, FSDP, ZeRO-1, TP, 1F1B, ... in that order, from
   calibration/validate_local.py's LocalLayout set) planned on the measured machine and trained
   S steps each through the real `exaplan run`;
3. **fit**: `calibrate --from-runs` on those runs (calibration/fit_runs.py) refits the framework
   figures (per-step and per-operator costs, the matmul curve, the optimizer's traffic) and
   writes DIR/fitted.yaml, which `exaplan plan --machine DIR/fitted.yaml` takes;
4. **report**: DIR/validation.csv, .json and .png (predicted with the measured machine against
   measured step time, validate_local_report.py) and DIR/README.md (the figures, the errors
   before and after the refit, the commands that follow).

Multi-node: run it ONCE PER JOB, from the job's first node (the batch script's own shell), with
`--launcher "srun ..."` or `--launcher "mpiexec ..."` (or EXAPLAN_LAUNCHER in the environment):
the measurement and every `exaplan run` of the sweep are started through that launcher, one
process per device on all N nodes, as the training job would be; DIR must be on a file
system every node sees. On one node without a launcher, the ranks are started locally (spawned
processes for the measurement, torchrun for the runs). Layouts need a power-of-two world size.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.schema.errors import PlanError

ROOT = Path(__file__).resolve().parent.parent
# The order the sweep takes layouts in: the kinds that differ most first.
LAYOUT_ORDER = ("ddp-b25", "fsdp", "zero1", "tp2", "pp2-1f1b", "ddp-mbs1-gas", "fsdp-grad-op", "tp2-sp",
                "ddp-recompute", "pp2-gpipe", "fsdp-recompute", "ddp-b400", "hsdp")
LAUNCHER_ENV = "EXAPLAN_LAUNCHER"


@dataclass
class Arrival:
    """What one calibration on arrival does (checked by `check`, before anything is written)."""

    out: Path
    ranks: int = 2  # ranks (devices) per node
    nodes: int = 1
    layouts: int = 4
    steps: int = 8
    model: str = "protein-small"
    base: str | None = None
    quick: bool = False
    launcher: list[str] = field(default_factory=list)
    seq_len: int = 64

    @property
    def world(self) -> int:
        return self.ranks * self.nodes

    def check(self) -> None:
        """Bad options: PlanError naming the option; nothing is written."""
        for name, value, low in (("--ranks", self.ranks, 1), ("--nodes", self.nodes, 1), ("--layouts", self.layouts, 1),
                                 ("--steps", self.steps, 3)):
            if value < low:
                raise PlanError(f"must be at least {low}, got {value}" + (" (the first 2 steps are warm-up)"
                                                                           if name == "--steps" else ""), field=name)
        if self.world < 2 or self.world & (self.world - 1):
            raise PlanError(f"the sweep's layouts need a power of two of at least 2 ranks in all; --ranks {self.ranks} "
                            f"x --nodes {self.nodes} = {self.world}", field="--ranks")
        available = len(pick_layouts(self.world, 10**6, self.seq_len))
        if self.layouts > available:
            raise PlanError(f"at most {available} layouts on {self.world} ranks, got {self.layouts}", field="--layouts")
        if self.nodes > 1 and not self.launcher:
            raise PlanError(f"{self.nodes} nodes need a launcher to start the ranks on them: --launcher \"srun ...\" or "
                            f"\"mpiexec ...\" (or {LAUNCHER_ENV}), run once per job from the first node",
                            field="--launcher")
        if self.launcher:
            check_launcher(self.launcher)
        if self.out.exists() and not self.out.is_dir():
            raise PlanError(f"{self.out} exists and is not a folder", field="--out")
        if (self.out / "fitted.yaml").exists():
            raise PlanError(f"{self.out} already holds a calibration (fitted.yaml): choose another --out", field="--out")
        from machine_models import load_machine
        from planner.inputs import load_model

        load_model(self.model)
        if self.base:
            load_machine(self.base)


def launcher_from(text: str | None) -> list[str]:
    """The launcher command (`--launcher`, else EXAPLAN_LAUNCHER), split as a shell would."""
    text = text if text is not None else os.environ.get(LAUNCHER_ENV, "")
    try:
        return shlex.split(text)
    except ValueError as e:
        raise PlanError(f"cannot split {text!r}: {e}", field="--launcher") from None


SHELL_CHARACTERS = set(";&|`$()<>\n")


def check_launcher(words: list[str]) -> None:
    """The launcher runs as a command, not through a shell: its words hold no shell syntax and
    its program is on PATH (otherwise each step would fail, late, with a traceback)."""
    import shutil

    bad = next((w for w in words if SHELL_CHARACTERS & set(w)), None)
    if bad is not None:
        raise PlanError(f"{bad!r}: the launcher is one command and its arguments, run without a shell (no ; & | $ "
                        "` ( ) < >)", field="--launcher")
    if shutil.which(words[0]) is None:
        raise PlanError(f"{words[0]!r} is not a program on PATH (the launcher: srun ..., mpiexec ...)",
                        field="--launcher")


def pick_layouts(world: int, k: int, seq_len: int):
    """The first k of validate_local's layouts on `world` ranks, in LAYOUT_ORDER."""
    from calibration.validate_local_layouts import default_layouts

    lays = default_layouts(world, seq_len=seq_len)
    rank = {name: i for i, name in enumerate(LAYOUT_ORDER)}
    return sorted(lays, key=lambda lay: rank.get(lay.name, len(rank)))[:k]


def write_plan(model: str, machine, nodes: int, layout, path: Path):
    """One layout's plan over `nodes` nodes of `machine` (validate_local.write_layout_plan),
    its command naming the run's measured.yaml."""
    from calibration.validate_local_layouts import write_layout_plan

    return write_layout_plan(model, machine, machine.devices_per_node, layout, path, nodes=nodes,
                             machine_label=str(path.parents[2] / "measured.yaml"))


def _sub(cmd: list[str], log: Path, timeout_s: float = 3600.0) -> int:
    """Run a command (cwd: the repository, so `-m cli` resolves), its output to `log`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return 124


def _tail(log: Path, n: int = 2000) -> str:
    return log.read_text()[-n:] if log.exists() else ""


def measure_step(a: Arrival) -> Path:
    """Step 1: `exaplan calibrate` through the launcher; DIR/measured.yaml."""
    out = a.out / "measured.yaml"
    cmd = [*a.launcher, sys.executable, "-m", "cli", "calibrate", "--ranks", str(a.ranks), "-o", str(out), "--json"]
    cmd += (["--quick"] if a.quick else []) + (["--base", a.base] if a.base else [])
    log = a.out / "logs" / "measure.log"
    code = _sub(cmd, log)
    if code != 0 or not out.exists():
        raise PlanError(f"the measurement failed ({code}); see {log}:\n{_tail(log)}", field="calibrate")
    return out


def sweep_step(a: Arrival, measured, data: Path, advance) -> tuple[list[dict], dict, list[Path]]:
    """Step 2: plan and run every layout; (rows, job, finished run folders)."""
    from calibration.validate_local import _row_from_run

    rows, job, done = [], {}, []
    for lay in pick_layouts(a.world, a.layouts, a.seq_len):
        run_dir = a.out / "runs" / lay.name
        advance(f"{lay.name}: {a.steps} steps")
        row = dict(name=lay.name, estimate_args=lay.describe(), run_dir=str(run_dir))
        try:
            plan = write_plan(a.model, measured, a.nodes, lay, run_dir / "plan.yaml")
        except PlanError as e:
            rows.append({**row, "status": f"not planned: {e}"})
            continue
        (run_dir / "layout.json").write_text(json.dumps(lay.__dict__, indent=2))
        job = job or plan.job.model_dump(mode="json")
        cmd = [*a.launcher, sys.executable, "-m", "cli", "run", str(run_dir / "plan.yaml"), "--steps", str(a.steps),
               "--out", str(run_dir), "--data", str(data), "--val-every", "0", "--val-batches", "1",
               "--log-every", "1000"]
        t0 = time.perf_counter()
        code = _sub(cmd, run_dir / "run.log")
        if code != 0 or not (run_dir / "summary.json").exists():
            rows.append({**row, "status": f"run failed ({code})", "output_tail": _tail(run_dir / "run.log", 1500)})
            continue
        import shutil

        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        rows.append({**_row_from_run(lay, plan, run_dir, None, measured.memory_reserve_gib),
                     "wall_s": time.perf_counter() - t0})
        done.append(run_dir)
    return rows, job, done


def run_arrival(a: Arrival, progress: bool = True, console=None) -> dict[str, Any]:
    """The four steps (module docstring); returns what DIR/README.md summarises."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from calibration.fit_runs import refit_to_file
    from calibration.validate_local_layouts import predict
    from calibration.validate_local_summary import ValidationReport, summarise
    from machine_models import load_machine
    from runtime.dataprep.cache import ensure_prepared

    a.check()
    a.out.mkdir(parents=True, exist_ok=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console or Console(stderr=True, highlight=False), disable=not progress)
    t0 = time.perf_counter()
    with bar:
        task = bar.add_task("measuring (exaplan calibrate)", total=a.layouts + 2)
        measured = load_machine(measure_step(a))
        bar.advance(task)
        data = ensure_prepared(None, a.out / "data", rank=0, progress=False)
        rows, job, done = sweep_step(a, measured, data,
                                     lambda what: (bar.update(task, description=f"sweep {what}"), bar.advance(task)))
        if len(done) < 2:
            raise PlanError(f"only {len(done)} of {a.layouts} layouts ran (see {a.out}/runs/*/run.log); the refit "
                            f"needs 2", field="--layouts")
        bar.update(task, description="fitting (calibrate --from-runs)")
        fitted, holdout = refit_to_file(done, measured, a.out / "fitted.yaml",
                                        f"exaplan calibrate --arrival --out {a.out} (--from-runs {a.out}/runs/*)")
        bar.advance(task)
    for r in rows:
        if r["status"] == "ok":
            p = predict(_plan(r), fitted)["step_time_s"]
            r["fitted_step_time_s"], r["fitted_step_time_error"] = p, r["measured_step_time_s"] / p - 1.0
    rep = ValidationReport(model=a.model, machine=measured.name, ranks=a.world, steps=a.steps, job=job, rows=rows,
                           baseline_rss_gib=None, memory_reserve_gib=measured.memory_reserve_gib)
    for k, v in summarise(rows).items():
        setattr(rep, k, v)
    plot = _save_report(rep, a.out)
    result = dict(out=str(a.out), rows=rows, holdout=holdout, plot=plot, wall_s=time.perf_counter() - t0,
                  median_abs_step_error=rep.median_abs_step_error, spearman=rep.spearman,
                  median_abs_fitted_error=_median_abs([r.get("fitted_step_time_error") for r in rows]))
    (a.out / "README.md").write_text(readme(a, measured, fitted, result))
    return result


def _plan(row: dict):
    from planner.schema.plan import load_plan

    return load_plan(Path(row["run_dir"]) / "plan.yaml")


def _median_abs(values) -> float | None:
    vals = sorted(abs(v) for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def _save_report(rep, out: Path) -> bool:
    """validation.csv/.json, and the plot when matplotlib is installed (the `plot` extra)."""
    from calibration.validate_local_report import save_report

    try:
        save_report(rep, out)
        return True
    except ImportError:
        return False


def _pct(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"


def readme(a: Arrival, measured, fitted, result: dict) -> str:
    """DIR/README.md: what was measured and fitted, the sweep's errors, what to run next."""
    from planner.schema.figures import figures_of
    from calibration.fit_runs import FIT_FIGURES_DEFAULT

    before, after = figures_of(measured, FIT_FIGURES_DEFAULT), figures_of(fitted, FIT_FIGURES_DEFAULT)
    lines = [f"# Calibration on arrival: {measured.name}", "",
             f"{a.nodes} node(s) x {a.ranks} ranks, {measured.device_name}; model {a.model}, {a.layouts} layouts x "
             f"{a.steps} steps; {result['wall_s']:.0f} s in all.", "",
             "| file | what |", "|---|---|",
             "| measured.yaml | `exaplan calibrate`: microbenchmarks (measurements beside it) |",
             "| runs/NAME/ | each layout's `exaplan run` folder (plan, metrics, summary, run.log) |",
             "| fitted.yaml | measured.yaml refitted to the runs (`calibrate --from-runs`): **use this one** |",
             "| validation.csv, .json" + (", .png" if result["plot"] else "") + " | predicted (measured.yaml) "
             "against measured step time per layout |", "",
             "## Step time per layout", "",
             "| layout | measured (s) | predicted, measured.yaml | error | predicted, fitted.yaml | error |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']} | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['measured_step_time_s']:.4g} | {r['predicted_step_time_s']:.4g} | "
                     f"{_pct(r['step_time_error'])} | {r['fitted_step_time_s']:.4g} | {_pct(r['fitted_step_time_error'])} |")
    lines += ["", f"Median |error|: {_pct(result['median_abs_step_error']).lstrip('+')} from the microbenchmarks, "
                  f"{_pct(result['median_abs_fitted_error']).lstrip('+')} after the refit (fitted on these same runs; with 4 "
                  f"layouts or more `calibrate --from-runs` also reports layouts held out of the fit).", ""]
    band = fitted.step_time_band
    if band is not None:
        lines += [f"Intervals: fitted.yaml's own step-time band is +/-{band.half_width:.1%} (the 80% conformal bound of "
                  f"the step-time errors of its {band.runs} layouts, each predicted by a refit without it: {band.basis}); "
                  f"plans on it show it, or their framework's band where that is wider.", ""]
    lines += ["## Figures refitted", "", "| figure | measured.yaml | fitted.yaml |", "|---|---|---|"]
    lines += [f"| {k} | {before[k]:.4g} | {after[k]:.4g} |" for k in after]
    lines += ["", "## Next", "", "```",
              f"exaplan plan --model protein-3.5b --machine {a.out / 'fitted.yaml'} --nodes {a.nodes} -o plan.yaml",
              "```", ""]
    return "\n".join(lines)
