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

Default job (in the report): 2 sequences per rank, sequence 64, fp32 (--backend jax: jaxrt's layouts)."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from calibration.validate_local_report import save_report
from planner.schema.errors import PlanError

GIB = float(1 << 30)
DEFAULT_SEQ_LEN = 64
SEQUENCES_PER_RANK = 2
TARGETS = dict(median_abs_step_error=0.10, spearman=0.90, first_choice_miss=0.05, median_abs_memory_error=0.15)


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalLayout:
    """One layout to run on this machine: a name, the degrees `Layouts.one` takes, the job
    (fp32: the CPU's fast precision) and optionally a DDP bucket size to force (otherwise the
    planner picks one)."""

    name: str
    dp: int
    mbs: int
    global_batch: int
    seq_len: int
    tp: int = 1
    pp: int = 1
    sharding: str = "none"
    shard_group: int | None = None
    recompute: str = "none"
    schedule: str | None = None
    sp: bool | None = None
    ddp_bucket_mb: float | None = None

    def layouts(self):
        from planner.cost.layout import Layouts

        return Layouts.one(dp=self.dp, mbs=self.mbs, gas=max(self.global_batch // (self.dp * self.mbs), 1), tp=self.tp,
                           pp=self.pp, sharding=self.sharding, shard_group=self.shard_group, recompute=self.recompute,
                           schedule=self.schedule, sp=self.sp)

    def estimate_args(self) -> list[str]:
        """The same layout as options of `exaplan estimate` (after --model/--machine/--nodes)."""
        args = ["--dp", self.dp, "--mbs", self.mbs]
        for flag, value, default in (("--tp", self.tp, 1), ("--pp", self.pp, 1), ("--shard", self.sharding, "none"),
                                     ("--shard-group", self.shard_group, None), ("--recompute", self.recompute, "none"),
                                     ("--schedule", self.schedule, None)):
            if value != default:
                args += [flag, value]
        if self.sp is not None:
            args.append("--sp" if self.sp else "--no-sp")
        args += ["--global-batch", self.global_batch, "--seq-len", self.seq_len, "--precision", "fp32"]
        return [str(a) for a in args]

    def describe(self) -> str:
        """The estimate options, and the forced bucket if any (the report's `estimate_args`)."""
        bucket = f" (ddp bucket {self.ddp_bucket_mb:g} MB)" if self.ddp_bucket_mb else ""
        return " ".join(self.estimate_args()) + bucket


def default_layouts(ranks: int = 2, *, global_batch: int | None = None, seq_len: int = DEFAULT_SEQ_LEN) -> list[LocalLayout]:
    """At least 10 different layouts on `ranks` local ranks (a power of two, >= 2)."""
    if ranks < 2 or ranks & (ranks - 1):
        raise PlanError(f"local validation needs a power of two of at least 2 ranks, got {ranks}", field="ranks")
    gb = global_batch or SEQUENCES_PER_RANK * ranks
    half = ranks // 2
    mbs = gb // ranks  # one micro-batch per step on pure data parallelism

    def L(name, **kw):
        return LocalLayout(name, global_batch=gb, seq_len=seq_len, **kw)

    out = [
        L("ddp-b25", dp=ranks, mbs=mbs, ddp_bucket_mb=25.0),
        L("ddp-b400", dp=ranks, mbs=mbs, ddp_bucket_mb=400.0),
        L("ddp-mbs1-gas", dp=ranks, mbs=1),
        L("ddp-recompute", dp=ranks, mbs=mbs, recompute="full"),
        L("fsdp", dp=ranks, mbs=mbs, sharding="fsdp"),
        L("fsdp-recompute", dp=ranks, mbs=mbs, sharding="fsdp", recompute="full"),
        L("fsdp-grad-op", dp=ranks, mbs=mbs, sharding="fsdp-grad-op"),
        L("zero1", dp=ranks, mbs=mbs, sharding="zero1"),
        L("tp2", tp=2, dp=half, mbs=gb // half, sp=False),
        L("tp2-sp", tp=2, dp=half, mbs=gb // half, sp=True),
        L("pp2-1f1b", pp=2, dp=half, mbs=1, schedule="1f1b"),
        L("pp2-gpipe", pp=2, dp=half, mbs=1, schedule="gpipe"),
    ]
    if ranks >= 4:
        out.append(L("hsdp", dp=ranks, mbs=mbs, sharding="hsdp", shard_group=2))
    return out


def resolve_machine(machine, ranks: int):
    from machine_models import load_machine
    from planner.schema.specs import MachineModel

    if isinstance(machine, MachineModel):
        return machine
    return load_machine(machine, ranks=ranks) if str(machine) == "local" else load_machine(machine)


def write_layout_plan(model: str, machine, ranks: int, layout: LocalLayout, path: Path, nodes: int = 1,
                      machine_label: str | None = None, backend: str = "torch"):
    """Write the plan of one layout, as `exaplan estimate --model MODEL --machine LABEL
    --nodes NODES ARGS -o PATH` would (the same functions; the machine may be a MachineModel,
    named in the plan's command by `machine_label` (default: its preset name, or "local"),
    layout.ddp_bucket_mb forces the DDP bucket; backend jax: the jax framework profile and
    `backend: jax` in the plan). Returns the plan."""
    from machine_models.frameworks import load_framework
    from planner.cost.step import evaluate
    from planner.emit import build_plan
    from planner.inputs import load_model, make_job
    from planner.schema.plan import write_plan
    from planner.search.space import layout_problems

    mach = resolve_machine(machine, ranks)
    name = machine_label or (machine if isinstance(machine, str) else "local")
    spec = load_model(model)
    world = mach.devices_per_node * nodes
    framework = load_framework("jax") if backend == "jax" else None
    job = make_job(spec, mach, world, layout.global_batch, layout.seq_len, "fp32", None, framework=framework)
    lay = layout.layouts()
    problems = layout_problems(spec, job, world, lay)
    if problems:
        raise PlanError(f"layout {layout.name}: " + "; ".join(problems))
    buckets = (float(layout.ddp_bucket_mb),) if layout.ddp_bucket_mb else None
    ev = evaluate(spec, mach, job, lay, ddp_buckets_mb=buckets)
    argv = ["estimate", "--model", model, "--machine", name, "--nodes", str(nodes), *layout.estimate_args()]
    if backend == "jax":
        argv += ["--framework", "jax"]
    plan = build_plan(spec, mach, job, nodes, lay, ev, 0, command=shlex.join(["exaplan", *argv, "-o", str(path)]),
                      backend=None if backend == "torch" else backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plan(plan, path)
    return plan


def predict(plan, machine=None) -> dict[str, float]:
    """Re-predict a plan's layout (same model, job, DDP bucket) on `machine` (default: the
    plan's own): step time, its parts and memory (GiB)."""
    from planner.cost.layout import Layouts
    from planner.cost.step import evaluate

    mach = machine or plan.machine
    # DDP runs with the plan's bucket; the other kinds let the model choose, as the planner did.
    ddp = plan.sharding.kind.value == "none"
    buckets = (plan.sharding.ddp_bucket_mb,) if ddp else None
    ev = evaluate(plan.model, mach, plan.job, Layouts.from_plan(plan), ddp_buckets_mb=buckets)
    return dict(step_time_s=float(ev.step_time_s[0]), compute_s=float(ev.compute_s[0]), dp_s=float(ev.dp_s[0]),
                tp_s=float(ev.tp_s[0]), pp_s=float(ev.pp_s[0]), bubble_s=float(ev.bubble_s[0]),
                optimizer_s=float(ev.optimizer_s[0]), memory_gib=float(ev.memory.total[0] / GIB))


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman rank correlation (nan with fewer than 3 points or a constant series)."""
    from scipy.stats import spearmanr

    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) < 3 or np.all(p == p[0]) or np.all(m == m[0]):
        return float("nan")
    return float(spearmanr(p, m).statistic)


def first_choice(names: Sequence[str], predicted: Sequence[float], measured: Sequence[float]) -> dict[str, Any]:
    """The planner's first choice (lowest predicted) against the fastest measured: names, and
    how much slower the first choice ran (measured / fastest measured - 1; 0 when it was)."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    i, j = int(np.argmin(p)), int(np.argmin(m))
    return dict(first_choice=names[i], fastest=names[j], first_choice_is_fastest=i == j,
                first_choice_miss=float(m[i] / m[j] - 1.0))


def _err(measured, predicted):
    if measured is None or predicted is None or not predicted:
        return None
    return measured / predicted - 1.0


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


@dataclass
class ValidationReport:
    model: str
    machine: str
    ranks: int
    steps: int
    job: dict
    rows: list[dict]
    baseline_rss_gib: float | None
    memory_reserve_gib: float
    median_abs_step_error: float | None = None
    max_abs_step_error: float | None = None
    median_abs_memory_error: float | None = None
    max_abs_memory_error: float | None = None
    median_abs_memory_error_raw: float | None = None
    max_abs_memory_error_raw: float | None = None
    spearman: float | None = None
    first_choice: dict = field(default_factory=dict)
    targets: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)

    @property
    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "ok"]

    def to_json(self) -> dict:
        return _clean(asdict(self))


def _clean(x):
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def summarise(rows: list[dict]) -> dict[str, Any]:
    """Aggregate errors, Spearman and the first-choice check over the rows that ran."""
    ok = [r for r in rows if r["status"] == "ok"]
    out: dict[str, Any] = {}
    if not ok:
        return out
    se = np.abs([r["step_time_error"] for r in ok])
    out["median_abs_step_error"], out["max_abs_step_error"] = float(np.median(se)), float(np.max(se))
    for key, suffix in (("memory_error", ""), ("memory_error_raw", "_raw")):
        vals = np.abs([r[key] for r in ok if r.get(key) is not None])
        if len(vals):
            out[f"median_abs_memory_error{suffix}"], out[f"max_abs_memory_error{suffix}"] = float(np.median(vals)), float(np.max(vals))
    pred = [r["predicted_step_time_s"] for r in ok]
    meas = [r["measured_step_time_s"] for r in ok]
    out["spearman"] = spearman(pred, meas)
    out["first_choice"] = first_choice([r["name"] for r in ok], pred, meas)
    t = TARGETS
    got = dict(median_abs_step_error=out["median_abs_step_error"], spearman=out["spearman"],
               first_choice_miss=out["first_choice"]["first_choice_miss"],
               median_abs_memory_error=out.get("median_abs_memory_error"))
    out["targets"] = {
        k: dict(target=t[k], value=v, met=None if v is None or (isinstance(v, float) and math.isnan(v))
                else (v >= t[k] if k == "spearman" else v <= t[k]))
        for k, v in got.items()
    }
    return out


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
        predicted_step_time_s=pred_t, measured_step_time_s=meas_t, step_time_error=_err(meas_t, pred_t),
        predicted_memory_gib=pred_m, measured_memory_gib=meas_m, memory_error_raw=_err(meas_m, pred_m),
        predicted_memory_net_gib=pred_net, measured_memory_net_gib=meas_net, memory_error=_err(meas_net, pred_net),
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
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mach = resolve_machine(machine, ranks)
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
