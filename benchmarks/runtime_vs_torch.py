"""`exaplan run` against hand-written plain-torch training loops of the same layout.

    .venv/bin/python -m benchmarks.runtime_vs_torch [--layouts ddp,fsdp,zero1,tp_sp,pp_1f1b]
        [--rounds 3] [--steps 30] [--warmup 5] [--out runs/bench-runtime] [--quick]

For each layout kind: a plan with the layout's axes pinned (`exaplan plan ... --dp --shard --tp
--sp --pp --schedule --mbs --recompute none --precision fp32`), checked to hold that layout;
then R rounds, each running A = `exaplan run PLAN --io-mode synthetic` and B = the layout's
torch script (benchmarks/torch_<layout>.py under `torch.distributed.run --standalone
--nproc-per-node 2`), alternating which goes first. The workload is the demo's (protein-small,
global batch 4 x 128 tokens, fp32, one fixed batch reused; benchmarks/common.py).

Measured the same way on both sides:
  step time     from before the forward to after optimizer.step() + zero_grad() (exaplan's
                runtime/trainer.py `_train_step`; metrics.jsonl's step_time_s), the first
                --warmup steps of every run dropped;
  start-up      from the driver's launch of the command (time.time() just before starting
                it) to the end of the first step, stamped with time.time(): the "time" of
                exaplan's first metrics.jsonl step record (stamped as the step ends; runtimes
                that stamp it at writing add that step's metric reductions, a few ms), the
                torch script's first_step_end_time.

Writes OUT/results.json and OUT/results.md, prints the table, shows progress on stderr; the
runs' folders, JSON files and logs stay in OUT/runs and OUT/logs (exaplan's final
checkpoints are deleted unless --keep-checkpoints). Exit 0, or 1 when a run failed (the
others still reported).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import summary  # noqa: E402
from benchmarks.common import GLOBAL_BATCH, MODEL, SEQ_LEN, cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RANKS = 2
# Layout kind -> the axes pinned in its plan (and what the plan must then hold).
LAYOUTS: dict[str, dict] = {
    "ddp": {"pins": ["--dp", "2", "--shard", "none", "--tp", "1", "--pp", "1", "--mbs", "2"],
            "mesh": {"pp": 1, "tp": 1, "dp": 2}, "sharding": "none", "mbs": 2},
    "fsdp": {"pins": ["--dp", "2", "--shard", "fsdp", "--tp", "1", "--pp", "1", "--mbs", "2"],
             "mesh": {"pp": 1, "tp": 1, "dp": 2}, "sharding": "fsdp", "mbs": 2},
    "zero1": {"pins": ["--dp", "2", "--shard", "zero1", "--tp", "1", "--pp", "1", "--mbs", "2"],
              "mesh": {"pp": 1, "tp": 1, "dp": 2}, "sharding": "zero1", "mbs": 2},
    "tp_sp": {"pins": ["--dp", "1", "--shard", "none", "--tp", "2", "--sp", "--pp", "1", "--mbs", "4"],
              "mesh": {"pp": 1, "tp": 2, "dp": 1}, "sequence_parallel": True, "mbs": 4},
    "pp_1f1b": {"pins": ["--dp", "1", "--shard", "none", "--tp", "1", "--pp", "2", "--vpp", "1", "--schedule", "1f1b",
                         "--mbs", "1"],
                "mesh": {"pp": 2, "tp": 1, "dp": 1}, "schedule": "1f1b", "mbs": 1},
}


class RunFailed(RuntimeError):
    pass


def add_run_options(ap: argparse.ArgumentParser, layouts, out: str, quick: str) -> None:
    """The options every benchmark driver here shares (its own --rounds come before them)."""
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="first steps of every run left out (default 5)")
    ap.add_argument("--out", default=out, help=f"output folder (default {out})")
    ap.add_argument("--quick", action="store_true", help=f"smoke test: {quick}")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take (default 1800)")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep the runs' final checkpoints")
    ap.add_argument("--layouts", default=",".join(layouts), help=f"comma-separated (default {','.join(layouts)})")


def checked_layouts(ap: argparse.ArgumentParser, args: argparse.Namespace, layouts) -> list[str]:
    """--layouts as a list, each one of `layouts` (else the parser's error, exit 2)."""
    chosen = [s.strip() for s in args.layouts.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in layouts]
    if unknown or not chosen:
        ap.error(f"--layouts: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(layouts)}")
    return chosen


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.runtime_vs_torch",
                                 description="exaplan run against hand-written torch loops of the same layouts "
                                             "(protein-small, global batch 4 x 128, fp32, 2 ranks).")
    ap.add_argument("--rounds", type=int, default=3, help="A/B rounds per layout (default 3)")
    add_run_options(ap, LAYOUTS, "runs/bench-runtime", "1 round, 6 steps, 1 warm-up step")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 6, 1
    args.layouts = checked_layouts(ap, args, LAYOUTS)
    if args.rounds < 1 or args.steps < 1 or not 0 <= args.warmup < args.steps:
        ap.error("need --rounds >= 1, --steps >= 1 and 0 <= --warmup < --steps")
    return args


def progress(msg: str) -> None:
    print(f"[bench-runtime {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def exaplan_command() -> list[str]:
    """The `exaplan` of this interpreter's environment (the console script), else of the PATH."""
    here = Path(sys.executable).with_name("exaplan")
    found = str(here) if here.exists() else shutil.which("exaplan")
    if not found:
        raise RunFailed("no `exaplan` command next to this Python or on the PATH (pip install -e .)")
    return [found]


def launch(cmd: list[str], log: Path, env: dict, timeout: float) -> tuple[float, float]:
    """Run `cmd` from the repository root, stdout and stderr to `log`. Returns (time.time() at
    launch, wall seconds); RunFailed on a non-zero exit or a timeout (the process group is
    then ended)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        t_launch = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            raise RunFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd)} (log {log})") from None
        except BaseException:  # Ctrl-C: the run, in a session of its own, does not outlive the driver
            _end_group(proc)
            raise
    wall = time.time() - t_launch
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise RunFailed(f"exit {rc}: {' '.join(cmd)} (log {log}); its last lines:\n{tail}")
    return t_launch, wall


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group this driver started, SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def make_plan(layout: str, out: Path, env: dict) -> Path:
    """The layout's plan (its axes pinned), checked to hold that layout."""
    path = out / f"plan-{layout}.yaml"
    cmd = [*exaplan_command(), "plan", "--model", MODEL, "--machine", "local", "--global-batch", str(GLOBAL_BATCH),
           "--seq-len", str(SEQ_LEN), "--precision", "fp32", "--cp", "1", "--recompute", "none", "--draws", "0",
           "--top", "1", *LAYOUTS[layout]["pins"], "-o", str(path)]
    launch(cmd, out / "logs" / f"plan-{layout}.log", env, 300)
    check_plan(path, layout)
    return path


def check_plan(path: Path, layout: str) -> None:
    import yaml

    plan = yaml.safe_load(path.read_text())
    want = LAYOUTS[layout]
    mesh = plan["mesh"]
    got = {"pp": mesh["pp"], "tp": mesh["tp"], "dp": mesh["dp_replicate"] * mesh["dp_shard"]}
    problems = [f"mesh {got} (want {want['mesh']})"] if got != want["mesh"] or mesh.get("cp", 1) != 1 else []
    if plan["micro_batch_size"] != want["mbs"]:
        problems.append(f"micro-batch {plan['micro_batch_size']} (want {want['mbs']})")
    if "sharding" in want and plan["sharding"]["kind"] != want["sharding"]:
        problems.append(f"sharding {plan['sharding']['kind']} (want {want['sharding']})")
    if want.get("sequence_parallel") and not plan.get("sequence_parallel"):
        problems.append("no sequence parallelism")
    if "schedule" in want and plan["pipeline"]["schedule"] != want["schedule"]:
        problems.append(f"schedule {plan['pipeline']['schedule']} (want {want['schedule']})")
    if plan.get("recompute") != "none" or plan["job"]["precision"] != "fp32":
        problems.append(f"recompute {plan.get('recompute')}, precision {plan['job']['precision']}")
    if problems:
        raise RunFailed(f"{path}: not the {layout} layout: {'; '.join(problems)}")


def run_exaplan(plan: Path, data: Path, run_dir: Path, log: Path, args, env: dict) -> dict:
    """One `exaplan run`: its step times (metrics.jsonl) and start-up to the end of its first step."""
    shutil.rmtree(run_dir, ignore_errors=True)  # exaplan refuses an --out that holds checkpoints
    cmd = [*exaplan_command(), "run", str(plan), "--steps", str(args.steps), "--io-mode", "synthetic",
           "--data", str(data), "--out", str(run_dir), "--val-every", "0", "--val-batches", "1",
           "--log-every", str(args.steps)]
    t_launch, wall = launch(cmd, log, env, args.timeout)
    steps = read_step_records(run_dir / "metrics.jsonl")
    if not args.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    if not steps:
        raise RunFailed(f"{run_dir / 'metrics.jsonl'}: no step records (log {log})")
    if len(steps) != args.steps:
        progress(f"  note: exaplan logged {len(steps)} step records of {args.steps}")
    first_end = steps[0].get("time")
    return {"step_times_s": [r["step_time_s"] for r in steps],
            "startup_to_first_step_s": first_end - t_launch if first_end is not None else None,
            "first_step": steps[0]["step"], "wall_s": wall, "log": str(log)}


def read_step_records(path: Path) -> list[dict]:
    """metrics.jsonl's per-step records (kind "train"; "step" accepted too), by step."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("kind") in ("train", "step") and r.get("step_time_s") is not None:
            records.append(r)
    return sorted(records, key=lambda r: r["step"])


def run_torch(layout: str, result: Path, log: Path, args, env: dict) -> dict:
    """One hand-written torch run: its step times and start-up to the end of its first step."""
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node",
           str(RANKS), "--max-restarts", "0", "-m", f"benchmarks.torch_{layout}", "--steps", str(args.steps),
           "--out", str(result)]
    t_launch, wall = launch(cmd, log, env, args.timeout)
    if not result.exists():
        raise RunFailed(f"{result}: not written (log {log})")
    r = json.loads(result.read_text())
    return {"step_times_s": r["step_times_s"], "startup_to_first_step_s": r["first_step_end_time"] - t_launch,
            "in_script_startup_s": r["startup_to_first_step_s"], "losses": r.get("losses", []), "wall_s": wall,
            "log": str(log)}


def bench_layout(layout: str, data: Path, out: Path, args, env: dict) -> dict:
    """The plan, then the interleaved rounds of one layout kind: {"exaplan": [runs], "torch": [runs], ...}."""
    progress(f"{layout}: exaplan plan ({' '.join(LAYOUTS[layout]['pins'])})")
    plan = make_plan(layout, out, env)
    runs: dict[str, list] = {"exaplan": [], "torch": []}
    for r in range(args.rounds):
        order = ("exaplan", "torch") if r % 2 == 0 else ("torch", "exaplan")
        for side in order:
            tag = f"{layout}-r{r + 1}-{side}"
            progress(f"{layout} round {r + 1}/{args.rounds}: {side} ({args.steps} steps{', first' if side == order[0] else ''})")
            log = out / "logs" / f"{tag}.log"
            if side == "exaplan":
                rec = run_exaplan(plan, data, out / "runs" / tag, log, args, env)
            else:
                rec = run_torch(layout, out / "runs" / f"{tag}.json", log, args, env)
            rec.update({"round": r + 1, "first_in_round": side == order[0]})
            runs[side].append(rec)
            t = sorted(rec["step_times_s"][args.warmup:]) or [float("nan")]
            startup = rec["startup_to_first_step_s"]
            progress(f"  {side}: median step {t[len(t) // 2] * 1e3:.1f} ms, start-up to first step "
                     f"{'?' if startup is None else f'{startup:.2f}'} s, wall {rec['wall_s']:.1f} s")
    return {"plan": str(plan), **runs}


def run_env() -> dict:
    """The environment of both sides: exaplan's launcher gives each of its 2 ranks
    cores // 2 OpenMP threads unless OMP_NUM_THREADS is set; the torch side gets the same (both
    start from the repository root, so `-m benchmarks.torch_*` needs no PYTHONPATH)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // RANKS)))
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = run_env()
    config = {"layouts": args.layouts, "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
              "model": MODEL, "global_batch": GLOBAL_BATCH, "seq_len": SEQ_LEN, "ranks": RANKS, "cores": cores(),
              "omp_num_threads": env["OMP_NUM_THREADS"], "quick": args.quick,
              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    results: dict = {"config": config, "layouts": {}, "failures": []}
    data = out / "data"
    try:  # the shipped sample, tokenised once for every exaplan run (0.1 s; synthetic mode reuses one batch)
        launch([*exaplan_command(), "data", "prepare", "-o", str(data), "--overwrite", "--no-progress"],
               out / "logs" / "data-prepare.log", env, 600)
    except RunFailed as e:
        progress(f"FAILED: {e}")
        results["failures"].append({"layout": None, "error": str(e)})
    for layout in args.layouts if not results["failures"] else []:
        try:
            runs = bench_layout(layout, data, out, args, env)
        except RunFailed as e:
            progress(f"FAILED {layout}: {e}")
            results["failures"].append({"layout": layout, "error": str(e)})
            continue
        results["layouts"][layout] = summary.layout_result(runs, args.warmup)
    summary.write(results, out)
    summary.print_table(results)
    if results["failures"]:
        print(f"bench-runtime: {len(results['failures'])} failed: "
              + "; ".join(f"{f['layout']}: {f['error'].splitlines()[0]}" for f in results["failures"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
