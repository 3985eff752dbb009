"""`exaplan whatif`: compare machines, sweep node counts and any field; node-hours, energy,
deadlines, the fastest machine and the knee of each scaling curve, with error bars."""

from __future__ import annotations

import argparse
import sys
import time

from cli.common import COMPILE_HELP, FRAMEWORK_HELP, REFERENCE_HELP, WORKLOAD_HELP, add_json_option, add_set_option, command_line, console
from planner.schema.errors import PlanError, check_name_or_path

BATCH_RULE = ("Fair comparison: by default every machine and node count of a model trains with ONE global batch, the "
              "critical-batch estimate of DeepSeek LLM (2024; B_opt = 0.2920 C^0.3271 tokens, C = non-embedding "
              "FLOPs per token x --tokens) rounded down to m x 2^k sequences (m: the odd part of the lcm of the "
              "machines' devices per node, 3 with Aurora), so that every machine's data-parallel degrees can divide "
              "it. --global-batch N fixes it yourself; --batch-per-rank N gives each rank N sequences (weak scaling, "
              "as the seed runs did: each machine and node count then trains a different batch). A batch past the "
              "estimate is warned about.")


def add_parser(sub) -> None:
    from planner.whatif.parse import MAX_NODE_COUNTS, MAX_POINTS, MAX_VARY_VALUES

    w = sub.add_parser(
        "whatif", help="compare machines and node counts (and any varied field): days, node-hours, energy, deadlines",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="For every model x machine x node count x varied value: the best layout from the full search, "
                    "step time, tokens/s, TFLOP/s per device, MFU, days to train, node-hours, energy (the machine "
                    "file's power: section) and scaling efficiency, each time-derived figure with its interval.\n\n"
                    + BATCH_RULE,
        epilog="examples:\n"
               "  exaplan whatif --model protein-3.5b --machine frontier --nodes 64:4096 --tokens 1e12 --deadline-days 7\n"
               "  exaplan whatif --model protein-7b --machine aurora,alps,frontier,leonardo,pdx --nodes 64:1024 "
               "--tokens 1e12 --fastest\n"
               "  exaplan whatif --model protein-7b --machine dgx-h100 --nodes 8:64 --vary machine.nic_gbit_s=x0.5,x1,x2")
    w.add_argument("--model", required=True, help="model preset(s) or ModelSpec YAML file(s), comma-separated")
    w.add_argument("--machine", required=True, help="machine preset(s) or MachineModel YAML file(s), comma-separated")
    w.add_argument("--nodes", required=True, metavar="LO:HI|N,N,...",
                   help="LO:HI = LO, 2 LO, 4 LO, ... up to HI; or a comma-separated list of node counts (at most "
                        f"{MAX_NODE_COUNTS})")
    w.add_argument("--tokens", type=float, help="tokens to train on (default 1e9)")
    w.add_argument("--deadline-days", type=float, help="per machine: the fewest nodes and the cheapest point that "
                                                       "train within D days (or the best achievable)")
    w.add_argument("--minimise", choices=["node-hours", "energy"], default="node-hours",
                   help="what 'cheapest' means for --deadline-days (default node-hours)")
    w.add_argument("--fastest", action="store_true", help="rank the machines per model at equal node counts and "
                                                          "by the node-hours of their cheapest point")
    w.add_argument("--knee", type=float, default=0.8, help="scaling-efficiency threshold that marks the knee of each "
                                                           "curve (default 0.8)")
    w.add_argument("--vary", action="append", default=[], metavar="FIELD=v1,v2|x0.5,x2",
                   help="sweep a field (the dotted paths of --set, e.g. machine.nic_gbit_s, model.layers, "
                        "machine.power.node_w) over absolute values or multipliers of the preset's value; repeatable "
                        f"(every combination); at most {MAX_VARY_VALUES} values each, and at most {MAX_POINTS} points "
                        "(models x machines x combinations x node counts) in one what-if")
    b = w.add_mutually_exclusive_group()
    b.add_argument("--global-batch", type=int, help="one global batch (sequences; dpo: pairs) at every point")
    b.add_argument("--batch-per-rank", type=int, help="sequences (dpo: pairs) per rank: weak scaling")
    w.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    w.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    w.add_argument("--workload", choices=["pretrain", "dpo"], default="pretrain", help=WORKLOAD_HELP)
    w.add_argument("--reference", choices=["in-step", "precomputed"], default="in-step", help=REFERENCE_HELP)
    w.add_argument("--framework", default="exaplan", metavar="NAME", help=FRAMEWORK_HELP)
    w.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    add_set_option(w)
    add_json_option(w, "print the result as JSON (points, answers, inputs) instead of tables")
    w.add_argument("--csv", metavar="FILE", help="also write one CSV row per point")
    w.add_argument("--report", metavar="FILE.html", help="also write the self-contained HTML report with its plots")
    w.add_argument("--plots", metavar="DIR", help="also save the plots as PNG files in DIR, created if missing: "
                                                  "scaling.png, pareto.png, and heatmap.png with two varied fields")
    w.add_argument("--force", action="store_true",
                   help="replace the --csv and --report files and the --plots PNGs when they exist (never a "
                        "symlink or a device); without it an existing one is refused before the sweep")


def run(args: argparse.Namespace) -> int:
    from planner.whatif import run_whatif

    for option in ("csv", "report", "plots"):  # before they become file names (ENAMETOOLONG, NUL)
        if getattr(args, option):
            check_name_or_path(getattr(args, option), option)
    _check_outputs(args)
    writer = _report_writer() if args.report else None
    plots = _plots_saver(args.plots) if args.plots else None
    bar = ProgressBar(enabled=sys.stderr.isatty())  # stderr: --json output on stdout stays clean
    try:
        result = run_whatif(
            model=args.model, machine=args.machine, nodes=args.nodes, tokens=args.tokens,
            deadline_days=args.deadline_days, minimise=args.minimise, fastest=args.fastest, knee=args.knee,
            vary=args.vary, global_batch=args.global_batch, batch_per_rank=args.batch_per_rank,
            framework=args.framework, workload=args.workload, reference=args.reference, seq_len=args.seq_len,
            precision=args.precision, overrides=args.overrides, progress=bar, command=_command(args),
            compiled=args.compile, while_sweeping=_plots_warm_up if (args.report or args.plots) else None)
    finally:
        bar.close()
    if args.csv:
        from planner.whatif.output import write_csv

        _write(lambda: write_csv(result, args.csv), "csv")
    if writer is not None:
        _write(lambda: writer(result, args.report), "report")
    saved = plots(result) if plots is not None else []
    if args.json:
        from cli.common import print_json

        print_json(result.as_json())
        return 0
    out = console()
    print_result(result, out)
    if plots is not None:
        out.print(f"plots in {args.plots}: {', '.join(p.name for p in saved) or 'none (nothing fits)'}")
    return 0


def _plots_warm_up() -> None:
    from report.plots import warm_up

    warm_up()


def _command(args) -> str:
    """The command line that regenerates the result (main() hands its argv on)."""
    import shlex

    argv = getattr(args, "argv", None)
    return shlex.join(["exaplan", *argv]) if argv else command_line()


def _report_writer():
    """report.whatif.write_report, checked before any work (exit 2 without it)."""
    try:
        from report.whatif import write_report
    except ImportError:
        raise PlanError("the report needs report/whatif.py", field="report") from None
    return write_report


def _plots_saver(directory: str):
    """--plots DIR, checked before any work: an existing directory, or one whose nearest existing
    ancestor is a writable directory (exit 2 naming --plots otherwise). The saver draws every plot,
    then writes each PNG to a temporary file and renames it (report.plots.save_plots)."""
    import os
    from pathlib import Path

    try:
        from report.plots import save_plots
    except ImportError:
        raise PlanError("the plots need report/plots.py", field="plots") from None
    path = Path(directory)
    probe = next(a for a in (path, *path.absolute().parents) if a.exists() or a.is_symlink())
    why = ("a broken link" if not probe.exists() else "not a directory" if not probe.is_dir()
           else "not writable" if not os.access(probe, os.W_OK | os.X_OK) else "")
    if why:
        raise PlanError(f"cannot create the directory {directory}: {probe} is {why}", field="plots")

    def save(result) -> list:
        try:
            return save_plots(result, path)
        except OSError as e:
            raise PlanError(f"cannot write the plots in {directory}: {e.strerror or e}", field="plots") from None

    return save


def _check_outputs(args: argparse.Namespace) -> None:
    """The files the sweep will write, refused before it runs when they exist (without --force),
    are links or are not regular files."""
    from pathlib import Path

    from planner.schema.files import check_target

    for option, what in (("csv", "the CSV (--csv)"), ("report", "the report (--report)")):
        if getattr(args, option):
            check_target(getattr(args, option), what, args.force)
    if args.plots and Path(args.plots).is_dir():
        for name in ("scaling.png", "pareto.png", "heatmap.png"):
            if (Path(args.plots) / name).exists() or (Path(args.plots) / name).is_symlink():
                check_target(Path(args.plots) / name, f"the plot {name} (--plots)", args.force)


def _write(fn, option: str) -> None:
    try:
        fn()
    except OSError as e:
        raise PlanError(f"cannot write: {e.strerror or e}", field=option) from None


class ProgressBar:
    """A rich progress bar on stderr, shown once a sweep has run for SHOW_AFTER_S seconds
    (quick sweeps stay silent), only when stderr is a terminal."""

    SHOW_AFTER_S = 1.0

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.start = time.perf_counter()
        self.progress = None
        self.task = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        if self.progress is None:
            if time.perf_counter() - self.start < self.SHOW_AFTER_S or done >= total:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.progress.start()
            self.task = self.progress.add_task("searching", total=total)
        self.progress.update(self.task, completed=done, description=f"searching {label}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def print_result(result, out) -> None:
    """The points as a table, then the answers, warnings and how far to trust them."""
    table = points_table(result)
    if not sys.stdout.isatty():  # a file or a pipe: as wide as the table needs, never truncated
        from rich.measure import Measurement

        out.width = max(out.width, Measurement.get(out, out.options.update_width(1000), table).maximum)
    out.print(table)
    for title, items in (("deadline", result.deadline), ("fastest", result.fastest), ("knee", result.knee_details)):
        for d in items:
            out.print(f"[b]{title}[/b]: {d['sentence']}")
    for w in result.warnings:
        out.print(f"[yellow]warning[/yellow]: {w}")
    status = ", ".join(f"{k}: {v}" for k, v in result.device_status.items())
    out.print(f"device kinds: {status}")
    bases = dict.fromkeys(f"{p.machine}: {p.uncertainty_basis}" for p in result.points)
    out.print("intervals (lo-hi): " + "; ".join(bases))
    out.print(f"global batch: {result.inputs['batch_rule']}")
    out.print(f"{len(result.points)} points in {result.seconds:.1f} s; regenerate: {result.command}")


def _two_digits(value: float) -> str:
    """A rate in whole units, or two significant digits below 10 (a small model's 0.41 TFLOP/s
    per device, not 0)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def _small(value: float, fmt: str = "{:,.2f}") -> str:
    """`fmt`, or two significant digits where `fmt` would print a nonzero value as zero (a
    short job's 0.0041 days, not 0.00)."""
    text = fmt.format(value)
    return f"{value:.2g}" if value and not any(c in "123456789" for c in text) else text


def points_table(result):
    from rich import box
    from rich.table import Table

    inp = result.inputs
    batches = {(p.global_batch_seqs, p.global_batch_tokens) for p in result.points}
    one_batch = len(batches) == 1
    title = f"time to train {inp['tokens']:.3g} tokens"
    if one_batch:
        seqs, toks = next(iter(batches))
        title += f"; global batch {seqs:,} sequences = {toks:,} tokens at every point"
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    models = len({p.model for p in result.points}) > 1
    varied = list(dict.fromkeys(k for p in result.points for k in p.varied))
    cols = (["model"] if models else []) + ["machine"] + [k.rsplit(".", 1)[-1] for k in varied] + ["nodes"] + ([] if one_batch else ["batch seqs"]) + [
        "best layout", "step s", "tokens/s", "TF/dev", "MFU", "days (lo-hi)", "node-h", "MWh", "eff"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("model", "machine", "best layout") else "right", no_wrap=True)
    knees = result.knees
    for p in result.points:
        head = ([p.model] if models else []) + [p.machine] + [p.varied.get(k, "") for k in varied] + [f"{p.nodes:,}"]
        head += [] if one_batch else [f"{p.global_batch_seqs:,}"]
        if not p.fits:
            t.add_row(*head, f"[dim]{p.reason}[/dim]", *[""] * 8)
            continue
        mark = " [b]knee[/b]" if knees.get(p.group) == p.nodes else ""
        energy = "" if p.energy_kwh is None else _small(p.energy_kwh / 1000, "{:,.1f}")
        t.add_row(*head, p.layout, f"{p.step_time_s:.3g}", f"{p.tokens_per_s:.3g}", _two_digits(p.tflops_per_device),
                  f"{p.mfu:.0%}" if p.mfu >= 0.1 else f"{100 * p.mfu:.2g}%",
                  f"{_small(p.days)} ({_small(p.days_lo)}-{_small(p.days_hi)})", _small(p.node_hours, "{:,.0f}"), energy,
                  f"{p.scaling_efficiency:.0%}{mark}")
    return t
