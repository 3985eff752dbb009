"""`exaplan validate --local`: run a set of layouts on this machine and compare with the planner.

For each layout (`default_layouts`: DDP with two bucket sizes, FSDP, FSDP grad-op, ZeRO-1,
tensor parallel with and without sequence parallelism, 1F1B and GPipe pipelines, recompute,
two micro-batch sizes with accumulation, HSDP from 4 ranks) the planner writes a plan, as
`exaplan estimate ... -o plan.yaml` would, and `exaplan run PLAN` trains it for a few steps as
a subprocess (the real launcher, torchrun + gloo). Then, per layout and over all of them:

    step time   predicted (plan) vs measured (summary.json: median over the steps after
                warm-up); error = measured / predicted - 1 (as runtime/metrics.py)
    memory      on CPU the measured figure is the ranks' RSS high-water mark, which includes
                the interpreter, torch's libraries and gloo. Two comparisons are reported:
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
plan.yaml and layout.json next to summary.json, so that `refit_from_runs` (the local
machine's efficiency figures refitted by least squares on the log step-time errors) and
`holdout_report` (error on layouts left out of the fit, before and after) can use them later:
`exaplan calibrate --from-runs OUT/runs/*`.

Default job (stated in the report): global batch 2 sequences per rank (4 on 2 ranks), sequence
length 64, fp32 (the CPU's fast precision): protein-small takes about 0.5-0.8 s a step on 2 cores.
"""

from __future__ import annotations

import contextlib
import csv
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
from typing import Any, Iterable, Sequence

import numpy as np

from planner.errors import PlanError

GIB = float(1 << 30)
DEFAULT_SEQ_LEN = 64
SEQUENCES_PER_RANK = 2
TARGETS = dict(median_abs_step_error=0.10, spearman=0.90, first_choice_miss=0.05, median_abs_memory_error=0.15)
CSV_COLUMNS = [
    "name", "status", "estimate_args", "predicted_step_time_s", "measured_step_time_s", "step_time_error",
    "predicted_memory_gib", "measured_memory_gib", "memory_error_raw", "predicted_memory_net_gib",
    "measured_memory_net_gib", "memory_error", "predicted_compute_s", "predicted_dp_s", "predicted_tp_s",
    "predicted_pp_s", "predicted_bubble_s", "predicted_optimizer_s", "run_dir",
]
# Figures `refit_from_runs` can fit: name -> (getter, setter, lower, upper).
FIT_FIGURES_DEFAULT = ("peak_fraction", "half_dim", "overlap_dp", "step_overhead_s", "op_overhead_us")


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


def default_layouts(ranks: int = 2, *, global_batch: int | None = None, seq_len: int = DEFAULT_SEQ_LEN) -> list[dict]:
    """At least 10 different layouts on `ranks` local ranks (a power of two, >= 2), each a
    dict: name, args (the arguments of `exaplan estimate` after --model/--machine/--nodes) and
    optionally ddp_bucket_mb (forces that DDP bucket size; the planner otherwise picks one)."""
    if ranks < 2 or ranks & (ranks - 1):
        raise PlanError(f"local validation needs a power of two of at least 2 ranks, got {ranks}", field="ranks")
    gb = global_batch or SEQUENCES_PER_RANK * ranks
    half = ranks // 2
    job = ["--global-batch", str(gb), "--seq-len", str(seq_len), "--precision", "fp32"]

    def L(name, *args, bucket=None):
        d = dict(name=name, args=[*map(str, args), *job])
        if bucket is not None:
            d["ddp_bucket_mb"] = float(bucket)
        return d

    mbs = gb // ranks  # one micro-batch per step on pure data parallelism
    out = [
        L("ddp-b25", "--dp", ranks, "--mbs", mbs, bucket=25),
        L("ddp-b400", "--dp", ranks, "--mbs", mbs, bucket=400),
        L("ddp-mbs1-gas", "--dp", ranks, "--mbs", 1),
        L("ddp-recompute", "--dp", ranks, "--mbs", mbs, "--recompute", "full"),
        L("fsdp", "--dp", ranks, "--mbs", mbs, "--shard", "fsdp"),
        L("fsdp-recompute", "--dp", ranks, "--mbs", mbs, "--shard", "fsdp", "--recompute", "full"),
        L("fsdp-grad-op", "--dp", ranks, "--mbs", mbs, "--shard", "fsdp-grad-op"),
        L("zero1", "--dp", ranks, "--mbs", mbs, "--shard", "zero1"),
        L("tp2", "--tp", 2, "--dp", half, "--mbs", gb // half, "--no-sp"),
        L("tp2-sp", "--tp", 2, "--dp", half, "--mbs", gb // half, "--sp"),
        L("pp2-1f1b", "--pp", 2, "--dp", half, "--mbs", 1, "--schedule", "1f1b"),
        L("pp2-gpipe", "--pp", 2, "--dp", half, "--mbs", 1, "--schedule", "gpipe"),
    ]
    if ranks >= 4:
        out.append(L("hsdp", "--dp", ranks, "--mbs", mbs, "--shard", "hsdp", "--shard-group", 2))
    return out


@contextlib.contextmanager
def _forced_bucket(mb: float | None):
    """Make the cost model consider only this DDP bucket size (None: leave its choice)."""
    from planner.cost import step

    if mb is None:
        yield
        return
    saved = step.DDP_BUCKETS_MB
    step.DDP_BUCKETS_MB = (float(mb),)
    try:
        yield
    finally:
        step.DDP_BUCKETS_MB = saved


def _resolve_machine(machine, ranks: int):
    from machine_models import load_machine
    from planner.specs import MachineModel

    if isinstance(machine, MachineModel):
        return machine
    return load_machine(machine, ranks=ranks) if str(machine) == "local" else load_machine(machine)


def write_layout_plan(model: str, machine, ranks: int, layout: dict, path: Path):
    """Write the plan of one layout, as `exaplan estimate --model MODEL --machine local
    --nodes 1 ARGS -o PATH` would (the same functions; the machine may be a MachineModel, and
    layout["ddp_bucket_mb"] forces the DDP bucket). Returns the plan."""
    from planner import cli
    from planner.cost.step import evaluate
    from planner.emit import build_plan
    from planner.inputs import load_model, make_job
    from planner.plan import write_plan
    from planner.search.space import layout_problems

    mach = _resolve_machine(machine, ranks)
    name = machine if isinstance(machine, str) else "local"
    argv = ["estimate", "--model", model, "--machine", name, "--nodes", "1", *layout["args"]]
    args = cli.build_parser().parse_args(argv)
    if args.global_batch is None:
        args.global_batch = args.dp * args.mbs
    spec = load_model(model)
    world = mach.devices_per_node
    job = make_job(spec, mach, world, args.global_batch, args.seq_len, args.precision, args.token_budget)
    lay = cli._layout_from_args(args, mach)
    problems = layout_problems(spec, job, world, lay)
    if problems:
        raise PlanError(f"layout {layout['name']}: " + "; ".join(problems))
    with _forced_bucket(layout.get("ddp_bucket_mb")):
        ev = evaluate(spec, mach, job, lay)
    command = shlex.join(["exaplan", *argv, "-o", str(path)])
    plan = build_plan(spec, mach, job, 1, lay, ev, 0, command=command)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plan(plan, path)
    return plan


def plan_layouts(plan):
    """The planner's Layouts (one row) of a plan."""
    from planner.cost.layout import RECOMPUTES, SCHEDULES, SHARDINGS, Layouts

    m = plan.mesh
    return Layouts(
        pp=m.pp, dp_replicate=m.dp_replicate, dp_shard=m.dp_shard, cp=m.cp, tp=m.tp, mbs=plan.micro_batch_size,
        gas=plan.grad_accumulation_steps, vpp=plan.pipeline.virtual_stages,
        schedule=SCHEDULES.index(plan.pipeline.schedule), sharding=SHARDINGS.index(plan.sharding.kind),
        recompute=RECOMPUTES.index(plan.recompute), sp=int(plan.sequence_parallel),
    )


def predict(plan, machine=None) -> dict[str, float]:
    """Re-predict a plan's layout (same model, job, DDP bucket) on `machine` (default: the
    plan's own): step time, its parts and memory (GiB)."""
    from planner.cost.step import evaluate

    mach = machine or plan.machine
    with _forced_bucket(plan.sharding.ddp_bucket_mb if plan.sharding.kind.value == "none" else None):
        ev = evaluate(plan.model, mach, plan.job, plan_layouts(plan))
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


def measure_baseline_rss_gib(timeout_s: float = 120.0) -> float | None:
    """RSS high-water mark of an idle rank: torch and the runtime imported, a one-rank gloo
    group initialised, nothing trained (GiB). None if it could not be measured."""
    code = (
        "import os, resource, tempfile, torch, torch.distributed as dist\n"
        "import runtime.trainer, runtime.model, runtime.parallel, runtime.data, runtime.metrics\n"
        "f = tempfile.mktemp()\n"
        "dist.init_process_group('gloo', init_method='file://' + f, rank=0, world_size=1)\n"
        "t = torch.ones(4); dist.all_reduce(t); dist.destroy_process_group()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
    )
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                             cwd=str(Path(__file__).resolve().parent.parent))
        return int(res.stdout.strip().splitlines()[-1]) / GIB if res.returncode == 0 else None
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def run_one(plan_path: Path, run_dir: Path, steps: int, data_dir: Path | None, timeout_s: float = 900.0) -> tuple[int, str]:
    """`exaplan run PLAN --steps N --out DIR` as a subprocess (returns code, output tail)."""
    cmd = [sys.executable, "-m", "planner.cli", "run", str(plan_path), "--steps", str(steps), "--out", str(run_dir),
           "--val-every", "0", "--val-batches", "1", "--log-every", "1000"]
    if data_dir is not None:
        cmd += ["--data", str(data_dir)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:g} s"
    return res.returncode, (res.stdout + res.stderr)[-3000:]


def _row_from_run(layout: dict, plan, run_dir: Path, baseline: float | None, reserve_gib: float) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    pred_t, meas_t = s["predicted_step_time_s"], s["measured_step_time_s"]
    pred_m, meas_m = s["predicted_memory_gib"], s.get("peak_memory_gib")
    pred_net = pred_m - reserve_gib
    meas_net = None if meas_m is None or baseline is None else meas_m - baseline
    st = plan.prediction.step_time
    ex = {k.value if hasattr(k, "value") else str(k): v for k, v in st.exposed_comm_s.items()}
    return dict(
        name=layout["name"], status="ok", estimate_args=" ".join(layout["args"]) +
        (f" (ddp bucket {layout['ddp_bucket_mb']:g} MB)" if layout.get("ddp_bucket_mb") else ""),
        predicted_step_time_s=pred_t, measured_step_time_s=meas_t, step_time_error=_err(meas_t, pred_t),
        predicted_memory_gib=pred_m, measured_memory_gib=meas_m, memory_error_raw=_err(meas_m, pred_m),
        predicted_memory_net_gib=pred_net, measured_memory_net_gib=meas_net, memory_error=_err(meas_net, pred_net),
        predicted_compute_s=st.compute_s, predicted_dp_s=ex.get("dp", 0.0), predicted_tp_s=ex.get("tp", 0.0),
        predicted_pp_s=ex.get("pp", 0.0), predicted_bubble_s=st.bubble_s, predicted_optimizer_s=st.optimizer_s,
        run_dir=str(run_dir),
    )


def run_local_validation(model: str, ranks: int, out: Path, steps: int = 8, machine="local", layouts=None,
                         progress: bool = True, keep_checkpoints: bool = False, console=None) -> ValidationReport:
    """Plan, run and compare every layout (see the module docstring); writes OUT/validation.*"""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from runtime import data as rdata

    if steps < 3:
        raise PlanError("needs at least 3 steps (the first 2 are warm-up)", field="steps")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mach = _resolve_machine(machine, ranks)
    layouts = list(layouts if layouts is not None else default_layouts(ranks))
    console = console or Console(highlight=False)
    data_dir = rdata.ensure_prepared(None, out / "data", rank=0, progress=False)
    baseline = measure_baseline_rss_gib()
    rows: list[dict] = []
    job = None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not progress)
    with bar:
        task = bar.add_task("validating", total=len(layouts))
        for lay in layouts:
            bar.update(task, description=f"{lay['name']:16s}")
            run_dir = out / "runs" / lay["name"]
            if run_dir.exists():
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True)
            try:
                plan = write_layout_plan(model, mach, ranks, lay, run_dir / "plan.yaml")
            except PlanError as e:
                rows.append(dict(name=lay["name"], status=f"not planned: {e}", estimate_args=" ".join(lay["args"]), run_dir=str(run_dir)))
                bar.advance(task)
                continue
            job = job or plan.job.model_dump(mode="json")
            (run_dir / "layout.json").write_text(json.dumps(lay, indent=2))
            t0 = time.perf_counter()
            code, tail = run_one(run_dir / "plan.yaml", run_dir, steps, data_dir)
            if not keep_checkpoints:
                shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            if code != 0 or not (run_dir / "summary.json").exists():
                rows.append(dict(name=lay["name"], status=f"run failed ({code})", estimate_args=" ".join(lay["args"]),
                                 run_dir=str(run_dir), output_tail=tail[-1500:]))
            else:
                row = _row_from_run(lay, plan, run_dir, baseline, mach.memory_reserve_gib)
                row["wall_s"] = time.perf_counter() - t0
                rows.append(row)
            bar.advance(task)
    rep = ValidationReport(model=model, machine=mach.name, ranks=ranks, steps=steps, job=job or {}, rows=rows,
                           baseline_rss_gib=baseline, memory_reserve_gib=mach.memory_reserve_gib)
    for k, v in summarise(rows).items():
        setattr(rep, k, v)
    save_report(rep, out)
    return rep


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def save_report(rep: ValidationReport, out: Path) -> None:
    out = Path(out)
    files = dict(csv=str(out / "validation.csv"), json=str(out / "validation.json"), png=str(out / "validation.png"))
    rep.files = files
    with open(files["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rep.rows:
            w.writerow({k: r.get(k, "") for k in CSV_COLUMNS})
    Path(files["json"]).write_text(json.dumps(rep.to_json(), indent=2) + "\n")
    plot(rep, Path(files["png"]))


def plot(rep: ValidationReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = rep.ok_rows
    fig, ax = plt.subplots(figsize=(7, 6))
    if ok:
        p = np.array([r["predicted_step_time_s"] for r in ok])
        m = np.array([r["measured_step_time_s"] for r in ok])
        ax.scatter(p, m, zorder=3)
        for r, x, y in zip(ok, p, m):
            ax.annotate(r["name"], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        lo, hi = min(p.min(), m.min()) / 1.15, max(p.max(), m.max()) * 1.15
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.15, label="±10%")
        if hi / lo > 5:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.legend(loc="upper left")
    sp = rep.spearman
    ax.set_title(f"{rep.model} on {rep.ranks} x {rep.machine}: median |err| "
                 f"{(rep.median_abs_step_error or 0):.0%}, Spearman {sp if sp is not None else float('nan'):.2f}")
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("measured step time (s)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(rep: ValidationReport, console=None) -> None:
    """The rich table and the summary lines."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False, width=140)

    def pct(v):
        return "" if v is None else f"{v:+.0%}"

    def num(v, spec=".3f"):
        return "" if v is None else format(v, spec)

    t = Table(title=f"Local validation: {rep.model} on {rep.ranks} ranks of {rep.machine}, global batch "
                    f"{rep.job.get('global_batch')} x {rep.job.get('seq_len')} tokens, {rep.steps} steps")
    for col in ("layout", "pred s", "meas s", "err", "pred GiB", "RSS GiB", "err raw", "net pred", "net meas", "err net"):
        t.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    for r in rep.rows:
        if r["status"] != "ok":
            t.add_row(r["name"], f"[red]{r['status']}[/red]", *[""] * 8)
            continue
        t.add_row(r["name"], num(r["predicted_step_time_s"]), num(r["measured_step_time_s"]), pct(r["step_time_error"]),
                  num(r["predicted_memory_gib"], ".2f"), num(r["measured_memory_gib"], ".2f"), pct(r["memory_error_raw"]),
                  num(r["predicted_memory_net_gib"], ".2f"), num(r["measured_memory_net_gib"], ".2f"), pct(r["memory_error"]))
    console.print(t)
    if rep.baseline_rss_gib is not None:
        console.print(f"memory: RSS high-water mark (max over ranks); 'net' = RSS - idle rank {rep.baseline_rss_gib:.2f} GiB "
                      f"vs predicted - reserve {rep.memory_reserve_gib:g} GiB")
    for k, v in rep.targets.items():
        val = v["value"]
        shown = "n/a" if val is None else (f"{val:.2f}" if k == "spearman" else f"{val:.1%}")
        mark = {True: "[green]met[/green]", False: "[red]missed[/red]", None: "n/a"}[v["met"]]
        console.print(f"{k:26s} {shown:>8s}  (target {'>=' if k == 'spearman' else '<='} {v['target']:g})  {mark}")
    fc = rep.first_choice
    if fc:
        console.print(f"first choice {fc['first_choice']}; fastest measured {fc['fastest']}"
                      + ("" if fc["first_choice_is_fastest"] else f"; first choice {fc['first_choice_miss']:.1%} slower"))
    if rep.files:
        console.print(f"wrote {rep.files['csv']}, {rep.files['json']}, {rep.files['png']}")


# --------------------------------------------------------------------------------------------
# Refit from measured runs
# --------------------------------------------------------------------------------------------


def _get(machine, fig: str) -> float:
    return {"peak_fraction": lambda: machine.matmul_efficiency.peak_fraction,
            "half_dim": lambda: machine.matmul_efficiency.half_dim,
            "overlap_dp": lambda: machine.overlap.dp,
            "step_overhead_s": lambda: machine.step_overhead_s,
            "op_overhead_us": lambda: machine.op_overhead_us,
            "memory_bandwidth_gbps": lambda: machine.memory_bandwidth_gbps,
            "attention_efficiency_factor": lambda: machine.attention_efficiency_factor}[fig]()


BOUNDS = {"peak_fraction": (0.02, 1.0), "half_dim": (0.0, 4096.0), "overlap_dp": (0.0, 1.0),
          "step_overhead_s": (0.0, 2.0), "op_overhead_us": (0.0, 500.0), "memory_bandwidth_gbps": (0.5, 200.0), "attention_efficiency_factor": (0.05, 1.0)}


def with_figures(machine, figures: dict[str, float]):
    """A copy of the machine with these figures set (names as in FIT_FIGURES_DEFAULT/BOUNDS)."""
    m = machine.model_copy(deep=True)
    me, ov = m.matmul_efficiency.model_copy(), m.overlap.model_copy()
    for k, v in figures.items():
        v = float(v)
        if k == "peak_fraction":
            me.peak_fraction = min(max(v, 0.0), 1.0)
        elif k == "half_dim":
            me.half_dim = max(v, 0.0)
        elif k == "overlap_dp":
            ov.dp = min(max(v, 0.0), 1.0)
        elif k == "step_overhead_s":
            m.step_overhead_s = max(v, 0.0)
        elif k == "op_overhead_us":
            m.op_overhead_us = max(v, 0.0)
        elif k == "memory_bandwidth_gbps":
            m.memory_bandwidth_gbps = v
        elif k == "attention_efficiency_factor":
            m.attention_efficiency_factor = min(max(v, 0.0), 1.0)
        else:
            raise PlanError(f"unknown figure {k!r}; known: {', '.join(BOUNDS)}", field="figures")
    m.matmul_efficiency, m.overlap = me, ov
    return m


@dataclass
class MeasuredRun:
    name: str
    plan: Any
    measured_step_time_s: float
    measured_memory_gib: float | None


def load_runs(run_dirs: Iterable[Path]) -> list[MeasuredRun]:
    """Runs with a summary.json and the plan.yaml they ran (written by run_local_validation)."""
    from planner.plan import load_plan

    runs = []
    for d in map(Path, run_dirs):
        s, p = d / "summary.json", d / "plan.yaml"
        if not s.exists() or not p.exists():
            raise PlanError(f"{d}: needs summary.json and plan.yaml (a run directory of `exaplan validate --local`)", field="runs")
        summ = json.loads(s.read_text())
        runs.append(MeasuredRun(d.name, load_plan(p), float(summ["measured_step_time_s"]), summ.get("peak_memory_gib")))
    if not runs:
        raise PlanError("no run directories given", field="runs")
    return runs


def _log_residuals(runs: list[MeasuredRun], machine) -> np.ndarray:
    return np.array([math.log(predict(r.plan, machine)["step_time_s"] / r.measured_step_time_s) for r in runs])


def refit_from_runs(run_dirs, machine="local", figures: Sequence[str] = FIT_FIGURES_DEFAULT, ranks: int | None = None,
                    runs: list[MeasuredRun] | None = None):
    """The machine with `figures` refitted to the measured step times of the runs: least
    squares on log(predicted / measured) (scipy.optimize.least_squares, bounded; a weak pull
    towards the starting values keeps figures the runs do not constrain where they were).
    `machine`: a MachineModel, a name, or None for the machine stored in the first run's plan.
    Returns a MachineModel with calibrated=True and a description saying what was fitted."""
    from scipy.optimize import least_squares

    runs = runs if runs is not None else load_runs(run_dirs)
    if machine is None:
        base = runs[0].plan.machine
    else:
        base = _resolve_machine(machine, ranks or runs[0].plan.machine.devices_per_node)
    figures = list(figures)
    x0 = np.array([_get(base, f) for f in figures], float)
    lo = np.array([BOUNDS[f][0] for f in figures])
    hi = np.array([BOUNDS[f][1] for f in figures])
    scale = np.maximum(hi - lo, 1e-9)
    x0 = np.clip(x0, lo, hi)
    prior = 0.02  # weight of the pull towards x0, per unit of each figure's range

    def resid(x):
        r = _log_residuals(runs, with_figures(base, dict(zip(figures, x))))
        return np.concatenate([r, prior * (x - x0) / scale])

    res = least_squares(resid, x0, bounds=(lo, hi), x_scale=scale, diff_step=1e-3)
    fitted = dict(zip(figures, map(float, res.x)))
    out = with_figures(base, fitted)
    out.calibrated = True
    names = ", ".join(f"{k}={v:.4g}" for k, v in fitted.items())
    out.description = (base.description + f" Refitted from {len(runs)} measured runs ({', '.join(r.name for r in runs)}): "
                       f"{names}.").strip()
    return out


def holdout_report(run_dirs, machine="local", figures: Sequence[str] = FIT_FIGURES_DEFAULT, test_every: int = 2,
                   offset: int = 1) -> dict[str, Any]:
    """Refit on some runs and measure the step-time error on the others, before and after.
    Runs sorted by name; every `test_every`-th from `offset` is held out. Returns the fitted
    figures and per-run errors (measured / predicted - 1) on both sets."""
    runs = sorted(load_runs(run_dirs), key=lambda r: r.name)
    test = [r for i, r in enumerate(runs) if i % test_every == offset % test_every]
    train = [r for r in runs if r not in test]
    if not train or not test:
        raise PlanError("needs at least 2 runs to hold some out", field="runs")
    base = runs[0].plan.machine if machine is None else _resolve_machine(machine, runs[0].plan.machine.devices_per_node)
    fitted = refit_from_runs(None, base, figures, runs=train)

    def errors(rs, m):
        return {r.name: r.measured_step_time_s / predict(r.plan, m)["step_time_s"] - 1.0 for r in rs}

    def med(d):
        return float(np.median(np.abs(list(d.values()))))

    out = dict(train=[r.name for r in train], test=[r.name for r in test],
               figures_before={f: _get(base, f) for f in figures}, figures_after={f: _get(fitted, f) for f in figures},
               train_before=errors(train, base), train_after=errors(train, fitted),
               test_before=errors(test, base), test_after=errors(test, fitted))
    for k in ("train_before", "train_after", "test_before", "test_after"):
        out[f"median_abs_{k}"] = med(out[k])
    out["machine"] = fitted
    return out


# --------------------------------------------------------------------------------------------
# Command line (the lead wires `exaplan validate --local` to this)
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="exaplan validate --local", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="protein-small")
    ap.add_argument("--machine", default="local")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="runs/validate-local")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        rep = run_local_validation(args.model, args.ranks, Path(args.out), steps=args.steps, machine=args.machine,
                                   progress=not args.json)
    except PlanError as e:
        print(f"exaplan validate: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rep.to_json(), indent=2))
    else:
        render(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
