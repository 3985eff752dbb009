"""`exaplan estimate`: the predicted cost of one layout you give (and optionally its plan)."""

from __future__ import annotations

import argparse

from cli.common import (RECOMPUTE_HELP, RECOMPUTES, add_force_option, add_job_options, command_line, machine_file_of, console, evaluation_json,
                        load_inputs, print_json)
from planner.schema.errors import PlanError
from planner.schema.files import check_target


def add_parser(sub) -> None:
    e = sub.add_parser("estimate", help="predict one given layout",
                       description="Predict step time, throughput and memory of one layout you give.")
    add_job_options(e, nodes_required=True)
    e.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    e.add_argument("--pp", type=int, default=1, help="pipeline stages")
    e.add_argument("--dp", type=int, required=True, help="data-parallel degree (replicas x shards)")
    e.add_argument("--cp", type=int, default=1, help="context-parallel degree")
    e.add_argument("--mbs", type=int, required=True, help="micro-batch size (sequences)")
    e.add_argument("--shard", choices=["none", "zero1", "zero2", "fsdp", "fsdp-grad-op", "hsdp"], default="none",
                   help="sharding of model states over dp")
    e.add_argument("--shard-group", type=int, help="hsdp shard-group size (default: the data-parallel ranks of one node)")
    e.add_argument("--recompute", choices=RECOMPUTES, default="none", help=RECOMPUTE_HELP)
    e.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages per rank (interleaved 1F1B when > 1)")
    e.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b"],
                   help="pipeline schedule (default 1f1b, or interleaved with --vpp > 1)")
    e.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism (default on when tp > 1)")
    e.add_argument("-o", "--output", help="also write this layout as a plan file")
    add_force_option(e, "the plan file (-o)")


def layout_of(args, machine):
    """The layout the options give (hsdp's shard group defaults to the data-parallel ranks of
    one node; the accumulation steps follow from the global batch)."""
    from planner.cost.layout import Layouts, default_shard_group

    group = args.shard_group
    if args.shard == "hsdp" and group is None:
        group = default_shard_group(args.dp, machine.devices_per_node // max(args.tp * args.cp, 1))
    gas = max(args.global_batch // max(args.dp * args.mbs, 1), 1) if args.global_batch else 1
    return Layouts.one(dp=args.dp, mbs=args.mbs, gas=gas, tp=args.tp, pp=args.pp, cp=args.cp, sharding=args.shard,
                       shard_group=group, recompute=args.recompute, schedule=args.schedule, vpp=args.vpp, sp=args.sp)


def run(args: argparse.Namespace) -> int:
    from machine_models.uncertainty import uncertainty_of
    from planner.cost.flops import step_flops
    from planner.report import uncertainty_line
    from planner.cost.layout import framework_problems
    from planner.cost.step import evaluate
    from planner.emit import build_plan, layout_point
    from planner.report import layout_label
    from planner.schema.plan import write_plan
    from planner.search.space import layout_problems

    if args.output:
        check_target(args.output, "the plan file (-o)", args.force)
    for name in ("tp", "pp", "dp", "cp", "mbs", "vpp"):
        if getattr(args, name) <= 0:
            raise PlanError("must be a positive integer", field=name)
    if args.global_batch is None:
        args.global_batch = args.dp * args.mbs
    model, machine, job = load_inputs(args)
    lay = layout_of(args, machine)
    problems = layout_problems(model, job, args.nodes * machine.devices_per_node, lay)
    problems += framework_problems(job.framework, lay, layers=model.layers, ranks_per_node=machine.devices_per_node,
                                   device_name=machine.device_name, tied_embeddings=model.tied_embeddings,
                                   workload=job.workload.value)
    if problems:
        raise PlanError("; ".join(problems))
    ev = evaluate(model, machine, job, lay)
    if args.output:
        write_plan(build_plan(model, machine, job, args.nodes, lay, ev, 0, command=command_line(),
                              machine_file=machine_file_of(args)), args.output,
                   force=args.force)
    u = uncertainty_of(machine, job.framework, point=layout_point(model, job, lay, 0))
    if args.json:
        print_json(dict(layout=layout_label(lay, 0), **evaluation_json(ev, 0, u), flops_per_step=step_flops(model, job),
                        workload=job.workload.value))
        return 0
    _print(args, model, machine, job, lay, ev)
    console().print(uncertainty_line(u))
    return 0


def _print(args, model, machine, job, lay, ev) -> None:
    from planner.report import breakdown_table, flops_text, fmt_rate, layout_label, memory_table

    out = console()
    out.print(f"[b]{model.name}[/b] on {args.nodes} x {machine.name} with {job.framework.name}: {layout_label(lay, 0)}")
    out.print(f"{ev.tokens_per_s[0]:,.0f} tokens/s, {fmt_rate(ev.model_tflops_per_device[0])} model TFLOP/s per device "
              f"({fmt_rate(ev.hardware_tflops_per_device[0])} hardware), MFU {ev.mfu[0]:.1%}, time to train "
              f"{job.token_budget:.3g} tokens {ev.time_to_train_days[0]:.2f} days")
    out.print(flops_text(model, job, ev, 0))
    out.print(breakdown_table(ev, 0))
    out.print(memory_table(ev, 0, machine.device_memory_gib))
    if args.output:
        out.print(f"wrote {args.output}")
