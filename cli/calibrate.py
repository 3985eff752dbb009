"""`exaplan calibrate`: measure this machine and write its machine model, refit the model's
figures from runs that `exaplan run` made (`--from-runs`), read what a training log's
collectives reached on the NICs (`--from-comms-log`), or read a training framework's log back
against the plan it ran (`--from-log`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import add_force_option, add_json_option, command_line, console, print_json
from planner.schema.errors import PlanError
from planner.schema.files import check_target


def add_parser(sub) -> None:
    k = sub.add_parser("calibrate", help="measure this machine (matmul, memory, collectives) and write its machine model",
                       description="Measure matmul throughput over shapes, memory bandwidth and collectives (allreduce, "
                                   "reduce-scatter, all-gather, point-to-point) between N ranks with this machine's "
                                   "backend, fit the machine model's figures, and write a MachineModel YAML (raw "
                                   "measurements beside it). `--from-runs` refits the efficiency figures from runs that "
                                   "`exaplan run` made; `--from-comms-log` reads what a training run's collectives "
                                   "reached on a machine's NICs from DeepSpeed's comms-logger lines; `--from-log` reads "
                                   "a Megatron-LM, Megatron-DeepSpeed, DeepSpeed or torchtitan log back against the "
                                   "plan it ran, and can record the run for `--from-runs`.")
    k.add_argument("--ranks", type=int, default=2, help="ranks (devices) to measure between (default 2)")
    k.add_argument("--quick", action="store_true", help="fewer sizes and repeats: under a minute on a laptop")
    k.add_argument("--base", default=None, help="machine model to start from (default: the detected local machine)")
    k.add_argument("-o", "--output", default=None,
                   help="YAML to write (default machine_models/local.yaml, which `--machine local` then uses)")
    add_force_option(k, "the -o file and its .measurements.json")
    k.add_argument("--from-runs", nargs="+", metavar="DIR",
                   help="refit from these `exaplan run` output folders instead of measuring; with 4 layouts or more "
                        "also the machine's own step-time band (leave-one-layout-out; the largest error below 9 layouts)")
    k.add_argument("--from-comms-log", metavar="LOG",
                   help="read a training log's DeepSpeed comms-logger lines and print the bus bandwidth its collectives "
                        "reached, as a fraction of one rank's share of the NICs of --base (the machine it ran on): the "
                        "machine file's inter_node_efficiency (calibration/comms_log.py); needs --group-size")
    k.add_argument("--group-size", type=int, metavar="N",
                   help="with --from-comms-log: the logged collectives' group (the data-parallel degree)")
    from calibration.framework_logs import FORMATS, WARMUP_LINES

    fl = k.add_argument_group("a framework's log against its plan (--from-log: calibration/framework_logs.py)")
    fl.add_argument("--from-log", metavar="LOG",
                    help="read a training framework's per-iteration lines (Megatron-LM, Megatron-DeepSpeed, DeepSpeed, "
                         "torchtitan) and print the measured step time, tokens/s, TFLOP/s, MFU and peak memory (median, "
                         "p10, p90) against --plan's prediction and interval; refuses a log whose batch, sequence, "
                         "world size, degrees or model differ from the plan's")
    fl.add_argument("--plan", metavar="PLAN", help="with --from-log: the plan file the run was made from (required)")
    fl.add_argument("--log-format", choices=FORMATS, help="with --from-log: the framework that wrote it (default: detected)")
    fl.add_argument("--warmup", type=int, metavar="N",
                    help=f"with --from-log: iteration lines left out at the start (default {WARMUP_LINES})")
    fl.add_argument("--record", metavar="DIR",
                    help="with --from-log: also write the run as DIR/plan.yaml and DIR/summary.json, a run folder that "
                         "`exaplan calibrate --from-runs DIR ... --base MACHINE` refits from (its step time; the plan "
                         "must be of the log's framework profile)")
    arr = k.add_argument_group("calibrate on arrival (--arrival: calibration/arrival.py)")
    arr.add_argument("--arrival", action="store_true",
                     help="measure, run a short validation sweep of --layouts layouts through `exaplan run`, refit from "
                          "those runs, and leave OUT/fitted.yaml, validation.csv/.png and README.md in --out. On N "
                          "nodes: once per job from the first node, with --launcher")
    arr.add_argument("--out", metavar="DIR", help="with --arrival: output folder (required)")
    arr.add_argument("--layouts", type=int, default=None, help="with --arrival: layouts in the sweep (default 4; from 4 the machine carries its own "
                     "step-time band, which only 9 or more can make narrower than the largest error)")
    arr.add_argument("--steps", type=int, default=None, help="with --arrival: steps per layout (default 8, at least 3)")
    arr.add_argument("--nodes", type=int, default=None, help="with --arrival: nodes (default 1; more need --launcher)")
    arr.add_argument("--model", default=None, help="with --arrival: model of the sweep (default protein-small)")
    arr.add_argument("--launcher", default=None, metavar="CMD",
                     help="with --arrival: the command that starts one process per device on every node, e.g. "
                          "\"srun --ntasks-per-node 8\" or \"mpiexec -n 24 --ppn 12\" (default: EXAPLAN_LAUNCHER; "
                          "none on one node: local ranks)")
    add_json_option(k)


ARRIVAL_ONLY = ("out", "layouts", "steps", "nodes", "model", "launcher")
FROM_LOG_ONLY = ("plan", "log_format", "warmup", "record")


def run(args: argparse.Namespace) -> int:
    from machine_models import PRESET_DIR, detect_local_machine, load_machine

    if args.ranks <= 0:
        raise PlanError("must be a positive number of ranks", field="ranks")
    if args.from_log or any(getattr(args, name) is not None for name in FROM_LOG_ONLY):
        return _from_log(args)
    if args.from_comms_log or args.group_size is not None:
        return _from_comms_log(args)
    if args.arrival:
        return _arrival(args)
    for name in ARRIVAL_ONLY:
        if getattr(args, name) is not None:
            raise PlanError("only with --arrival", field=f"--{name}")
    out = Path(args.output) if args.output else PRESET_DIR / "local.yaml"
    check_target(out, "the fitted machine file (-o)", args.force)  # before minutes of measuring
    if not args.from_runs:
        from calibration.fit_measurements import measurements_path

        check_target(measurements_path(out), "the measurements file", args.force)
    base = load_machine(args.base) if args.base else detect_local_machine(args.ranks)
    if args.from_runs:
        return _from_runs(args, base, out)
    from calibration.fit_measurements import fit, write_calibration
    from calibration.measure import launched_job, measure

    meas = measure(args.ranks, quick=args.quick, progress=not args.json)
    if (launched_job() or {}).get("rank", 0) != 0:
        return 0  # under a launcher (srun, mpiexec) rank 0 alone writes the files: another would find them written
    m = fit(meas, base)
    write_calibration(m, meas, out, force=args.force)
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


def _arrival(args) -> int:
    """`--arrival`: calibration/arrival.py; every option checked before anything is written."""
    from calibration.arrival import Arrival, launcher_from, run_arrival

    if args.from_runs:
        raise PlanError("--arrival makes its own runs; leave out --from-runs", field="--from-runs")
    if args.output:
        raise PlanError("--arrival writes OUT/fitted.yaml: give --out DIR instead", field="--output")
    if not args.out:
        raise PlanError("--arrival needs an output folder", field="--out")
    a = Arrival(Path(args.out), ranks=args.ranks, nodes=1 if args.nodes is None else args.nodes,
                layouts=4 if args.layouts is None else args.layouts, steps=8 if args.steps is None else args.steps,
                model=args.model or "protein-small", base=args.base, quick=args.quick,
                launcher=launcher_from(args.launcher))
    a.check()
    result = run_arrival(a, progress=not args.json)
    if args.json:
        print_json(result)
        return 0
    c = console()
    c.print(f"wrote {a.out}/fitted.yaml, validation.csv" + (", validation.png" if result["plot"] else "")
            + f" and README.md in {result['wall_s']:.0f} s")
    c.print(f"median |step-time error| over {sum(r['status'] == 'ok' for r in result['rows'])} layouts: "
            f"{result['median_abs_step_error']:.1%} from the microbenchmarks, {result['median_abs_fitted_error']:.1%} "
            f"after the refit")
    c.print(f"next: exaplan plan --model M --machine {a.out}/fitted.yaml --nodes N")
    return 0


def _from_runs(args, base, out: Path) -> int:
    """Refit from `exaplan run` folders; show the step-time error on held-out runs before and
    after, then write the model fitted on all."""
    from calibration.fit_runs import refit_to_file

    machine, summary = refit_to_file([Path(d) for d in args.from_runs], base, out, command_line(), args.force)
    if args.json:
        band = None if machine.step_time_band is None else machine.step_time_band.model_dump(mode="json")
        print_json(dict(output=str(out), holdout=summary, step_time_band=band, machine=machine.model_dump(mode="json")))
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
    band = machine.step_time_band
    if band is not None:
        c.print(f"its own step-time band: +/-{band.half_width:.1%} (80% conformal bound of the {band.runs} layouts' "
                f"leave-one-layout-out errors), which the intervals of plans on it take")
    c.print(f"wrote {out} (fitted on all {len(args.from_runs)} runs)")
    return 0


def _from_comms_log(args) -> int:
    """What the logged collectives reached on the NICs of the machine they ran on."""
    from calibration.comms_log import read_rows, suggested_efficiency
    from machine_models import load_machine

    if not args.from_comms_log:
        raise PlanError("only with --from-comms-log", field="--group-size")
    if args.group_size is None:
        raise PlanError("give the logged collectives' group size (the data-parallel degree)", field="--group-size")
    if not args.base:
        raise PlanError("give the machine the log ran on (a preset or a machine file)", field="--base")
    machine = load_machine(args.base)
    rows = read_rows(args.from_comms_log, args.group_size, machine)
    suggested = {op: suggested_efficiency(rows, op) for op in ("all_reduce", "all_gather")}
    if args.json:
        print_json(dict(machine=machine.name, group_size=args.group_size, rows=[vars(r) for r in rows],
                        inter_node_efficiency=suggested["all_reduce"], all_gather_efficiency=suggested["all_gather"]))
        return 0
    from rich.table import Table

    t = Table(title=f"{args.from_comms_log}: collectives of {args.group_size} ranks on {machine.name}")
    for col in ("op", "message", "calls", "median call", "bus GB/s per rank", "of the NIC share"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for r in rows:
        t.add_row(r.op, f"{r.size_bytes / 2**20:,.0f} MiB", str(r.calls), f"{r.median_s * 1e3:,.1f} ms",
                  f"{r.bus_gbyte_s:.2f}", f"{r.nic_fraction:.2f}")
    c = console()
    c.print(t)
    c.print(f"Bus bandwidth of a ring of {args.group_size} (the group given); a message of another group reads wrong: "
            "a tied embedding's allreduce runs between the first and last pipeline stage (2 ranks).",
            markup=False, highlight=False)
    if suggested["all_reduce"] is not None:
        c.print(f"inter_node_efficiency: {suggested['all_reduce']:.2f}  (the fastest of the largest allreduces; "
                f"{machine.name}'s file has {machine.nic_efficiency:.2f})",
                markup=False, highlight=False)
    else:
        c.print("no allreduce of the gradient's size in the log: nothing to suggest", markup=False, highlight=False)
    return 0


def _from_log(args) -> int:
    """A framework's log against the plan it ran; optionally recorded as a run folder."""
    from calibration.framework_logs import WARMUP_LINES, compare, read_log, record_run
    from planner.schema.plan import load_plan

    if not args.from_log:
        name = next(n for n in FROM_LOG_ONLY if getattr(args, n) is not None)
        raise PlanError("only with --from-log", field=f"--{name.replace('_', '-')}")
    for name, given in (("--from-runs", args.from_runs), ("--from-comms-log", args.from_comms_log),
                        ("--arrival", args.arrival), ("--group-size", args.group_size is not None)):
        if given:
            raise PlanError("--from-log reads one log against its plan; leave out " + name, field=name)
    if not args.plan:
        raise PlanError("give the plan file the run was made from", field="--plan")
    if not Path(args.plan).is_file():
        raise PlanError(f"no such file: {args.plan}", field="--plan")
    plan = load_plan(args.plan)
    log = read_log(args.from_log, args.log_format)
    result = compare(log, plan, WARMUP_LINES if args.warmup is None else args.warmup, plan_path=args.plan)
    if args.record:
        result["recorded"] = str(record_run(result, plan, args.plan, args.record))
    if args.json:
        print_json(result)
        return 0
    _print_from_log(result, plan)
    return 0


def _print_from_log(result: dict, plan) -> None:
    from rich.table import Table

    def fmt(x, unit):
        if x is None:
            return ""
        if unit == "":
            return f"{x:.1%}"
        return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"

    t = Table(title=f"{result['log']} ({result['format']}, steps {result['first_step']}-{result['last_step']}: "
                    f"{result['steps_measured']} lines after {result['warmup_lines_excluded']} of warm-up) against "
                    f"{result['plan']}")
    for col in ("", "median", "p10", "p90", "predicted", "interval", "inside", "error"):
        t.add_column(col, justify="left" if col == "" else "right", no_wrap=col == "")
    for r in result["rows"]:
        u = r["unit"]
        name = r["what"] + (f" ({u})" if u and u not in r["what"] else "")
        interval = "" if r["interval"] is None else f"{fmt(r['interval'][0], u)} - {fmt(r['interval'][1], u)}"
        inside = {None: "", True: "yes", False: "no"}[r["inside"]]
        err = "" if r["error"] is None else f"{r['error']:+.1%}"
        t.add_row(name, fmt(r["median"], u), fmt(r["p10"], u), fmt(r["p90"], u), fmt(r["predicted"], u), interval,
                  inside, err)
    c = console()
    c.print(t)
    for r in result["rows"]:
        c.print(f"{r['what']}: {r['source']}", markup=False)
    if result["checked"]:
        c.print("the log's statements equal the plan's: " + "; ".join(
            f"{x['description']} {x['log']} (line {x['line']})" for x in result["checked"]), markup=False)
    if result["repeated_lines"]:
        c.print(f"{result['repeated_lines']} iteration lines repeat a step already read (other ranks): the first kept",
                markup=False)
    for note in result["notes"]:
        c.print("note: " + note, markup=False)
    if result["uncertainty_basis"]:
        c.print(f"intervals: {result['uncertainty_basis']}", markup=False)
    if result.get("recorded"):
        c.print(f"recorded {result['recorded']}/summary.json and plan.yaml; refit with: exaplan calibrate --from-runs "
                f"{result['recorded']} ... --base {plan.machine.name} -o fitted.yaml", markup=False)
