"""A training framework's own log, read back against the plan it ran (`exaplan calibrate
--from-log LOG --plan PLAN`).

`exaplan export` turns a plan into a framework's configuration; the framework's log then says
what the run reached. `read_log` parses the per-iteration lines of four frameworks:

    megatron            Megatron-LM: ` iteration  N/ M | ... | elapsed time per iteration (ms): T |
                        throughput per GPU (TFLOP/s/GPU): F | ... | global batch size: B | ...`
    megatron-deepspeed  the same lines with `actual seqlen`, `samples per second`, `tokens per gpu
                        per second (tgs)`, `TFLOPs` (and `elapsed time per iteration (s)` in the
                        BigScience lineage)
    deepspeed           DeepSpeed's engine: the throughput timer (`global_step=N, ...,
                        CurrSamplesPerSec=R, ..., MaxMemAllocated=M GB`), or where it logs only its
                        running average (older releases), the time between the step reports
                        (`[Rank 0] step=N, skipped=...`)
    torchtitan          `step: N  loss: ...  memory: M GiB(P%)  tps: T  tflops: F  mfu: U%`

plus what the log states about the run (Megatron's `using world size: ...` line and arguments
block, DeepSpeed's config print, torchtitan's device-mesh and trainer lines) and its memory
report. `compare` checks those statements against the plan (a mismatch is refused, naming the
plan's field), leaves out the first iteration lines (warm-up), and sets the median, 10th and
90th percentile of the rest against the plan's prediction and its interval. DeepSpeed's
comms-logger lines in the same log are calibration/comms_log.py's (`--from-comms-log`).

`record_run` writes the run as the folder `exaplan calibrate --from-runs` refits from
(calibration/fit_runs.py: plan.yaml and summary.json): the step time only, since a framework
logs no per-phase times (metrics.jsonl), and only for a plan predicted with the framework's own
profile, so that the refit does not fold one framework's cost into the machine's figures.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.schema.errors import PlanError

FORMATS = ("megatron", "megatron-deepspeed", "deepspeed", "torchtitan")
# The framework profile (machine_models/frameworks.yaml) that predicts each format's runs: the
# one `exaplan export --to FORMAT` keeps (export/base.py TARGETS).
PROFILE_OF = {"megatron": "megatron", "megatron-deepspeed": "deepspeed", "deepspeed": "deepspeed",
              "torchtitan": "torchtitan"}
WARMUP_LINES = 2  # iteration lines left out at the start, as `exaplan run` leaves out 2 steps
MIB, GIB = float(1 << 20), float(1 << 30)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*\.?[0-9]*(?:[eE][+-]?[0-9]+)?)"

# Megatron-LM and Megatron-DeepSpeed
_M_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
_M_ELAPSED = re.compile(r"elapsed time per iteration \((ms|s)\):\s*" + _NUM)
_M_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM + r"|\bTFLOPs:\s*" + _NUM)
_M_BATCH = re.compile(r"\bglobal batch size:\s*(\d+)")
_M_SEQ = re.compile(r"\bactual seqlen:\s*(\d+)")
_M_SPS = re.compile(r"\bsamples per second:\s*" + _NUM)
_M_TGS = re.compile(r"tokens per gpu per second \(tgs\):\s*" + _NUM)
_M_DS_MARKS = ("samples per second:", "TFLOPs:", "actual seqlen:", "consumed tokens:")
_M_MEMORY = re.compile(r"memory \(MB\) \| allocated: [0-9.]+ \| max allocated: ([0-9.]+)")
_M_WORLD_LINE = re.compile(r"using world size:\s*(\d+)")
_M_WORLD_FIELDS = {"dp": re.compile(r"data-parallel[- ]size:\s*(\d+)"),
                   "cp": re.compile(r"(?<!hierarchical )context-parallel size:\s*(\d+)"),
                   "tp": re.compile(r"(?<!encoder-)tensor-model-parallel size:\s*(\d+)"),
                   "pp": re.compile(r"(?<!encoder-)pipeline-model-parallel size:\s*(\d+)")}
# `  name ....... value` in Megatron's arguments block (an `N:` rank prefix from srun -l allowed)
_M_ARG = re.compile(r"^(?:\s*\d+:)?\s+([a-z_]+) \.{2,} (\S+)")
_M_ARGS = {"global_batch_size": "global_batch", "micro_batch_size": "micro_batch", "seq_length": "seq_len",
           "world_size": "world_size", "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
           "context_parallel_size": "cp", "data_parallel_size": "dp", "num_layers": "layers", "hidden_size": "hidden",
           "num_attention_heads": "heads", "ffn_hidden_size": "ffn_hidden"}

# DeepSpeed's engine
_DS_TPUT = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=" + _NUM + r", CurrSamplesPerSec=" + _NUM +
                      r", MemAllocated=[0-9.]+GB, MaxMemAllocated=([0-9.]+)GB")
_DS_TPUT_OLD = re.compile(r"\] \d+/\d+, SamplesPerSec=" + _NUM + r"(?:, MemAllocated=[0-9.]+GB, MaxMemAllocated=([0-9.]+)GB)?")
_DS_STEP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\].*?\[Rank 0\] step=(\d+), skipped=\d+")
# `[config.py:NNN:print]   name ...... value` (DeepSpeedConfig.print); its world_size is the
# data-parallel degree (the batch triple's)
_DS_CONFIG = re.compile(r"\[config\.py:\d+:print\]\s+([a-z_]+)\s+\.*\s*(\S+)\s*$")
_DS_ARGS = {"train_batch_size": "global_batch", "train_micro_batch_size_per_gpu": "micro_batch",
            "gradient_accumulation_steps": "grad_accumulation", "world_size": "dp"}

# torchtitan
_TT_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:")
_TT_MEMORY = re.compile(r"\bmemory:\s*([0-9.]+)GiB")
_TT_TPS = re.compile(r"\b(?:tps|wps):\s*([0-9,]+)")
_TT_TFLOPS = re.compile(r"\btflops:\s*" + _NUM)
_TT_MFU = re.compile(r"\bmfu:\s*([0-9.]+)%")
_TT_MESH = re.compile(r"Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(\d+), cp=(\d+), "
                      r"tp=(\d+)")
_TT_MESH_OLD = re.compile(r"Building \d-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")
_TT_BATCH = re.compile(r"\bglobal batch size (\d+)")
_TT_SEQ = re.compile(r"\bsequence length (\d+)")

# What a log may state, and the plan's field it must equal.
PLAN_FIELDS: dict[str, tuple[str, Any]] = {
    "global_batch": ("job.global_batch", lambda p: p.job.global_batch),
    "seq_len": ("job.seq_len", lambda p: p.job.seq_len),
    "micro_batch": ("micro_batch_size", lambda p: p.micro_batch_size),
    "grad_accumulation": ("grad_accumulation_steps", lambda p: p.grad_accumulation_steps),
    "world_size": ("nodes", lambda p: p.world_size),
    "tp": ("mesh.tp", lambda p: p.mesh.tp),
    "pp": ("mesh.pp", lambda p: p.mesh.pp),
    "cp": ("mesh.cp", lambda p: p.mesh.cp),
    "dp": ("mesh", lambda p: p.mesh.dp),
    "dp_replicate": ("mesh.dp_replicate", lambda p: p.mesh.dp_replicate),
    "dp_shard": ("mesh.dp_shard", lambda p: p.mesh.dp_shard),
    "layers": ("model.layers", lambda p: p.model.layers),
    "hidden": ("model.hidden", lambda p: p.model.hidden),
    "heads": ("model.heads", lambda p: p.model.heads),
    "ffn_hidden": ("model.ffn_hidden", lambda p: p.model.ffn_hidden),
}
_WHAT = {"global_batch": "global batch size", "seq_len": "sequence length", "micro_batch": "micro-batch size",
         "grad_accumulation": "gradient accumulation steps", "world_size": "world size (nodes x ranks_per_node)",
         "tp": "tensor-parallel degree", "pp": "pipeline-parallel degree", "cp": "context-parallel degree",
         "dp": "data-parallel degree (mesh.dp_replicate x mesh.dp_shard)", "dp_replicate": "replicas",
         "dp_shard": "shards", "layers": "layers", "hidden": "hidden size", "heads": "attention heads",
         "ffn_hidden": "FFN hidden size"}


@dataclass
class Step:
    """One iteration line: what it states (None where it does not)."""

    step: int
    line: int  # 1-based line number in the file
    step_time_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s_per_device: float | None = None
    tflops_per_device: float | None = None  # the framework's own count
    mfu: float | None = None  # the framework's own, as a fraction
    memory_gib: float | None = None
    global_batch: int | None = None
    seq_len: int | None = None


@dataclass
class FrameworkLog:
    path: str
    format: str
    steps: list[Step]
    stated: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (value, line)
    memory_gib: float | None = None
    memory_measure: str | None = None
    repeated_lines: int = 0  # iteration lines of a step already read (other ranks' copies)
    comms_lines: int = 0  # DeepSpeed comms-logger lines (calibration/comms_log.py reads them)


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def _state(stated: dict, key: str, value: int, line: int, path: str) -> None:
    if key in stated and stated[key][0] != value:
        raise PlanError(f"{path} states {_WHAT[key]} {stated[key][0]} (line {stated[key][1]}) and {value} (line {line}): "
                        "give the log of one run", field="--from-log")
    stated.setdefault(key, (value, line))


def _int(s: str) -> int | None:
    m = re.match(r"\d+", s)
    return int(m.group()) if m else None


def detect_format(lines: list[str]) -> str | None:
    """The format whose iteration lines the log holds (Megatron's first), or None."""
    megatron = [ln for ln in lines if _M_ITER.search(ln) and _M_ELAPSED.search(ln)]
    if megatron:
        return "megatron-deepspeed" if any(m in ln for ln in megatron for m in _M_DS_MARKS) else "megatron"
    if any(_TT_STEP.search(ln) and _TT_TPS.search(ln) for ln in lines):
        return "torchtitan"
    if any(_DS_TPUT.search(ln) or _DS_TPUT_OLD.search(ln) or _DS_STEP.search(ln) for ln in lines):
        return "deepspeed"
    return None


def _megatron(lines, log: FrameworkLog) -> None:
    mem = []
    for n, ln in enumerate(lines, 1):
        if (m := _M_MEMORY.search(ln)) is not None:
            mem.append(float(m.group(1)) * MIB / GIB)
            continue
        if (it := _M_ITER.search(ln)) is None or (el := _M_ELAPSED.search(ln)) is None:
            continue
        s = Step(int(it.group(1)), n, step_time_s=_num(el.group(2)) / (1e3 if el.group(1) == "ms" else 1.0))
        if (m := _M_TFLOPS.search(ln)) is not None:
            s.tflops_per_device = _num(m.group(1) or m.group(2))
        if (m := _M_BATCH.search(ln)) is not None:
            s.global_batch = int(m.group(1))
        if (m := _M_SEQ.search(ln)) is not None:
            s.seq_len = int(m.group(1))
        if (m := _M_SPS.search(ln)) is not None:
            s.samples_per_s = _num(m.group(1))
        if (m := _M_TGS.search(ln)) is not None:
            s.tokens_per_s_per_device = _num(m.group(1))
        _add(log, s)
    if mem:
        log.memory_gib = max(mem)
        log.memory_measure = ("max allocated of Megatron's memory report (torch.cuda.max_memory_allocated)"
                              + (f", the largest of its {len(mem)} report lines" if len(mem) > 1 else ""))


def _deepspeed(lines, log: FrameworkLog) -> None:
    tput, reports, mem = [], [], []
    for n, ln in enumerate(lines, 1):
        if (m := _DS_TPUT.search(ln)) is not None:
            tput.append(Step(int(m.group(1)), n, samples_per_s=_num(m.group(3))))
            mem.append(float(m.group(4)))
        elif (m := _DS_TPUT_OLD.search(ln)) is not None:
            if m.group(2):
                mem.append(float(m.group(2)))
        elif (m := _DS_STEP.search(ln)) is not None:
            t = _dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            reports.append((int(m.group(2)), t, n))
    if tput:
        for s in tput:
            _add(log, s)
    else:  # the time between step reports: (t1 - t0) / (steps between)
        for (s0, t0, _), (s1, t1, n1) in zip(reports, reports[1:]):
            if s1 > s0 and t1 > t0:
                _add(log, Step(s1, n1, step_time_s=(t1 - t0) / (s1 - s0)))
    if mem:  # DeepSpeed's "GB" are GiB (bytes / 1024**3)
        log.memory_gib = max(mem)
        log.memory_measure = "MaxMemAllocated of DeepSpeed's throughput timer (torch max_memory_allocated of rank 0)"


def _torchtitan(lines, log: FrameworkLog) -> None:
    for n, ln in enumerate(lines, 1):
        if (m := _TT_STEP.search(ln)) is None or (tps := _TT_TPS.search(ln)) is None:
            continue
        s = Step(int(m.group(1)), n, tokens_per_s_per_device=_num(tps.group(1)))
        if (x := _TT_MEMORY.search(ln)) is not None:
            s.memory_gib = float(x.group(1))
        if (x := _TT_TFLOPS.search(ln)) is not None:
            s.tflops_per_device = _num(x.group(1))
        if (x := _TT_MFU.search(ln)) is not None:
            s.mfu = float(x.group(1)) / 100
        _add(log, s)
    mem = [s.memory_gib for s in log.steps if s.memory_gib is not None]
    if mem:
        log.memory_gib = max(mem)
        log.memory_measure = ("torchtitan's memory column: torch.cuda.max_memory_reserved of the logging rank (the "
                              "allocator's cache included)")


def _statements(lines, log: FrameworkLog) -> None:
    """What the log states about the run, in any format's words: Megatron's world-size line and
    arguments block, DeepSpeed's config print, torchtitan's device-mesh and trainer lines."""
    for n, ln in enumerate(lines, 1):
        found: list[tuple[str, int]] = []
        if (m := _M_WORLD_LINE.search(ln)) is not None:
            found.append(("world_size", int(m.group(1))))
            found += [(key, int(x.group(1))) for key, rx in _M_WORLD_FIELDS.items() if (x := rx.search(ln))]
        elif (m := _M_ARG.match(ln)) is not None and m.group(1) in _M_ARGS and (v := _int(m.group(2))) is not None:
            found.append((_M_ARGS[m.group(1)], v))
        elif (m := _DS_CONFIG.search(ln)) is not None and m.group(1) in _DS_ARGS and (v := _int(m.group(2))) is not None:
            found.append((_DS_ARGS[m.group(1)], v))
        elif (m := _TT_MESH.search(ln)) is not None:
            pp, dpr, dps, cp, tp = map(int, m.groups())
            found += [("pp", pp), ("dp_replicate", dpr), ("dp_shard", dps), ("cp", cp), ("tp", tp),
                      ("world_size", pp * dpr * dps * cp * tp)]
        elif (m := _TT_MESH_OLD.search(ln)) is not None:
            names = [x.strip(" '\"") for x in m.group(1).split(",") if x.strip()]
            degrees = [int(x) for x in m.group(2).split(",") if x.strip()]
            found += [(k, v) for k, v in zip(names, degrees) if k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")]
        elif "global batch size" in ln and "sequence length" in ln and not _TT_STEP.search(ln):
            found += [(k, int(x.group(1))) for k, rx in (("global_batch", _TT_BATCH), ("seq_len", _TT_SEQ))
                      if (x := rx.search(ln))]
        for key, v in found:
            _state(log.stated, key, v, n, log.path)


def _add(log: FrameworkLog, s: Step) -> None:
    if any(x.step == s.step for x in log.steps):
        log.repeated_lines += 1  # the same step from another rank (or printed again): the first is kept
    else:
        log.steps.append(s)


def read_log(path: str | Path, fmt: str | None = None) -> FrameworkLog:
    """The iteration lines and statements of a framework's log; `fmt` None: detected. PlanError
    naming the file where it is missing or holds no iteration lines."""
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"no such file: {path}", field="--from-log")
    if fmt is not None and fmt not in FORMATS:
        raise PlanError(f"unknown log format {fmt!r}; known: {', '.join(FORMATS)}", field="--log-format")
    from calibration.comms_log import parse as comms_lines

    text = p.read_text(errors="replace")
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    lines = ["" if ln.lstrip().startswith("#") else ln for ln in lines]  # a sample's header comments
    fmt = fmt or detect_format(lines)
    if fmt is None:
        raise PlanError(f"no iteration lines of Megatron-LM, Megatron-DeepSpeed, DeepSpeed or torchtitan in {path}",
                        field="--from-log")
    log = FrameworkLog(str(path), fmt, [])
    _statements(lines, log)
    log.comms_lines = len(comms_lines(text))
    {"megatron": _megatron, "megatron-deepspeed": _megatron, "deepspeed": _deepspeed, "torchtitan": _torchtitan}[fmt](lines, log)
    if not log.steps:
        raise PlanError(f"no {fmt} iteration lines with a step time or throughput in {path}", field="--from-log")
    return log


# ------------------------------------------------------------------------------------- against a plan


def _pct(values: list[float], q: float) -> float:
    """The q-th percentile, linear between order statistics (numpy's default)."""
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def check_against_plan(log: FrameworkLog, plan, steps: list[Step]) -> list[dict]:
    """Every statement of the log (and each measured line's batch and sequence) against the
    plan; PlanError naming the plan's field at the first mismatch. Returns what was checked."""
    checked = []
    per_line = [(k, getattr(s, k), s.line) for s in steps for k in ("global_batch", "seq_len") if getattr(s, k) is not None]
    for key, (value, line) in [*log.stated.items(), *((k, (v, n)) for k, v, n in per_line)]:
        fld, get = PLAN_FIELDS[key]
        want = get(plan)
        if value != want:
            raise PlanError(f"{log.path} line {line}: the run's {_WHAT[key]} is {value}, the plan's is {want}: "
                            f"not the run of this plan", field=fld)
        if not any(c["what"] == key for c in checked):
            checked.append(dict(what=key, description=_WHAT[key], plan_field=fld, log=value, plan=want, line=line))
    return checked


def step_times(log: FrameworkLog, plan, steps: list[Step]) -> tuple[list[float], str]:
    """Each measured line's step time (s) and where it comes from."""
    if all(s.step_time_s is not None for s in steps):
        src = {"megatron": "elapsed time per iteration", "megatron-deepspeed": "elapsed time per iteration",
               "deepspeed": "the time between DeepSpeed's step reports / the steps between them"}[log.format]
        return [s.step_time_s for s in steps], src
    if all(s.samples_per_s for s in steps):
        batch, whose = ((log.stated["global_batch"][0], "the log's") if "global_batch" in log.stated
                        else (plan.job.global_batch, "the plan's"))
        return [batch / s.samples_per_s for s in steps], f"{whose} global batch {batch} / CurrSamplesPerSec"
    if all(s.tokens_per_s_per_device for s in steps):
        tokens, world = plan.job.tokens_per_step, plan.world_size
        return ([tokens / (s.tokens_per_s_per_device * world) for s in steps],
                f"the plan's tokens per step {tokens:,} / (tps x world size {world})")
    raise PlanError(f"{log.path}: its iteration lines give neither a step time nor a throughput", field="--from-log")


def _row(name, unit, values, predicted=None, interval=None, source="") -> dict:
    med = statistics.median(values)
    inside = None if interval is None else bool(interval[0] <= med <= interval[1])
    return dict(what=name, unit=unit, median=med, p10=_pct(values, 10), p90=_pct(values, 90), predicted=predicted,
                interval=None if interval is None else list(interval), inside=inside,
                error=None if not predicted else med / predicted - 1.0, source=source)


def compare(log: FrameworkLog, plan, warmup: int = WARMUP_LINES, plan_path: str | None = None) -> dict:
    """The measured run against the plan: the checks, then one row per figure (median, p10, p90
    of the lines after the first `warmup`, the prediction, its interval, inside or not)."""
    if warmup < 0:
        raise PlanError("must be 0 or more iteration lines", field="--warmup")
    if plan.job.workload.value != "pretrain":
        raise PlanError(f"a {log.format} log is read against a pretraining plan; this plan's workload is "
                        f"{plan.job.workload.value}", field="job.workload")
    steps = log.steps[warmup:]
    if not steps:
        raise PlanError(f"{log.path} has {len(log.steps)} iteration lines, all left out as warm-up (--warmup {warmup}): "
                        "give a smaller --warmup", field="--warmup")
    checked = check_against_plan(log, plan, steps)
    pred, u = plan.prediction, plan.prediction.uncertainty
    times, source = step_times(log, plan, steps)
    world, peak = plan.world_size, plan.machine.peak_flops(plan.job.precision)
    flops = pred.model_flops_per_step
    rows = [
        _row("step time", "s", times, pred.step_time_s, u and u.time_interval(pred.step_time_s), source),
        _row("tokens/s", "tokens/s", [plan.job.tokens_per_step / t for t in times], pred.tokens_per_s,
             u and u.rate_interval(pred.tokens_per_s), "the plan's tokens per step / step time"),
        _row("model TFLOP/s per device", "TFLOP/s", [flops / t / world / 1e12 for t in times],
             pred.model_tflops_per_device, u and u.rate_interval(pred.model_tflops_per_device),
             "the plan's model FLOPs per step / step time / world size"),
        _row("MFU", "", [flops / t / world / peak for t in times], pred.mfu, u and u.rate_interval(pred.mfu),
             f"model FLOP/s per device / {plan.machine.name}'s {plan.job.precision.value} peak"),
    ]
    logged = [s.tflops_per_device for s in steps]
    if all(x is not None for x in logged):
        rows.append(_row("TFLOP/s per device, as logged", "TFLOP/s", logged,
                         source=f"{log.format}'s own FLOP count (its formula, not the planner's)"))
    logged = [s.mfu for s in steps]
    if all(x is not None for x in logged):
        rows.append(_row("MFU, as logged", "", logged, source="torchtitan's FLOP count over its own peak for the device"))
    if log.memory_gib is not None:
        m = pred.memory_gib_per_device
        rows.append(_row("peak memory per device", "GiB", [log.memory_gib], m, u and u.memory_interval(m),
                         log.memory_measure))
    notes = []
    profile = PROFILE_OF[log.format]
    if plan.job.framework.name != profile:
        notes.append(f"the plan was predicted with the {plan.job.framework.name!r} framework profile; `exaplan plan "
                     f"--framework {profile}` predicts the run as {log.format} runs it")
    missing = [k for k in ("global_batch", "seq_len", "world_size") if k not in log.stated
               and not any(getattr(s, k, None) is not None for s in steps)]
    if missing:
        notes.append("the log does not state its " + ", ".join(_WHAT[k] for k in missing) + ": taken as the plan's")
    if log.comms_lines:
        notes.append(f"the log also holds {log.comms_lines} DeepSpeed comms-logger lines: `exaplan calibrate "
                     f"--from-comms-log {log.path} --group-size {plan.mesh.dp} --base {plan.machine.name}` reads what "
                     "its collectives reached on the NICs")
    return dict(log=log.path, format=log.format, plan=plan_path, framework_profile=plan.job.framework.name,
                lines=len(log.steps), repeated_lines=log.repeated_lines, warmup_lines_excluded=min(warmup, len(log.steps)),
                steps_measured=len(steps), first_step=steps[0].step, last_step=steps[-1].step, checked=checked,
                rows=rows, uncertainty_basis=None if u is None else u.basis, notes=notes)


# ------------------------------------------------------------------------------------- a run to refit


def record_run(result: dict, plan, plan_path: str | Path, out_dir: str | Path) -> Path:
    """Write the compared run as `out_dir/plan.yaml` (the plan file as it is) and
    `out_dir/summary.json` (what `exaplan calibrate --from-runs` reads: the median step time
    and the peak memory, with where they come from). Refused for a plan predicted with another
    framework profile than the log's (the refit would fold that framework's cost into the
    machine's figures) and where out_dir already holds a run. Returns out_dir."""
    from calibration.fit_measurements import atomic_write

    profile = PROFILE_OF[result["format"]]
    if plan.job.framework.name != profile:
        raise PlanError(f"a {result['format']} run refits the machine only with a plan of the {profile!r} profile (this "
                        f"one's is {plan.job.framework.name!r}): make it with `exaplan plan --framework {profile}`",
                        field="job.framework")
    out = Path(out_dir)
    if (out / "summary.json").exists() or (out / "plan.yaml").exists():
        raise PlanError(f"{out} already holds a run (summary.json or plan.yaml): give a new folder", field="--record")
    rows = {r["what"]: r for r in result["rows"]}
    t, mem = rows["step time"], rows.get("peak memory per device")
    summary = {
        "source": "framework log", "log": str(Path(result["log"]).resolve()), "log_format": result["format"],
        "framework_profile": plan.job.framework.name, "steps": result["lines"],
        "warmup_steps_excluded": result["warmup_lines_excluded"], "steps_measured": result["steps_measured"],
        "first_step": result["first_step"], "last_step": result["last_step"],
        "measured_step_time_s": t["median"], "step_time_p10_s": t["p10"], "step_time_p90_s": t["p90"],
        "step_time_source": t["source"], "predicted_step_time_s": t["predicted"], "step_time_error": t["error"],
        "predicted_step_time_interval_s": t["interval"],
        "tokens_per_s": rows["tokens/s"]["median"], "predicted_tokens_per_s": rows["tokens/s"]["predicted"],
        "mfu": rows["MFU"]["median"], "predicted_mfu": rows["MFU"]["predicted"],
        "peak_memory_gib": None if mem is None else mem["median"],
        "peak_memory_measures": None if mem is None else mem["source"],
        "predicted_memory_gib": plan.prediction.memory_gib_per_device,
        "world_size": plan.world_size, "model": plan.model.name, "machine": plan.machine.name,
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "plan.yaml", Path(plan_path).read_text())
    atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return out
