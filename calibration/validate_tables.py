"""The output of `exaplan validate --published`: the rich tables with their summary lines, and
the same as a JSON-ready dict (`--json`). The rows: calibration/validate_rows.py."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from calibration import gemm_benchmarks
from calibration.strata import MIN_COVERAGE, MIN_STRATUM_ROWS, coverage_by_stratum, short_strata
from calibration.ranking import MIN_LAYOUTS, REGRET_TARGET, SPEARMAN_TARGET, ranked_jobs, ranking_summary
from calibration.record_check import out_of_reach, record_lines
from calibration.validate_rows import (
    PINNED_SHIFT, SUMMARISED_SECTIONS, ValidationRow, foundry_groups, groups, interval_coverage, loo_summary, loo_targets,
    summary,
)
from machine_models.uncertainty import QUANTILE


def _targets_line(rows: list[ValidationRow]) -> str | None:
    t = loo_targets(rows)
    if t is None:
        return None

    def mark(key: str) -> str:
        return "met" if t[key]["met"] else "NOT met"

    unreachable = t["max"]["unreachable_records"]
    over = ", ".join(f"{k} {100 * v:+.1f}%{' (record out of reach, below)' if k in unreachable else ''}"
                     for k, v in t["max"]["rows_over"].items())
    return (f"targets: leave-one-out median <= {100 * t['median']['target']:.0f}% ({100 * t['median']['value']:.1f}%: "
            f"{mark('median')}), max <= {100 * t['max']['target']:.0f}% ({100 * t['max']['value']:.1f}%: {mark('max')}"
            f"{': ' + over if over else ''}), at least {t['rows']['target']} rows ({t['rows']['value']}: {mark('rows')})")


def _fmt(value: float, kind: str) -> str:
    if kind == "mfu":
        return f"{100 * value:.1f}%"
    if kind == "iteration_time_s":
        return f"{value:.2f}"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}"


def render_published(rows: list[ValidationRow], console, held_out: list[ValidationRow] | None = None,
                     searched: list | None = None, list_all: bool = False) -> None:
    """Print the rows as a rich table, then median and max |error| (and leave-one-out),
    overall, per device kind and per framework; then the held-out rows, if given (section L
    summarised by table and sequence band unless `list_all`)."""
    console.print(_table("Published runs: predicted vs published", rows))
    console.print(_summary_line("all rows", rows))
    for name, part in {**groups(rows, "device"), **groups(rows, "framework")}.items():
        console.print("  " + _summary_line(name, part))
    for line in gemm_benchmarks.report_lines():
        console.print("  " + line)
    if all(r.loo_error is None for r in rows):
        console.print("leave-one-out (fit without each row, then predict it): `--loo`")
    else:
        console.print(_targets_line(rows))
    for line in pinned_lines(rows) + record_lines(rows + [r for r in held_out or [] if r.section not in SUMMARISED_SECTIONS]):
        console.print(line)
    if held_out:
        listed = [r for r in held_out if list_all or r.section not in SUMMARISED_SECTIONS]
        console.print(_table("Held out (never fitted): predicted vs published", listed))
        console.print(_summary_line("held-out rows", listed, coverage=True))
        console.print(_strata_table(coverage_by_stratum(held_out)))
        foundry = [r for r in held_out if r.section == "L"]
        if foundry:
            console.print(_foundry_table(foundry))
            console.print(_summary_line("section L (every row: --json)", foundry, coverage=True))
    jobs = ranked_jobs(rows, held_out or [])
    if jobs:
        console.print(_ranking_table(jobs))
        console.print(ranking_line(ranking_summary(jobs)))
    if searched:
        console.print(_searched_table(searched, {r.id: r for r in rows + (held_out or [])}))
    if any(r.assumed for r in rows + (held_out or [])):
        console.print("* a field of this row is not published; its data file (calibration/data/published/) documents the choice made")
    if any(out_of_reach(r.record) for r in rows + (held_out or [])):
        console.print("! the record is out of the fitted model's reach (above)")


def _foundry_table(rows: list[ValidationRow]):
    from rich.table import Table

    table = Table(title="Held out: llm-foundry's whole benchmark tables (section L), |error| by table and sequence")
    for col in ("table", "rows", "median", "max", "mean (signed)", "median, seq < 8k", "median, seq >= 8k",
                "inside interval"):
        table.add_column(col, justify="left" if col == "table" else "right")
    for name, bands in foundry_groups(rows).items():
        cells = [f"{100 * summary(part)[0]:.1f}%" if part else "-" for band, part in bands.items() if band != "all"]
        med, worst = summary(bands["all"])
        mean = float(np.mean([r.error for r in bands["all"]]))
        inside = interval_coverage(bands["all"])
        table.add_row(name, str(len(bands["all"])), f"{100 * med:.1f}%", f"{100 * worst:.1f}%", f"{100 * mean:+.1f}%",
                      *cells, "-" if inside is None else f"{100 * inside:.0f}%")
    return table


def _strata_table(coverage: dict):
    """Held-out coverage of the intervals per stratum (calibration/strata.py); strata held to
    the target that miss it in yellow."""
    from rich.table import Table

    short = short_strata(coverage)
    title = (f"Held out: rows inside the {100 * QUANTILE:.0f}% interval by stratum (at least {100 * MIN_COVERAGE:.0f}% "
             f"wanted where a stratum has {MIN_STRATUM_ROWS}+ rows; {len(short)} short)")
    table = Table(title=title)
    for col in ("dimension", "stratum", "rows", "inside"):
        table.add_column(col, justify="right" if col in ("rows", "inside") else "left")
    for dim, part in coverage.items():
        for name, s in part.items():
            inside = f"{100 * s['inside']:.0f}%"
            table.add_row(dim, name, str(s["rows"]), inside if s["meets_target"] else f"[yellow]{inside}[/]")
    return table


def _ranking_table(jobs: list):
    """calibration/ranking.py's jobs: one line each, the pick against the measured best."""
    from rich.table import Table

    table = Table(title="Ranking: jobs whose source measured several layouts (one source, model, sequence, machine, "
                        "GPU count)")
    for col in ("job", "layouts", "fitted", "Spearman", "pick's regret", "pick (predicted best)", "measured best"):
        table.add_column(col, justify="right" if col in ("layouts", "fitted", "Spearman", "pick's regret") else "left",
                         overflow="fold")
    for j in jobs:
        rho = "-" if j.spearman is None else f"{j.spearman:+.2f}"
        regret = f"{100 * j.regret:.1f}%"
        if j.held_to_targets and not j.meets_targets:
            regret, rho = f"[yellow]{regret}[/]", f"[yellow]{rho}[/]"
        table.add_row(j.name, str(j.layouts), str(j.fitted), rho, regret, j.pick + ("" if j.pick_fits else " (no fit)"),
                      "=" if j.best == j.pick else j.best)
    return table


def ranking_line(s: dict) -> str:
    """The ranking summary of calibration.ranking.ranking_summary in one line."""
    if not s["held_to_targets"]:
        return f"ranking: {s['jobs']} jobs with several layouts, none with {MIN_LAYOUTS} or more"
    return (f"ranking: {s['meet_targets']} of {s['held_to_targets']} jobs with {MIN_LAYOUTS}+ layouts meet regret <= "
            f"{100 * REGRET_TARGET:.0f}% and Spearman >= {SPEARMAN_TARGET}; regret median {100 * s['median_regret']:.1f}%, "
            f"max {100 * s['max_regret']:.1f}%; Spearman median {s['median_spearman']:.2f}, min {s['min_spearman']:.2f} "
            f"({s['jobs']} jobs with 2+ layouts in all)")


def _searched_table(searched: list, rows: dict[str, ValidationRow]):
    from rich.table import Table

    table = Table(title="Rows with unpublished layout fields: those fields searched, the rest pinned")
    for col in ("row", "searched", "as recorded", "error", "best layout found", "error"):
        table.add_column(col, justify="right" if col == "error" else "left", no_wrap=col == "error", overflow="fold")
    for s in searched:
        r = rows[s.id]
        err = "" if s.error is None else f"{100 * s.error:+.1f}%"
        table.add_row(s.id, ", ".join(s.free), r.layout, f"{100 * r.error:+.1f}%", s.layout or "(nothing fits)", err)
    return table


def _table(title: str, rows: list[ValidationRow]):
    """Names wrap (folded, never cut to "..."); figures stay on one line; leave-one-out only with --loo."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    with_loo = any(r.loo_error is not None for r in rows)
    for col in ["row", "model", "framework", "GPUs", "layout", "published", "predicted", "unit", "error", "leave-one-out"][:9 + with_loo]:
        figure = col in ("GPUs", "published", "predicted", "error", "leave-one-out")
        table.add_column(col, justify="right" if figure else "left", no_wrap=figure, overflow="fold")
    for r in rows:
        err = f"{100 * r.error:+.1f}%" + (" !" if out_of_reach(r.record) else "")
        style = "red" if abs(r.error) > 0.25 else ("yellow" if abs(r.error) > 0.10 else "")
        loo = [] if not with_loo else ["" if r.loo_error is None else f"{100 * r.loo_error:+.1f}%"]
        table.add_row(r.id + ("*" if r.assumed else ""), r.model, r.framework, str(r.gpus), r.layout,
                      _fmt(r.published, r.kind), _fmt(r.predicted, r.kind), r.unit,
                      f"[{style}]{err}[/]" if style else err, *loo)
    return table


def _summary_line(name: str, rows: list[ValidationRow], coverage: bool = False) -> str:
    med, worst = summary(rows)
    text = f"{name}: median |error| {100 * med:.1f}%, max {100 * worst:.1f}% over {len(rows)} rows"
    loo = loo_summary(rows)
    if loo:
        text += f"; leave-one-out median {100 * loo[0]:.1f}%, max {100 * loo[1]:.1f}%"
    inside = interval_coverage(rows)
    if coverage and inside is not None:
        text += (f"; {round(inside * len(rows))} of {len(rows)} ({100 * inside:.0f}%) inside the interval a plan "
                 f"would show (meant to hold {100 * QUANTILE:.0f}%)")
    return text


def pinned_lines(rows: list[ValidationRow]) -> list[str]:
    """The rows that pin a fitted figure (leaving them out moves it by PINNED_SHIFT or more),
    largest leave-one-out error first: where the leave-one-out errors come from."""
    pinned = sorted((r for r in rows if r.loo_moved), key=lambda r: -abs(r.loo_error or 0.0))
    if not pinned:
        return []
    out = [f"rows that pin a fitted figure (left out, it moves by {100 * PINNED_SHIFT:.0f}% or more):"]
    for r in pinned:
        moved = ", ".join(f"{name} {was:.3g} -> {now:.3g}" for name, (was, now) in r.loo_moved.items())
        out.append(f"  {r.id} (leave-one-out {100 * r.loo_error:+.1f}%): {r.device}/{r.framework} {moved}")
    return out


def published_json(rows: list[ValidationRow], held_out: list[ValidationRow] | None = None,
                   searched: list | None = None) -> dict:
    """The rows and their summary (all rows, then per device kind and per framework) as a
    JSON-ready dict, and the held-out rows with theirs; errors are signed fractions
    (predicted / published - 1), summaries absolute."""
    out = {
        "rows": [asdict(r) for r in rows],
        "summary": _summary_json(rows),
        "by_device": {device: _summary_json(part) for device, part in groups(rows, "device").items()},
        "by_framework": {fw: _summary_json(part) for fw, part in groups(rows, "framework").items()},
        "gemm_benchmarks": gemm_benchmarks.report(),
    }
    targets = loo_targets(rows)
    if targets is not None:
        out["targets"] = targets
    if held_out:
        out["held_out"] = {"rows": [asdict(r) for r in held_out], "summary": _summary_json(held_out),
                           "coverage_by_stratum": coverage_by_stratum(held_out)}
        foundry = [r for r in held_out if r.section == "L"]
        if foundry:
            out["held_out"]["section_l"] = {table: {band: _summary_json(part) for band, part in bands.items() if part}
                                            for table, bands in foundry_groups(foundry).items()}
    jobs = ranked_jobs(rows, held_out or [])
    out["ranking"] = {"jobs": [asdict(j) | {"name": j.name, "layouts": j.layouts} for j in jobs],
                      "summary": ranking_summary(jobs)}
    if searched:
        out["searched_unstated"] = [asdict(s) for s in searched]
    return out


def _summary_json(rows: list[ValidationRow]) -> dict:
    med, worst = summary(rows)
    loo = loo_summary(rows)
    return {
        "rows": len(rows),
        "median_abs_error": med,
        "max_abs_error": worst,
        "loo_median_abs_error": None if loo is None else loo[0],
        "loo_max_abs_error": None if loo is None else loo[1],
        "inside_interval": interval_coverage(rows),
    }
