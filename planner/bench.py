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

`--commands`: whole commands in fresh processes as a user waits on them (COMMANDS: `--help`,
`list`, the 3,200-node Aurora plan, the what-if sweep with its report, and `data prepare` on a
generated ~223 MB FASTA, plain and gzip, one process and one per core), each against its target:
median wall and CPU seconds, peak memory, and for `data prepare` MB of FASTA per CPU second.

`make bench` records them (benchmarks/record.py): docs/results/bench-search.json,
docs/results/bench-whatif.json and docs/results/bench-commands.json, rendered on the docs site's "Benchmark results" page.
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
WHATIF_TARGET_S = 2.5  # the whole command, report included, on a 2-core machine (issue 53)


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
# this 2-core machine). `data prepare` reads a generated FASTA (FASTA_COPIES copies of the shipped
# UniProt sample) and is rated in MB of FASTA per second of CPU time (the process's and its workers').
@dataclass(frozen=True)
class Command:
    what: str
    args: tuple[str, ...]  # after `exaplan`; {tmp} is a temporary directory, {run} the run's index
    target_s: float | None = None  # wall
    target_mb: float | None = None  # peak resident memory
    reads: str | None = None  # the FASTA (under {tmp}) whose size gives MB/s: for gzip input, the
    # uncompressed FASTA it holds, so that plain and gzip rates compare
    target_mb_per_cpu_s: float | None = None


_WHATIF_ARGS = ("whatif", "--model", WHATIF["model"], "--machine", WHATIF["machine"], "--nodes", WHATIF["nodes"],
                "--tokens", "1e12", "--report", "{tmp}/r.html", "--force")
_PREPARE = ("data", "prepare", "--no-progress", "--force", "-o", "{tmp}/prepared-{run}")
COMMANDS = [
    Command("exaplan --help", ("--help",), 0.3),
    Command("exaplan list", ("list",), 0.3),
    Command("exaplan plan protein-3.5b on 3,200 Aurora nodes (robustness draws included)",
            ("plan", "--model", "protein-3.5b", "--machine", "aurora", "--nodes", "3200", "-o", "{tmp}/plan.yaml",
             "--force"), 1.0, 250),
    Command("exaplan whatif, five machines x 16-2,048 nodes, HTML report", _WHATIF_ARGS, 2.5),
    Command("exaplan data prepare, one process", (*_PREPARE, "{tmp}/big.fasta"), reads="big.fasta",
            target_mb_per_cpu_s=200),
    Command("exaplan data prepare, --workers 0 (one per core)", (*_PREPARE, "--workers", "0", "{tmp}/big.fasta"),
            reads="big.fasta"),
    Command("exaplan data prepare, gzip input (zlib-bound), one process", (*_PREPARE, "{tmp}/big.fasta.gz"),
            reads="big.fasta"),
    Command("exaplan data prepare, gzip input, --workers 0", (*_PREPARE, "--workers", "0", "{tmp}/big.fasta.gz"),
            reads="big.fasta"),
]
SAMPLE_FASTA = Path(__file__).resolve().parents[1] / "runtime" / "dataprep" / "samples" / "uniprot_sample.fasta.gz"
FASTA_COPIES = 150  # of the sample's 3,103 records: about 223 MB, 465,450 records


def write_fasta(path: Path, copies: int = FASTA_COPIES) -> None:
    """`copies` copies of the shipped UniProt sample, each record's id suffixed with its copy
    (_0, _1, ...: distinct ids, so the split hashes differ) and its sequence wrapped at 60
    letters, as UniProt's files are; and the same gzip-compressed (level 1) beside it."""
    import gzip

    records = []  # (">id", " description\nsequence lines\n")
    for chunk in gzip.decompress(SAMPLE_FASTA.read_bytes()).split(b"\n>"):
        head, _, seq = chunk.lstrip(b">").partition(b"\n")
        ident, _, rest = head.rstrip().partition(b" ")
        seq = seq.replace(b"\n", b"")
        lines = b"\n".join(seq[i:i + 60] for i in range(0, len(seq), 60))
        records.append((b">" + ident, b" " + rest + b"\n" + lines + b"\n"))
    with open(path, "wb") as f, gzip.open(f"{path}.gz", "wb", compresslevel=1) as g:
        for c in range(copies):
            suffix = b"_%d" % c
            block = b"".join(i + suffix + r for i, r in records)
            f.write(block)
            g.write(block)


def _exaplan() -> list[str]:
    """The console script beside this interpreter where there is one, else `python -m cli`."""
    exe = Path(sys.executable).with_name("exaplan")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cli"]


def time_command(argv: list[str], repeats: int) -> dict:
    """Median wall and CPU seconds over `repeats` fresh processes (CPU: user + system of the
    process and the children it waited for, from wait4's rusage), and the largest peak resident
    memory (MB: the process's high-water mark, which on Linux includes the pages it shared with
    this process when forked: run from a small process, as `make bench` does). Each argument's
    {run} is the run's index."""
    import os
    import statistics

    walls, cpus, peaks = [], [], []
    for run in range(repeats):
        args = [a.replace("{run}", str(run)) for a in argv]
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - start)
        cpus.append(usage.ru_utime + usage.ru_stime)
        peaks.append(usage.ru_maxrss / 1024)  # KiB on Linux
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(args)}: exit code {proc.returncode}")
    return dict(wall_s=statistics.median(walls), cpu_s=statistics.median(cpus), runs=repeats, peak_mb=max(peaks))


def compile_sources() -> None:
    """The project's bytecode written first, as Python caches it for a user (this machine's
    PYTHONDONTWRITEBYTECODE=1 would otherwise have every start compile every module again)."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for package in ("cli", "planner", "machine_models", "calibration", "export", "launch", "report", "runtime"):
        compileall.compile_dir(str(root / package), quiet=1)


def run_commands(repeats: int = 5, commands: list[Command] | None = None, fasta_copies: int = FASTA_COPIES) -> list[dict]:
    """Each command (default COMMANDS) timed over `repeats` fresh processes; the FASTA that
    `data prepare` reads written first (write_fasta, `fasta_copies` copies)."""
    import os
    import tempfile

    commands = COMMANDS if commands is None else commands
    compile_sources()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if any(c.reads for c in commands):
            write_fasta(Path(tmp) / "big.fasta", fasta_copies)
        for c in commands:
            argv = [*_exaplan(), *[a.replace("{tmp}", tmp) for a in c.args]]
            row = dict(what=c.what, command="exaplan " + " ".join(c.args).replace("{tmp}", "TMP").replace("-{run}", ""),
                       **time_command(argv, repeats), target_s=c.target_s, target_mb=c.target_mb)
            if c.reads:
                size = os.path.getsize(Path(tmp) / c.reads) / 1e6
                row.update(input_mb=size, mb_per_cpu_s=size / row["cpu_s"], mb_per_s=size / row["wall_s"],
                           target_mb_per_cpu_s=c.target_mb_per_cpu_s)
            rows.append(row)
    return rows


def render_commands(rows: list[dict]) -> str:
    def line(r: dict) -> str:
        out = f"{r['what']}: {r['wall_s']:.2f} s" + (f" (target {r['target_s']:g} s)" if r["target_s"] else "")
        out += f", peak {r['peak_mb']:.0f} MB" + (f" (target {r['target_mb']:g} MB)" if r["target_mb"] else "")
        if "mb_per_cpu_s" in r:
            out += (f"; {r['input_mb']:.0f} MB in {r['cpu_s']:.2f} s of CPU: {r['mb_per_cpu_s']:.0f} MB/s per core"
                    + (f" (target {r['target_mb_per_cpu_s']:g})" if r["target_mb_per_cpu_s"] else ""))
        return out

    return "\n".join(line(r) for r in rows)


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
