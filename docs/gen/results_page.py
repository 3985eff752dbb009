"""reference/results.md: the latest recorded run of each benchmark (docs/results/bench-*.json,
written by benchmarks/record.py from `make bench` and the bench-* targets), as tables."""

from __future__ import annotations

import json
from pathlib import Path

from md import cell, code, table, written_by

RESULTS = Path(__file__).resolve().parents[1] / "results"

# name -> (section title, the make target that records it, what it measures)
BENCHMARKS = {
    "search": ("Search speed", "make bench",
               "The planner's search on the seed paper's two largest jobs (`python -m planner.bench`): a cold first "
               "search and the best of three warm ones, the layouts enumerated and scored, the layout chosen."),
    "commands": ("Whole commands", "make bench",
                 "`exaplan --help`, `exaplan list` and the 3,200-node Aurora plan (robustness draws included), each in "
                 "fresh processes (`python -m planner.bench --commands`): the median wall time and the peak memory, "
                 "beside the planner's interactive-speed targets."),
    "whatif": ("What-if speed", "make bench",
               "The what-if sweep of protein-3.5b over the five seed machines and 16-2,048 nodes "
               "(`python -m planner.bench --whatif`): in process, then the whole `exaplan whatif ... --report` command."),
    "check": ("A rank at full size", "make bench",
              "`exaplan check` on the 3,200-node Aurora plan (38,400 ranks): its first and last rank built on a fake "
              "process group and stepped twice under fake tensors, memory and collectives accounted; the target "
              "is under a minute a rank."),
    "runtime": ("exaplan run against plain torch", "make bench-runtime",
                "`exaplan run` against hand-written torch loops of the same layouts (benchmarks/runtime_vs_torch.py): "
                "ddp, fsdp, zero1, tp_sp and pp_1f1b on 2 CPU ranks, protein-small."),
    "jax": ("The JAX backend against the torch runtime", "make bench-jax",
            "`exaplan run --backend jax` beside `--backend torch` on the demo's job (benchmarks/jax_vs_torch.py)."),
    "gpu": ("On one GPU", "make bench-gpu",
            "`exaplan run` against a plain-torch loop on one H100 / H200, measured against predicted "
            "(benchmarks/gpu_check.py; needs CUDA)."),
    "gpu-jax": ("The JAX backend on one GPU", "make bench-gpu-jax",
                "The JAX twins of the H100 plans, measured against predicted (benchmarks/gpu_check.py --exaplan-only)."),
}


def _machine(m: dict) -> str:
    parts = [f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores available"]
    if m.get("logical_cpus") and m.get("logical_cpus") != m.get("cores"):
        parts[0] += f" of {m['logical_cpus']}"
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']:g} GiB")
    if m.get("gpus"):
        parts.append(", ".join(m["gpus"]))
    if m.get("os"):
        parts.append(m["os"])
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    if m.get("load_1min") is not None:
        parts.append(f"load average {m['load_1min']:.2f} at the start")
    return "; ".join(parts)


def render_record(record: dict) -> str:
    """One benchmark's record: where and when it ran, the command, its tables and notes."""
    out = [f"- Machine: {cell(_machine(record.get('machine', {})))}",
           f"- Date: {cell(record.get('date'))}",
           f"- Command: {code(record.get('command'))}"]
    wall = record.get("wall_s")
    status = f"{wall:.1f} s" if isinstance(wall, (int, float)) else "—"
    if record.get("exit_code"):
        status += f", exit code {record['exit_code']} (some runs failed: notes below)"
    out.append(f"- Wall clock: {status}\n")
    for t in record.get("tables", []):
        out.append(f"**{cell(t.get('caption'))}**\n")
        if "markdown" in t:
            out.append(t["markdown"].strip() + "\n")
            continue
        cols = t["columns"]
        out.append(table([cell(c) for c in cols], [[_cell(v) for v in r] for r in t["rows"]], right=set(range(1, len(cols)))))
    for n in record.get("notes", []):
        out.append(cell(n) + "\n")
    return "\n".join(out)


def _cell(v) -> str:
    s = str(v)
    return code(s[1:-1]) if s.startswith("`") and s.endswith("`") and len(s) > 1 else cell(s)


def section(name: str, results: Path = RESULTS) -> str:
    title, target, what = BENCHMARKS[name]
    path = results / f"bench-{name}.json"
    head = f"## {title} {{#{name}}}\n\n{what} Recorded by `{target}` in `docs/results/{path.name}`.\n"
    if not path.exists():
        return head + f"\nNot recorded yet: run `{target}`.\n"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return head + f"\n`{path.name}` cannot be read ({cell(e)}): run `{target}` again.\n"
    return head + "\n" + render_record(record)


def render(results: Path = RESULTS) -> str:
    head = ["# Benchmark results\n",
            written_by("It renders the latest recorded run of each benchmark, `docs/results/bench-*.json`, which "
                       "`make bench` (search and what-if speed, then `make bench-runtime` and `make bench-jax`) and "
                       "`make bench-gpu` / `make bench-gpu-jax` on a GPU write through `benchmarks/record.py`: the "
                       "machine as detected, the date, the exact command and the figures. Git keeps the earlier runs."),
            "Benchmarks: " + ", ".join(f"[{t}](#{n})" for n, (t, _, _) in BENCHMARKS.items()) + ".\n"]
    return "\n".join(head + [section(n, results) for n in BENCHMARKS])
