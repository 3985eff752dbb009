"""The JAX backend (`exaplan run PLAN --backend jax`) beside the torch runtime (`--backend torch`).

    .venv/bin/python -m benchmarks.jax_vs_torch [--layouts demo,demo-jax-plan,fsdp,tp2]
        [--rounds 3] [--extra-rounds 1] [--steps 30] [--warmup 5] [--out runs/bench-jax] [--quick]

The job is the demo's: the plan comes from the Makefile's `demo` target's command (`exaplan plan
--model protein-small --machine local --global-batch 4 --seq-len 128 --top 3`; checked against
the Makefile by tests/benchmarks/test_jax_vs_torch.py). That plan is pipeline-parallel (pp 2,
interleaved 1F1B) on this kind of machine, which the JAX backend refuses; so the layouts are:

  demo           torch runs the demo's plan; jax runs the same command's plan for JAX (`... --backend
                 jax`, the layouts the JAX backend runs: dp2 zero2 here): the demo job on each
                 backend as its planner lays it out. --rounds interleaved rounds.
  demo-jax-plan  both backends on that JAX plan: the same layout on both. --extra-rounds rounds.
  fsdp, tp2      both backends on the demo command with `--shard fsdp --pp 1` / `--tp 2 --pp 1`.
                 --extra-rounds rounds.

Every run: `exaplan run PLAN --backend B --steps N --io-mode synthetic --val-every 0
--val-batches 1 --data DATA --out FRESH_DIR` (DATA: the shipped sample prepared once); each round
runs both backends, alternating which goes first (round by round and layout by layout). Only
`exaplan` commands run (no jaxrt/, runtime/ or calibration/ code here); the environment is this
process's (the torch launcher gives each rank cores / 2 OpenMP threads unless OMP_NUM_THREADS is
set; the JAX backend holds both ranks as XLA CPU devices of one process).

Measured (as benchmarks/runtime_vs_torch.py measures exaplan's side):
  step time  metrics.jsonl's step_time_s (before the step to after it, the JAX step waited for),
             the first --warmup steps of every run dropped (JAX compiles in its first step), the
             rest of all rounds pooled: fastest and median; and each round's median (noise);
  start-up   from the driver's launch of the command (time.time() just before starting it) to
             the end of the first step: the `time` of the first metrics.jsonl train record
             (stamped as that step ends) minus the launch time. JAX's includes its compile.

Writes OUT/results.json and OUT/results.md, prints the table (rich), shows a progress bar on
stderr; the runs' folders and logs stay in OUT/runs and OUT/logs (final checkpoints deleted
unless --keep-checkpoints). Exit 0, or 1 when a run failed (the others still reported).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import summary  # noqa: E402
from benchmarks.common import GLOBAL_BATCH, MODEL, SEQ_LEN, cores  # noqa: E402
from benchmarks.runtime_vs_torch import (  # noqa: E402
    RunFailed, add_run_options, checked_layouts, exaplan_command, launch, read_step_records,
)

BACKENDS = ("torch", "jax")
# The Makefile's `demo` target's job: `exaplan plan` with these options (and -o PLAN), on `local`
# where the demo plans on the machine its arrival calibration fitted.
DEMO_PLAN_OPTIONS = ["--model", MODEL, "--machine", "local", "--global-batch", str(GLOBAL_BATCH),
                     "--seq-len", str(SEQ_LEN), "--top", "3"]
# Plan name -> (the options added to the demo's, what the plan must hold).
PLANS: dict[str, tuple[list[str], dict]] = {
    "demo": ([], {}),
    "jax": (["--backend", "jax"], {"pp": 1, "cp": 1}),
    "fsdp": (["--shard", "fsdp", "--pp", "1"], {"pp": 1, "cp": 1, "sharding": "fsdp"}),
    "tp2": (["--tp", "2", "--pp", "1"], {"pp": 1, "cp": 1, "tp": 2}),
}
# Layout row -> the plan each backend runs.
LAYOUTS: dict[str, dict[str, str]] = {
    "demo": {"torch": "demo", "jax": "jax"},
    "demo-jax-plan": {"torch": "jax", "jax": "jax"},
    "fsdp": {"torch": "fsdp", "jax": "fsdp"},
    "tp2": {"torch": "tp2", "jax": "tp2"},
}
MAIN = "demo"  # the layout run --rounds times; the others --extra-rounds times

METHOD = (
    "Step time: metrics.jsonl step_time_s (the whole optimizer step; JAX's waited for), the first {warmup} steps "
    "of every run left out (JAX compiles in its first step), the rest of all rounds pooled. Start-up: from the "
    "driver's launch of `exaplan run` to the end of the first step (the time of the first metrics.jsonl train "
    "record minus the launch time; JAX's includes its compile). Ratios are jax / torch (below 1: JAX faster). "
    "Noise: each round's median step. Rounds alternate which backend runs first. The demo row runs the demo's "
    "plan on torch and the demo command's plan for JAX (--backend jax) on jax: the JAX backend refuses the "
    "demo's pipeline-parallel plan; the other rows run one plan on both.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.jax_vs_torch",
        description="exaplan run --backend jax beside --backend torch on the demo's job (protein-small, global "
                    "batch 4 x 128, fp32, 2 ranks on this machine): the demo's plan and a few pinned layouts, "
                    "interleaved rounds; step time (median, fastest) and start-up to the end of the first step.",
        epilog="Layouts: demo (torch: the Makefile demo's plan; jax: the same `exaplan plan` command with --backend "
               "jax, since the JAX backend runs no pipeline parallelism), demo-jax-plan (that JAX plan on both), "
               "fsdp (--shard fsdp --pp 1), tp2 (--tp 2 --pp 1). Run it on an otherwise idle machine.")
    ap.add_argument("--rounds", type=int, default=3, help=f"interleaved rounds of the {MAIN} layout (default 3)")
    ap.add_argument("--extra-rounds", type=int, default=1, help="rounds of every other layout (default 1)")
    add_run_options(ap, LAYOUTS, "runs/bench-jax", "the demo layout only, 2 rounds x 8 steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.layouts, args.rounds, args.steps = MAIN, 2, 8
    args.layouts = checked_layouts(ap, args, LAYOUTS)
    if args.rounds < 1 or args.extra_rounds < 1 or args.steps < 1 or not 0 <= args.warmup < args.steps:
        ap.error("need --rounds >= 1, --extra-rounds >= 1, --steps >= 1 and 0 <= --warmup < --steps")
    return args


def rounds_of(layout: str, args) -> int:
    return args.rounds if layout == MAIN else args.extra_rounds


def describe(plan: dict) -> str:
    """A plan's layout in a few words, e.g. "pp2 | mbs2 x 2 | interleaved-1f1b v4"."""
    mesh = plan["mesh"]
    dp = mesh.get("dp_replicate", 1) * mesh.get("dp_shard", 1)
    axes = [f"{a}{n}" for a, n in (("pp", mesh.get("pp", 1)), ("dp", dp), ("cp", mesh.get("cp", 1)),
                                   ("tp", mesh.get("tp", 1))) if n > 1]
    if plan.get("sequence_parallel"):
        axes.append("sp")
    kind = plan.get("sharding", {}).get("kind", "none")
    parts = [" ".join(axes + ([kind] if kind != "none" else [])) or "1 rank"]
    parts.append(f"mbs{plan['micro_batch_size']} x {plan.get('grad_accumulation_steps', 1)}")
    pipe = plan.get("pipeline") or {}
    if mesh.get("pp", 1) > 1 and pipe.get("schedule"):
        vpp = pipe.get("virtual_stages", 1)
        parts.append(pipe["schedule"] + (f" v{vpp}" if vpp > 1 else ""))
    if plan.get("recompute", "none") != "none":
        parts.append(f"recompute {plan['recompute']}")
    return " | ".join(parts)


def check_plan(plan: dict, want: dict) -> list[str]:
    """What in `plan` differs from `want` ({"pp", "cp", "tp": n, "sharding": kind})."""
    got = {"pp": plan["mesh"].get("pp", 1), "cp": plan["mesh"].get("cp", 1), "tp": plan["mesh"].get("tp", 1),
           "sharding": plan["sharding"]["kind"]}
    return [f"{k} {got[k]} (want {v})" for k, v in want.items() if got[k] != v]


def make_plans(names: set[str], out: Path, env: dict) -> dict[str, dict]:
    """Each named plan written by `exaplan plan` (the demo's options + its own) and checked:
    {name: {"path", "layout", "options"}}."""
    import yaml

    made = {}
    for name in sorted(names):
        extra, want = PLANS[name]
        path = out / f"plan-{name}.yaml"
        launch([*exaplan_command(), "plan", *DEMO_PLAN_OPTIONS, *extra, "-o", str(path)],
               out / "logs" / f"plan-{name}.log", env, 300)
        plan = yaml.safe_load(path.read_text())
        problems = check_plan(plan, want)
        if problems:
            raise RunFailed(f"{path}: not the {name} plan: {'; '.join(problems)}")
        made[name] = {"path": str(path), "layout": describe(plan), "options": " ".join(extra)}
    return made


def step_stats(times: list[float], warmup: int) -> dict:
    """Median and fastest of one run's steps after the first `warmup`."""
    kept = times[warmup:]
    return {"median_s": statistics.median(kept) if kept else None, "min_s": min(kept) if kept else None}


def parse_run(run_dir: Path, t_launch: float) -> dict:
    """One run's numbers from its folder: the step times and losses (metrics.jsonl, by step),
    start-up (first train record's time minus `t_launch`) and summary.json's
    measured_step_time_s. RunFailed when there are no step records."""
    steps = read_step_records(run_dir / "metrics.jsonl")
    if not steps:
        raise RunFailed(f"{run_dir / 'metrics.jsonl'}: no step records")
    first_end = steps[0].get("time")
    measured = None
    if (run_dir / "summary.json").exists():
        measured = json.loads((run_dir / "summary.json").read_text()).get("measured_step_time_s")
    return {"step_times_s": [r["step_time_s"] for r in steps],
            "losses": [r.get("loss") for r in steps],
            "startup_to_first_step_s": first_end - t_launch if first_end is not None else None,
            "first_step": steps[0]["step"], "summary_measured_step_time_s": measured}


def run_backend(backend: str, plan: str, data: Path, run_dir: Path, log: Path, args, env: dict) -> dict:
    """One `exaplan run PLAN --backend B` in a fresh `run_dir`, parsed."""
    shutil.rmtree(run_dir, ignore_errors=True)  # exaplan refuses an --out that holds checkpoints
    cmd = [*exaplan_command(), "run", plan, "--backend", backend, "--steps", str(args.steps), "--io-mode", "synthetic",
           "--data", str(data), "--out", str(run_dir), "--val-every", "0", "--val-batches", "1",
           "--log-every", str(args.steps)]
    t_launch, wall = launch(cmd, log, env, args.timeout)
    try:
        rec = parse_run(run_dir, t_launch)
    except RunFailed as e:
        raise RunFailed(f"{e} (log {log})") from None
    if not args.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    rec.update({"wall_s": wall, "log": str(log), "plan": plan})
    return rec


def layout_result(layout: str, plans: dict, runs: dict, warmup: int) -> dict:
    """Both backends' runs of one layout summarised (benchmarks/summary.py's side_stats), the
    jax / torch ratios, each round's median per backend, the runs themselves."""
    t, j = summary.side_stats(runs["torch"], warmup), summary.side_stats(runs["jax"], warmup)
    return {
        "plans": {b: plans[LAYOUTS[layout][b]]["path"] for b in BACKENDS},
        "plan_layouts": {b: plans[LAYOUTS[layout][b]]["layout"] for b in BACKENDS},
        "plan_options": {b: plans[LAYOUTS[layout][b]]["options"] for b in BACKENDS},
        "torch": t,
        "jax": j,
        "fastest_step_ratio": summary._ratio(j["min_step_s"], t["min_step_s"]),
        "median_step_ratio": summary._ratio(j["median_step_s"], t["median_step_s"]),
        "round_median_ratios": [a / b for a, b in zip(j["round_medians_s"], t["round_medians_s"])],
        "startup_ratio": summary._ratio(j["startup_to_first_step_s"], t["startup_to_first_step_s"]),
        "runs": runs,
    }


def schedule(args) -> list[tuple[str, int, str, bool]]:
    """(layout, round, backend, first in its round) of every run in order: each round runs both
    backends, the first alternating round by round and layout by layout."""
    out = []
    for i, layout in enumerate(args.layouts):
        for r in range(rounds_of(layout, args)):
            first = (i + r) % 2
            out += [(layout, r + 1, BACKENDS[first], True), (layout, r + 1, BACKENDS[1 - first], False)]
    return out


def run_all(args, plans: dict, data: Path, out: Path, env: dict, results: dict, console) -> None:
    """Every run of the schedule under a progress bar (on `console`); each layout summarised into
    results["layouts"] after its last run; a failed run recorded and its layout's other runs skipped."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    runs: dict[str, dict[str, list]] = {layout: {b: [] for b in BACKENDS} for layout in args.layouts}
    todo = schedule(args)
    failed: set[str] = set()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("bench-jax", total=len(todo))
        for k, (layout, r, backend, first) in enumerate(todo):
            if layout not in failed:
                bar.update(task, description=f"{layout} round {r}/{rounds_of(layout, args)}: {backend}")
                tag = f"{layout}-r{r}-{backend}"
                try:
                    rec = run_backend(backend, plans[LAYOUTS[layout][backend]]["path"], data, out / "runs" / tag,
                                      out / "logs" / f"{tag}.log", args, env)
                    rec.update({"round": r, "first_in_round": first})
                    runs[layout][backend].append(rec)
                    console.log(f"{tag}: {one_line(rec, args.warmup)}")
                except RunFailed as e:
                    console.log(f"FAILED {tag}: {e}")
                    results["failures"].append({"layout": layout, "backend": backend, "error": str(e)})
                    failed.add(layout)
            bar.advance(task)
            if (k + 1 == len(todo) or todo[k + 1][0] != layout) and layout not in failed:
                results["layouts"][layout] = layout_result(layout, plans, runs[layout], args.warmup)


def one_line(rec: dict, warmup: int) -> str:
    s = step_stats(rec["step_times_s"], warmup)
    return (f"median step {summary._ms(s['median_s'])} ms, fastest {summary._ms(s['min_s'])} ms, start-up "
            f"{summary._s(rec['startup_to_first_step_s'])} s, wall {rec['wall_s']:.1f} s")


def rows(results: dict) -> list[tuple[str, ...]]:
    """The table's rows: one per layout; cells "torch / jax" but the ratios (jax / torch)."""
    ms, x = summary._ms, summary._x
    out = []
    for layout, r in results["layouts"].items():
        t, j, pl = r["torch"], r["jax"], r["plan_layouts"]
        out.append((layout, pl["torch"] if pl["torch"] == pl["jax"] else f"{pl['torch']} / {pl['jax']}",
                    f"{ms(t['min_step_s'])} / {ms(j['min_step_s'])}", x(r["fastest_step_ratio"]),
                    f"{ms(t['median_step_s'])} / {ms(j['median_step_s'])}", x(r["median_step_ratio"]),
                    f"{summary._s(t['startup_to_first_step_s'])} / {summary._s(j['startup_to_first_step_s'])}",
                    x(r["startup_ratio"]),
                    ", ".join(ms(m) for m in t["round_medians_s"]), ", ".join(ms(m) for m in j["round_medians_s"])))
    return out


HEADER = ("layout", "plan (torch / jax)", "fastest step, ms", "ratio", "median step, ms", "ratio",
          "start-up to step 1, s", "ratio", "round medians torch, ms", "round medians jax, ms")


def title(results: dict) -> str:
    c = results["config"]
    return (f"exaplan run --backend jax vs --backend torch: {c['model']}, global batch {c['global_batch']} x "
            f"{c['seq_len']}, fp32, 2 ranks on {c['cores']} cores; {c['steps']} steps a run, {c['warmup']} dropped; "
            f"{c['rounds']} round(s) of {MAIN}, {c['extra_rounds']} of the others. Cells: torch / jax, ratios "
            f"jax / torch")


def markdown(results: dict) -> str:
    lines = [f"# {title(results)}", "", f"Started {results['config']['started']}; "
             f"{results['config']['elapsed_s']:.0f} s in all.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(HEADER) - 2)) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows(results)]
    lines += ["", "Plans (`exaplan plan " + " ".join(DEMO_PLAN_OPTIONS) + " ... -o PLAN`, the Makefile demo's "
              "command):"]
    lines += [f"- {name}: {p['options'] or '(as the demo)'} -> {p['layout']} ({p['path']})"
              for name, p in results["plans"].items()]
    lines += ["", METHOD.format(warmup=results["config"]["warmup"])]
    for f in results["failures"]:
        lines += ["", f"**Failed** ({f['layout']}, {f.get('backend')}): " + f["error"].splitlines()[0]]
    return "\n".join(lines) + "\n"


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a log file: no wrapping into narrow columns
    t = Table(title=title(results))
    for i, col in enumerate(HEADER):
        t.add_column(col, justify="left" if i < 2 else "right")
    for r in rows(results):
        t.add_row(*r)
    console.print(t)
    console.print(METHOD.format(warmup=results["config"]["warmup"]), soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rich.console import Console

    console = Console(stderr=True, log_path=False)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    t0 = time.time()
    config = {"layouts": args.layouts, "rounds": args.rounds, "extra_rounds": args.extra_rounds, "steps": args.steps,
              "warmup": args.warmup, "model": MODEL, "global_batch": GLOBAL_BATCH, "seq_len": SEQ_LEN,
              "cores": cores(), "omp_num_threads": env.get("OMP_NUM_THREADS"), "xla_flags": env.get("XLA_FLAGS"),
              "quick": args.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    results: dict = {"config": config, "plans": {}, "layouts": {}, "failures": []}
    data = out / "data"
    try:  # the shipped sample, tokenised once for every run (synthetic mode then reuses one batch)
        launch([*exaplan_command(), "data", "prepare", "-o", str(data), "--overwrite", "--no-progress"],
               out / "logs" / "data-prepare.log", env, 600)
        results["plans"] = make_plans({LAYOUTS[la][b] for la in args.layouts for b in BACKENDS}, out, env)
    except RunFailed as e:
        console.log(f"FAILED: {e}")
        results["failures"].append({"layout": None, "error": str(e)})
    if not results["failures"]:
        run_all(args, results["plans"], data, out, env, results, console)
    config["elapsed_s"] = time.time() - t0
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results))
    print_table(results)
    if results["failures"]:
        print(f"bench-jax: {len(results['failures'])} failed: " + "; ".join(
            f"{f['layout']}: {f['error'].splitlines()[0]}" for f in results["failures"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
