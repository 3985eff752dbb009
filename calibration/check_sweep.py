"""The planner's memory model and communicator table against torch's accounting, at full size:
`exaplan check` (runtime/check.py) over every committed plan and a sweep of layouts of every
kind, the first and last rank of each, the errors tabled by memory category and layout kind.

    python -m calibration.check_sweep [--out docs/results/check-sweep.json] [--workers 2]
        [--only committed|sweep] [--match TEXT] [--limit N]

Writes the JSON the docs page "Memory and traffic at full size" renders (docs/gen/check_page.py):
per rank, the layout, torch's peak and categories, the planner's, and the bytes of each
communicator measured against the plan's table. About 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs/results/check-sweep.json"

# (name, model, machine, nodes, precision, workload, layout as Layouts.one takes it); every
# sharding kind, the three schedules (interleaved with 2 virtual stages), every recompute
# level, TP with and without SP, CP, accumulation, DPO, bf16 and fp32.
_KINDS = ("none", "zero1", "zero2", "fsdp", "fsdp-grad-op", "hsdp")


def sweep_cases() -> list[tuple[str, str, str, int, str, str, dict]]:
    cases = []
    m35, m7 = "protein-3.5b", "protein-7b"
    for kind in _KINDS:  # data parallelism alone, two micro-batches accumulated
        extra = {"shard_group": 8} if kind == "hsdp" else {}
        cases.append((f"dp {kind}", m35, "dgx-h100", 4, "bf16", "pretrain", dict(dp=32, mbs=4, gas=2, sharding=kind, **extra)))
        cases.append((f"dp {kind} fp32", m35, "dgx-h100", 4, "fp32", "pretrain",
                      dict(dp=32, mbs=2, gas=4, sharding=kind, recompute="full", **extra)))
    for level in ("none", "selective", "full", "selective-op"):
        cases.append((f"fsdp recompute {level}", m7, "dgx-h100", 8, "bf16", "pretrain",
                      dict(dp=64, mbs=8, gas=1, sharding="fsdp", recompute=level)))
        cases.append((f"tp4 sp recompute {level}", m7, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=8, tp=4, mbs=4, gas=2, sharding="fsdp", recompute=level)))
    for tp in (2, 8):
        cases.append((f"tp{tp} no sp", m35, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=32 // tp, tp=tp, mbs=4, gas=2, sharding="fsdp", sp=False)))
        cases.append((f"tp{tp} sp zero1", m35, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=32 // tp, tp=tp, mbs=4, gas=2, sharding="zero1")))
    for schedule, vpp in (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)):
        for kind in ("none", "zero1", "fsdp", "hsdp"):
            extra = {"shard_group": 2} if kind == "hsdp" else {}
            cases.append((f"pp4 {schedule} {kind}", m35, "dgx-h100", 4, "bf16", "pretrain",
                          dict(dp=8, pp=4, mbs=2, gas=8, schedule=schedule, vpp=vpp, sharding=kind, **extra)))
        cases.append((f"pp2 tp2 {schedule} recompute full", m7, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=8, pp=2, tp=2, mbs=2, gas=8, schedule=schedule, vpp=vpp, sharding="fsdp", recompute="full")))
    for cp in (2, 4):
        cases.append((f"cp{cp} fsdp", m35, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=32 // cp, cp=cp, mbs=2, gas=2, sharding="fsdp")))
        cases.append((f"cp{cp} tp2", m35, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=16 // cp, cp=cp, tp=2, mbs=2, gas=2, sharding="fsdp")))
    for kind in ("none", "zero1", "fsdp", "hsdp"):
        extra = {"shard_group": 8} if kind == "hsdp" else {}
        cases.append((f"dpo {kind}", m35, "dgx-h100", 4, "bf16", "dpo", dict(dp=32, mbs=2, gas=2, sharding=kind, **extra)))
    cases.append(("dpo pp4 1f1b", m35, "dgx-h100", 4, "bf16", "dpo", dict(dp=8, pp=4, mbs=2, gas=8, sharding="none")))
    cases.append(("dpo cp2", m35, "dgx-h100", 4, "bf16", "dpo", dict(dp=16, cp=2, mbs=2, gas=2, sharding="fsdp")))
    for mbs, gas in ((1, 16), (16, 1)):
        cases.append((f"accumulation mbs{mbs} x {gas}", m35, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=32, mbs=mbs, gas=gas, sharding="fsdp")))
    for kind in ("zero2", "fsdp-grad-op"):  # the other kinds under a pipeline and TP
        cases.append((f"pp2 tp2 1f1b {kind}", m7, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=8, pp=2, tp=2, mbs=2, gas=4, sharding=kind)))
    for level in ("selective", "selective-op"):
        cases.append((f"pp4 1f1b fsdp recompute {level}", m35, "dgx-h100", 4, "bf16", "pretrain",
                      dict(dp=8, pp=4, mbs=2, gas=8, sharding="fsdp", recompute=level)))
    cases.append(("pp4 interleaved fp32", m35, "dgx-h100", 4, "fp32", "pretrain",
                  dict(dp=8, pp=4, mbs=1, gas=8, schedule="interleaved-1f1b", vpp=2, sharding="fsdp", recompute="full")))
    cases.append(("tp8 sp fp32 zero2", m35, "dgx-h100", 4, "fp32", "pretrain", dict(dp=4, tp=8, mbs=2, gas=2, sharding="zero2")))
    cases.append(("hsdp pp2 tp2 cp2", m7, "dgx-h100", 8, "bf16", "pretrain",
                  dict(dp=8, pp=2, tp=2, cp=2, mbs=1, gas=4, sharding="hsdp", shard_group=4)))
    cases.append(("70b tp8 fsdp", "protein-70b", "dgx-h100", 16, "bf16", "pretrain",
                  dict(dp=16, tp=8, mbs=1, gas=4, sharding="fsdp", recompute="full")))
    cases.append(("aurora pp8 ddp", m35, "aurora", 64, "bf16", "pretrain",
                  dict(dp=96, pp=8, mbs=1, gas=32, sharding="none")))
    cases.append(("frontier tp8 pp8 fsdp", "protein-70b", "frontier", 64, "bf16", "pretrain",
                  dict(dp=8, pp=8, tp=8, mbs=1, gas=16, sharding="fsdp", recompute="full")))
    return cases


def sweep_plan(case):
    """The plan of a sweep case, as `exaplan plan` would write it for that layout."""
    from machine_models import load_machine
    from planner.cost.layout import Layouts
    from planner.cost.step import evaluate
    from planner.emit import build_plan
    from planner.inputs import make_job
    from planner.presets import get_model

    _, model_name, machine_name, nodes, precision, workload, lay = case
    model, machine = get_model(model_name), load_machine(machine_name)
    world = nodes * machine.devices_per_node
    lay = Layouts.one(**lay)
    global_batch = int(lay.dp[0] * lay.mbs[0] * lay.gas[0])
    job = make_job(model, machine, world, global_batch, None, precision, None, workload=workload)
    return build_plan(model, machine, job, nodes, lay, evaluate(model, machine, job, lay), 0, command="check_sweep")


def layout_kind(plan) -> str:
    m = plan.mesh
    parts = [plan.sharding.kind.value]
    if m.pp > 1:
        parts.append(f"pp {plan.pipeline.schedule.value}" + (f" v{plan.pipeline.virtual_stages}" if plan.pipeline.virtual_stages > 1 else ""))
    if m.tp > 1:
        parts.append("tp+sp" if plan.sequence_parallel else "tp")
    if m.cp > 1:
        parts.append("cp")
    if plan.job.workload.value == "dpo":
        parts.append("dpo")
    return " ".join(parts)


def exaplan_table(plan) -> dict[str, float]:
    """The communicator table (bytes a step) of the plan's layout as exaplan's torch runtime runs
    it, which is what the check steps: a framework's or the JAX backend's plan is emitted again
    under exaplan's profile (its own table counts what that framework would issue)."""
    from runtime.check import torch_runtime_note

    if torch_runtime_note(plan):
        from machine_models.frameworks import as_exaplan_runtime
        from planner.cost.layout import Layouts
        from planner.cost.step import evaluate
        from planner.emit import build_plan

        ours = as_exaplan_runtime(plan)
        lay = Layouts.from_plan(ours)
        ev = evaluate(ours.model, ours.machine, ours.job, lay, ddp_buckets_mb=(ours.sharding.ddp_bucket_mb,))
        plan = build_plan(ours.model, ours.machine, ours.job, ours.nodes, lay, ev, 0, command="check_sweep")
    return {k.value: c.bytes_per_step for k, c in plan.collectives.communicators.items()}


def _row(name: str, source: str, plan, result) -> dict:
    from runtime.check import communicator_bytes

    m = plan.mesh
    row = {"name": name, "source": source, "kind": layout_kind(plan), "model": plan.model.name,
           "machine": plan.machine.name, "world": plan.world_size,
           "mesh": f"pp{m.pp} dp{m.dp_replicate}x{m.dp_shard} cp{m.cp} tp{m.tp}", "mbs": plan.micro_batch_size,
           "gas": plan.grad_accumulation_steps, "recompute": plan.recompute.value, "precision": plan.job.precision.value}
    row.update(result.as_json())
    table = exaplan_table(plan)
    row["communicators"] = {k: {"measured": a, "plan": table.get(k)} for k, (a, _) in communicator_bytes(plan, result).items()}
    return row


def _check(job: tuple[str, str, object, int]) -> list[dict]:
    """One worker's task: a plan's first and last rank (or the error of a rank that failed)."""
    import torch

    from machine_models.frameworks import as_exaplan_runtime
    from planner.cost.memory import rank_parameters
    from planner.cost.rank import rank_memory
    from planner.schema.plan import load_plan
    from runtime.check import check_rank, ranks_of, torch_runtime_note

    torch.set_num_threads(1)
    name, source, what, _ = job
    plan = load_plan(what) if source == "committed" else sweep_plan(what)
    note = torch_runtime_note(plan)  # a framework's or the JAX backend's plan: exaplan's figures for its layout
    ours = as_exaplan_runtime(plan) if note else plan
    rows = []
    for rank in ranks_of(plan, "first,last"):
        try:
            result = check_rank(plan, rank, rank_parameters, lambda _plan, k: rank_memory(ours, k))
            result.note = result.note or note
            rows.append(_row(name, source, plan, result))
        except Exception as err:  # reported in the table: the runtime's own error
            rows.append({"name": name, "source": source, "kind": layout_kind(plan), "rank": rank,
                         "error": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"})
    return rows


def jobs(only: str | None = None, limit: int | None = None, match: str | None = None) -> list[tuple[str, str, object, int]]:
    out = []
    if only in (None, "committed"):
        for path in sorted((ROOT / "plans").rglob("*.yaml")):
            out.append((str(path.relative_to(ROOT)), "committed", str(path), 0))
    if only in (None, "sweep"):
        out.extend((case[0], "sweep", case, 0) for case in sweep_cases())
    if match:
        out = [j for j in out if match in j[0]]
    return out[:limit] if limit else out


def _machine() -> dict:
    """This machine as the page names it: its CPU and the cores this process may use."""
    from calibration.timing import device_name

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"cpu": device_name("cpu"), "cores": cores}


def replanned(data: dict) -> dict:
    """`data` with each row's communicator table (the plan side of the traffic comparison) taken
    from its plan as the planner makes it now; torch's measured bytes and memory are kept. For a
    change to the table alone (planner/emit.py), which moves no measured figure."""
    from planner.schema.plan import load_plan

    cases = {case[0]: case for case in sweep_cases()}
    plans: dict = {}
    for row in data["rows"]:
        if "communicators" not in row:
            continue
        name = row["name"]
        if name not in plans:
            plans[name] = load_plan(ROOT / name) if row["source"] == "committed" else sweep_plan(cases[name])
        table = exaplan_table(plans[name])
        for k, v in row["communicators"].items():
            v["plan"] = table.get(k)
    return data


def _updated(old: dict, new: dict, names: set[str]) -> dict:
    """`old` with the rows of the plans in `names` replaced by `new`'s, in `old`'s order (new
    plans at the end); the update's command, date and machine listed under `updates`."""
    fresh: dict[str, list[dict]] = {}
    for row in new["rows"]:
        fresh.setdefault(row["name"], []).append(row)
    rows = []
    for row in old["rows"]:
        if row["name"] not in names:
            rows.append(row)
        elif row["name"] in fresh:
            rows.extend(fresh.pop(row["name"]))
    rows.extend(r for group in fresh.values() for r in group)
    update = {k: new[k] for k in ("command", "date", "machine", "seconds")}
    return {**old, "rows": rows, "updates": [*old.get("updates", []), update]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.check_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"the JSON to write (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                    help="processes checking plans side by side (default: 2, or the cores there are)")
    ap.add_argument("--only", choices=["committed", "sweep"], help="the committed plans or the sweep alone")
    ap.add_argument("--match", metavar="TEXT", help="only the plans whose name (file or sweep case) contains TEXT")
    ap.add_argument("--limit", type=int, help="the first N plans only (a quick look)")
    ap.add_argument("--update", action="store_true",
                    help="replace only the checked plans' rows of an existing --out (after a model change that "
                         "touches a few plans; the file lists each update's command and date)")
    ap.add_argument("--replan", action="store_true",
                    help="measure nothing: recompute the plan side of every row's traffic table in --out from the "
                         "plans as the planner makes them now (after a change to the communicator table alone)")
    args = ap.parse_args(argv)
    if args.replan:
        data = replanned(json.loads(args.out.read_text()))
        data.setdefault("updates", []).append({"command": "python -m calibration.check_sweep --replan",
                                               "date": time.strftime("%Y-%m-%d"), "machine": _machine(), "seconds": 0})
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"the traffic tables of {len(data['rows'])} rows recomputed: {args.out}")
        return 0
    if args.out.exists() and not args.out.is_file():
        print(f"error: --out {args.out} is not a file", file=sys.stderr)
        return 2
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from rich.progress import Progress


    todo = jobs(args.only, args.limit, args.match)
    if not todo:
        print("error: --match/--only/--limit leave no plan to check", file=sys.stderr)
        return 2
    rows: list[dict] = []
    start = time.perf_counter()
    with Progress() as bar, ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        task = bar.add_task("checking plans at full size", total=len(todo))
        for got in pool.map(_check, todo):
            rows.extend(got)
            bar.advance(task)
    out = {"command": "python -m calibration.check_sweep " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d"), "machine": _machine(), "seconds": time.perf_counter() - start,
           "rows": rows}
    if args.update and args.out.is_file():
        out = _updated(json.loads(args.out.read_text()), out, {name for name, *_ in todo})
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(f"{len(rows)} ranks of {len(todo)} plans in {time.perf_counter() - start:.0f} s: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
