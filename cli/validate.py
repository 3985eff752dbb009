"""`exaplan validate`: predictions against published training runs (`--published`) or against
layouts run on this machine (`--local`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import add_json_option, console, print_json


def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="compare predictions with published training runs, local runs or GPU kernels",
                       description="--published: predict every published run (calibration/data/published/) and print "
                                   "predicted vs published with the error, its median and max, how often the held-out "
                                   "rows fall inside the interval a plan would show, and optionally leave-one-out errors "
                                   "with the rows that pin a fitted figure, and the records out of the fitted model's reach (the published "
                                   "step, less the modelled communication, leaves the compute faster than the fitted GEMM "
                                   "asymptote: calibration/record_check.py). --local: run at least 10 layouts on this machine through "
                                   "`exaplan run` and compare measured with predicted step time and memory. "
                                   "--kernels FILE: the cost model's kernel terms against kernels a GPU timed "
                                   "(benchmarks/gpu_kernels.py).")
    which = v.add_mutually_exclusive_group(required=True)
    which.add_argument("--published", action="store_true", help="check against the published runs")
    which.add_argument("--local", action="store_true",
                       help="run at least 10 layouts on this machine through `exaplan run` and compare measured with "
                            "predicted (CSV, JSON, PNG in --out)")
    which.add_argument("--kernels", metavar="FILE",
                       help="compare the cost model's kernel terms (GEMM, attention, elementwise, loss, exaplan's block "
                            "by kind) with kernels timed one by one on a GPU by benchmarks/gpu_kernels.py (its "
                            "gpu_kernels.json; docs/gpu/2026-11-26-h100-kernels.json is an H100's)")
    v.add_argument("--plot", metavar="PNG", help="with --kernels: also draw attention's rate against the sequence "
                                               "per backend and the model, and model / measured per case, into PNG")
    v.add_argument("--force", action="store_true", help="replace an existing --plot file (never a symlink or a device)")
    v.add_argument("--model", default="protein-small", help="with --local: the model (default protein-small)")
    v.add_argument("--machine", default="local", help="with --local: the machine model to predict with (default local); "
                                                      "with --kernels: the preset of the measured card (default: from "
                                                      "the card's name)")
    v.add_argument("--ranks", type=int, default=2, help="with --local: ranks (default 2)")
    v.add_argument("--steps", type=int, default=8, help="with --local: steps per layout (default 8)")
    v.add_argument("--repeats", type=int, default=1,
                   help="with --local: timing runs per layout, in rounds over all layouts; the median is kept (default 1)")
    v.add_argument("--no-memory-runs", action="store_true",
                   help="with --local: take memory from the timing runs' RSS instead of a separate short run with a "
                        "fixed malloc mmap threshold (whose RSS follows the live tensors)")
    v.add_argument("--out", default="runs/validate-local", help="with --local: output folder")
    v.add_argument("--backend", choices=["torch", "jax"], default="torch",
                   help="with --local: the runtime to run the layouts with (jax: those it runs, planned with the jax "
                        "framework profile)")
    v.add_argument("--refit", action="store_true",
                   help="with --published: refit the per-device-kind and per-framework figures and save them in "
                        "machine_models/device_kinds.yaml; with --local --backend jax: fit the jax profile's CPU "
                        "figures to these runs (leave-one-layout-out errors shown) and save them in "
                        "machine_models/frameworks.yaml")
    v.add_argument("--search-unstated", action="store_true",
                   help="with --published: for rows whose source leaves layout fields unstated (micro-batch, "
                        "recompute, sequence parallelism, virtual stages), search those fields with the rest pinned "
                        "and show the best layout's error beside the recorded choice's")
    v.add_argument("--loo", action="store_true",
                   help="with --published: also leave-one-out errors: refit without each run and predict it "
                        "(one fit of about 11 s per run, over the CPUs: 5-7 minutes on 2 cores), and name the rows "
                        "whose leaving out moves a fitted figure by 20%% or more")
    v.add_argument("--all-rows", action="store_true",
                   help="with --published: list every held-out row, section L's 199 too, instead of section L's "
                        "summary by table and sequence length")
    add_json_option(v)


def run(args: argparse.Namespace) -> int:
    if args.kernels:
        return _kernels(args)
    return _local(args) if args.local else _published(args)


def _kernels(args) -> int:
    from calibration import kernel_check
    from machine_models import load_machine
    from planner.schema.errors import check_name_or_path

    for option in ("kernels", "plot"):  # before they become file names
        if getattr(args, option):
            check_name_or_path(getattr(args, option), f"--{option}")
    if args.plot:
        from planner.schema.files import check_target

        check_target(args.plot, "the plot (--plot)", args.force)
    data = kernel_check.load(args.kernels)
    card = data["device"]["device"]
    name = args.machine if args.machine != "local" else kernel_check.preset_for(card)
    if name is None:
        raise kernel_check.KernelFileError(f"--machine: no preset known for the card {card!r}; name one")
    machine = load_machine(name)
    rows = kernel_check.compare(data, machine)
    if args.plot:
        kernel_check.plot(data, machine, rows, args.plot, force=args.force)
    if args.json:
        print_json(kernel_check.to_json(data, machine, rows))
    else:
        kernel_check.render(data, machine, rows, console())
    return 0


def _published(args) -> int:
    from calibration import validate_published as validate

    if args.json or not (args.refit or args.loo):
        rows = validate.validate_published(refit=args.refit, leave_one_out_errors=args.loo)
    else:
        rows = _published_with_progress(validate, args)
    held_out = validate.validate_held_out()
    searched = validate.validate_searched() if args.search_unstated else None
    if args.json:
        print_json(validate.published_json(rows, held_out, searched))
        return 0
    validate.render_published(rows, console(), held_out, searched, list_all=args.all_rows)
    return 0


def _published_with_progress(validate, args):
    """The fit under a spinner on stderr; with --loo, a bar over the leave-one-out folds (a
    whole fit each, about 11 s per fold and core)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from calibration.published import published_runs

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        what = ("fitting, then leave-one-out refits (one fit without each run)" if args.refit else
                "leave-one-out refits (one fit without each run)") if args.loo else "fitting the figures"
        task = progress.add_task(what, total=len(published_runs()) if args.loo else None)
        return validate.validate_published(refit=args.refit, leave_one_out_errors=args.loo,
                                           on_fold=lambda rid: progress.advance(task))


def _local(args) -> int:
    from calibration.validate_local import run_local_validation
    from calibration.validate_local_report import render
    from planner.schema.errors import PlanError

    if args.refit and args.backend != "jax":
        raise PlanError("with --local, --refit fits the jax profile (--backend jax); the torch runtime's figures are the "
                        "machine's: `exaplan calibrate --from-runs OUT/runs/*`", field="--refit")
    rep = run_local_validation(args.model, args.ranks, Path(args.out), steps=args.steps, machine=args.machine,
                               progress=not args.json, repeats=args.repeats, memory_runs=not args.no_memory_runs,
                               backend=args.backend)
    if args.json:
        print_json(rep.to_json())
    else:
        render(rep)
    if args.refit:
        _refit_profile(args)
    return 0


def _refit_profile(args) -> None:
    """Fit the jax profile's CPU figures to the runs just made; print and save them."""
    import shlex
    import sys

    from rich.table import Table

    from calibration.fit_framework import fit_cpu_figures, save_cpu_figures

    runs = sorted(p.parent for p in Path(args.out, "runs").glob("**/summary.json"))
    result = fit_cpu_figures(runs)
    table = Table(title=f"jax profile: CPU figures fitted to {len(runs)} runs")
    for col in ("figure", "machine (torch)", "jax fit"):
        table.add_column(col, justify="right" if col != "figure" else "left")
    for name, value in result["figures"].items():
        table.add_row(name, f"{result['machine_figures'][name]:.4g}", f"{value:.4g}")
    out = console()
    out.print(table)
    for key, label in (("before", "with the machine's figures"), ("fit", "fitted to all"),
                       ("loo", "leave-one-layout-out")):
        s = result[f"{key}_stats"]
        out.print(f"step-time error {label:28s} median {s['median_abs']:6.1%}  max {s['max_abs']:6.1%}")
    save_cpu_figures("jax", result, shlex.join(["exaplan", *sys.argv[1:]]))
    out.print("saved in machine_models/frameworks.yaml (jax.cpu_figures)")
