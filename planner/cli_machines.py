"""The `calibrate` and `validate` subcommands: measuring machines and checking predictions.

Split from planner/cli.py (which parses the arguments); heavy and torch-using modules are
imported inside each function, so `exaplan plan` never loads them.
"""

from __future__ import annotations

import json
import sys

from planner.schema.errors import PlanError


def _console(args):
    from planner.cli import _console as console

    return console(args)


def cmd_validate(args) -> int:
    if args.local:
        from runtime.validate_local import main as local_main

        argv = ["--model", args.model, "--machine", args.machine, "--ranks", str(args.ranks), "--steps", str(args.steps),
                "--out", args.out, "--repeats", str(args.repeats)] + (["--json"] if args.json else []) \
            + (["--no-memory-runs"] if args.no_memory_runs else [])
        return local_main(argv)
    from calibration import validate_published as validate

    console = _console(args)
    if args.json or not (args.refit or args.loo):
        rows = validate.validate_published(refit=args.refit, leave_one_out_errors=args.loo)
    else:
        with console.status("fitting the figures" + (" and leave-one-out refits (about a minute)" if args.loo else "") + " ..."):
            rows = validate.validate_published(refit=args.refit, leave_one_out_errors=args.loo)
    if args.json:
        print(json.dumps(validate.published_json(rows), indent=2))
        return 0
    validate.render_published(rows, console)
    return 0


def cmd_calibrate(args) -> int:
    from pathlib import Path

    from machine_models import PRESET_DIR, detect_local_machine, load_machine
    from calibration.fit_measurements import fit, write_calibration

    if args.ranks <= 0:
        raise PlanError("must be a positive number of ranks", field="ranks")
    out = Path(args.output) if args.output else PRESET_DIR / "local.yaml"
    base = load_machine(args.base) if args.base else detect_local_machine(args.ranks)
    if args.from_runs:
        return _calibrate_from_runs(args, base, out)
    else:
        from calibration.measure import measure

        meas = measure(args.ranks, quick=args.quick, progress=not args.json)
        machine = fit(meas, base)
        write_calibration(machine, meas, out)
    if args.json:
        print(json.dumps(dict(output=str(out), machine=machine.model_dump(mode="json")), indent=2))
        return 0
    console = _console(args)
    m = machine
    console.print(f"wrote {out} (raw measurements beside it)")
    console.print(f"matmul: peak {m.peak_tflops[next(iter(m.peak_tflops))] * 1e3:.1f} GFLOP/s x efficiency "
                  f"{m.matmul_efficiency.peak_fraction:.2f} (half at d = {m.matmul_efficiency.half_dim:.0f}); memory "
                  f"{m.memory_bandwidth_gbyte_s:.1f} GB/s; collectives alpha {m.intra_node_latency_us:.0f} us, "
                  f"beta {m.intra_node_bandwidth_gbyte_s:.2f} GB/s per rank")
    return 0


def _calibrate_from_runs(args, base, out) -> int:
    """Refit the efficiency figures from `exaplan run` folders; show the step-time error on
    held-out runs (every other one) before and after, then write the model fitted on all."""
    import yaml
    from pathlib import Path

    from calibration.fit_measurements import _atomic_write
    from runtime.refit_local import holdout_report, refit_from_runs

    dirs = [Path(d) for d in args.from_runs]
    for d in dirs:
        if not (d / "summary.json").exists() or not (d / "plan.yaml").exists():
            raise PlanError(f"{d}: not a finished `exaplan run` folder (needs summary.json and plan.yaml)", field="--from-runs")
    report = holdout_report(dirs, base) if len(dirs) >= 4 else None
    machine = refit_from_runs(dirs, base)
    names = [f"{d.parent.name}/{d.name}" if d.name.startswith("repeat-") else d.name for d in dirs]
    header = f"# Refitted by: exaplan {' '.join(sys.argv[1:])}\n# from {len(dirs)} runs: {', '.join(names)}\n"
    _atomic_write(out, header + yaml.safe_dump(machine.model_dump(mode="json"), sort_keys=False))
    summary = None if report is None else {k: report[k] for k in ("median_abs_test_before", "median_abs_test_after",
                                                                  "median_abs_train_before", "median_abs_train_after",
                                                                  "figures_before", "figures_after", "train", "test")}
    if args.json:
        print(json.dumps(dict(output=str(out), holdout=summary, machine=machine.model_dump(mode="json")), indent=2))
        return 0
    console = _console(args)
    if summary:
        def layouts(names):
            return ", ".join(sorted({n.split("/")[0] for n in names}))

        console.print(f"held-out layouts ({layouts(summary['test'])}; {len(summary['test'])} runs): median |step-time "
                      f"error| {summary['median_abs_test_before']:.1%} before, {summary['median_abs_test_after']:.1%} after "
                      f"refitting on the others ({layouts(summary['train'])}; {len(summary['train'])} runs)")
        console.print("figures: " + ", ".join(f"{k} {summary['figures_before'][k]:.3g} -> {v:.3g}" for k, v in summary["figures_after"].items()))
    console.print(f"wrote {out} (fitted on all {len(dirs)} runs)")
    return 0
