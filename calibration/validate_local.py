"""`exaplan validate --local`: run a set of layouts on this machine and compare with the planner.

For each layout (`default_layouts`: DDP with two bucket sizes, FSDP, FSDP grad-op, ZeRO-1,
tensor parallel with and without sequence parallelism, 1F1B and GPipe pipelines, recompute,
two micro-batch sizes with accumulation, HSDP from 4 ranks) the planner writes a plan, as
`exaplan estimate ... -o plan.yaml` would, and `exaplan run PLAN` trains it for a few steps as
a subprocess (the real launcher, torchrun + gloo). Then, per layout and over all of them:

    step time   predicted (plan) vs measured (summary.json: median over the steps after
                warm-up; with --repeats, the median over rounds of runs of every layout);
                error = measured / predicted - 1 (as runtime/metrics.py)
    memory      on CPU the measured figure is the ranks' RSS high-water mark, which includes
                the interpreter, torch's libraries and gloo, taken from a separate 3-step run
                with glibc's mmap threshold fixed low (MEMORY_RUN_ENV), so that freed blocks
                go back to the system and RSS follows the live tensors rather than malloc's
                hoard. Two comparisons are reported:
                  raw   measured RSS vs the predicted total (which includes the machine's
                        `memory_reserve_gib` for exactly that),
                  net   measured RSS - the RSS of an idle rank (torch + runtime imported, a
                        gloo group initialised, measured here once) vs the predicted total
                        less `memory_reserve_gib`. The headline memory error is the net one.
    ranking     Spearman rank correlation of predicted vs measured step time; the planner's
                first choice (lowest predicted step time among the layouts run) against the
                fastest measured, and by how much it missed.

Saved in OUT: validation.csv, validation.json, validation.png (predicted vs measured step
time, one labelled point per layout, y = x). Each run's directory OUT/runs/NAME keeps its
plan.yaml and layout.json next to summary.json, so that calibration/fit_runs.py (the local
machine's efficiency figures refitted by least squares on the log step-time errors, and the
error on layouts left out of the fit, before and after) can use them later:
`exaplan calibrate --from-runs OUT/runs/*`.

Default job (in the report): 2 sequences per rank, sequence 64, fp32 (--backend jax: jaxrt's layouts).

The parts: the layouts and their plans (validate_local_layouts.py), the statistics and the
report's data (validate_local_summary.py), its files and table (validate_local_report.py); this
module runs the layouts."""


from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from calibration.validate_local_layouts import (DEFAULT_SEQ_LEN, GIB, SEQUENCES_PER_RANK, LocalLayout, default_layouts,
                                                predict, resolve_machine, write_layout_plan)
from calibration.validate_local_report import save_report
from calibration.validate_local_summary import (TARGETS, ValidationReport, first_choice, relative_error, spearman,
                                                summarise)
from planner.schema.errors import PlanError

# The names of `exaplan validate --local` in one place, its layouts' and its statistics' included
# (calibration/validate_local_layouts.py, calibration/validate_local_summary.py).
__all__ = ["DEFAULT_SEQ_LEN", "GIB", "MEMORY_RUN_ENV", "MEMORY_RUN_STEPS", "SEQUENCES_PER_RANK", "TARGETS", "LocalLayout",
           "PlanError", "ValidationReport", "default_layouts", "first_choice", "measure_baseline_rss_gib", "predict",
           "resolve_machine", "run_local_validation", "run_one", "spearman", "summarise", "write_layout_plan"]


# Memory runs: glibc's malloc keeps freed blocks (its mmap threshold rises to the largest
# block freed so far), so a rank's RSS high-water mark can be 1.5-2x the tensors it ever held
# at once. A short second run with a fixed, low mmap threshold returns every large block to
# the system when freed, so its RSS follows the live tensors (steps run slower: only the
# memory of that run is used).
MEMORY_RUN_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
MEMORY_RUN_STEPS = 3


def measure_baseline_rss_gib(timeout_s: float = 120.0, env: dict[str, str] | None = None) -> float | None:
    """RSS high-water mark of an idle rank: torch and the runtime imported, a one-rank gloo
    group initialised, nothing trained (GiB). None if it could not be measured."""
    code = (
        "import os, resource, tempfile, torch, torch.distributed as dist\n"
        "import runtime.trainer, runtime.model, runtime.parallel, runtime.loader, runtime.metrics\n"
        "f = tempfile.mktemp()\n"
        "dist.init_process_group('gloo', init_method='file://' + f, rank=0, world_size=1)\n"
        "t = torch.ones(4); dist.all_reduce(t); dist.destroy_process_group()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
    )
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                             cwd=str(Path(__file__).resolve().parent.parent), env={**os.environ, **(env or {})})
        return int(res.stdout.strip().splitlines()[-1]) / GIB if res.returncode == 0 else None
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def run_one(plan_path: Path, run_dir: Path, steps: int, data_dir: Path | None, timeout_s: float = 900.0,
            extra_env: dict[str, str] | None = None, backend: str = "torch") -> tuple[int, str]:
    """`exaplan run PLAN --steps N --out DIR --backend B` as a subprocess (returns code, output tail)."""
    cmd = [sys.executable, "-m", "cli", "run", str(plan_path), "--steps", str(steps), "--out", str(run_dir),
           "--val-every", "0", "--val-batches", "1", "--log-every", "1000", "--backend", backend]
    if data_dir is not None:
        cmd += ["--data", str(data_dir)]
    env = {**os.environ, **(extra_env or {})}
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:g} s"
    return res.returncode, (res.stdout + res.stderr)[-3000:]


def _row_from_run(layout: LocalLayout, plan, run_dir: Path, baseline: float | None, reserve_gib: float,
                  step_times: Sequence[float] = (), memory_gib: float | None = None) -> dict:
    """One layout's row: the step time is the median over its timing runs (`step_times`,
    default that of run_dir's summary), the memory the memory run's (default run_dir's)."""
    s = json.loads((run_dir / "summary.json").read_text())
    pred_t = s["predicted_step_time_s"]
    meas_t = float(np.median(step_times)) if len(step_times) else s["measured_step_time_s"]
    pred_m, meas_m = s["predicted_memory_gib"], memory_gib if memory_gib is not None else s.get("peak_memory_gib")
    pred_net = pred_m - reserve_gib
    meas_net = None if meas_m is None or baseline is None else meas_m - baseline
    st = plan.prediction.step_time
    ex = {k.value if hasattr(k, "value") else str(k): v for k, v in st.exposed_comm_s.items()}
    return dict(
        name=layout.name, status="ok", estimate_args=layout.describe(),
        predicted_step_time_s=pred_t, measured_step_time_s=meas_t, step_time_error=relative_error(meas_t, pred_t),
        predicted_memory_gib=pred_m, measured_memory_gib=meas_m, memory_error_raw=relative_error(meas_m, pred_m),
        predicted_memory_net_gib=pred_net, measured_memory_net_gib=meas_net, memory_error=relative_error(meas_net, pred_net),
        predicted_compute_s=st.compute_s, predicted_dp_s=ex.get("dp", 0.0), predicted_tp_s=ex.get("tp", 0.0),
        predicted_pp_s=ex.get("pp", 0.0), predicted_bubble_s=st.bubble_s, predicted_optimizer_s=st.optimizer_s,
        run_dir=str(run_dir),
    )


@dataclass
class _Runs:
    """The runs of one validation and what they gathered, per layout name."""

    out: Path
    steps: int
    data_dir: Path
    keep_checkpoints: bool = False
    backend: str = "torch"
    plans: dict[str, Any] = field(default_factory=dict)
    failed: dict[str, dict] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)
    memory: dict[str, float | None] = field(default_factory=dict)
    walls: dict[str, float] = field(default_factory=dict)
    job: dict | None = None

    def dir(self, lay: LocalLayout) -> Path:
        return self.out / "runs" / lay.name

    def fail(self, lay: LocalLayout, status: str, tail: str = "") -> None:
        self.failed[lay.name] = dict(name=lay.name, status=status, estimate_args=lay.describe(),
                                     run_dir=str(self.dir(lay)), **({"output_tail": tail[-1500:]} if tail else {}))

    def plan(self, lay: LocalLayout, model: str, mach, ranks: int) -> None:
        """Write the layout's plan (a layout the planner refuses is reported, not run)."""
        run_dir = self.dir(lay)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        try:
            self.plans[lay.name] = write_layout_plan(model, mach, ranks, lay, run_dir / "plan.yaml",
                                                     backend=self.backend)
        except PlanError as e:
            self.fail(lay, f"not planned: {e}")
            return
        self.job = self.job or self.plans[lay.name].job.model_dump(mode="json")
        (run_dir / "layout.json").write_text(json.dumps(asdict(lay), indent=2))

    def time(self, lay: LocalLayout, repeat: int) -> None:
        """One timing run (repeats after the first go to LAYOUT/repeat-N)."""
        run_dir = self.dir(lay)
        target = run_dir if repeat == 0 else run_dir / f"repeat-{repeat}"
        t0 = time.perf_counter()
        code, tail = run_one(run_dir / "plan.yaml", target, self.steps, self.data_dir, backend=self.backend)
        self.walls[lay.name] = self.walls.get(lay.name, 0.0) + time.perf_counter() - t0
        if not self.keep_checkpoints:
            shutil.rmtree(target / "checkpoints", ignore_errors=True)
        if code != 0 or not (target / "summary.json").exists():
            self.fail(lay, f"run failed ({code})", tail)
        else:
            summary = json.loads((target / "summary.json").read_text())
            self.times.setdefault(lay.name, []).append(summary["measured_step_time_s"])

    def measure_memory(self, lay: LocalLayout) -> None:
        """A short run with MEMORY_RUN_ENV: its RSS high-water mark follows the live tensors."""
        target = self.dir(lay) / "memory"
        code, _ = run_one(self.dir(lay) / "plan.yaml", target, MEMORY_RUN_STEPS, self.data_dir, extra_env=MEMORY_RUN_ENV,
                          backend=self.backend)
        shutil.rmtree(target / "checkpoints", ignore_errors=True)
        ok = code == 0 and (target / "summary.json").exists()
        self.memory[lay.name] = json.loads((target / "summary.json").read_text()).get("peak_memory_gib") if ok else None

    def rows(self, layouts: Sequence[LocalLayout], baseline: float | None, reserve_gib: float) -> list[dict]:
        rows = []
        for lay in layouts:
            if lay.name in self.failed:
                rows.append(self.failed[lay.name])
                continue
            times = self.times.get(lay.name, [])
            row = _row_from_run(lay, self.plans[lay.name], self.dir(lay), baseline, reserve_gib, step_times=times,
                                memory_gib=self.memory.get(lay.name))
            rows.append({**row, "wall_s": self.walls.get(lay.name, 0.0), "step_time_runs_s": times})
        return rows


def run_local_validation(model: str, ranks: int, out: Path, steps: int = 8, machine="local", layouts=None,
                         progress: bool = True, keep_checkpoints: bool = False, console=None, repeats: int = 1,
                         memory_runs: bool = True, backend: str = "torch") -> ValidationReport:
    """Plan, run and compare every layout (see the module docstring); writes OUT/validation.*

    `repeats`: timing runs per layout, in rounds (every layout once, then again), so that a
    slow spell of a shared machine falls on all layouts alike; the median is kept.
    `memory_runs`: measure memory in a separate short run (MEMORY_RUN_ENV), else take the
    timing run's RSS high-water mark. `backend` jax: the layouts jaxrt runs, with its profile."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from runtime.dataprep.cache import ensure_prepared

    if steps < 3:
        raise PlanError("needs at least 3 steps (the first 2 are warm-up)", field="steps")
    if repeats < 1:
        raise PlanError("must be at least 1", field="repeats")
    from planner.inputs import load_model

    load_model(model)  # a bad model file is refused (exit 2) before anything is written or run
    mach = resolve_machine(machine, ranks)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layouts = list(layouts if layouts is not None else default_layouts(ranks))
    if backend == "jax":
        layouts = [lay for lay in layouts if lay.pp == 1 and lay.name != "ddp-b400"]
    runs = _Runs(out, steps, ensure_prepared(None, out / "data", rank=0, progress=False), keep_checkpoints, backend)
    baseline = measure_baseline_rss_gib(env=MEMORY_RUN_ENV if memory_runs else None)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console or Console(highlight=False), transient=True, disable=not progress)
    with bar:
        task = bar.add_task("validating", total=len(layouts) * (repeats + (1 if memory_runs else 0)))
        for lay in layouts:
            runs.plan(lay, model, mach, ranks)
        for r in range(repeats):
            for lay in layouts:
                bar.update(task, description=f"{lay.name:16s} timing {r + 1}/{repeats}")
                if lay.name not in runs.failed:
                    runs.time(lay, r)
                bar.advance(task)
        for lay in layouts if memory_runs else ():
            bar.update(task, description=f"{lay.name:16s} memory")
            if lay.name not in runs.failed:
                runs.measure_memory(lay)
            bar.advance(task)
    rep = ValidationReport(model=model, machine=mach.name, ranks=ranks, steps=steps, job=runs.job or {},
                           rows=runs.rows(layouts, baseline, mach.memory_reserve_gib), baseline_rss_gib=baseline,
                           memory_reserve_gib=mach.memory_reserve_gib)
    for k, v in summarise(rep.rows).items():
        setattr(rep, k, v)
    save_report(rep, out)
    return rep