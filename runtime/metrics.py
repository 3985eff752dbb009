"""What a run measured, next to what its plan predicted.

`MetricsWriter` (rank 0 writes; the others pass enabled=False and do nothing):

    out_dir/metrics.jsonl   one JSON object a line: {"kind": "train", step, loss, tokens,
                            step_time_s, tokens_per_s, model_tflops_per_device, mfu,
                            peak_memory_bytes, peak_memory_gib, lr, grad_norm, time} per step,
                            {"kind": "validation", step, val_loss, time} per validation;
                            DPO runs add {"kind": "dpo", ...} per step and
                            {"kind": "dpo_validation", ...} per validation (log_dpo_*)
    out_dir/summary.json    at the end (written atomically): measured against predicted
    out_dir/tensorboard/    the same scalars, if the `tensorboard` package is installed

Throughput follows the planner's definitions (planner/cost/step.py), so that measured and
predicted compare like for like: model FLOPs per token = the plan's
`prediction.model_flops_per_step / job.tokens_per_step` (forward + backward, no recompute;
for DPO with the reference in the step, plus its forward, as the planner counts it), model
TFLOP/s per device = tokens x that / step time / devices, MFU = that /
`plan.machine.peak_flops(plan.job.precision)`. "Devices" are the plan's ranks
(plan.world_size). The measured step time is the median over the steps after warm-up (the
first `warmup_steps` = 2 steps logged by this process are left out: allocator, caches, lazy
initialisation, compilation).
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from planner.schema.plan import Plan

log = logging.getLogger(__name__)

GIB = float(1 << 30)
WARMUP_STEPS = 2
_warned_no_tensorboard = False


# --------------------------------------------------------------------------------------------
# Peak memory
# --------------------------------------------------------------------------------------------


def peak_memory_bytes(device=None) -> int:
    """This process's peak memory on `device` (a torch.device or a string; None = CPU), bytes.

    cuda  torch.cuda.max_memory_allocated: the high-water mark of memory held by tensors
          through the caching allocator since the start (or torch.cuda.reset_peak_memory_stats);
          excludes the CUDA context, NCCL buffers and the allocator's cached-but-free blocks,
          so it reads below nvidia-smi.
    xpu   torch.xpu.max_memory_allocated: the same for Intel GPUs.
    cpu   resource.getrusage(RUSAGE_SELF).ru_maxrss: the process's resident-set high-water mark
          (KiB on Linux, bytes on macOS): every tensor plus the interpreter, torch's libraries
          (several hundred MB), gloo buffers and the data loader; it never decreases and cannot
          be reset. 0 where the platform has no `resource` module.
    """
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    if dev.type == "xpu":
        return int(torch.xpu.max_memory_allocated(dev))
    try:
        import resource
    except ImportError:  # Windows
        return 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def describe_peak_memory(device=None) -> str:
    """One line saying what `peak_memory_bytes` measures on this kind of device."""
    kind = getattr(device, "type", None) or str(device or "cpu").split(":")[0]
    if kind in ("cuda", "xpu"):
        return f"torch.{kind}.max_memory_allocated (tensors only; no context or allocator cache)"
    return "process RSS high-water mark (ru_maxrss: tensors + interpreter + libraries)"


# --------------------------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------------------------


def flops_per_token(plan: Plan) -> float:
    """Model FLOPs per trained token as the planner counts them: the policy's forward +
    backward, plus the frozen reference's forward when a dpo plan runs it in the step (the
    plan's prediction carries them per step)."""
    return plan.prediction.model_flops_per_step / plan.job.tokens_per_step


def throughput(plan: Plan, tokens: float, step_time_s: float) -> dict[str, float]:
    """tokens/s, model TFLOP/s per device and MFU of one step (the planner's definitions)."""
    if step_time_s <= 0:
        return {"tokens_per_s": math.nan, "model_tflops_per_device": math.nan, "mfu": math.nan}
    tps = tokens / step_time_s
    model_flops_per_s = tps * flops_per_token(plan) / plan.world_size
    return {
        "tokens_per_s": tps,
        "model_tflops_per_device": model_flops_per_s / 1e12,
        "mfu": model_flops_per_s / plan.machine.peak_flops(plan.job.precision),
    }


def _num(x: Any) -> float | None:
    """A plain float for JSON (tensors and numpy scalars too); None for missing or non-finite."""
    if x is None:
        return None
    if hasattr(x, "full_tensor"):  # a DTensor (e.g. FSDP2's clipped gradient norm)
        x = x.full_tensor()
    try:
        v = float(x.item() if hasattr(x, "item") else x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _error(measured: float | None, predicted: float | None) -> float | None:
    """Relative error of the prediction: measured / predicted - 1 (None when undefined)."""
    if measured is None or predicted is None or predicted == 0:
        return None
    return measured / predicted - 1.0


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# The writer
# --------------------------------------------------------------------------------------------


def _intervals(pred, step_time: float | None, peak_gib: float | None) -> dict[str, Any]:
    """The plan's intervals (prediction.uncertainty: step time x (1 +/- u), a rate / (1 +/- u),
    memory x (1 +/- u_mem)) and whether the measured figures lie inside; {} for a plan without."""
    u = pred.uncertainty
    if u is None:
        return {}

    def inside(value, lo_hi):
        return None if value is None else bool(lo_hi[0] <= value <= lo_hi[1])

    t, m = list(u.time_interval(pred.step_time_s)), list(u.memory_interval(pred.memory_gib_per_device))
    rate = list(u.rate_interval(pred.tokens_per_s))
    return {"predicted_step_time_interval_s": t, "step_time_inside_interval": inside(step_time, t),
            "predicted_tokens_per_s_interval": rate, "predicted_memory_interval_gib": m,
            "memory_inside_interval": inside(peak_gib, m), "uncertainty_basis": u.basis}


class MetricsWriter:
    """Per-step metrics to metrics.jsonl (and TensorBoard), the summary at the end.

    Only rank 0 should pass enabled=True; a disabled writer does nothing and returns {}.
    `device` (optional) only labels what the peak memory means in the summary; `purge_step`
    (a resumed run: the checkpoint's step) drops TensorBoard's events from that step on."""

    def __init__(self, out_dir: str | Path, plan: Plan, enabled: bool = True, *, warmup_steps: int = WARMUP_STEPS,
                 tensorboard: bool = True, console=None, device=None, purge_step: int | None = None):
        self.out_dir = Path(out_dir)
        self.plan = plan
        self.enabled = enabled
        self.warmup_steps = warmup_steps
        self.console = console
        self.device = device
        self.steps: list[dict[str, Any]] = []
        self.validations: list[dict[str, Any]] = []
        self._t0 = time.time()
        self._tb = None
        self._file = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self._file = open(self.path, "a")
        if tensorboard:
            self._tb = _summary_writer(self.out_dir / "tensorboard", purge_step)

    # ------------------------------------------------------------------------------ logging

    def _emit(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_step(self, step: int, loss, tokens: float, step_time_s: float, peak_memory_bytes: int,
                 lr: float | None = None, grad_norm=None, phases: dict[str, float] | None = None,
                 time_s: float | None = None) -> dict[str, Any]:
        """One optimizer step. `loss`: the global mean loss; `tokens`: tokens processed by all
        ranks in the step (global batch x sequence length); `peak_memory_bytes`: the maximum
        over ranks (the trainer all-reduces it); `phases`: seconds per part of the step on rank
        0 (forward_backward_s, clip_s, optimizer_s); `time_s`: when the step ended (default
        now: the trainer writes steps in batches, runtime/steplog.py). Returns the record."""
        if not self.enabled:
            return {}
        rate = throughput(self.plan, float(tokens), float(step_time_s))
        record = {
            "kind": "train",
            "step": int(step),
            "loss": _num(loss),
            "tokens": int(tokens),
            "step_time_s": float(step_time_s),
            "tokens_per_s": _num(rate["tokens_per_s"]),
            "model_tflops_per_device": _num(rate["model_tflops_per_device"]),
            "mfu": _num(rate["mfu"]),
            "peak_memory_bytes": int(peak_memory_bytes),
            "peak_memory_gib": int(peak_memory_bytes) / GIB,
            "lr": _num(lr),
            "grad_norm": _num(grad_norm),
            "time": time.time() if time_s is None else float(time_s),
        }
        record.update({k: float(v) for k, v in (phases or {}).items()})
        self.steps.append(record)
        self._emit(record)
        if self._tb is not None:
            for key in ("loss", "tokens_per_s", "model_tflops_per_device", "mfu", "step_time_s", "peak_memory_gib", "lr", "grad_norm"):
                if record[key] is not None:
                    self._tb.add_scalar(f"train/{key}", record[key], record["step"])
        return record

    def log_validation(self, step: int, val_loss) -> dict[str, Any]:
        if not self.enabled:
            return {}
        record = {"kind": "validation", "step": int(step), "val_loss": _num(val_loss), "time": time.time()}
        self.validations.append(record)
        self._emit(record)
        if self._tb is not None and record["val_loss"] is not None:
            self._tb.add_scalar("val/loss", record["val_loss"], record["step"])
        return record

    def log_event(self, kind: str, step: int, **fields) -> dict[str, Any]:
        """A record of what happened to the run: {"kind": "resume", step, sample, checkpoint}
        when it continues from a checkpoint; {"kind": "stop", step, reason, resume_step,
        checkpoint, exit_code} when a signal stopped it (runtime/walltime.py); {"kind":
        "attention", step, kernel} when the JAX backend's cuDNN attention refused the traced
        shapes and XLA's ran instead (jaxrt/trainer.py)."""
        if not self.enabled:
            return {}
        record = {"kind": kind, "step": int(step), **fields, "time": time.time()}
        self._emit(record)
        return record

    def log_dpo_step(self, step: int, stats: dict[str, float]) -> dict[str, Any]:
        """DPO metrics of one step (runtime/dpo.py STAT_KEYS, means over the global batch's
        pairs), next to its "train" record: {"kind": "dpo", step, loss, reward_accuracy,
        reward_margin, chosen_reward, rejected_reward, chosen_logp, rejected_logp,
        logp_accuracy, pairs}."""
        return self._dpo_record("dpo", "dpo", step, stats)

    def log_dpo_validation(self, step: int, stats: dict[str, float]) -> dict[str, Any]:
        """DPO metrics over the validation pairs: {"kind": "dpo_validation", step, val_loss,
        reward_accuracy, ...}; counts as a validation for the summary's val_loss."""
        record = self._dpo_record("dpo_validation", "dpo_val", step, stats)
        if record:
            self.validations.append(record)
        return record

    def _dpo_record(self, kind: str, board: str, step: int, stats: dict[str, float]) -> dict[str, Any]:
        if not self.enabled:
            return {}
        record = {"kind": kind, "step": int(step), **{k: (_num(v) if k != "pairs" else int(v)) for k, v in stats.items()},
                  "time": time.time()}
        if kind == "dpo_validation":
            record["val_loss"] = record.get("loss")
        self._emit(record)
        if self._tb is not None:
            for key, value in stats.items():
                if key != "pairs" and _num(value) is not None:
                    self._tb.add_scalar(f"{board}/{key}", _num(value), int(step))
        return record

    # ------------------------------------------------------------------------------ summary

    def measured_steps(self) -> list[dict[str, Any]]:
        """The steps the measurement uses: all but the first `warmup_steps` logged (all of them
        when there are no more than that)."""
        return self.steps[self.warmup_steps:] or list(self.steps)

    def compute_summary(self) -> dict[str, Any]:
        plan, pred = self.plan, self.plan.prediction
        used = self.measured_steps()
        step_time = statistics.median(r["step_time_s"] for r in used) if used else None
        tokens = statistics.median(r["tokens"] for r in used) if used else None
        rate = throughput(plan, tokens, step_time) if used else {}
        peak = max((r["peak_memory_bytes"] for r in self.steps), default=None)
        losses = [r["loss"] for r in self.steps]
        out = {
            "steps": len(self.steps),
            "first_step": self.steps[0]["step"] if self.steps else None,
            "last_step": self.steps[-1]["step"] if self.steps else None,
            "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else None,
            "val_loss": self.validations[-1]["val_loss"] if self.validations else None,
            "warmup_steps_excluded": len(self.steps) - len(used),
            "steps_measured": len(used),
            "tokens_per_step": tokens,
            "measured_step_time_s": step_time,
            "predicted_step_time_s": pred.step_time_s,
            "step_time_error": _error(step_time, pred.step_time_s),
            "tokens_per_s": _num(rate.get("tokens_per_s")),
            "predicted_tokens_per_s": pred.tokens_per_s,
            "tokens_per_s_error": _error(_num(rate.get("tokens_per_s")), pred.tokens_per_s),
            "model_tflops_per_device": _num(rate.get("model_tflops_per_device")),
            "predicted_model_tflops_per_device": pred.model_tflops_per_device,
            "mfu": _num(rate.get("mfu")),
            "predicted_mfu": pred.mfu,
            "mfu_error": _error(_num(rate.get("mfu")), pred.mfu),
            "peak_memory_gib": peak / GIB if peak is not None else None,
            "predicted_memory_gib": pred.memory_gib_per_device,
            "memory_error": _error(peak / GIB if peak is not None else None, pred.memory_gib_per_device),
            "peak_memory_measures": describe_peak_memory(self.device if self.device is not None else _default_device()),
            "model_flops_per_token": flops_per_token(plan),
            "peak_flops_per_device": plan.machine.peak_flops(plan.job.precision),
            "world_size": plan.world_size,
            "model": plan.model.name,
            "machine": plan.machine.name,
            "mesh": dict(zip(("pp", "dp_replicate", "dp_shard", "cp", "tp"), plan.mesh.degrees)),
            "wall_time_s": time.time() - self._t0,
        }
        out.update(_intervals(pred, step_time, out["peak_memory_gib"]))
        return out

    def finish(self, summary: dict | None = None) -> dict[str, Any]:
        """Write summary.json (what was measured and predicted; `summary` entries from the
        trainer are added and win), print the measured-vs-predicted table, close the files.
        Returns the summary ({} when disabled)."""
        if not self.enabled:
            return {}
        out = self.compute_summary()
        for k, v in (summary or {}).items():
            out[k] = _num(v) if k in ("val_loss", "final_loss", "first_loss") else v
        _write_json_atomic(self.out_dir / "summary.json", out)
        self._print_table(out)
        self.close()
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def _print_table(self, s: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.table import Table

        def fmt(v, spec):
            return "—" if v is None else format(v, spec)

        def err(v):
            return "—" if v is None else f"{v:+.1%}"

        def span(key, spec, inside):
            lo_hi = s.get(key)
            if lo_hi is None:
                return "—"
            mark = "" if inside is None else (" inside" if inside else " OUTSIDE")
            return f"{format(lo_hi[0], spec)}-{format(lo_hi[1], spec)}{mark}"

        t = Table(title=f"Measured vs predicted: {s['model']} on {s['world_size']} ranks of {s['machine']} "
                        f"({s['steps_measured']} steps after {s['warmup_steps_excluded']} warm-up)",
                  title_justify="left", caption_justify="left")
        for col, just in (("", "left"), ("measured", "right"), ("predicted", "right"), ("error", "right"),
                          ("interval", "right")):
            t.add_column(col, justify=just)
        inside_t, inside_m = s.get("step_time_inside_interval"), s.get("memory_inside_interval")
        t.add_row("step time (s)", fmt(s["measured_step_time_s"], ".4g"), fmt(s["predicted_step_time_s"], ".4g"),
                  err(s["step_time_error"]), span("predicted_step_time_interval_s", ".3g", inside_t))
        t.add_row("tokens/s", fmt(s["tokens_per_s"], ",.0f"), fmt(s["predicted_tokens_per_s"], ",.0f"),
                  err(s["tokens_per_s_error"]), span("predicted_tokens_per_s_interval", ",.0f", inside_t))
        t.add_row("memory (GiB/device)", fmt(s["peak_memory_gib"], ".3g"), fmt(s["predicted_memory_gib"], ".3g"),
                  err(s["memory_error"]), span("predicted_memory_interval_gib", ".3g", inside_m))
        t.add_row("MFU", fmt(s["mfu"], ".2%"), fmt(s["predicted_mfu"], ".2%"), err(s["mfu_error"]), "")
        t.caption = (f"loss {fmt(s['first_loss'], '.4f')} -> {fmt(s['final_loss'], '.4f')}, validation "
                     f"{fmt(s['val_loss'], '.4f')}; error = measured / predicted - 1; memory: {s['peak_memory_measures']}")
        (self.console or Console()).print(t)


def truncate_after(path: str | Path, step: int) -> int:
    """Drop the per-step records (train, validation, samples, dpo, ...) of steps >= `step` from a
    metrics.jsonl, atomically: what a resumed run will log again from that checkpoint step.
    Events (resume, stop) are kept. Returns the number of records dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash
            dropped += 1
            continue
        if record.get("kind") not in ("resume", "stop") and int(record.get("step", -1)) >= step:
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def _summary_writer(log_dir: Path, purge_step: int | None = None):
    """torch.utils.tensorboard's SummaryWriter, or None (one warning) without `tensorboard`.
    `purge_step` (a resumed run's checkpoint step): TensorBoard hides the events of that step
    and later from the earlier event files, so the steps a resume repeats appear once."""
    global _warned_no_tensorboard
    try:
        import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        if not _warned_no_tensorboard:
            log.warning("tensorboard is not installed: metrics go to metrics.jsonl only (pip install tensorboard)")
            _warned_no_tensorboard = True
        return None
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
