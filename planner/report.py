"""Human-readable output: tables of layouts, why the best won, and plan reports."""

from __future__ import annotations

import numpy as np

from rich.console import Console
from rich.table import Table

from planner.cost.layout import RECOMPUTES, SCHEDULES, SHARDINGS, Layouts
from planner.cost.step import Evaluation
from planner.schema.plan import MESH_AXES, Plan

GIB = 2.0**30


def layout_label(lay: Layouts, i: int) -> str:
    """Compact one-line layout: 'pp4 dp8(hsdp g4) tp2+sp | mbs2 x 16 | 1f1b | rc=selective'."""
    r = lay.row(i)
    kind = SHARDINGS[r["sharding"]].value
    dp = r["dp_replicate"] * r["dp_shard"]
    parts = []
    if r["pp"] > 1:
        parts.append(f"pp{r['pp']}")
    if dp > 1 or r["cp"] > 1:
        parts.append(f"dp{dp} " + {"none": "ddp", "hsdp": f"hsdp(g{r['dp_shard']})"}.get(kind, kind))
    if r["cp"] > 1:
        parts.append(f"cp{r['cp']}")
    if r["tp"] > 1:
        parts.append(f"tp{r['tp']}" + ("+sp" if r["sp"] else ""))
    sched = SCHEDULES[r["schedule"]]
    pipe = "" if sched is None else f" | {sched.value}" + (f" v{r['vpp']}" if r["vpp"] > 1 else "")
    rc = RECOMPUTES[r["recompute"]].value
    return f"{' '.join(parts)} | mbs{r['mbs']} x {r['gas']}{pipe}" + (f" | recompute {rc}" if rc != "none" else "")


def _fmt_time(s: float) -> str:
    if s >= 86400 * 2:
        return f"{s / 86400:.1f} d"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 1:
        return f"{s:.3f} s"
    return f"{s * 1e3:.1f} ms"


def fmt_rate(tflops: float) -> str:
    """TFLOP/s with one decimal, or three significant digits below 1 (a CPU's 0.0412, not 0.0)."""
    return f"{tflops:.1f}" if tflops >= 1 else f"{tflops:.3g}"


def top_table(lay: Layouts, ev: Evaluation, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in (("#", "right"), ("layout", "left"), ("step", "right"), ("tokens/s", "right"),
                      ("TFLOP/s/dev", "right"), ("MFU", "right"), ("mem/dev GiB", "right")):
        t.add_column(col, justify=just, no_wrap=col != "layout")  # the layout wraps; no figure is cut short
    for i in range(len(lay)):
        t.add_row(str(i + 1), layout_label(lay, i), _fmt_time(ev.step_time_s[i]), f"{ev.tokens_per_s[i]:,.0f}",
                  fmt_rate(ev.model_tflops_per_device[i]), f"{ev.mfu[i]:.1%}", f"{ev.memory.total[i] / GIB:.1f}")
    return t


PARTS = (("compute", "compute_s"), ("pipeline bubble", "bubble_s"), ("exposed dp/fsdp traffic", "dp_s"),
         ("exposed tp traffic", "tp_s"), ("pipeline p2p", "pp_s"), ("cp ring traffic", "cp_s"), ("optimizer + step overhead", "optimizer_s"))


def why_best(lay: Layouts, ev: Evaluation) -> str:
    """Why layout 0 beat layout 1: the step-time parts that differ most, and the memory."""
    if len(lay) < 2:
        return "Only one layout fits."
    d = ev.step_time_s[1] - ev.step_time_s[0]
    diffs = sorted(((getattr(ev, f)[1] - getattr(ev, f)[0], name) for name, f in PARTS), reverse=True)
    gains = [f"{name} {_fmt_time(delta)} less" for delta, name in diffs if delta > 1e-4 * ev.step_time_s[0]][:3]
    losses = [f"{name} {_fmt_time(-delta)} more" for delta, name in diffs if delta < -1e-4 * ev.step_time_s[0]][:2]
    if abs(d) <= 1e-12 * max(ev.step_time_s[0], 1e-30):
        mem = (ev.memory.total[1] - ev.memory.total[0]) / GIB
        return f"#1 ties #2 on step time and needs {mem:.2f} GiB less memory per device, so it ranks first."
    text = f"#1 is {_fmt_time(d)} ({d / ev.step_time_s[1]:.1%}) faster per step than #2 ({layout_label(lay, 1)})"
    if gains:
        text += ": " + ", ".join(gains)
    if losses:
        text += "; it pays " + ", ".join(losses)
    return text + "."


def breakdown_table(ev: Evaluation, i: int = 0) -> Table:
    t = Table(title="Step time", title_justify="left", show_header=False)
    t.add_column("part")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    total = ev.step_time_s[i]
    for name, f in PARTS:
        v = float(getattr(ev, f)[i])
        t.add_row(name, _fmt_time(v), f"{v / total:.1%}")
    t.add_row("[b]step[/b]", f"[b]{_fmt_time(total)}[/b]", "")
    return t


def memory_table(ev: Evaluation, i: int, capacity_gib: float) -> Table:
    t = Table(title="Memory per device", title_justify="left", show_header=False)
    t.add_column("part")
    t.add_column("GiB", justify="right")
    m = ev.memory
    rows = [("parameters", m.parameters), ("gradients", m.gradients), ("optimizer states", m.optimizer),
            ("activations", m.activations), ("buffers", m.buffers), ("reserve + fragmentation", m.reserve)]
    ref = np.broadcast_to(np.asarray(m.reference, dtype=np.float64), m.total.shape)
    if ref[i] > 0:
        rows.insert(3, ("reference model (dpo)", ref))
    for name, arr in rows:
        t.add_row(name, f"{arr[i] / GIB:.2f}")
    fits = "fits" if m.fits[i] else "[red]does not fit[/red]"
    t.add_row("[b]total[/b]", f"[b]{m.total[i] / GIB:.2f}[/b] of {capacity_gib:.1f} ({fits})")
    return t


def flops_text(model, job, ev: Evaluation, i: int = 0) -> str:
    """Model FLOPs of a step both ways (planner/cost/flops.step_flops), per device per second."""
    from planner.cost.flops import step_flops

    f = step_flops(model, job)
    t, world = float(ev.step_time_s[i]), float(ev.space.units.world[ev.space.unit[i]])
    rate = lambda x: x / t / world / 1e12  # noqa: E731
    what = "policy forward+backward" + (" + reference forward" if job.reference_in_step else "")
    return (f"model FLOPs per step: {f['executed'] / 1e15:.4g} PFLOP as executed ({what}; {fmt_rate(rate(f['executed']))} "
            f"TFLOP/s per device), {f['six_n'] / 1e15:.4g} PFLOP as 6·N·tokens of the policy "
            f"({fmt_rate(rate(f['six_n']))} TFLOP/s per device); {f['tokens']:,.0f} policy tokens per step")


def explain_plan(plan: Plan, console: Console) -> None:
    """A readable report of a plan file."""
    p, pr = plan, plan.prediction
    console.print(f"[b]{p.model.name}[/b] on [b]{p.nodes} x {p.machine.name}[/b] ({p.world_size} ranks, "
                  f"{p.ranks_per_node} per node, {p.machine.device_name})")
    console.print(f"job: global batch {p.job.global_batch} x {p.job.seq_len} tokens, {p.job.precision.value}, "
                  f"{p.job.workload.value}, token budget {p.job.token_budget:.3g}, framework {p.job.framework.name}")
    console.print(f"kernels: {kernels_line(p)}")
    mesh = Table(title="Mesh (ranks row-major over these axes, tp fastest; node = rank // ranks_per_node)", title_justify="left")
    for a in MESH_AXES:
        mesh.add_column(a, justify="right")
    mesh.add_row(*(str(d) for d in p.mesh.degrees))
    console.print(mesh)
    shown = min(p.world_size, 4)
    coords = lambda r: ",".join(str(c) for c in p.coordinates(r).values())  # noqa: E731
    console.print("rank -> node/device (pp,dp_replicate,dp_shard,cp,tp): " + "; ".join(
        f"{r} -> {p.placement(r)[0]}/{p.placement(r)[1]} ({coords(r)})" for r in range(shown))
        + (f"; ... {p.world_size - 1} -> {p.placement(p.world_size - 1)[0]}/{p.placement(p.world_size - 1)[1]} ({coords(p.world_size - 1)})" if p.world_size > shown else ""))
    console.print(f"batch: micro-batch {p.micro_batch_size} x {p.grad_accumulation_steps} accumulation steps x dp {p.mesh.dp}"
                  f"{' | sequence parallel' if p.sequence_parallel else ''} | recompute {p.recompute.value}"
                  f" | {'the whole step one XLA graph' if p.job.framework.compiled_step else 'blocks compiled' if p.compile else 'blocks eager'}")
    s = p.sharding
    grads = "fp32" if p.job.framework.grad_reduce_bytes(p.job.precision) == 4 else p.job.precision.value
    console.print(f"sharding: {s.kind.value}" + (f" (shard group {s.shard_group_size})" if s.kind.value == "hsdp" else "")
                  + f" | reshard after forward {s.reshard_after_forward} | DDP bucket {s.ddp_bucket_mb:g} MB"
                  + f" | gradients reduced in {grads}")
    if p.pipeline.schedule:
        st = Table(title=f"Pipeline: {p.pipeline.schedule.value}, {p.pipeline.virtual_stages} virtual stage(s) per rank", title_justify="left")
        for col in ("stage", "pp rank", "chunk", "layers", "extra"):
            st.add_column(col)
        for i, x in enumerate(p.pipeline.stages):
            extra = ", ".join(n for n, f in (("embedding", x.embedding), ("head", x.head)) if f)
            st.add_row(str(i), str(x.pp_rank), str(x.virtual_index), f"{x.first_layer}-{x.last_layer - 1}", extra)
        console.print(st)
    ct = Table(title=f"Collectives ({p.collectives.library})", title_justify="left")
    for col in ("communicator", "op", "algorithm", "ranks", "nodes", "GB/step"):
        ct.add_column(col)
    for name, c in p.collectives.communicators.items():
        ct.add_row(name.value, c.op, c.algorithm.value, str(c.ranks), str(c.nodes_spanned), f"{c.bytes_per_step / 1e9:.2f}")
    console.print(ct)
    env = " ".join(f"{k}={v!r}" for k, v in p.collectives.env.items()) or "(none: the library's algorithm is fixed or default)"
    console.print(f"environment: {env}")
    tt = Table(title="Prediction", title_justify="left", show_header=False)
    tt.add_column("what")
    tt.add_column("value", justify="right")
    tt.add_row("step time", _fmt_time(pr.step_time_s))
    tt.add_row("  compute", _fmt_time(pr.step_time.compute_s))
    tt.add_row("  pipeline bubble", _fmt_time(pr.step_time.bubble_s))
    tt.add_row("  optimizer + step overhead", _fmt_time(pr.step_time.optimizer_s))
    for k, v in pr.step_time.exposed_comm_s.items():
        tt.add_row(f"  exposed {k.value} traffic", _fmt_time(v))
    tt.add_row("tokens/s", f"{pr.tokens_per_s:,.0f}")
    tt.add_row("model / hardware TFLOP/s per device", f"{fmt_rate(pr.model_tflops_per_device)} / {fmt_rate(pr.hardware_tflops_per_device)}")
    tt.add_row("MFU", f"{pr.mfu:.1%}")
    tt.add_row("time to train", _fmt_time(pr.time_to_train_days * 86400))
    mem = pr.memory
    tt.add_row("memory per device", f"{pr.memory_gib_per_device:.2f} GiB of {p.machine.device_memory_gib:g} ({'fits' if pr.fits else 'DOES NOT FIT'})")
    tt.add_row("  params / grads at peak / optimizer", f"{mem.parameters_gib:.2f} / {mem.gradients_gib:.2f} / {mem.optimizer_gib:.2f}")
    tt.add_row("  activations / buffers / reserve", f"{mem.activations_gib:.2f} / {mem.buffers_gib:.2f} / {mem.reserve_gib:.2f}")
    console.print(tt)
    if pr.uncertainty is not None:
        console.print(uncertainty_line(pr.uncertainty))
    v = p.provenance
    console.print(f"made by exaplan {v.exaplan_version} (cost model {v.cost_model_version}); regenerate: {v.command}")
    console.print(f"content hash {v.content_hash[:16]}... (checked)")


def capacity_table(rows, model: str, machine: str, tokens: float, best=None, u=None) -> Table:
    """The capacity sweep; with an uncertainty `u`, days as "value (low-high)"."""
    t = Table(title=f"{model} on {machine}: time to train {tokens:.3g} tokens", title_justify="left")
    for col, just in (("nodes", "right"), ("ranks", "right"), ("global batch", "right"), ("best layout", "left"),
                      ("step", "right"), ("tokens/s", "right"), ("MFU", "right"), ("days", "right")):
        t.add_column(col, justify=just, no_wrap=col != "best layout")  # the layout wraps; no figure is cut short
    for r in rows:
        mark = " <" if best is not None and r.nodes == best.nodes else ""
        if r.layout is None:
            t.add_row(f"{r.nodes:,}", f"{r.ranks:,}", f"{r.global_batch:,}", f"[dim]{r.note}[/dim]", "", "", "", "")
        else:
            days = f"{r.days:,.2f}"
            if u is not None:
                lo, hi = u.time_interval(r.days)
                days += f" ({lo:,.2f}-{hi:,.2f})"
            t.add_row(f"{r.nodes:,}{mark}", f"{r.ranks:,}", f"{r.global_batch:,}", r.layout, _fmt_time(r.step_time_s),
                      f"{r.tokens_per_s:,.0f}", f"{r.mfu:.1%}", days)
    return t


def uncertainty_line(u) -> str:
    """One line on how far to trust the predictions shown (u: a PredictionUncertainty or
    machine_models.uncertainty.Uncertainty)."""
    label = "" if u.fitted else "[b]unfitted[/b]: "
    return (f"{label}predictions +/-{u.step_time:.0%} in step time and every rate and time derived from it, "
            f"+/-{u.memory:.0%} in memory ({u.basis})")


def robustness_line(r, finalists: Layouts) -> str:
    """How often the first choice stays first when the fitted figures are drawn within their
    uncertainty, and which layouts ever win instead."""
    others = [(i, n) for i, n in sorted(r.winners.items(), key=lambda kv: -kv[1]) if i != 0]
    text = f"ranking under the uncertainty: #1 stays #1 in {r.stays_first:.0%} of {r.draws} draws of the fitted figures"
    if others:
        text += "; also winning: " + "; ".join(f"{layout_label(finalists, i)} ({n / r.draws:.0%})" for i, n in others[:4])
        if len(others) > 4:
            text += f"; {len(others) - 4} more"
    return text


def kernels_line(plan: Plan) -> str:
    """Which kernel rates the prediction charges: the device kind's measurement of exaplan's
    runtime (planner/schema/kernels.py) or its fitted figures."""
    from planner.cost.compute import measured_kernels

    kernels = measured_kernels(plan.machine, plan.job)
    if kernels is None:
        return f"the fitted figures of {plan.machine.device_name} (matmul curve, attention factor, elementwise fraction)"
    return (f"attention and elementwise work measured for exaplan's runtime on this device kind ({kernels.source}); "
            f"GEMMs on the fitted curve")
