"""PNG plots of a what-if sweep (matplotlib's Agg canvas; no display, no pyplot state):

1. scaling: per model, tokens/s and TFLOP/s per device against nodes (log2), one curve per
   machine (and varied values), its error band (the interval of the time-derived figures), the
   ideal line from the curve's smallest point (linear tokens/s; flat TFLOP/s per device) and the
   knee where the scaling efficiency falls below the threshold;
2. pareto: per model, time to train against node-hours, points per machine with their
   intervals, the Pareto front highlighted;
3. heatmap: when the sweep varies exactly two fields, days to train (tokens/s when no budget
   gives days) over their values, per model x machine, at the largest node count swept.

Each function returns PNG bytes, or None with `skipped(result)` saying why; `render` gives all
three as Plot records, `save_plots` writes them to a folder.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from report.data import (finite, group_label, groups, knees, machines, models, pareto_front,
                         varied_fields)

if TYPE_CHECKING:
    from planner.whatif import WhatifResult

DPI = 90
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]


@dataclass
class Plot:
    name: str       # file stem: scaling, pareto, heatmap
    title: str
    png: bytes | None
    note: str       # what it shows, or why it was skipped


def _figure(rows: int, cols: int, width: float, height: float, right: float = 0.2):
    """A figure of rows x cols panels, each width x height inches, with fixed margins (in
    inches): tight_layout would draw every label once more to measure it, a third of the time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = width * cols, height * rows
    fig = Figure(figsize=(w, h), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.85 / w, right=1 - right / w, bottom=0.5 / h, top=1 - 0.35 / h,
                        wspace=0.95 * cols / w, hspace=1.0 * rows / h)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def warm_up() -> None:
    """Imports matplotlib's Figure and Agg canvas and draws one small labelled figure (its
    fonts loaded): about half a second of a report's time, which `exaplan whatif` spends while
    its worker processes search (run_whatif's while_sweeping)."""
    fig, axes = _figure(1, 1, 3.0, 2.0)
    axes[0][0].plot([1, 2], [1, 2])
    axes[0][0].set_xlabel("nodes")
    _png(fig)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def text(s: object) -> str:
    """A label matplotlib draws as written: '$' would start mathtext."""
    return str(s).replace("$", r"\$")


def _node_axis(ax, nodes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(nodes))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(n) for n in ticks], fontsize=7)
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def _ratio(p, lo: bool) -> float:
    """The interval of tokens/s as a ratio, applied to the per-device TFLOP/s."""
    bound = p.tokens_per_s_lo if lo else p.tokens_per_s_hi
    return bound / p.tokens_per_s if finite(bound) and finite(p.tokens_per_s) and p.tokens_per_s else math.nan


def _curve(ax, pts, colour: str, label: str, knee: int | None, per_device: bool) -> None:
    """One curve: line, band, ideal line from its smallest point, knee."""
    metric = "tflops_per_device" if per_device else "tokens_per_s"
    pts = [p for p in pts if p.fits and finite(getattr(p, metric))]
    if not pts:
        return
    x = [p.nodes for p in pts]
    y = [getattr(p, metric) for p in pts]
    if per_device:
        lo = [v * _ratio(p, True) for v, p in zip(y, pts)]
        hi = [v * _ratio(p, False) for v, p in zip(y, pts)]
        ideal = [y[0]] * len(x)
    else:
        lo = [p.tokens_per_s_lo for p in pts]
        hi = [p.tokens_per_s_hi for p in pts]
        ideal = [y[0] * n / x[0] for n in x]
    ax.plot(x, y, "o-", color=colour, ms=3, lw=1.4, label=text(label))
    lo = [v if finite(v) else yv for v, yv in zip(lo, y)]
    hi = [v if finite(v) else yv for v, yv in zip(hi, y)]
    ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
    ax.plot(x, ideal, "--", color=colour, lw=0.8, alpha=0.8)
    if knee is not None and knee in x:
        i = x.index(knee)
        ax.plot([knee], [y[i]], marker="X", ms=9, color=colour, mec="black", zorder=5)
        ax.annotate("knee", (knee, y[i]), textcoords="offset points", xytext=(5, -11), fontsize=7)


def scaling_png(result: WhatifResult) -> bytes | None:
    """Per model (a row): tokens/s and TFLOP/s per device against nodes."""
    by_model = models(result.points)
    if not any(p.fits for p in result.points):
        return None
    curves = groups(result.points)
    knee_at = knees(result)
    fig, axes = _figure(len(by_model), 2, 6.0, 3.8)
    for row, model in enumerate(by_model):
        mine = [g for g in curves if g[0] == model]
        for col, per_device in enumerate((False, True)):
            ax = axes[row][col]
            for i, g in enumerate(mine):
                _curve(ax, curves[g], COLOURS[i % len(COLOURS)], group_label(g, with_model=False),
                       knee_at.get(g), per_device)
            _node_axis(ax, [p.nodes for g in mine for p in curves[g]])
            ax.set_xlabel("nodes", fontsize=8)
            if per_device:
                ax.set_ylabel("TFLOP/s per device", fontsize=8)
                ax.set_title(text(f"{model}: TFLOP/s per device (ideal: flat)"), fontsize=9)
            else:
                ax.set_yscale("log")
                ax.set_ylabel("tokens/s", fontsize=8)
                ax.set_title(text(f"{model}: tokens/s (dashed: ideal linear; X: knee)"), fontsize=9)
                if mine:
                    ax.legend(fontsize=7, loc="upper left")
            ax.tick_params(labelsize=7)
    return _png(fig)


def _plain_log(ax) -> None:
    """Log axes ticked at 1, 2, 5 x 10^k and labelled 2,000 and 0.5 rather than 2x10^3; minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def _err(v: float, lo: float, hi: float) -> tuple[float, float]:
    """Error-bar lengths below and above (0 where the bound is unknown or on the wrong side)."""
    return (max(0.0, v - lo) if finite(lo) else 0.0, max(0.0, hi - v) if finite(hi) else 0.0)


def pareto_png(result: WhatifResult) -> bytes | None:
    """Per model: days to train against node-hours, the front highlighted."""
    by_model = [m for m in models(result.points)
                if any(p.model == m and p.fits and finite(p.days) and finite(p.node_hours) for p in result.points)]
    if not by_model:
        return None
    colour = {m: COLOURS[i % len(COLOURS)] for i, m in enumerate(machines(result.points))}
    cols = min(2, len(by_model))
    rows = math.ceil(len(by_model) / cols)
    fig, axes = _figure(rows, cols, 6.0, 4.2)
    for k, model in enumerate(by_model):
        ax = axes[k // cols][k % cols]
        pts = [p for p in result.points if p.model == model and p.fits and finite(p.days) and finite(p.node_hours)]
        for machine, c in colour.items():
            mine = [p for p in pts if p.machine == machine]
            if not mine:
                continue
            xe = list(zip(*[_err(p.node_hours, p.node_hours_lo, p.node_hours_hi) for p in mine]))
            ye = list(zip(*[_err(p.days, p.days_lo, p.days_hi) for p in mine]))
            ax.errorbar([p.node_hours for p in mine], [p.days for p in mine], xerr=xe, yerr=ye, fmt="o", ms=4,
                        color=c, ecolor=c, elinewidth=0.6, alpha=0.85, label=text(machine))
        front = pareto_front(pts)
        ax.plot([p.node_hours for p in front], [p.days for p in front], "-", color="black", lw=1.2, zorder=4)
        ax.scatter([p.node_hours for p in front], [p.days for p in front], s=70, facecolors="none",
                   edgecolors="black", lw=1.2, zorder=5, label="Pareto front")
        several = len({p.machine for p in front}) > 1
        for p in front:
            ax.annotate(text(f"{p.machine} {p.nodes}" if several else p.nodes), (p.node_hours, p.days),
                        textcoords="offset points", xytext=(4, 3), fontsize=6)
        _plain_log(ax)
        ax.set_xlabel("node-hours", fontsize=8)
        ax.set_ylabel("days to train", fontsize=8)
        ax.set_title(text(f"{model}: time to train vs node-hours (labels: nodes)"), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper right")
    for k in range(len(by_model), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    return _png(fig)


def heatmap_skipped(result: WhatifResult) -> str:
    """Why there is no heat map, or '' when there is one."""
    n = len(varied_fields(result.points))
    if n != 2:
        return f"No heat map: the sweep varies {n} field{'s' * (n != 1)}; a heat map needs exactly two (--vary twice)."
    return ""


def _heat_cells(pts, f1: str, v1: list[str], f2: str, v2: list[str], metric: str) -> list[list[float]]:
    cells = [[math.nan] * len(v2) for _ in v1]
    for p in pts:
        val = getattr(p, metric)
        if p.fits and finite(val) and f1 in p.varied and f2 in p.varied:
            cells[v1.index(str(p.varied[f1]))][v2.index(str(p.varied[f2]))] = val
    return cells


def heatmap_png(result: WhatifResult) -> bytes | None:
    """Per model x machine: the metric over the two varied fields at the largest node count."""
    if heatmap_skipped(result):
        return None
    (f1, v1), (f2, v2) = varied_fields(result.points).items()
    metric = "days" if any(p.fits and finite(p.days) for p in result.points) else "tokens_per_s"
    panels = [(m, mc) for m in models(result.points) for mc in machines(result.points)
              if any(p.model == m and p.machine == mc for p in result.points)]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = _figure(rows, cols, 4.2, 3.4)
    for k, (model, machine) in enumerate(panels):
        ax = axes[k // cols][k % cols]
        pts = [p for p in result.points if p.model == model and p.machine == machine]
        nodes = max(p.nodes for p in pts)
        cells = _heat_cells([p for p in pts if p.nodes == nodes], f1, v1, f2, v2, metric)
        im = ax.imshow(cells, aspect="auto", cmap="viridis_r" if metric == "days" else "viridis")
        for i, row in enumerate(cells):
            for j, v in enumerate(row):
                r, g, b, _ = im.cmap(im.norm(v)) if finite(v) else (1, 1, 1, 1)
                ax.text(j, i, f"{v:.3g}" if finite(v) else "n/a", ha="center", va="center", fontsize=7,
                        color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
        ax.set_xticks(range(len(v2)))
        ax.set_xticklabels([text(v) for v in v2], fontsize=7)
        ax.set_yticks(range(len(v1)))
        ax.set_yticklabels([text(v) for v in v1], fontsize=7)
        ax.set_xlabel(text(f2), fontsize=8)
        ax.set_ylabel(text(f1), fontsize=8)
        ax.set_title(text(f"{model} on {machine}, {nodes} nodes: {'days' if metric == 'days' else 'tokens/s'}"),
                     fontsize=8)
        fig.colorbar(im, ax=ax, shrink=0.8).ax.tick_params(labelsize=6)
    for k in range(len(panels), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    return _png(fig)


def render(result: WhatifResult) -> list[Plot]:
    """The three plots, each drawn once (None where skipped, with the reason as its note)."""
    out = []
    png = scaling_png(result)
    out.append(Plot("scaling", "Scaling curves", png,
                    "Tokens/s and TFLOP/s per device against nodes; band: the interval of the time-derived figures; "
                    "dashed: ideal scaling from the smallest point; X: the knee (scaling efficiency below the threshold)."
                    if png else "No scaling curves: no point fits."))
    png = pareto_png(result)
    out.append(Plot("pareto", "Time to train vs node-hours", png,
                    "Each point a node count; bars: the interval; circled and joined: the Pareto front "
                    "(no other point is both faster and cheaper), labelled with its node count." if png else "No Pareto plot: no point fits."))
    png = heatmap_png(result)
    fields = " x ".join(varied_fields(result.points))
    out.append(Plot("heatmap", "Heat map over the varied fields", png,
                    f"Over {fields}, at the largest node count swept (n/a: does not fit)." if png
                    else heatmap_skipped(result)))
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """Write the chunks to a temporary file beside `path`, then rename: a reader never sees half
    a file, and a failure (in writing or in producing a chunk) leaves `path` as it was."""
    from planner.schema.files import check_target

    path = check_target(path, "the output file", force=True)  # never through a symlink or over a device
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.chmod(tmp, 0o666 & ~_umask())
        check_target(path, "the output file", force=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_plots(result: WhatifResult, directory: Path | str) -> list[Path]:
    """Write scaling.png, pareto.png and (with two varied fields) heatmap.png into `directory`
    (created if missing); the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in render(result):
        if plot.png is not None:
            write_atomic(directory / f"{plot.name}.png", [plot.png])
            written.append(directory / f"{plot.name}.png")
    return written
