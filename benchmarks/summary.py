"""The numbers of benchmarks/runtime_vs_torch.py: per layout and side, the steps after warm-up of
every round pooled (fastest, median), the rounds' medians and their spread, start-up to the
first step; the exaplan / torch ratios; results.json, results.md and the printed table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

METHOD = (
    "Step time: from before the forward to after optimizer.step() + zero_grad() on rank 0 (exaplan: "
    "metrics.jsonl step_time_s; torch: the same span in the script), the first {warmup} steps of every run left "
    "out, the rest of all rounds pooled. Start-up: from the driver's launch of the command to the end of the "
    "first step as time.time() (exaplan: the time of its first metrics.jsonl step record, stamped as that step "
    "ends; torch: first_step_end_time written by the script). Ratios are exaplan / "
    "torch (below 1: exaplan faster). Noise: max / min of one side's per-round medians. Rounds alternate which "
    "side runs first.")


def side_stats(runs: list[dict], warmup: int) -> dict:
    """One side's runs of one layout, summarised."""
    per_round = [r["step_times_s"][warmup:] for r in runs]
    pooled = [t for ts in per_round for t in ts]
    medians = [statistics.median(ts) for ts in per_round if ts]
    startups = [r["startup_to_first_step_s"] for r in runs if r["startup_to_first_step_s"] is not None]
    out = {
        "steps_measured": len(pooled),
        "min_step_s": min(pooled) if pooled else None,
        "median_step_s": statistics.median(pooled) if pooled else None,
        "round_medians_s": medians,
        "round_spread": max(medians) / min(medians) if medians else None,
        "startup_to_first_step_s": statistics.median(startups) if startups else None,
        "startup_rounds_s": startups,
        "wall_s_rounds": [r["wall_s"] for r in runs],
    }
    inside = [r["in_script_startup_s"] for r in runs if "in_script_startup_s" in r]
    if inside:
        out["in_script_startup_s"] = statistics.median(inside)  # from the script's first line
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def layout_result(runs: dict, warmup: int) -> dict:
    """{"exaplan": stats, "torch": stats, the ratios, the runs themselves} of one layout."""
    e, t = side_stats(runs["exaplan"], warmup), side_stats(runs["torch"], warmup)
    by_round = zip(e["round_medians_s"], t["round_medians_s"])
    return {
        "plan": runs["plan"],
        "exaplan": e,
        "torch": t,
        "fastest_step_ratio": _ratio(e["min_step_s"], t["min_step_s"]),
        "median_step_ratio": _ratio(e["median_step_s"], t["median_step_s"]),
        "round_median_ratios": [a / b for a, b in by_round],
        "startup_ratio": _ratio(e["startup_to_first_step_s"], t["startup_to_first_step_s"]),
        "runs": {"exaplan": runs["exaplan"], "torch": runs["torch"]},
    }


def _ms(v) -> str:
    return "—" if v is None else f"{v * 1e3:.1f}"


def _s(v) -> str:
    return "—" if v is None else f"{v:.2f}"


def _x(v) -> str:
    return "—" if v is None else f"{v:.3f}"


# Each cell but the ratios: exaplan / torch.
HEADER = ("layout", "fastest step, ms", "ratio", "median step, ms", "ratio", "start-up to step 1, s", "ratio",
          "noise (round medians)")


def rows(results: dict) -> list[tuple[str, ...]]:
    out = []
    for layout, r in results["layouts"].items():
        e, t = r["exaplan"], r["torch"]
        out.append((layout, f"{_ms(e['min_step_s'])} / {_ms(t['min_step_s'])}", _x(r["fastest_step_ratio"]),
                    f"{_ms(e['median_step_s'])} / {_ms(t['median_step_s'])}", _x(r["median_step_ratio"]),
                    f"{_s(e['startup_to_first_step_s'])} / {_s(t['startup_to_first_step_s'])}", _x(r["startup_ratio"]),
                    f"{_x(e['round_spread'])} / {_x(t['round_spread'])}"))
    return out


def _title(results: dict) -> str:
    c = results["config"]
    return (f"exaplan run vs plain torch: {c['model']}, global batch {c['global_batch']} x {c['seq_len']}, fp32, "
            f"{c['ranks']} ranks on {c['cores']} cores; {c['rounds']} round(s) x {c['steps']} steps, "
            f"{c['warmup']} warm-up dropped. Cells: exaplan / torch")


def markdown(results: dict) -> str:
    lines = [f"# {_title(results)}", "", f"Started {results['config']['started']}.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] + ["---:"] * (len(HEADER) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    lines += ["", METHOD.format(warmup=results["config"]["warmup"])]
    for f in results["failures"]:
        lines += ["", f"**Failed** ({f['layout']}): " + f["error"].splitlines()[0]]
    return "\n".join(lines) + "\n"


def write(results: dict, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results))


def print_table(results: dict) -> None:
    """The table on stdout: rich when installed, else aligned text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        table = [HEADER, *rows(results)]
        widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
        print(_title(results))
        for r in table:
            print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        print(METHOD.format(warmup=results["config"]["warmup"]))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)  # a log file: no wrapping into narrow columns
    t = Table(title=_title(results))
    for i, col in enumerate(HEADER):
        t.add_column(col, justify="left" if i == 0 else "right")
    for r in rows(results):
        t.add_row(*r)
    console.print(t)
    console.print(METHOD.format(warmup=results["config"]["warmup"]), soft_wrap=True)
