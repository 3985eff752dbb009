"""exaplan: plan, estimate and explain parallel layouts for training protein language models.

Every subcommand takes `--json` for scripts. Bad input: one message naming the field or the
reason on stderr, exit code 2, nothing written. Heavy modules are imported inside each
subcommand so that `exaplan --help` and `exaplan plan` start fast (and never import torch).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from planner.schema.errors import PlanError

EPILOG = """examples:
  exaplan plan --model protein-3.5b --machine aurora --nodes 3200
  exaplan plan --model protein-70b --machine frontier --nodes 64 --global-batch 512 --top 10 -o plan.yaml
  exaplan plan --model protein-7b --machine dgx-h100 --nodes 16 --set machine.nic_gbit_s=800   # what if NICs were 2x?
  exaplan estimate --model protein-3.5b --machine frontier --nodes 8 --tp 1 --pp 1 --dp 64 --mbs 8 \\
      --global-batch 512 --shard zero1 --recompute none
  exaplan explain plan.yaml
  exaplan capacity --model protein-3.5b --machine frontier --tokens 1e12 --deadline-days 7
  exaplan validate --published
  exaplan schema plan
"""

SET_HELP = ("override a spec field by dotted path, repeatable: model.layers=96, model.vocab_size=51200, "
            "machine.nics_per_node=4, machine.nic_gbit_s=400 (per NIC per direction, Gbit/s), "
            "machine.overlap.dp=0.5 ... ")


def _common(p: argparse.ArgumentParser, nodes_required: bool = False) -> None:
    p.add_argument("--model", required=True, help="preset (protein-3.5b, protein-7b, protein-70b, protein-small, protein-tiny) or a ModelSpec YAML file")
    p.add_argument("--machine", required=True, help="preset (aurora, alps, frontier, leonardo, pdx, dgx-a100-80gb, dgx-h100, local) or a MachineModel YAML file")
    p.add_argument("--nodes", type=int, default=None if nodes_required else 1, required=nodes_required, help="nodes to use (default 1)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step, held fixed (default: 8 per rank, as in the seed runs)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"], help="compute precision (default: bf16 on GPUs, fp32 on CPUs); accumulation and reduction are fp32")
    p.add_argument("--token-budget", type=float, help="tokens to train on, for time-to-train (default 1e9)")
    p.add_argument("--workload", choices=["pretrain", "dpo"], default="pretrain",
                   help="pretrain (next-token loss), or dpo: preference tuning on (chosen, rejected) pairs; the global "
                        "batch counts pairs, both sequences run through the policy, plus a frozen reference model")
    p.add_argument("--reference", choices=["in-step", "precomputed"], default="in-step",
                   help="dpo: the reference model runs its forward passes in every step and is held in memory "
                        "(in-step, default), or its log-probabilities were precomputed once (exaplan run --precompute-reference)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="exaplan", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Config compiler for large-scale training of protein language models: searches every legal "
                    "parallel layout (data, tensor+sequence, pipeline, context, ZeRO/FSDP/HSDP sharding, micro-batching, "
                    "recompute, collective algorithms) with an analytical cost model and writes a plan file.")
    from planner import __version__

    ap.add_argument("--version", action="version", version=f"exaplan {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("plan", help="search all legal layouts, print the best, write the best plan",
                       description="Search every legal layout of the job on the machine, rank by predicted step time "
                                   "(then memory), print the top K and why the best won, and write the best plan.")
    _common(p)
    p.add_argument("--top", type=int, default=5, help="layouts to show (default 5)")
    p.add_argument("-o", "--output", default="plan.yaml", help="plan file to write (default plan.yaml; .json for JSON)")
    p.add_argument("--no-write", action="store_true", help="print only; write no plan file")

    e = sub.add_parser("estimate", help="predict one given layout",
                       description="Predict step time, throughput and memory of one layout you give.")
    _common(e, nodes_required=True)
    e.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    e.add_argument("--pp", type=int, default=1, help="pipeline stages")
    e.add_argument("--dp", type=int, required=True, help="data-parallel degree (replicas x shards)")
    e.add_argument("--cp", type=int, default=1, help="context-parallel degree")
    e.add_argument("--mbs", type=int, required=True, help="micro-batch size (sequences)")
    e.add_argument("--shard", choices=["none", "zero1", "zero2", "fsdp", "fsdp-grad-op", "hsdp"], default="none", help="sharding of model states over dp")
    e.add_argument("--shard-group", type=int, help="hsdp shard-group size (default: the data-parallel ranks of one node)")
    e.add_argument("--recompute", choices=["none", "selective", "full"], default="none", help="activation recompute")
    e.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages per rank (interleaved 1F1B when > 1)")
    e.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b"], help="pipeline schedule (default 1f1b, or interleaved with --vpp > 1)")
    e.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallelism (default on when tp > 1)")
    e.add_argument("-o", "--output", help="also write this layout as a plan file")

    x = sub.add_parser("explain", help="readable report of a plan file")
    x.add_argument("plan", help="plan file (YAML or JSON)")
    x.add_argument("--json", action="store_true", help="print the checked plan as JSON")

    s = sub.add_parser("schema", help="print the JSON schema of the specs and the plan")
    s.add_argument("which", nargs="?", choices=["model", "machine", "job", "plan", "all"], default="all")

    v = sub.add_parser("validate", help="compare predictions with published training runs",
                       description="Predict every published run in calibration-runs.md and print predicted vs published "
                                   "with the error, its median and max, and leave-one-out errors.")
    which = v.add_mutually_exclusive_group(required=True)
    which.add_argument("--published", action="store_true", help="check against the published runs")
    which.add_argument("--local", action="store_true",
                       help="run at least 10 layouts on this machine through `exaplan run` and compare measured with predicted "
                            "(CSV, JSON, PNG in --out)")
    v.add_argument("--model", default="protein-small", help="with --local: the model (default protein-small)")
    v.add_argument("--machine", default="local", help="with --local: the machine model to predict with (default local)")
    v.add_argument("--ranks", type=int, default=2, help="with --local: ranks (default 2)")
    v.add_argument("--steps", type=int, default=8, help="with --local: steps per layout (default 8)")
    v.add_argument("--repeats", type=int, default=1,
                   help="with --local: timing runs per layout, in rounds over all layouts; the median is kept (default 1)")
    v.add_argument("--no-memory-runs", action="store_true",
                   help="with --local: take memory from the timing runs' RSS instead of a separate short run with a "
                        "fixed malloc mmap threshold (whose RSS follows the live tensors)")
    v.add_argument("--out", default="runs/validate-local", help="with --local: output folder")
    v.add_argument("--refit", action="store_true", help="refit the per-device-kind and per-framework figures and save them in machine_models/device_kinds.yaml")
    v.add_argument("--loo", action="store_true", help="also leave-one-out errors: refit without each run and predict it (about a minute)")
    v.add_argument("--json", action="store_true")

    k = sub.add_parser("calibrate", help="measure this machine (matmul, memory, collectives) and write its machine model",
                       description="Measure matmul throughput over shapes, memory bandwidth and collectives (allreduce, "
                                   "reduce-scatter, all-gather, point-to-point) between N ranks with this machine's backend, "
                                   "fit the machine model's figures, and write a MachineModel YAML (raw measurements beside "
                                   "it). `--from-runs` refits the efficiency figures from runs that `exaplan run` made.")
    k.add_argument("--ranks", type=int, default=2, help="ranks (devices) to measure between (default 2)")
    k.add_argument("--quick", action="store_true", help="fewer sizes and repeats: under a minute on a laptop")
    k.add_argument("--base", default=None, help="machine model to start from (default: the detected local machine)")
    k.add_argument("-o", "--output", default=None, help="YAML to write (default machine_models/local.yaml, which `--machine local` then uses)")
    k.add_argument("--from-runs", nargs="+", metavar="DIR", help="refit from these `exaplan run` output folders instead of measuring")
    k.add_argument("--json", action="store_true")

    c = sub.add_parser("capacity", help="time-to-train against node count; the fewest nodes that meet a deadline",
                       description="Search the best layout at each node count and report tokens/s and days to train "
                                   "the token budget; with --deadline-days, the fewest nodes that meet it.")
    c.add_argument("--model", required=True, help="preset or ModelSpec YAML file")
    c.add_argument("--machine", required=True, help="preset or MachineModel YAML file")
    c.add_argument("--tokens", type=float, required=True, help="tokens to train on")
    c.add_argument("--deadline-days", type=float, help="report the fewest nodes that finish within this many days")
    c.add_argument("--nodes", help="comma-separated node counts (default: powers of two up to the machine's size)")
    c.add_argument("--global-batch", type=int, help="hold this global batch at every size (default: 8 sequences per rank, "
                                                      "i.e. weak scaling as in the seed runs)")
    c.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    c.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    c.add_argument("--workload", choices=["pretrain", "dpo"], default="pretrain",
                   help="dpo: the global batch counts pairs (default 4 per rank), plus the frozen reference model")
    c.add_argument("--reference", choices=["in-step", "precomputed"], default="in-step",
                   help="dpo: the reference model runs in every step, or its log-probabilities were precomputed")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP)
    c.add_argument("--json", action="store_true")

    r = sub.add_parser("run", help="train the protein LM with a plan (torch.distributed; `exaplan run --help`)", add_help=False)
    r.add_argument("rest", nargs=argparse.REMAINDER)
    d = sub.add_parser("data", help="prepare FASTA into token shards (`exaplan data prepare --help`)", add_help=False)
    d.add_argument("rest", nargs=argparse.REMAINDER)

    ls = sub.add_parser("list", help="list model and machine presets")
    ls.add_argument("--json", action="store_true")
    return ap


# ------------------------------------------------------------------------------------------


def _inputs(args, world_nodes: int | None = None):
    from machine_models import load_machine
    from planner.inputs import apply_overrides, check_overrides, load_model, make_job, parse_override

    overrides = [parse_override(o) for o in args.overrides]
    check_overrides(overrides, ("model", "machine"))
    model = apply_overrides(load_model(args.model), "model", overrides)
    machine = apply_overrides(load_machine(args.machine), "machine", overrides)
    if args.nodes is not None and args.nodes <= 0:
        raise PlanError("must be a positive number of nodes", field="nodes")
    world = args.nodes * machine.devices_per_node
    job = make_job(model, machine, world, args.global_batch, args.seq_len, args.precision, args.token_budget,
                   args.workload, args.reference)
    return model, machine, job


def _console(args):
    from rich.console import Console

    import shutil

    width = shutil.get_terminal_size((140, 40)).columns if sys.stdout.isatty() else 140
    return Console(stderr=False, highlight=False, width=max(width, 100))


def cmd_plan(args) -> int:
    from planner.emit import build_plan
    from planner.schema.plan import write_plan
    from planner.report import breakdown_table, layout_label, memory_table, top_table, why_best
    from planner.search.search import search

    if args.top <= 0:
        raise PlanError("must be at least 1", field="top")
    model, machine, job = _inputs(args)
    console = _console(args)
    if args.json:
        result = search(model, machine, job, args.nodes, top_k=args.top)
    else:
        with console.status(f"searching layouts of {model.name} on {args.nodes} x {machine.name} ..."):
            result = search(model, machine, job, args.nodes, top_k=args.top)
    lay, ev = result.layouts, result.evaluation
    plan = build_plan(model, machine, job, args.nodes, lay, ev, 0, command=shlex.join(["exaplan", *sys.argv[1:]]))
    if not args.no_write:
        write_plan(plan, args.output)
    stats = dict(legal_layouts=result.total_layouts, layouts_scored=result.layouts_scored, fitting=result.fitting,
                 search_seconds=round(result.seconds, 4), layouts_per_second=round(result.layouts_scored / max(result.seconds, 1e-9)))
    if args.json:
        out = dict(search=stats, world_size=result.world, global_batch=job.global_batch,
                   top=[dict(layout=layout_label(lay, i), **_estimate_json(ev, i)) for i in range(len(lay))],
                   why=why_best(lay, ev), plan_file=None if args.no_write else args.output, plan=plan.model_dump(mode="json"))
        print(json.dumps(out, indent=2))
        return 0
    console.print(f"[b]{model.name}[/b] on {args.nodes} x {machine.name} = {result.world:,} ranks; global batch "
                  f"{job.global_batch:,} x {job.seq_len} tokens, {job.precision.value}")
    console.print(f"searched {result.total_layouts:,} legal layouts ({result.layouts_scored:,} with collective-algorithm "
                  f"choices) in {result.seconds:.3f} s ({stats['layouts_per_second']:,.0f} /s); {result.fitting:,} fit in "
                  f"{machine.device_memory_gib:g} GiB per device")
    console.print(top_table(lay, ev, f"Top {len(lay)} layouts"))
    console.print(why_best(lay, ev))
    console.print(breakdown_table(ev, 0))
    console.print(memory_table(ev, 0, machine.device_memory_gib))
    env = " ".join(f"{k}={v!r}" for k, v in plan.collectives.env.items())
    if env:
        console.print(f"collective settings: {env}")
    console.print(f"time to train {job.token_budget:.3g} tokens: {ev.time_to_train_days[0]:.2f} days")
    if not args.no_write:
        console.print(f"wrote {args.output}  (run `exaplan explain {args.output}` for the full report)")
    return 0


def _estimate_json(ev, i: int) -> dict:
    gib = 2.0**30
    return dict(
        step_time_s=float(ev.step_time_s[i]), tokens_per_s=float(ev.tokens_per_s[i]),
        model_tflops_per_device=float(ev.model_tflops_per_device[i]),
        hardware_tflops_per_device=float(ev.hardware_tflops_per_device[i]), mfu=float(ev.mfu[i]),
        memory_gib_per_device=float(ev.memory.total[i] / gib), fits=bool(ev.memory.fits[i]),
        time_to_train_days=float(ev.time_to_train_days[i]),
        breakdown=dict(
            compute_s=float(ev.compute_s[i]), bubble_s=float(ev.bubble_s[i]), optimizer_s=float(ev.optimizer_s[i]),
            exposed_dp_s=float(ev.dp_s[i]), exposed_tp_s=float(ev.tp_s[i]), exposed_pp_s=float(ev.pp_s[i]),
            exposed_cp_s=float(ev.cp_s[i]),
            parameters_gib=float(ev.memory.parameters[i] / gib), gradients_gib=float(ev.memory.gradients[i] / gib),
            optimizer_gib=float(ev.memory.optimizer[i] / gib), activations_gib=float(ev.memory.activations[i] / gib),
            buffers_gib=float(ev.memory.buffers[i] / gib), reserve_gib=float(ev.memory.reserve[i] / gib),
        ),
    )


def _layout_from_args(args, machine):
    """The layout `exaplan estimate` is given (hsdp's shard group defaults to the data-parallel
    ranks of one node; the accumulation steps follow from the global batch)."""
    from planner.cost.layout import Layouts, default_shard_group

    group = args.shard_group
    if args.shard == "hsdp" and group is None:
        group = default_shard_group(args.dp, machine.devices_per_node // max(args.tp * args.cp, 1))
    gas = max(args.global_batch // max(args.dp * args.mbs, 1), 1) if args.global_batch else 1
    return Layouts.one(dp=args.dp, mbs=args.mbs, gas=gas, tp=args.tp, pp=args.pp, cp=args.cp, sharding=args.shard,
                       shard_group=group, recompute=args.recompute, schedule=args.schedule, vpp=args.vpp, sp=args.sp)


def cmd_estimate(args) -> int:
    from planner.cost.step import evaluate
    from planner.emit import build_plan
    from planner.schema.plan import write_plan
    from planner.cost.flops import step_flops
    from planner.report import breakdown_table, flops_text, layout_label, memory_table
    from planner.search.space import layout_problems

    for name in ("tp", "pp", "dp", "cp", "mbs", "vpp"):
        if getattr(args, name) <= 0:
            raise PlanError("must be a positive integer", field=name)
    if args.global_batch is None:
        args.global_batch = args.dp * args.mbs
    model, machine, job = _inputs(args)
    lay = _layout_from_args(args, machine)
    problems = layout_problems(model, job, args.nodes * machine.devices_per_node, lay)
    if problems:
        raise PlanError("; ".join(problems))
    ev = evaluate(model, machine, job, lay)
    if args.output:
        plan = build_plan(model, machine, job, args.nodes, lay, ev, 0, command=shlex.join(["exaplan", *sys.argv[1:]]))
        write_plan(plan, args.output)
    if args.json:
        print(json.dumps(dict(layout=layout_label(lay, 0), **_estimate_json(ev, 0),
                              flops_per_step=step_flops(model, job), workload=job.workload.value), indent=2))
        return 0
    console = _console(args)
    console.print(f"[b]{model.name}[/b] on {args.nodes} x {machine.name}: {layout_label(lay, 0)}")
    console.print(f"{ev.tokens_per_s[0]:,.0f} tokens/s, {ev.model_tflops_per_device[0]:.1f} model TFLOP/s per device "
                  f"({ev.hardware_tflops_per_device[0]:.1f} hardware), MFU {ev.mfu[0]:.1%}, time to train "
                  f"{job.token_budget:.3g} tokens {ev.time_to_train_days[0]:.2f} days")
    console.print(flops_text(model, job, ev, 0))
    console.print(breakdown_table(ev, 0))
    console.print(memory_table(ev, 0, machine.device_memory_gib))
    if args.output:
        console.print(f"wrote {args.output}")
    return 0


def cmd_explain(args) -> int:
    from planner.schema.plan import load_plan
    from planner.report import explain_plan

    plan = load_plan(args.plan)
    if args.json:
        print(json.dumps(plan.model_dump(mode="json"), indent=2))
        return 0
    explain_plan(plan, _console(args))
    return 0


def cmd_schema(args) -> int:
    from planner.schema.plan import Plan
    from planner.schema.specs import MachineModel, ModelSpec, TrainingJob

    classes = {"model": ModelSpec, "machine": MachineModel, "job": TrainingJob, "plan": Plan}
    chosen = classes if args.which == "all" else {args.which: classes[args.which]}
    out = {k: c.model_json_schema() for k, c in chosen.items()}
    print(json.dumps(out if args.which == "all" else out[args.which], indent=2))
    return 0




def cmd_capacity(args) -> int:
    from dataclasses import asdict

    from planner.capacity import default_node_counts, smallest_meeting, sweep
    from planner.inputs import make_job
    from planner.report import capacity_table

    if args.tokens <= 0:
        raise PlanError("must be positive", field="tokens")
    if args.deadline_days is not None and args.deadline_days <= 0:
        raise PlanError("must be positive", field="deadline-days")
    args.nodes_list, args.nodes, args.token_budget = args.nodes, 1, args.tokens
    model, machine, _ = _inputs(args)
    if args.nodes_list:
        try:
            counts = [int(x) for x in args.nodes_list.split(",") if x.strip()]
        except ValueError:
            raise PlanError(f"expected comma-separated integers, got {args.nodes_list!r}", field="nodes") from None
        bad = [n for n in counts if n <= 0 or n > machine.nodes]
        if not counts or bad:
            raise PlanError(f"node counts must be between 1 and {machine.nodes} ({machine.name}); got {bad or 'none'}", field="nodes")
    else:
        counts = default_node_counts(machine)

    def job_for(world: int):
        return make_job(model, machine, world, args.global_batch, args.seq_len, args.precision, args.tokens,
                        args.workload, args.reference)

    if args.json:
        rows = sweep(model, machine, job_for, counts)
    else:
        from rich.progress import Progress

        console = _console(args)
        rows = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("searching", total=len(counts))
            for n in counts:
                progress.update(task, description=f"searching {n} nodes")
                rows += sweep(model, machine, job_for, [n])
                progress.advance(task)
    best = smallest_meeting(rows, args.deadline_days) if args.deadline_days else None
    if args.json:
        print(json.dumps(dict(rows=[asdict(r) for r in rows], deadline_days=args.deadline_days,
                              fewest_nodes=best.nodes if best else None), indent=2))
        return 0
    console.print(capacity_table(rows, model.name, machine.name, args.tokens, best))
    if args.deadline_days:
        if best:
            console.print(f"fewest nodes that train {args.tokens:.3g} tokens within {args.deadline_days:g} days: "
                          f"[b]{best.nodes}[/b] ({best.days:.2f} days, {best.layout})")
        else:
            console.print(f"no node count tried meets {args.deadline_days:g} days")
    return 0


def cmd_run(args) -> int:
    """Under a launcher: run as one rank. Otherwise start the plan's ranks through torchrun."""
    from runtime import launch, trainer

    targs = trainer.parse_args(args.rest)  # --help and usage errors exit here (code 0 / 2)
    if launch.detect() is not None:
        return trainer.main(args.rest)
    from planner.schema.plan import load_plan

    plan = load_plan(targs.plan)
    check_run_inputs(targs, plan)
    return launch.spawn_local(plan, args.rest)


def check_run_inputs(targs, plan=None) -> None:
    """What can be refused before any rank starts: steps, the output folder, the data (the
    pretraining sequences; a dpo plan trains on --pairs, which the trainer checks)."""
    from pathlib import Path

    from runtime import checkpoint
    from runtime.dataprep.cache import ensure_prepared

    if targs.steps <= 0:
        raise PlanError("must be a positive number of steps", field="steps")
    ckpts = Path(targs.out) / "checkpoints"
    if targs.resume and checkpoint.latest(ckpts) is None:
        raise PlanError(f"no complete checkpoint in {ckpts} to resume from", field="--resume")
    if not targs.resume and checkpoint.latest(ckpts) is not None:
        raise PlanError(f"{ckpts} already holds checkpoints: pass --resume to continue, or choose another --out", field="--out")
    # Prepare (or check) the data here, once, so that bad input fails before the ranks start.
    if plan is None or plan.job.workload.value != "dpo":
        ensure_prepared(targs.data, Path(targs.out) / "data", rank=0)


def cmd_data(args) -> int:
    from runtime.dataprep.cli import main as data_main

    return data_main(args.rest)


def cmd_list(args) -> int:
    from machine_models import list_machines
    from planner.cost.flops import total_params
    from planner.presets import MODEL_PRESETS

    if args.json:
        print(json.dumps(dict(models=list(MODEL_PRESETS), machines=list_machines())))
        return 0
    console = _console(args)
    for name, m in MODEL_PRESETS.items():
        console.print(f"model   {name:15s} {total_params(m) / 1e6:9.1f} M parameters, {m.layers} x {m.hidden}, heads {m.heads}/{m.kv_heads}, seq {m.seq_len}")
    for name in list_machines():
        console.print(f"machine {name}")
    return 0


from planner.cli_machines import cmd_calibrate, cmd_validate  # noqa: E402

COMMANDS = {"plan": cmd_plan, "estimate": cmd_estimate, "explain": cmd_explain, "schema": cmd_schema,
            "validate": cmd_validate, "capacity": cmd_capacity, "calibrate": cmd_calibrate, "run": cmd_run, "data": cmd_data, "list": cmd_list}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except PlanError as e:
        print(f"exaplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
