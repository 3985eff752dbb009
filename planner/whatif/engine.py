"""The what-if sweep: for every model x machine x varied values x node count, the full layout
search (planner/search) and what its best layout predicts, with intervals, node-hours and
energy; then the questions (planner/whatif/questions.py).

    result = run_whatif(model="protein-3.5b", machine="aurora,frontier", nodes="16:2048", tokens=1e12,
                        deadline_days=7)
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Callable

from machine_models import list_machines, load_framework, load_machine
from machine_models.loader import device_kind_status
from machine_models.uncertainty import at_point, uncertainty_of
from planner.emit import layout_point
from planner.inputs import apply_overrides, check_overrides, load_model, make_job, parse_override
from planner.presets import MODEL_PRESETS
from planner.report import layout_label
from planner.schema.errors import PlanError
from planner.schema.specs import MachineModel, ModelSpec
from planner.search.search import search
from planner.whatif import batch as batch_rule
from planner.whatif import questions
from planner.whatif.parse import (Vary, check_name, check_points, combinations, parse_nodes, parse_vary, positive_finite,
                                  positive_int, split_names)
from planner.whatif.types import WhatifPoint, WhatifResult

DEFAULT_TOKENS = 1e9  # as everywhere in exaplan (make_job's token budget)
MINIMISE = ("node-hours", "energy")
Progress = Callable[[int, int, str], None]  # (points done, points in all, what was just done)


@dataclass(frozen=True)
class Case:
    """One scaling curve: a model and a machine as varied, and their labels."""

    model_name: str
    machine_name: str
    varied: dict[str, str]
    model: ModelSpec
    machine: MachineModel


def run_whatif(*, model: str | list[str], machine: str | list[str], nodes: str | list[int],
               tokens: float | None = None, deadline_days: float | None = None, minimise: str = "node-hours",
               fastest: bool = False, knee: float = 0.8, vary: list[str] | tuple = (),
               global_batch: int | None = None, batch_per_rank: int | None = None, framework: str = "exaplan",
               workload: str = "pretrain", reference: str = "in-step", seq_len: int | None = None,
               precision: str | None = None, overrides: list[str] | tuple = (), progress: Progress | None = None,
               command: str = "", workers: int | None = None, compiled: bool = False,
               while_sweeping: Callable[[], None] | None = None) -> WhatifResult:
    """Sweep and answer. Every input is checked before any search (PlanError naming the option).
    `progress(done, total, label)` is called after each point; `workers`: processes for the
    searches (default: one per core where the sweep is long enough); `compiled`: exaplan's blocks
    through torch.compile (load_framework); `while_sweeping`: work of the caller's (the report's
    imports) done in this process while the worker processes search, when there are any."""
    start = time.perf_counter()
    inputs = dict(model=model, machine=machine, nodes=nodes, tokens=tokens, deadline_days=deadline_days,
                  minimise=minimise, fastest=fastest, knee=knee, vary=list(vary), global_batch=global_batch,
                  batch_per_rank=batch_per_rank, framework=framework, workload=workload, reference=reference,
                  seq_len=seq_len, precision=precision, overrides=list(overrides))
    tokens = positive_finite(tokens, "tokens") or DEFAULT_TOKENS
    inputs["tokens"] = tokens
    deadline_days = positive_finite(deadline_days, "deadline-days")
    knee = positive_finite(knee, "knee")
    if knee > 1:
        raise PlanError(f"a scaling-efficiency threshold between 0 and 1, got {knee!r}", field="knee")
    if minimise not in MINIMISE:
        raise PlanError(f"one of {', '.join(MINIMISE)}, got {minimise!r}", field="minimise")
    if global_batch is not None and batch_per_rank is not None:
        raise PlanError("give --global-batch (one batch for every point) or --batch-per-rank (weak scaling), "
                        "not both", field="global-batch")
    positive_int(global_batch, "global-batch")
    positive_int(batch_per_rank, "batch-per-rank")
    positive_int(seq_len, "seq-len")
    counts = parse_nodes(nodes)
    models, machines = split_names(model, "model"), split_names(machine, "machine")
    varies = [parse_vary(v) for v in vary]
    check_points(len(models), len(machines), varies, len(counts))  # before any spec is loaded or searched
    fw = load_framework(framework, compiled=compiled)
    cases = _cases(models, machines, varies, list(overrides), fw)
    batches = _batches(cases, tokens, seq_len, workload, global_batch)
    inputs.update(node_counts=counts, batch_rule=_batch_rule(global_batch, batch_per_rank, workload),
                  global_batches=_batch_labels(cases, batches) if batch_per_rank is None else {})
    points = _sweep(cases, counts, tokens, fw, batches, batch_per_rank, workload, reference, seq_len, precision,
                    progress, workers, while_sweeping)
    points = questions.with_efficiency(points)
    result = WhatifResult(points=points, inputs=inputs, command=command,
                          device_status=_device_status(cases))
    result.knee_details = questions.knees(points, knee)
    result.knees = {(k["model"], k["machine"], tuple(sorted(k["varied"].items()))): k["knee_nodes"]
                    for k in result.knee_details}
    if deadline_days is not None:
        result.deadline = questions.deadline(points, deadline_days, minimise)
    if fastest:
        result.fastest = questions.fastest(points)
    result.warnings = (questions.batch_warnings(points, cases, tokens, seq_len) + questions.slowdown_warnings(points)
                       + questions.other_warnings(points, minimise))
    result.seconds = time.perf_counter() - start
    return result


def _batch_rule(global_batch, batch_per_rank, workload) -> str:
    unit = "pairs" if workload == "dpo" else "sequences"
    if global_batch is not None:
        return f"--global-batch: {global_batch:,} {unit} at every point"
    if batch_per_rank is not None:
        return f"--batch-per-rank: {batch_per_rank} {unit} per rank (weak scaling: the batch grows with the ranks)"
    return ("one global batch per model for every machine and node count: the critical-batch estimate "
            f"({batch_rule.SOURCE}) rounded down to m x 2^k {unit}, m the odd part of the lcm of devices per node")


def _batch_labels(cases: list[Case], batches: dict[str, int]) -> dict[str, int]:
    """{'protein-3.5b' (with its varied model fields): global batch} for the report."""
    out = {}
    for c in cases:
        model_fields = ", ".join(f"{k}={v}" for k, v in c.varied.items() if k.startswith("model."))
        out[c.model_name + (f" [{model_fields}]" if model_fields else "")] = batches[c.model.model_dump_json()]
    return out


def _cases(models: list[str], machines: list[str], varies: list[Vary], overrides: list[str], fw) -> list[Case]:
    """Every (model, machine, varied values), each spec loaded, overridden and validated."""
    sets = [parse_override(o) for o in overrides]
    check_overrides(sets, ("model", "machine"))
    base_models = {m: _with(load_model(check_name(m, sorted(MODEL_PRESETS), "model")), "model", sets) for m in models}
    base_machines = {m: _with(load_machine(check_name(m, list_machines(), "machine")), "machine", sets)
                     for m in machines}
    combos = combinations(varies)
    cases = []
    for mname, base_model in base_models.items():
        for cname, base_machine in base_machines.items():
            for combo in combos:
                items = {v.field: v.value_for(combo[v.field], _base_value(base_model, base_machine, v.field))
                         for v in varies}
                model = _with(base_model, "model", list(items.items()))
                machine = fw.applied_to(_with(base_machine, "machine", list(items.items())))
                cases.append(Case(mname, cname, combo, model, machine))
    return cases


def _base_value(model: ModelSpec, machine: MachineModel, path: str):
    head, _, rest = path.partition(".")
    spec = model if head == "model" else machine
    node = spec.model_dump(mode="json")
    if head == "machine" and rest.startswith("power."):
        node = {"power": machine.power.model_dump() if machine.power else None}
    for part in rest.split("."):
        if not isinstance(node, dict) or part not in node:
            apply_overrides(spec, head, [(path, 0)])  # raises PlanError: unknown field, did you mean
            raise PlanError("unknown field", field=path)
        node = node[part]
    if node is None:
        if path == "machine.inter_node_efficiency":  # unset: the NICs run at network_efficiency, which x-factors scale
            return machine.nic_efficiency
        if rest == "power":
            raise PlanError(f"{spec.name} has no such section", field=path)
        return None  # an unset optional figure: given values set it; a multiplier says it needs a number
    return node


def _with(spec, prefix: str, items: list[tuple[str, object]]):
    """`spec` with the overrides under `prefix.` applied; machine.power.* go to the power:
    section, which a model_dump (and so apply_overrides) leaves out and which is kept."""
    if prefix != "machine":
        return apply_overrides(spec, prefix, items)
    power_items = [(k, v) for k, v in items if k.startswith("machine.power.")]
    rest = [(k, v) for k, v in items if not k.startswith("machine.power.")]
    power = spec.power
    if power_items:
        if power is None:
            raise PlanError(f"{spec.name} has no power: section", field=power_items[0][0])
        power = apply_overrides(power, "machine", [(k.replace("machine.power.", "machine.", 1), v)
                                                   for k, v in power_items])
    out = apply_overrides(spec, prefix, rest)
    return out.model_copy(update={"power": power}) if out.power is not power else out


def _batches(cases: list[Case], tokens: float, seq_len: int | None, workload: str,
             global_batch: int | None) -> dict[str, int]:
    """The one global batch of each model (as varied; key: the model spec's JSON), unless
    --batch-per-rank; --global-batch gives it outright."""
    per_sample = 2 if workload == "dpo" else 1
    dpn = sorted({c.machine.devices_per_node for c in cases})
    out = {}
    for c in cases:
        key = c.model.model_dump_json()
        if key not in out:
            seq = seq_len or c.model.seq_len
            out[key] = global_batch or batch_rule.default_global_batch(c.model, seq, tokens, dpn, per_sample)
    return out


def _sweep(cases, counts, tokens, fw, batches, batch_per_rank, workload, reference, seq_len, precision,
           progress, workers, while_sweeping=None) -> list[WhatifPoint]:
    """Every point, in order: case by case, node count by node count. With `workers` > 1 the
    searches run in forked worker processes (each point is independent and costs 0.05-0.3 s),
    largest world first; `progress` then counts them as they finish."""
    tasks = []
    for case in cases:
        u = uncertainty_of(case.machine, fw)
        for n in counts:
            world = n * case.machine.devices_per_node
            gb = batch_per_rank * world if batch_per_rank else batches[case.model.model_dump_json()]
            job = make_job(case.model, case.machine, world, gb, seq_len, precision, tokens, workload, reference, fw)
            tasks.append((case, job, n, u))
    workers = _workers(workers, len(tasks))
    points: list[WhatifPoint] = []

    def report(p: WhatifPoint) -> None:
        points.append(p)
        if progress is not None:
            progress(len(points), len(tasks), f"{p.model} on {p.nodes:,} x {p.machine}")

    if workers <= 1:
        for t in tasks:
            report(evaluate_point(*t))
        return points
    global _TASKS
    _TASKS = tasks  # inherited by the forked workers: nothing but the index is pickled
    # The largest worlds first (their spaces are the largest): no worker is left with a long
    # search at the end while the others idle. The points are returned in the sweep's order.
    def ranks(t) -> int:  # 0: more nodes than the machine has (no search)
        case, _, nodes, _ = t
        return nodes * case.machine.devices_per_node if nodes <= case.machine.nodes else 0

    order = sorted(range(len(tasks)), key=lambda i: -ranks(tasks[i]))
    done: dict[int, WhatifPoint] = {}
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.imap_unordered(_evaluate_task, order)
            if while_sweeping is not None:  # after the fork: the workers inherit none of it
                while_sweeping()
            for i, p in results:
                done[i] = p
                report(p)
    finally:
        _TASKS = []
    return [done[i] for i in range(len(tasks))]


_TASKS: list = []
MIN_POINTS_PER_WORKER = 4  # below this a worker costs more than it saves


def _workers(asked: int | None, points: int) -> int:
    if asked is not None:
        return max(1, asked)
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(os.cpu_count() or 1, points // MIN_POINTS_PER_WORKER))


def _evaluate_task(i: int) -> tuple[int, WhatifPoint]:
    return i, evaluate_point(*_TASKS[i])


def evaluate_point(case: Case, job, nodes: int, u) -> WhatifPoint:
    """The best layout of `job` on `nodes` nodes of the case's machine, as a WhatifPoint."""
    seqs = job.global_batch * (2 if job.workload.value == "dpo" else 1)
    base = dict(model=case.model_name, machine=case.machine_name, nodes=nodes, varied=dict(case.varied),
                global_batch_seqs=seqs, global_batch_tokens=seqs * job.seq_len, fitted=u.fitted,
                uncertainty_basis=u.basis, ranks=nodes * case.machine.devices_per_node,
                devices_per_node=case.machine.devices_per_node)
    if nodes > case.machine.nodes:
        return WhatifPoint(**base, fits=False, reason=f"{case.machine.name} has {case.machine.nodes:,} nodes", layout="")
    try:
        r = search(case.model, case.machine, job, nodes, top_k=1, prune=True)
    except PlanError as e:
        return WhatifPoint(**base, fits=False, reason=_short(e, job), layout="")
    ev = r.evaluation
    u = at_point(u, case.machine, job.framework, layout_point(case.model, job, r.layouts, 0))  # the best layout's interval
    base.update(fitted=u.fitted, uncertainty_basis=u.basis)
    step, tps, days = float(ev.step_time_s[0]), float(ev.tokens_per_s[0]), float(ev.time_to_train_days[0])
    hours = days * 24.0 * nodes
    energy = {}
    if case.machine.power is not None:
        kw = case.machine.power.node_w / 1000.0
        e_lo, e_hi = u.time_interval(hours * kw)
        energy = dict(energy_kwh=hours * kw, energy_kwh_lo=e_lo, energy_kwh_hi=e_hi)
    (s_lo, s_hi), (t_lo, t_hi) = u.time_interval(step), u.rate_interval(tps)
    (d_lo, d_hi), (h_lo, h_hi) = u.time_interval(days), u.time_interval(hours)
    return WhatifPoint(**base, fits=True, reason="", layout=layout_label(r.layouts, 0), step_time_s=step,
                       step_time_lo_s=s_lo, step_time_hi_s=s_hi, tokens_per_s=tps, tokens_per_s_lo=t_lo,
                       tokens_per_s_hi=t_hi, tflops_per_device=float(ev.model_tflops_per_device[0]),
                       mfu=float(ev.mfu[0]), days=days, days_lo=d_lo, days_hi=d_hi, node_hours=hours,
                       node_hours_lo=h_lo, node_hours_hi=h_hi, **energy)


def _short(err: PlanError, job) -> str:
    if err.field == "memory":
        return "fits nowhere in memory"
    if err.field == "global_batch":
        return f"no layout keeps global batch {job.global_batch:,}"
    return str(err)


def _device_status(cases: list[Case]) -> dict[str, str]:
    status = device_kind_status()
    out = {}
    for c in cases:
        kind = status.get(c.machine.device_name, "unknown device kind")
        band = c.machine.step_time_band
        out[c.machine.device_name] = kind + ("" if band is None else f"; {c.machine.name} calibrated by its own runs "
                                                                     f"({band.runs} layouts, +/-{band.half_width:.0%})")
    return out
