"""`exaplan calibrate`: measure this machine and write its machine model, or refit the model's
figures from runs that `exaplan run` made (`--from-runs`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import add_json_option, command_line, console, print_json
from planner.schema.errors import PlanError


def add_parser(sub) -> None:
    k = sub.add_parser("calibrate", help="measure this machine (matmul, memory, collectives) and write its machine model",
                       description="Measure matmul throughput over shapes, memory bandwidth and collectives (allreduce, "
                                   "reduce-scatter, all-gather, point-to-point) between N ranks with this machine's "
                                   "backend, fit the machine model's figures, and write a MachineModel YAML (raw "
                                   "measurements beside it). `--from-runs` refits the efficiency figures from runs that "
                                   "`exaplan run` made.")
    k.add_argument("--ranks", type=int, default=2, help="ranks (devices) to measure between (default 2)")
    k.add_argument("--quick", action="store_true", help="fewer sizes and repeats: under a minute on a laptop")
    k.add_argument("--base", default=None, help="machine model to start from (default: the detected local machine)")
    k.add_argument("-o", "--output", default=None,
                   help="YAML to write (default machine_models/local.yaml, which `--machine local` then uses)")
    k.add_argument("--from-runs", nargs="+", metavar="DIR",
                   help="refit from these `exaplan run` output folders instead of measuring")
    add_json_option(k)


def run(args: argparse.Namespace) -> int:
    from machine_models import PRESET_DIR, detect_local_machine, load_machine

    if args.ranks <= 0:
        raise PlanError("must be a positive number of ranks", field="ranks")
    out = Path(args.output) if args.output else PRESET_DIR / "local.yaml"
    base = load_machine(args.base) if args.base else detect_local_machine(args.ranks)
    if args.from_runs:
        return _from_runs(args, base, out)
    from calibration.fit_measurements import fit, write_calibration
    from calibration.measure import measure

    meas = measure(args.ranks, quick=args.quick, progress=not args.json)
    m = fit(meas, base)
    write_calibration(m, meas, out)
    if args.json:
        print_json(dict(output=str(out), machine=m.model_dump(mode="json")))
        return 0
    c = console()
    c.print(f"wrote {out} (raw measurements beside it)")
    c.print(f"matmul: peak {m.peak_tflops[next(iter(m.peak_tflops))] * 1e3:.1f} GFLOP/s x efficiency "
            f"{m.matmul_efficiency.peak_fraction:.2f} (half at d = {m.matmul_efficiency.half_dim:.0f}); memory "
            f"{m.memory_bandwidth_gbyte_s:.1f} GB/s; collectives alpha {m.intra_node_latency_us:.0f} us, "
            f"beta {m.intra_node_bandwidth_gbyte_s:.2f} GB/s per rank")
    return 0


def _from_runs(args, base, out: Path) -> int:
    """Refit from `exaplan run` folders; show the step-time error on held-out runs before and
    after, then write the model fitted on all."""
    from calibration.fit_runs import refit_to_file

    machine, summary = refit_to_file([Path(d) for d in args.from_runs], base, out, command_line())
    if args.json:
        print_json(dict(output=str(out), holdout=summary, machine=machine.model_dump(mode="json")))
        return 0
    c = console()
    if summary:
        def layouts(names):
            return ", ".join(sorted({n.split("/")[0] for n in names}))

        c.print(f"held-out layouts ({layouts(summary['test'])}; {len(summary['test'])} runs): median |step-time "
                f"error| {summary['median_abs_test_before']:.1%} before, {summary['median_abs_test_after']:.1%} after "
                f"refitting on the others ({layouts(summary['train'])}; {len(summary['train'])} runs)")
        c.print("figures: " + ", ".join(f"{k} {summary['figures_before'][k]:.3g} -> {v:.3g}"
                                        for k, v in summary["figures_after"].items()))
    c.print(f"wrote {out} (fitted on all {len(args.from_runs)} runs)")
    return 0
