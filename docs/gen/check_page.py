"""validation/check-at-full-size.md: `exaplan check` over the committed plans and a sweep of
layouts (docs/results/check-sweep.json, written by `python -m calibration.check_sweep`): the
planner's tensor memory and communicator table against torch's accounting, rank by rank."""

from __future__ import annotations

import json
from pathlib import Path

from md import cell, code, pct, table, written_by

RESULTS = Path(__file__).resolve().parents[1] / "results" / "check-sweep.json"
CATEGORIES = ("parameters", "buffers", "gradients", "optimizer", "activations")


def _stats(errors: list[float]) -> tuple[str, str, str]:
    if not errors:
        return "—", "—", "—"
    absolute = sorted(abs(e) for e in errors)
    return str(len(errors)), pct(absolute[len(absolute) // 2]), pct(absolute[-1])


def summary(rows: list[dict]) -> dict:
    """The figures the page states (tests/docs check them against the rows)."""
    stepped = [r for r in rows if r.get("stepped")]
    committed = [r for r in stepped if r["source"] == "committed"]
    sweep = [r for r in stepped if r["source"] == "sweep"]
    within = lambda rs, tol: sum(abs(r["memory_error"]) <= tol for r in rs)  # noqa: E731
    return {"ranks": len(rows), "stepped": len(stepped), "failed": sum(1 for r in rows if "error" in r),
            "not_stepped": sum(1 for r in rows if "error" not in r and not r.get("stepped")),
            "committed": len(committed), "committed_within_10": within(committed, 0.10),
            "sweep": len(sweep), "sweep_within_15": within(sweep, 0.15)}


def _share(r: dict, c: str) -> float:
    """The planner's figure less torch's in one category, as a share of torch's peak."""
    peak = r["torch_peak_memory_gib"] or 1.0
    return (r["predicted_gib"].get(c, 0.0) - r["torch_memory_gib"].get(c, 0.0)) / peak


def render(path: Path = RESULTS) -> str:
    out = ["# Memory and traffic at full size\n",
           written_by("Its data, `docs/results/check-sweep.json`, is written by `python -m calibration.check_sweep`, "
                      "which runs `exaplan check` (first and last rank) over every committed plan and a sweep of "
                      "layouts of every kind.")]
    if not path.is_file():
        return "\n".join(out + ["No sweep has been recorded yet: run `python -m calibration.check_sweep`.\n"])
    data = json.loads(path.read_text())
    rows = data["rows"]
    s = summary(rows)
    m = data.get("machine", {})
    out.append(f"Recorded {data.get('date', '?')} on {m.get('cpu', '?')} ({m.get('cores', '?')} cores) by "
               f"{code(data.get('command', ''))} in {data.get('seconds', 0) / 60:.0f} min.\n")
    for u in data.get("updates", []):
        um = u.get("machine", {})
        what = ("every row's communicator table recomputed from the plans, torch's figures kept"
                if "--replan" in u.get("command", "") else "those plans' rows replaced")
        out.append(f"- Updated {u.get('date', '?')} on {um.get('cpu', '?')} ({um.get('cores', '?')} cores) by "
                   f"{code(u.get('command', ''))} ({u.get('seconds', 0) / 60:.0f} min): {what}.\n")
    out.append(
        "Each rank is built at the plan's full world size on torch's fake process group and steps twice under fake "
        "tensors; the second step is measured (see [Check a plan at full size](../guide/check.md)). *Error* is the "
        "planner's tensor memory (its prediction less the allocator reserve) against torch's peak: negative means "
        "the planner counts less than torch holds. The targets: within 10% on every committed plan, within 15% "
        "across the sweep.\n")
    out.append(f"- {s['ranks']} ranks checked, {s['stepped']} stepped, {s['not_stepped']} built but not stepped "
               f"(torch's DDP cannot step on fake tensors), {s['failed']} failed.\n"
               f"- Committed plans: {s['committed_within_10']} of {s['committed']} stepped ranks within 10%.\n"
               f"- Sweep: {s['sweep_within_15']} of {s['sweep']} stepped ranks within 15%.\n")

    stepped = [r for r in rows if r.get("stepped")]
    out.append("## By layout kind\n")
    kinds: dict[str, list[dict]] = {}
    for r in stepped:
        kinds.setdefault(r["kind"], []).append(r)
    out.append(table(["layout kind", "ranks", "median \\|error\\|", "largest \\|error\\|"],
                     [[cell(k), *_stats([r["memory_error"] for r in rs])] for k, rs in sorted(kinds.items())],
                     right={1, 2, 3}))
    out.append("\n## By memory category\n")
    out.append("The planner's figure less torch's in each category, as a share of torch's peak (categories as "
               "`exaplan check` names them; the planner's reserve is not a tensor and is left out).\n")
    out.append(table(["category", "ranks", "median \\|difference\\|", "largest \\|difference\\|"],
                     [[c, *_stats([_share(r, c) for r in stepped])] for c in CATEGORIES], right={1, 2, 3}))
    out.append("\n## Collective bytes per step\n")
    out.append("Bytes of every collective the measured step issued on a communicator's groups (a call's gathered "
               "output, scattered input, reduced or sent tensor), against the plan's communicator table.\n")
    comm: dict[str, list[float]] = {}
    for r in stepped:
        for name, v in r.get("communicators", {}).items():
            if v.get("plan"):
                comm.setdefault(name, []).append(v["measured"] / v["plan"] - 1)
    out.append(table(["communicator", "ranks", "median \\|error\\|", "largest \\|error\\|"],
                     [[name, *_stats(errs)] for name, errs in sorted(comm.items())], right={1, 2, 3}))
    out.append("\n## Every rank\n")
    body = []
    for r in rows:
        if "error" in r:
            body.append([cell(r["name"]), cell(r["kind"]), str(r["rank"]), "—", "—", "—", cell("failed: " + r["error"])])
            continue
        if not r.get("stepped"):
            body.append([cell(r["name"]), cell(r["kind"]), f"{r['rank']:,}", "—", "—", "—", "built, not stepped"])
            continue
        worst = max(CATEGORIES, key=lambda c: abs(_share(r, c)))
        body.append([cell(r["name"]), cell(r["kind"]), f"{r['rank']:,}", f"{r['torch_peak_memory_gib']:.2f}",
                     f"{r['predicted_memory_gib']:.2f}", pct(r["memory_error"], signed=True),
                     cell(f"{worst} {_share(r, worst):+.1%}")])
    out.append(table(["plan", "kind", "rank", "torch GiB", "planner GiB", "error", "largest category difference"],
                     body, right={2, 3, 4, 5}))
    return "\n".join(out)
