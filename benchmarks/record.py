"""A benchmark's results as a record under docs/results/, rendered on the docs site's
"Benchmark results" page (docs/gen/results_page.py): the machine as detected, the date, the
exact command, its wall-clock time and exit code, the figures and their tables.

    python -m benchmarks.record NAME --out docs/results/bench-NAME.json [--figures FILE] -- COMMAND...

runs COMMAND; its figures are FILE (JSON the command writes: `--out DIR`'s results.json), else
the JSON it prints on stdout (captured; the tables are printed instead). The record is written
when the figures could be read, whatever the exit code (a benchmark that lost one layout still
reports the others); the exit code is the command's. `make bench` and the bench-* targets run
every benchmark this way; a benchmark run by hand records nothing.

NAME picks how the figures become tables: TABLES. Imports nothing of exaplan (the repository
rule for benchmarks/), torch neither: the machine is read from /proc/cpuinfo and nvidia-smi.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

SCHEMA = 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def gpus() -> list[str]:
    """The GPUs nvidia-smi lists (none where there is no nvidia-smi)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine() -> dict:
    """The machine as detected: CPU model, cores this process may use, logical CPUs, memory, OS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem = None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # other work on the machine, at the start
    return {"cpu": cpu_model(), "cores": cores, "logical_cpus": os.cpu_count(),
            "memory_gib": None if mem is None else round(mem, 1), "os": platform.platform(terse=True),
            "python": platform.python_version(), "gpus": gpus(), "load_1min": load}


def _f(v, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def search_tables(figures: list[dict]) -> tuple[list[dict], list[str]]:
    """planner.bench --json: one row per case."""
    cols = ["job", "ranks", "global batch", "search, s (best warm)", "cold first search, s", "legal layouts",
            "scored (x algorithms)", "scored per s", "chosen layout", "step, s", "MFU"]
    rows = [[f"{r['model']} on {r['nodes']:,} x {r['machine']}", f"{r['ranks']:,}", f"{r['global_batch']:,}",
             f"{r['best_s']:.3f} (of {r['repeats']})", f"{r['cold_s']:.3f}", f"{r['legal_layouts']:,}",
             f"{r['layouts_scored']:,}", f"{r['layouts_scored_per_s']:,.0f}", r["chosen_layout"],
             f"{r['step_time_s']:.3f}", f"{r['mfu']:.1%}"] for r in figures]
    note = ("Times are wall-clock seconds of the whole search() call: enumerate, score, prune, rank and re-score "
            "the finalists (planner/bench.py).")
    return [{"caption": "Search speed", "columns": cols, "rows": rows}], [note]


def whatif_tables(figures: dict) -> tuple[list[dict], list[str]]:
    """planner.bench --whatif --json: the sweep in process, then the whole command."""
    c = figures["case"]
    rows = [["run_whatif in process (the planner's share)", f"{figures['points']} ({figures['fitting']} fit)",
             f"{figures['seconds']:.2f}", "—"]]
    if "command_seconds" in figures:
        rows.append([f"`{figures['command']}`", "", f"{figures['command_seconds']:.2f}", f"{figures['target_s']:g}"])
    return [{"caption": f"What-if: {c['model']} on {c['machine']}, nodes {c['nodes']}, {c['tokens']:g} tokens",
             "columns": ["what", "points", "seconds", "target, s"], "rows": rows}], []


def commands_tables(figures: list[dict]) -> tuple[list[dict], list[str]]:
    """planner.bench --commands --json: whole commands, each in fresh processes."""
    def rate(r: dict) -> str:
        if "mb_per_cpu_s" not in r:
            return "—"
        target = f" (target {r['target_mb_per_cpu_s']:g})" if r.get("target_mb_per_cpu_s") else ""
        return f"{r['mb_per_cpu_s']:.0f} per core{target}; {r['mb_per_s']:.0f} wall"

    rows = [[r["what"], f"`{r['command']}`", f"{r['wall_s']:.2f} (median of {r['runs']})",
             f"{r['target_s']:g}" if r.get("target_s") else "—", _f(r.get("cpu_s"), ".2f"), f"{r['peak_mb']:.0f}",
             f"{r['target_mb']:g}" if r.get("target_mb") else "—", rate(r)] for r in figures]
    inputs = sorted({f"{r['input_mb']:.0f} MB" for r in figures if "input_mb" in r})
    notes = ["Each command in a fresh process (interpreter start-up and imports included); CPU is user + system "
             "time of the process and its workers; peak memory is the process's resident high-water mark (wait4)."]
    if inputs:
        notes.append(f"`data prepare` reads a generated FASTA ({', '.join(inputs)}: copies of the shipped UniProt "
                     "sample, ids suffixed, wrapped at 60; planner/bench.py write_fasta); its rate is MB of FASTA "
                     "(uncompressed, for the gzip input too) per second of CPU, and per second of wall.")
    return [{"caption": "Whole commands, as a user waits on them",
             "columns": ["what", "command", "wall, s", "target, s", "CPU, s", "peak memory, MB", "target, MB",
                         "FASTA, MB/s"], "rows": rows}], notes


def _failures(figures: dict) -> list[str]:
    return [f"Failed ({f.get('layout') or f.get('plan') or 'setup'}): {str(f['error']).splitlines()[0][:300]}"
            for f in figures.get("failures", [])]


def runtime_tables(figures: dict) -> tuple[list[dict], list[str]]:
    """benchmarks.runtime_vs_torch's results.json."""
    from benchmarks import summary

    table = {"caption": summary._title(figures), "columns": list(summary.HEADER), "rows": summary.rows(figures)}
    return [table], [summary.METHOD.format(warmup=figures["config"]["warmup"]), *_failures(figures)]


def jax_tables(figures: dict) -> tuple[list[dict], list[str]]:
    """benchmarks.jax_vs_torch's results.json."""
    from benchmarks import jax_vs_torch as jx

    table = {"caption": jx.title(figures), "columns": list(jx.HEADER), "rows": jx.rows(figures)}
    plans = [f"{name}: {p['options'] or '(as the demo)'} -> {p['layout']}" for name, p in figures.get("plans", {}).items()]
    return [table], [*plans, jx.METHOD.format(warmup=figures["config"]["warmup"]), *_failures(figures)]


CHECK_TARGET_S = 60.0  # issue 50: a rank of the 3,200-node Aurora plan in under a minute on this machine


def check_tables(figures: list[dict]) -> tuple[list[dict], list[str]]:
    """exaplan check --json: one row per rank (its build, two fake-tensor steps, the accounting)."""
    cols = ["rank", "pipeline rank", "seconds", "target, s", "torch peak, GiB", "planner, GiB", "error", "verdict"]
    rows, notes = [], []
    for r in figures:
        if "error" in r:
            notes.append(f"rank {r['rank']} failed: {str(r['error'])[:300]}")
            continue
        err = r.get("memory_error")
        rows.append([f"{r['rank']:,}", str(r["pp_rank"]), f"{r['seconds']:.1f}", f"{CHECK_TARGET_S:g}",
                     _f(r.get("torch_peak_memory_gib"), ".2f"), _f(r.get("predicted_memory_gib"), ".2f"),
                     "—" if err is None else f"{err:+.1%}", "fits" if r.get("fits") else "does not fit"])
    return [{"caption": "exaplan check: a rank of the plan at full size on a fake process group", "columns": cols,
             "rows": rows}], notes


def gpu_tables(figures: dict) -> tuple[list[dict], list[str]]:
    """benchmarks.gpu_check's gpu_check.json: its own Markdown table, verbatim."""
    from benchmarks import gpu_check

    return [{"caption": "exaplan run against a plain-torch loop, measured against predicted",
             "markdown": gpu_check.table(figures)}], _failures(figures)


TABLES = {"search": search_tables, "whatif": whatif_tables, "commands": commands_tables, "check": check_tables, "runtime": runtime_tables,
          "jax": jax_tables,
          "gpu": gpu_tables, "gpu-jax": gpu_tables}


def trimmed(name: str, figures):
    """The figures kept in the record: the per-run step lists of runtime/jax left out (they stay in
    the command's own results.json)."""
    if name in ("runtime", "jax") and isinstance(figures, dict):
        layouts = {k: {a: b for a, b in v.items() if a != "runs"} for k, v in figures.get("layouts", {}).items()}
        return {**figures, "layouts": layouts}
    return figures


def make_record(name: str, command: list[str], figures, *, wall_s: float, exit_code: int, date: str | None = None,
                host: dict | None = None) -> dict:
    """The record of one run; `host` is machine() taken before the run (else now)."""
    tables, notes = TABLES[name](figures)
    return {"schema": SCHEMA, "benchmark": name, "command": shlex.join(command),
            "date": date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": host or machine(),
            "wall_s": round(wall_s, 2), "exit_code": exit_code, "tables": tables, "notes": notes,
            "figures": trimmed(name, figures)}


def write(record: dict, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return out


def print_tables(record: dict) -> None:
    for t in record["tables"]:
        print(t["caption"])
        if "markdown" in t:
            print(t["markdown"])
            continue
        print(" | ".join(t["columns"]))
        for r in t["rows"]:
            print(" | ".join(r))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.record", description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(TABLES), help="which benchmark (how its figures become tables)")
    ap.add_argument("--out", required=True, help="the record file (docs/results/bench-NAME.json)")
    ap.add_argument("--figures", help="JSON file the command writes its figures to (default: its stdout)")
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        ap.error("the benchmark's command goes after --")
    split = argv.index("--")
    args = ap.parse_args(argv[:split])
    args.command = argv[split + 1:]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures_file = Path(args.figures) if args.figures else None
    host, start, t0 = machine(), time.time(), time.perf_counter()
    try:
        proc = subprocess.run(args.command, stdout=None if figures_file else subprocess.PIPE, text=True)
    except OSError as e:
        print(f"record {args.name}: cannot run {args.command[0]}: {e}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    try:
        if figures_file:
            if figures_file.stat().st_mtime < start:
                raise ValueError(f"{figures_file} was not written by this run")
            figures = json.loads(figures_file.read_text())
        else:
            figures = json.loads(proc.stdout)
    except (OSError, ValueError) as e:
        print(f"record {args.name}: no figures to record ({e}); {args.out} left as it was", file=sys.stderr)
        return proc.returncode or 1
    record = make_record(args.name, args.command, figures, wall_s=wall, exit_code=proc.returncode, host=host)
    if not figures_file:
        print_tables(record)
    print(f"recorded {args.out}", file=sys.stderr)
    write(record, Path(args.out))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
