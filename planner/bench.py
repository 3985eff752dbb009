"""Search speed on the seed paper's two largest jobs: `python -m planner.bench [--json]`.

For each case: the first search in a cold process state (link tiers not cached), the best of
`--repeats` warm searches, the legal layouts enumerated, the layouts scored (x collective-
algorithm choices), the rate, and the layout chosen. Times are wall-clock seconds of the
whole `search()` call: enumerate, score, prune, rank, and re-score the finalists.

`--whatif`: the what-if sweep (WHATIF: protein-3.5b on the five seed machines, 16-2,048 nodes,
1e12 tokens; 40 searches): the wall-clock seconds of `run_whatif` in this process, the
planner's share, then of the whole command `exaplan whatif ... --report DIR/r.html` from its
start to its exit (target WHATIF_TARGET_S on a 2-core machine, report included; --no-command
leaves it out).

`make bench` records both (benchmarks/record.py): docs/results/bench-search.json and
docs/results/bench-whatif.json, rendered on the docs site's "Benchmark results" page.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from machine_models import load_machine
from planner.cost.topology import _tiers_cached
from planner.inputs import make_job
from planner.presets import get_model
from planner.report import layout_label
from planner.search.search import search


@dataclass(frozen=True)
class Case:
    model: str
    machine: str
    nodes: int
    sequences_per_rank: int  # global batch = this x ranks


CASES = (
    Case("protein-3.5b", "aurora", 3200, 8),  # MProt-DPO's largest run: 38,400 tiles
    Case("protein-70b", "frontier", 2048, 2),
)


@dataclass
class BenchResult:
    model: str
    machine: str
    nodes: int
    ranks: int
    global_batch: int
    cold_s: float
    best_s: float
    repeats: int
    legal_layouts: int
    layouts_scored: int
    layouts_scored_per_s: float
    legal_layouts_per_s: float
    chosen_layout: str
    step_time_s: float
    mfu: float


def _timed_search(model, machine, job, nodes):
    start = time.perf_counter()
    result = search(model, machine, job, nodes, top_k=1)
    return time.perf_counter() - start, result


def run_case(case: Case, repeats: int = 3) -> BenchResult:
    """Time one case: a cold first search, then the best of `repeats` warm ones."""
    model, machine = get_model(case.model), load_machine(case.machine)
    ranks = case.nodes * machine.devices_per_node
    job = make_job(model, machine, ranks, case.sequences_per_rank * ranks, None, None, None)
    _tiers_cached.cache_clear()  # the topology graph is built again, as in a fresh process
    cold_s, result = _timed_search(model, machine, job, case.nodes)
    best_s = min(_timed_search(model, machine, job, case.nodes)[0] for _ in range(repeats))
    ev = result.evaluation
    return BenchResult(
        model=case.model, machine=case.machine, nodes=case.nodes, ranks=ranks, global_batch=job.global_batch,
        cold_s=cold_s, best_s=best_s, repeats=repeats, legal_layouts=result.total_layouts,
        layouts_scored=result.layouts_scored, layouts_scored_per_s=result.layouts_scored / best_s,
        legal_layouts_per_s=result.total_layouts / best_s, chosen_layout=layout_label(result.layouts, 0),
        step_time_s=float(ev.step_time_s[0]), mfu=float(ev.mfu[0]),
    )


def render(r: BenchResult) -> str:
    return "\n".join([
        f"{r.model} on {r.nodes:,} x {r.machine} ({r.ranks:,} ranks), global batch {r.global_batch:,}",
        f"  search: {r.best_s:.3f} s best of {r.repeats} warm, {r.cold_s:.3f} s cold first run",
        f"  legal layouts {r.legal_layouts:,}; scored with algorithm choices {r.layouts_scored:,} "
        f"({r.layouts_scored_per_s:,.0f} /s; {r.legal_layouts_per_s:,.0f} legal layouts/s)",
        f"  chosen: {r.chosen_layout}  (step {r.step_time_s:.3f} s, MFU {r.mfu:.1%})",
    ])


WHATIF = dict(model="protein-3.5b", machine="aurora,alps,frontier,leonardo,pdx", nodes="16:2048", tokens=1e12)
WHATIF_TARGET_S = 10.0  # the whole command, report included, on a 2-core machine


def whatif_command(report: Path) -> list[str]:
    """`exaplan whatif` on WHATIF writing an HTML report: the console script beside this
    interpreter where there is one, else `python -m cli`."""
    return [*_exaplan(), "whatif", "--model", WHATIF["model"], "--machine", WHATIF["machine"], "--nodes", WHATIF["nodes"],
            "--tokens", f"{WHATIF['tokens']:g}".replace("e+", "e"), "--report", str(report)]


def run_whatif_case(report_dir: Path | None = None) -> dict:
    """Time the what-if sweep (every search of its 40 points, the questions, in worker
    processes where the machine has several cores); then, with `report_dir`, the whole
    `exaplan whatif ... --report` command in a fresh process."""
    from planner.whatif import run_whatif

    _tiers_cached.cache_clear()
    start = time.perf_counter()
    result = run_whatif(**WHATIF)
    seconds = time.perf_counter() - start
    out = dict(case=WHATIF, points=len(result.points), fitting=sum(p.fits for p in result.points), seconds=seconds)
    if report_dir is not None:
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        cmd = whatif_command(Path(report_dir) / "r.html")
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        out.update(command="exaplan " + " ".join(cmd[cmd.index("whatif"):]),
                   command_seconds=time.perf_counter() - start, target_s=WHATIF_TARGET_S)
    return out


def render_whatif(r: dict) -> str:
    c = r["case"]
    line = (f"whatif {c['model']} on {c['machine']}, nodes {c['nodes']}, {c['tokens']:.0e} tokens: "
            f"{r['points']} points ({r['fitting']} fit) in {r['seconds']:.2f} s")
    if "command_seconds" in r:
        line += f"\n{r['command']}: {r['command_seconds']:.1f} s (target {r['target_s']:g} s)"
    return line


# `--commands`: whole commands in fresh processes, as a user waits on them (issue 53's targets on
# this 2-core machine): (what, arguments after `exaplan`, wall target s, peak memory target MB).
COMMANDS = [
    ("exaplan --help", ["--help"], 0.3, None),
    ("exaplan list", ["list"], 0.3, None),
    ("exaplan plan protein-3.5b on 3,200 Aurora nodes (robustness draws included)",
     ["plan", "--model", "protein-3.5b", "--machine", "aurora", "--nodes", "3200", "-o", "{tmp}/plan.yaml", "--force"],
     1.0, 250),
]


def _exaplan() -> list[str]:
    """The console script beside this interpreter where there is one, else `python -m cli`."""
    exe = Path(sys.executable).with_name("exaplan")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cli"]


def time_command(argv: list[str], repeats: int) -> dict:
    """Median wall seconds over `repeats` fresh processes, and the largest peak resident memory
    (MB, from wait4's rusage: the process's high-water mark, which on Linux includes the pages it
    shared with this process when forked: run from a small process, as `make bench` does)."""
    import os
    import statistics

    walls, peaks = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - start)
        peaks.append(usage.ru_maxrss / 1024)  # KiB on Linux
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit code {proc.returncode}")
    return dict(wall_s=statistics.median(walls), runs=repeats, peak_mb=max(peaks))


def compile_sources() -> None:
    """The project's bytecode written first, as Python caches it for a user (this machine's
    PYTHONDONTWRITEBYTECODE=1 would otherwise have every start compile every module again)."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for package in ("cli", "planner", "machine_models", "calibration", "export", "launch", "report", "runtime"):
        compileall.compile_dir(str(root / package), quiet=1)


def run_commands(repeats: int = 5) -> list[dict]:
    import tempfile

    compile_sources()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for what, args, wall_target, mem_target in COMMANDS:
            argv = [*_exaplan(), *[a.format(tmp=tmp) for a in args]]
            rows.append(dict(what=what, command="exaplan " + " ".join(args).replace("{tmp}", "TMP"),
                             **time_command(argv, repeats), target_s=wall_target, target_mb=mem_target))
    return rows


def render_commands(rows: list[dict]) -> str:
    return "\n".join(f"{r['what']}: {r['wall_s']:.2f} s (target {r['target_s']:g} s), peak {r['peak_mb']:.0f} MB"
                     + (f" (target {r['target_mb']} MB)" if r["target_mb"] else "") for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--whatif", action="store_true", help="time the what-if sweep instead (WHATIF), then the whole "
                    "exaplan whatif command")
    ap.add_argument("--report-dir", default="runs/bench-whatif", metavar="DIR",
                    help="where --whatif's command writes its report (default runs/bench-whatif)")
    ap.add_argument("--commands", action="store_true", help="time whole commands (COMMANDS: --help, list, the "
                    "Aurora plan) in fresh processes instead: median wall of --repeats runs, peak memory")
    ap.add_argument("--no-command", action="store_true", help="--whatif: time the sweep in this process only")
    ap.add_argument("--repeats", type=int, default=3, help="warm searches per case (default 3)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.commands:
        rows = run_commands(max(args.repeats, 1))
        print(json.dumps(rows, indent=2) if args.json else render_commands(rows))
        return 0
    if args.whatif:
        whatif = run_whatif_case(None if args.no_command else Path(args.report_dir))
        print(json.dumps(whatif, indent=2) if args.json else render_whatif(whatif))
        return 0
    results = [run_case(c, args.repeats) for c in CASES]
    try:
        if args.json:
            print(json.dumps([asdict(r) for r in results], indent=2))
        else:
            print("\n".join(render(r) for r in results))
    except BrokenPipeError:  # piped into `head`
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
