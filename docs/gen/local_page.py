"""validation/local-rows.md: predicted against measured on this kind of CPU machine, from the
validation.csv files under docs/validate-local/ (`exaplan validate --local --out DIR`, or
`exaplan calibrate --arrival --out DIR`, which writes the same file; calibration/
validate_local_report.py CSV_COLUMNS)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from md import cell, code, pct, table, written_by

DOCS = Path(__file__).resolve().parents[1]
FOLDER = DOCS / "validate-local"
COMMAND = "exaplan validate --local --out docs/validate-local"
BREAKDOWN = ("compute", "dp", "tp", "pp", "bubble", "optimizer")


def _float(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float | None:
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else None


def _s(v) -> str:
    f = _float(v)
    return "—" if f is None else f"{f:.3f}"


def _gib(v) -> str:
    f = _float(v)
    return "—" if f is None else f"{f:.2f}"


def summary(rows: list[dict]) -> str:
    ok = [r for r in rows if r.get("status") == "ok" and _float(r.get("step_time_error")) is not None]
    if not ok:
        return f"{len(rows)} layouts, none measured."
    step = [abs(_float(r["step_time_error"])) for r in ok]
    worst = max(ok, key=lambda r: abs(_float(r["step_time_error"])))
    parts = [f"{len(ok)} of {len(rows)} layouts measured", f"median |step-time error| {pct(statistics.median(step))}",
             f"max {pct(max(step))} ({cell(worst['name'])})"]
    rho = spearman([_float(r["predicted_step_time_s"]) for r in ok], [_float(r["measured_step_time_s"]) for r in ok])
    if rho is not None:
        parts.append(f"Spearman {rho:.2f} between predicted and measured")
    mem = [abs(_float(r.get("memory_error"))) for r in ok if _float(r.get("memory_error")) is not None]
    if mem:
        parts.append(f"median |net memory error| {pct(statistics.median(mem))} (max {pct(max(mem))})")
    return ", ".join(parts) + "."


def row_cells(r: dict) -> list[str]:
    parts = [f"{b} {_s(r.get(f'predicted_{b}_s'))}" for b in BREAKDOWN if (_float(r.get(f"predicted_{b}_s")) or 0) > 0]
    return [cell(r.get("name")), cell(r.get("status")), code(r.get("estimate_args")), _s(r.get("predicted_step_time_s")),
            _s(r.get("measured_step_time_s")), pct(_float(r.get("step_time_error")), signed=True),
            _gib(r.get("predicted_memory_net_gib")), _gib(r.get("measured_memory_net_gib")),
            pct(_float(r.get("memory_error")), signed=True), cell(", ".join(parts))]


HEADER = ["layout", "status", "estimate arguments", "predicted step, s", "measured step, s", "step error",
          "predicted net memory, GiB", "measured net memory, GiB", "memory error", "predicted breakdown, s"]


def section(path: Path, folder: Path = FOLDER) -> str:
    base = folder.parent
    rel = path.relative_to(base).as_posix()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    where = path.parent.relative_to(base)
    title = "The validation runs" if path.parent == folder else f"`docs/{where.as_posix()}`"
    anchor = "-".join(where.parts)
    out = [f"## {title} {{#{anchor}}}\n", f"From `docs/{rel}`: {summary(rows)} Errors are measured / predicted - 1 "
           "(the CSV's step_time_error and memory_error).\n",
           table(HEADER, [row_cells(r) for r in rows], right={3, 4, 5, 6, 7, 8})]
    png = path.with_suffix(".png")
    if png.exists():
        out.append(f"![Predicted against measured step time, y = x](../{png.relative_to(base).as_posix()})\n")
    return "\n".join(out)


def render(folder: Path = FOLDER) -> str:
    head = ["# Local rows\n",
            written_by(f"It renders every `validation.csv` under `docs/{folder.name}/`, which "
                       f"`{COMMAND}` writes (`exaplan calibrate --arrival --out DIR` writes the same file for its "
                       "runs): each layout trained on this CPU machine, its predicted and measured step time and net "
                       "memory. What the runs are and how to read them: [Local runs](local.md).")]
    files = sorted(folder.rglob("validation.csv")) if folder.exists() else []
    if not files:
        return "\n".join(head + [f"Not recorded yet: run `{COMMAND}`.\n"])
    return "\n".join(head + [section(p, folder) for p in files])
