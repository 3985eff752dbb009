"""validation/published-rows.md: predicted against published, row by row, from
docs/results/validate-published.json (`exaplan validate --published --json`)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from md import cell, code, pct, table, written_by

SOURCE = Path(__file__).resolve().parents[1] / "results" / "validate-published.json"
COMMAND = "exaplan validate --published --json > docs/results/validate-published.json"
HEADER = ["id", "model", "machine", "GPUs", "layout", "figure", "published", "predicted", "error", "interval",
          "inside"]


def _value(v, unit: str) -> str:
    if v is None:
        return "—"
    if unit.startswith("MFU") and v <= 1.5:
        return f"{v:.1%}"
    return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def row_cells(r: dict) -> list[str]:
    unit = r.get("unit") or ""
    lo_hi = r.get("interval")
    interval = f"{_value(lo_hi[0], unit)} – {_value(lo_hi[1], unit)}" if lo_hi else "—"
    inside = {True: "yes", False: "**no**", None: "—"}[r.get("inside_interval")]
    assumed = r.get("assumed") or []
    rid = cell(r["id"]) + (" \\*" if assumed else "")
    return [rid, cell(r.get("model")), cell(r.get("machine")), f"{r.get('gpus', 0):,}", code(r.get("layout")),
            cell(unit), _value(r.get("published"), unit), _value(r.get("predicted"), unit),
            pct(r.get("error"), signed=True), interval, inside]


def _summary(s: dict | None) -> str:
    if not s:
        return "—"
    parts = [f"{s['rows']} rows", f"median |error| {pct(s.get('median_abs_error'))}",
             f"max {pct(s.get('max_abs_error'))}"]
    if s.get("loo_median_abs_error") is not None:
        parts.append(f"leave-one-out median {pct(s['loo_median_abs_error'])} (max {pct(s.get('loo_max_abs_error'))})")
    if s.get("inside_interval") is not None:
        parts.append(f"{pct(s['inside_interval'])} inside their interval")
    return ", ".join(parts)


def summary_table(title: str, groups: dict[str, dict]) -> str:
    rows = [[cell(k), str(s["rows"]), pct(s.get("median_abs_error")), pct(s.get("max_abs_error")),
             pct(s.get("inside_interval"))] for k, s in groups.items()]
    return f"**{title}**\n\n" + table(["", "rows", "median abs error", "max abs error", "inside interval"], rows,
                                      right={1, 2, 3, 4})


def _describe(rows: list[dict]) -> str:
    """A section's runs in a few words, from its rows: frameworks, devices, machines."""
    def uniq(key):
        return ", ".join(dict.fromkeys(str(r.get(key)) for r in rows if r.get(key)))

    return f"{len(rows)} rows; framework {uniq('framework')}; {uniq('device')} ({uniq('machine')})"


def sections(rows: list[dict], anchor: str = "section") -> str:
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r.get("section") or "?"].append(r)
    out = []
    for sec in sorted(by):
        rs = by[sec]
        errs = sorted(abs(r["error"]) for r in rs if r.get("error") is not None)
        med = statistics.median(errs) if errs else None
        out.append(f"### Section {sec} {{#{anchor}-{sec.lower()}}}\n\n{cell(_describe(rs))}; median |error| "
                   f"{pct(med)}, max {pct(errs[-1] if errs else None)}.\n")
        out.append(table(HEADER, [row_cells(r) for r in rs], right={3, 6, 7, 8}))
    return "\n".join(out)


def coverage(by_stratum: dict) -> str:
    """Held-out rows inside their interval, per stratum (calibration/strata.py)."""
    rows, short = [], 0
    for dim, part in by_stratum.items():
        for name, s in part.items():
            short += not s["meets_target"]
            inside = pct(s["inside"])
            rows.append([cell(dim), cell(name), str(s["rows"]), inside if s["meets_target"] else f"**{inside}**"])
    return ("### Coverage of the intervals by stratum {#held-out-strata}\n\n"
            "How often a held-out row's published figure lies inside the 80% interval a plan would show, per device "
            "kind, framework, sharding, pipeline or not, and band of world size, sequence length and model size. A "
            f"stratum of 10 rows or more is meant to hold at least 70%; in bold where it does not ({short}).\n\n"
            + table(["dimension", "stratum", "rows", "inside"], rows, right={2, 3}))


def ranking(data: dict) -> str:
    """The jobs with several measured layouts: Spearman and the pick's regret (calibration/ranking.py)."""
    s = data["summary"]
    text = ["## Ranking {#ranking}\n",
            f"{s['jobs']} jobs (one source, model, sequence length, machine and GPU count) have two measured layouts "
            f"or more; {s['held_to_targets']} have {s['min_layouts']} or more and are held to the targets (the pick's "
            f"regret at most {pct(s['regret_target'])}, Spearman at least {s['spearman_target']}): "
            f"{s['meet_targets']} meet both."]
    if s.get("max_regret") is not None:
        text[-1] += (f" Over those, the regret is {pct(s['median_regret'])} at the median and {pct(s['max_regret'])} "
                     f"at most; Spearman {s['median_spearman']:.2f} at the median, {s['min_spearman']:.2f} at least.")
    text[-1] += "\n"
    text.append("The pick is the layout predicted fastest among those predicted to fit; its regret is its measured time "
                "per token over the measured fastest's, minus one. A job of two layouts has a Spearman of +1 or -1: "
                "whether the pair is ordered right.\n")
    rows = [[cell(j["name"]), str(j["layouts"]), str(j["fitted"]),
             "—" if j["spearman"] is None else f"{j['spearman']:+.2f}", pct(j["regret"]), cell(j["pick"]),
             "same" if j["best"] == j["pick"] else cell(j["best"])] for j in data["jobs"]]
    text.append(table(["job", "layouts", "fitted", "Spearman", "regret", "pick (predicted fastest)", "measured fastest"],
                      rows, right={1, 2, 3, 4}))
    return "\n".join(text)


def render(source: Path = SOURCE) -> str:
    head = ["# Published rows\n",
            written_by(f"It renders `docs/results/{source.name}`, which `{COMMAND}` writes: every published row the "
                       "cost model predicts, grouped by section, with the published figure, the prediction, the error "
                       "and whether the published figure falls inside the predicted interval. "
                       "How the rows were chosen and read: [Published runs](published.md).")]
    if not source.exists():
        return "\n".join(head + [f"Not recorded yet: run `{COMMAND}`.\n"])
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError) as e:
        return "\n".join(head + [f"`{source.name}` cannot be read ({cell(e)}): run `{COMMAND}` again.\n"])
    out = head + ["## Summary {#summary}\n", f"Calibration set: {_summary(data.get('summary'))}.\n"]
    held = data.get("held_out") or {}
    if held.get("summary"):
        out.append(f"Held out of every fit: {_summary(held['summary'])}.\n")
    for title, key in (("By device kind", "by_device"), ("By framework", "by_framework")):
        if data.get(key):
            out.append(summary_table(title, data[key]))
    out.append("Rows marked \\* predict with some of their inputs assumed (the source does not state them): "
               "the `assumed` field of the JSON names them.\n")
    out.append("## The calibration set {#calibration-set}\n")
    out.append(sections(data.get("rows", [])))
    if held.get("rows"):
        listed = [r for r in held["rows"] if r.get("section") not in (held.get("summarised") or ("L",))]
        out.append("## Held out {#held-out}\n\nRows no fit reads: the prediction is blind.\n")
        out.append(sections(listed, "held-out"))
        if held.get("coverage_by_stratum"):
            out.append(coverage(held["coverage_by_stratum"]))
        if held.get("section_l"):
            out.append("### Section L, summarised {#held-out-l}\n")
            for group, subsets in held["section_l"].items():
                out.append(summary_table(group, subsets))
    if (data.get("ranking") or {}).get("jobs"):
        out.append(ranking(data["ranking"]))
    gemm = data.get("gemm_benchmarks") or []
    if gemm:
        out.append("## GEMM benchmarks {#gemm}\n\nPublished GEMM rates against the fitted matmul curve.\n")
        out.append(table(["device", "size", "precision", "measured, TFLOP/s", "curve, TFLOP/s", "error", "source"],
                         [[cell(g["device"]), str(g["size"]), cell(g["precision"]), f"{g['measured_tflops']:.0f}",
                           f"{g['curve_tflops']:.0f}", pct(g["error"], signed=True), cell(g.get("source"))]
                          for g in gemm], right={1, 3, 4, 5}))
    return "\n".join(out)
