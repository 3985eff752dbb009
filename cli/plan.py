"""`exaplan plan`: search every legal layout, print the best, write the best plan."""

from __future__ import annotations

import argparse

from cli.common import (RECOMPUTE_HELP, RECOMPUTES, add_force_option, add_job_options, command_line, machine_file_of, console, evaluation_json,
                        load_inputs, print_json)
from planner.schema.errors import PlanError
from planner.schema.files import check_target


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="search all legal layouts, print the best, write the best plan",
                       description="Search every legal layout of the job on the machine, rank by predicted step time "
                                   "(then memory), print the top K and why the best won, and write the best plan.")
    add_job_options(p)
    p.set_defaults(framework=None)  # None: exaplan's, or jax's with --backend jax (an explicit one is checked)
    p.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    p.add_argument("--top", type=int, default=5, help="layouts to show (default 5)")
    p.add_argument("-o", "--output", default="plan.yaml", help="plan file to write (default plan.yaml; .json for JSON)")
    p.add_argument("--no-write", action="store_true", help="print only; write no plan file")
    add_force_option(p, "the plan file (-o) and the --export folder's files")
    p.add_argument("--export", metavar="DIR", help="also write the plan as --framework runs it into DIR (exaplan export: "
                   "megatron -> Megatron-LM, deepspeed -> Megatron-DeepSpeed, torchtitan, maxtext; --export-to picks another)")
    p.add_argument("--export-to", metavar="TARGET", help="the export target of --export when not the framework's own "
                   "(e.g. deepspeed: a ds_config.json for your own model)")
    p.add_argument("--check", action="store_true",
                   help="before writing, run the best layout's first and last rank at full size on a fake process "
                        "group (exaplan check: a training step under fake tensors, torch's memory against the "
                        "planner's); a layout that fails or disagrees gives way to the next of the top K; exit 1, "
                        "nothing written, when none passes (exaplan's own runtime: --framework exaplan, --backend torch)")
    p.add_argument("--draws", type=_draws, default=200,
                   help="draws of the fitted figures within their uncertainty to test whether the first choice stays "
                        f"first (default 200; 0: skip; at most {MAX_DRAWS:,}, about 30 s)")
    add_pin_options(p)


MAX_DRAWS = 10_000  # 2,000 already pin how often #1 stays first to +/-1%; each draw re-scores the finalists (~3 ms)


def _draws(text: str) -> int:
    if not text.strip().isdigit() or int(text) > MAX_DRAWS:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a whole number from 0 to {MAX_DRAWS:,} (default 200)")
    return int(text)


BACKENDS = ("torch", "jax")
BACKEND_HELP = ("the runtime the plan is for, written into it as `backend:`: torch (exaplan's torch runtime; the "
                "default, and without the option the plan names none, as plans did before the JAX backend) or jax "
                "(the JAX backend, jaxrt/): jax searches only the layouts the JAX backend runs (pp = 1, cp = 1, bf16 "
                "or fp32, pretrain; every sharding, tensor parallelism with or without sequence parallelism, every "
                "recompute) with the jax framework profile of machine_models/frameworks.yaml (--framework, if given, "
                "must be jax)")


def backend_framework(args: argparse.Namespace) -> str | None:
    """The framework profile --backend and --framework name together (None: exaplan's);
    PlanError naming the option for a combination the backend cannot run."""
    if args.backend != "jax":
        return args.framework
    if args.framework not in (None, "jax"):
        raise PlanError(f"--backend jax plans with the jax profile, not {args.framework!r} (drop --framework or give "
                        f"--framework jax)", field="framework")
    if args.workload != "pretrain":
        raise PlanError(f"--backend jax runs pretrain only, not {args.workload}", field="workload")
    return "jax"


def add_pin_options(p) -> None:
    """`estimate`'s layout options, each optional: what is given is kept, the rest searched."""
    g = p.add_argument_group("pinned axes", "keep what you give (every layout shown has it) and search the rest")
    g.add_argument("--tp", type=int, help="tensor-parallel degree")
    g.add_argument("--pp", type=int, help="pipeline stages")
    g.add_argument("--dp", type=int, help="data-parallel degree (replicas x shards)")
    g.add_argument("--cp", type=int, help="context-parallel degree")
    g.add_argument("--mbs", type=int, help="micro-batch size (sequences)")
    g.add_argument("--shard", choices=["none", "zero1", "zero2", "fsdp", "fsdp-grad-op", "hsdp"],
                   help="sharding of model states over dp")
    g.add_argument("--shard-group", type=int, help="hsdp shard-group size (with --shard hsdp)")
    g.add_argument("--recompute", choices=RECOMPUTES, help=RECOMPUTE_HELP)
    g.add_argument("--vpp", type=int, help="virtual pipeline stages per rank (interleaved 1F1B when > 1)")
    g.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b"], help="pipeline schedule")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallelism")


def pins_of(args: argparse.Namespace):
    """The Pins the options give (PlanError naming the option for a bad value)."""
    from planner.search.pins import Pins

    return Pins(tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, mbs=args.mbs, shard=args.shard,
                shard_group=args.shard_group, vpp=args.vpp, schedule=args.schedule, recompute=args.recompute, sp=args.sp)


def run(args: argparse.Namespace) -> int:
    from machine_models.uncertainty import uncertainty_of
    from planner.emit import build_plan, layout_point
    from planner.report import layout_label, robustness_line, uncertainty_line, why_best
    from planner.schema.plan import write_plan
    from planner.search.search import search

    if args.top <= 0:
        raise PlanError("must be at least 1", field="top")
    if not args.no_write:  # refused before the search, not after it
        check_target(args.output, "the plan file (-o)", args.force)
    pins = pins_of(args)
    args.framework = backend_framework(args)
    model, machine, job = load_inputs(args)
    out = None if args.json else console()
    if out is None:
        result = search(model, machine, job, args.nodes, top_k=args.top, pins=pins)
    else:
        with out.status(f"searching layouts of {model.name} on {args.nodes} x {machine.name} ..."):
            result = search(model, machine, job, args.nodes, top_k=args.top, pins=pins)
    lay, ev = result.layouts, result.evaluation
    checked = None
    if args.check:
        checked = _check_layouts(model, machine, job, args, lay, ev, out)
        if checked["chosen"] is None:
            if args.json:
                print_json(dict(check=checked, plan_file=None))
            return 1
    chosen = checked["chosen"] if checked else 0
    plan = build_plan(model, machine, job, args.nodes, lay, ev, chosen, command=command_line(), backend=args.backend,
                      machine_file=machine_file_of(args))
    exported = _export(plan, args) if args.export else None  # refused before anything is written
    if exported is not None:
        from export.base import check_folder

        check_folder(exported, args.export, args.force)
    if not args.no_write:
        write_plan(plan, args.output, force=args.force)
    if exported is not None:
        from export import write_export

        write_export(exported, args.export, None if args.no_write else args.output, args.force)
    u = uncertainty_of(machine, job.framework, point=layout_point(model, job, lay, chosen))
    robust, robust_s = _robustness(model, machine, job, result, u, args.draws)
    stats = dict(legal_layouts=result.total_layouts, layouts_scored=result.layouts_scored, fitting=result.fitting,
                 search_seconds=round(result.seconds, 4), robustness_seconds=round(robust_s, 4),
                 layouts_per_second=round(result.layouts_scored / max(result.seconds, 1e-9)))
    if args.json:
        # "pins" only when some are given: the key set of an unpinned search stays as it was.
        pinned = dict(pins=pins.as_json()) if pins else {}
        labels = [layout_label(result.finalists, i) for i in range(len(result.finalists))]
        print_json(dict(search=stats, world_size=result.world, global_batch=job.global_batch, **pinned,
                        top=[dict(layout=layout_label(lay, i), **evaluation_json(ev, i, u)) for i in range(len(lay))],
                        why=why_best(lay, ev), uncertainty=u.as_json(),
                        robustness=robust.as_json(labels) if robust else None,
                        plan_file=None if args.no_write else args.output, plan=plan.model_dump(mode="json"),
                        **({"check": checked} if checked else {})))
        return 0
    _print(out, args, model, machine, job, result, plan, stats)
    out.print(uncertainty_line(u))
    if robust:
        out.print(robustness_line(robust, result.finalists))
    return 0


def _check_layouts(model, machine, job, args, lay, ev, out) -> dict:
    """--check: the top layouts in order, each checked at full size (first and last rank), until
    one passes. {"chosen": its index or None, "layouts": [{layout, passed, ranks}]}."""
    from cli.check import check_plan, passed, report
    from planner.emit import build_plan
    from planner.report import layout_label
    from runtime.check import ranks_of

    if job.framework.name != "exaplan" or args.backend == "jax":
        raise PlanError("checks exaplan's torch runtime at full size: plan with --framework exaplan and the torch "
                        "backend, or check an exported layout with the framework's own tools", field="check")
    tried = []
    for i in range(len(lay)):
        plan = build_plan(model, machine, job, args.nodes, lay, ev, i, backend=args.backend)
        results, failed = check_plan(plan, ranks_of(plan, "first,last"), out=out)
        ok = passed(results, failed)
        tried.append({"layout": layout_label(lay, i), "passed": ok,
                      "ranks": [r.as_json() for r in results] + [{"rank": r, "error": e} for r, e in failed]})
        if out is not None:
            report(out, plan, results, failed)
            out.print(f"check of layout {i + 1} ({layout_label(lay, i)}): " + ("passed" if ok else
                      "FAILED" + (", trying the next" if i + 1 < len(lay) else "")))
        if ok:
            return {"chosen": i, "layouts": tried}
    if out is not None:
        out.print(f"none of the top {len(lay)} layouts passed the check at full size: no plan written")
    return {"chosen": None, "layouts": tried}


# The export target of each framework profile (`plan --framework F --export DIR`).
EXPORT_TARGET = {"megatron": "megatron", "deepspeed": "megatron-deepspeed", "deepspeed-zero": "deepspeed",
                 "torchtitan": "torchtitan", "maxtext": "maxtext"}


def _export(plan, args):
    """The plan exported for --export (PlanError, before anything is written, where it cannot be)."""
    from export import export_plan

    target = args.export_to or EXPORT_TARGET.get(plan.job.framework.name)
    if target is None:
        raise PlanError(f"framework {plan.job.framework.name} is exaplan's own (exaplan run PLAN runs it); give "
                        f"--framework {' or '.join(EXPORT_TARGET)} or --export-to TARGET", field="export")
    return export_plan(plan, target)


def _robustness(model, machine, job, result, u, draws: int):
    """(Robustness or None, seconds): the ranking under `draws` draws of the fitted figures."""
    import time

    from planner.search.robustness import ranking_robustness

    if draws <= 0 or result.finalists is None or len(result.finalists) < 2:
        return None, 0.0
    t0 = time.perf_counter()
    r = ranking_robustness(model, machine, job, result.finalists, result.finalist_step_time_s, u.step_time, draws)
    return r, time.perf_counter() - t0


def _print(out, args, model, machine, job, result, plan, stats) -> None:
    from planner.report import breakdown_table, memory_table, top_table, why_best

    lay, ev = result.layouts, result.evaluation
    out.print(f"[b]{model.name}[/b] on {args.nodes} x {machine.name} = {result.world:,} ranks; global batch "
              f"{job.global_batch:,} x {job.seq_len} tokens, {job.precision.value}, framework {job.framework.name}"
              + (f", backend {args.backend}" if args.backend else ""))
    out.print(f"searched {result.total_layouts:,} legal layouts ({result.layouts_scored:,} with collective-algorithm "
              f"choices) in {result.seconds:.3f} s ({stats['layouts_per_second']:,.0f} /s); {result.fitting:,} fit in "
              f"{machine.device_memory_gib:g} GiB per device")
    if result.pins:
        out.print(f"pinned: {result.pins.label()} (every layout below keeps these)")
    out.print(top_table(lay, ev, f"Top {len(lay)} layouts"))
    out.print(why_best(lay, ev))
    out.print(breakdown_table(ev, 0))
    out.print(memory_table(ev, 0, machine.device_memory_gib))
    env = " ".join(f"{k}={v!r}" for k, v in plan.collectives.env.items())
    if env:
        out.print(f"collective settings: {env}")
    out.print(f"time to train {job.token_budget:.3g} tokens: {ev.time_to_train_days[0]:.2f} days")
    compiled = _compiled_step_s(model, machine, job, lay, float(ev.step_time_s[0]))
    if compiled is not None:
        out.print(f"blocks eager, as `exaplan run` runs this plan; compiled (--compile) this layout would take "
                  f"{compiled:.4g} s a step ({compiled / ev.step_time_s[0] - 1:+.0%})")
    if not args.no_write:
        out.print(f"wrote {args.output}  (run `exaplan explain {args.output}` for the full report)")
    if args.export:
        out.print(f"exported for {args.export_to or EXPORT_TARGET[plan.job.framework.name]} into {args.export}/ "
                  f"(docs/frameworks/)")


def _compiled_step_s(model, machine, job, lay, eager_step_s: float) -> float | None:
    """The best layout's step with the blocks compiled, where the plan runs them eager on a GPU
    and compiling changes its prediction (None otherwise: a CPU, a fused framework)."""
    from planner.cost.step import evaluate

    fw = job.framework
    if fw.compiled or (fw.eager_bytes_per_element is None and fw.launch_us_per_op is None):
        return None
    compiled_job = job.model_copy(update={"framework": fw.model_copy(update={"compiled": True})})
    step = float(evaluate(model, machine, compiled_job, lay.take([0])).step_time_s[0])
    return step if step < eager_step_s * (1 - 1e-9) else None
