"""The HTML report of `exaplan whatif --report F.html`: one self-contained file (inline CSS, the
plots as base64 PNG, no script, nothing fetched) with the command that regenerates it, the
inputs, the fitted/unfitted status of each device kind, the warnings, the answers (deadline,
fastest, knees), the plots and every point. Every string from the result is escaped. The file
is written to a temporary file beside the target and renamed into place, so a failure leaves
no file (or the previous one) at the path.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from report.data import finite, group_label, knees, varied_label
from report.plots import Plot, render, write_atomic

if TYPE_CHECKING:
    from planner.whatif import WhatifResult

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.82em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.nofit td { color: #999; } pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
.unfitted { color: #a15c00; font-weight: 600; } .fitted { color: #19692c; }
.warn { color: #a15c00; } figure { margin: 1em 0; } figcaption { font-size: 0.85em; color: #555; }
img { max-width: 100%; }
"""


def fmt(v: Any, unknown: str = "–") -> str:
    """A number for a cell: None -> `unknown`, nan/inf -> '–', large ones with separators."""
    if v is None:
        return unknown
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if not math.isfinite(v):
        return "–"
    if isinstance(v, int) or 999.5 <= abs(v) < 1e15:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def fmt_range(v: Any, lo: Any, hi: Any, unknown: str = "–") -> str:
    """'v (lo–hi)' where the interval is known."""
    if not finite(v):
        return fmt(v, unknown)
    if finite(lo) and finite(hi):
        return f"{fmt(v)} ({fmt(lo)}–{fmt(hi)})"
    return fmt(v)


def e(v: Any) -> str:
    return escape(str(v), quote=True)


def _table(head: list[str] | None, rows: list[list[str]], numeric: set[int] = frozenset(), classes=None) -> str:
    """Cells (and head) already escaped by the caller; no head row when `head` is None."""
    out = ["<table>"]
    if head:
        out += ["<thead><tr>", *(f"<th>{h}</th>" for h in head), "</tr></thead>"]
    out.append("<tbody>")
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f'<td class="n">{c}</td>' if j in numeric else f"<td>{c}</td>"
                                            for j, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _is_point(v: Any) -> bool:
    return dataclasses.is_dataclass(v) and hasattr(v, "nodes") and hasattr(v, "machine")


def _point_summary(p: Any) -> str:
    parts = [f"{p.model} on {p.nodes} x {p.machine}"]
    if getattr(p, "varied", None):
        parts.append(f"[{varied_label(p.varied)}]")
    parts.append(f"layout {p.layout}" if p.fits else f"does not fit: {p.reason}")
    if p.fits:
        parts.append(f"{fmt_range(p.days, p.days_lo, p.days_hi)} days, "
                     f"{fmt_range(p.node_hours, p.node_hours_lo, p.node_hours_hi)} node-hours, "
                     f"{fmt_range(p.energy_kwh, p.energy_kwh_lo, p.energy_kwh_hi, 'unknown')} kWh")
    return e("; ".join(parts))


def value_html(v: Any, depth: int = 0) -> str:
    """Any answer the engine gives (a point, a dict, a list, a sentence, a number), escaped."""
    if _is_point(v):
        return _point_summary(v)
    if depth > 4:
        return e(v)
    if isinstance(v, dict):
        if not v:
            return "–"
        if all(isinstance(x, dict) for x in v.values()):
            return _records([_key_label(k) for k in v], list(v.values()), depth)
        rows = [[e(_key_label(k)), value_html(x, depth + 1)] for k, x in v.items()]
        return _table(None, rows)
    if isinstance(v, (list, tuple)):
        if not v:
            return "none"
        if all(isinstance(x, dict) for x in v):
            return _records(None, list(v), depth)
        return "<ul>" + "".join(f"<li>{value_html(x, depth + 1)}</li>" for x in v) + "</ul>"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return value_html(dataclasses.asdict(v), depth + 1)
    if isinstance(v, float):
        return e(fmt(v))
    return e("–" if v is None else v)


def _records(labels: list[str] | None, records: list[dict], depth: int) -> str:
    """Dicts as one table: a column per key (in order of first appearance), a row per dict."""
    keys = list(dict.fromkeys(k for r in records for k in r))
    head = ([""] if labels else []) + [e(k) for k in keys]
    rows = [([e(labels[i])] if labels else []) + [value_html(r[k], depth + 1) if k in r else "" for k in keys]
            for i, r in enumerate(records)]
    return _table(head, rows)


def _key_label(k: Any) -> str:
    """A group key (model, machine, varied) as words."""
    if isinstance(k, tuple) and len(k) == 3:
        model, machine, varied = k
        varied = varied_label(varied) if isinstance(varied, (dict, tuple, list, frozenset)) else str(varied or "")
        return f"{model} on {machine}" + (f" [{varied}]" if varied else "")
    return " / ".join(map(str, k)) if isinstance(k, tuple) else str(k)


def _inputs(result: WhatifResult) -> str:
    rows = []
    for k, v in (result.inputs or {}).items():
        shown = v if isinstance(v, str) else json.dumps(v, default=str, sort_keys=True)
        rows.append([e(k), e(shown)])
    return _table(["input", "value"], rows) if rows else "<p>none recorded</p>"


def _status(result: WhatifResult) -> str:
    rows, classes = [], []
    for kind, status in (result.device_status or {}).items():
        s = str(status)
        rows.append([e(kind), e(s)])
        classes.append(next((c for c in ("fitted", "unfitted") if s.lower().startswith(c)), ""))
    if not rows:
        return "<p>none recorded</p>"
    return (_table(["device kind", "status"], rows, classes=classes)
            + "<p>Unfitted kinds run on first-guess figures: their intervals are wider and their points "
              "less certain.</p>")


def _warnings(result: WhatifResult) -> str:
    if not result.warnings:
        return "<p>none</p>"
    return "<ul>" + "".join(f'<li class="warn">{e(w)}</li>' for w in result.warnings) + "</ul>"


def _answer(v: Any) -> str:
    """Records that carry a 'sentence': the sentences, then every field folded in <details>."""
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v) and any(x.get("sentence") for x in v):
        said = "".join(f"<li>{e(x['sentence'])}</li>" for x in v if x.get("sentence"))
        return f"<ul>{said}</ul><details><summary>every figure</summary>{value_html(v)}</details>"
    return value_html(v)


def _answers(result: WhatifResult) -> str:
    out = ["<h3>Deadline</h3>", _answer(result.deadline) if result.deadline else "<p>no deadline given</p>",
           "<h3>Fastest</h3>", _answer(result.fastest) if result.fastest else "<p>not asked (--fastest)</p>",
           "<h3>Knees</h3>"]
    if getattr(result, "knee_details", None):
        out.append(_answer(result.knee_details))
    k = knees(result)
    if k:
        out.append(_table(["curve", "knee (nodes)"], [[e(group_label(g)), e(n)] for g, n in k.items()], {1}))
    elif result.knees:
        out.append(value_html(result.knees))
    else:
        out.append("<p>no curve falls below the efficiency threshold in the range swept</p>")
    return "".join(out)


POINT_HEAD = ["model", "machine", "nodes", "varied", "fits", "layout", "step time s", "tokens/s",
              "TFLOP/s per device", "MFU", "days", "node-hours", "energy kWh", "scaling eff.",
              "global batch seqs", "global batch tokens", "fitted", "interval basis", "reason"]


def _point_row(p: Any) -> list[str]:
    return [e(p.model), e(p.machine), e(p.nodes), e(varied_label(p.varied or {})), "yes" if p.fits else "no",
            e(p.layout or "–"), e(fmt_range(p.step_time_s, p.step_time_lo_s, p.step_time_hi_s)),
            e(fmt_range(p.tokens_per_s, p.tokens_per_s_lo, p.tokens_per_s_hi)), e(fmt(p.tflops_per_device)),
            e(f"{p.mfu:.1%}" if finite(p.mfu) else "–"), e(fmt_range(p.days, p.days_lo, p.days_hi)),
            e(fmt_range(p.node_hours, p.node_hours_lo, p.node_hours_hi)),
            e(fmt_range(p.energy_kwh, p.energy_kwh_lo, p.energy_kwh_hi, "unknown")),
            e(f"{p.scaling_efficiency:.0%}" if finite(p.scaling_efficiency) else "–"),
            e(fmt(p.global_batch_seqs)), e(fmt(p.global_batch_tokens)), "yes" if p.fitted else "no",
            e(p.uncertainty_basis), e(p.reason or "")]


def _points(result: WhatifResult) -> str:
    rows = [_point_row(p) for p in result.points]
    classes = ["" if p.fits else "nofit" for p in result.points]
    return _table(POINT_HEAD, rows, numeric={2, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, classes=classes)


def _plot(plot: Plot) -> str:
    if plot.png is None:
        return f"<h3>{e(plot.title)}</h3><p>{e(plot.note)}</p>"
    data = base64.b64encode(plot.png).decode("ascii")
    return (f'<figure><img alt="{e(plot.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(plot.title)}: {e(plot.note)}</figcaption></figure>")


def html_chunks(result: WhatifResult, plots: list[Plot]) -> Iterator[str]:
    """The document, section by section (written as it is produced)."""
    n_fit = sum(1 for p in result.points if p.fits)
    yield ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
           f"<title>exaplan what-if report</title><style>{CSS}</style></head><body>\n")
    yield (f"<h1>exaplan what-if report</h1><p>{len(result.points)} points, {n_fit} fit.</p>"
           f"<p>Regenerate with:</p><pre><code>{e(result.command)}</code></pre>\n")
    yield f"<h2>Inputs</h2>{_inputs(result)}\n"
    yield f"<h2>Device kinds</h2>{_status(result)}\n"
    yield f"<h2>Warnings</h2>{_warnings(result)}\n"
    yield f"<h2>Answers</h2>{_answers(result)}\n"
    yield "<h2>Plots</h2>" + "".join(_plot(p) for p in plots) + "\n"
    yield f"<h2>Every point</h2>{_points(result)}\n"
    yield "</body></html>\n"


def write_report(result: WhatifResult, path: Path | str) -> None:
    """Write the report to `path` atomically: draw the plots, stream the document into a
    temporary file beside it, rename. On any failure the temporary file goes and `path` is
    left as it was."""
    plots = render(result)
    write_atomic(Path(path), (chunk.encode("utf-8") for chunk in html_chunks(result, plots)))
