"""Output of `exaplan validate --local`: validation.csv, validation.json, validation.png
(predicted against measured step time, y = x), and the table printed."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from calibration.validate_local_summary import ValidationReport

CSV_COLUMNS = [
    "name", "status", "estimate_args", "predicted_step_time_s", "measured_step_time_s", "step_time_error",
    "predicted_memory_gib", "measured_memory_gib", "memory_error_raw", "predicted_memory_net_gib",
    "measured_memory_net_gib", "memory_error", "predicted_compute_s", "predicted_dp_s", "predicted_tp_s",
    "predicted_pp_s", "predicted_bubble_s", "predicted_optimizer_s", "run_dir",
]


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
