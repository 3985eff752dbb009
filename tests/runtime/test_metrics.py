"""Metrics: metrics.jsonl records, MFU by hand, summary.json, warm-up excluded from the
measured step time, the measured-vs-predicted table, peak memory on the CPU."""

from __future__ import annotations

import io
import json
import logging
import math
from pathlib import Path

import pytest
from rich.console import Console

from planner.schema.plan import load_plan
from runtime import metrics
from runtime.metrics import MetricsWriter, peak_memory_bytes

PLAN_FILE = Path(__file__).resolve().parents[2] / "plans" / "protein-7b_dgx-h100_16n.yaml"

TRAIN_FIELDS = {"kind", "step", "loss", "tokens", "step_time_s", "tokens_per_s", "model_tflops_per_device", "mfu",
                "peak_memory_bytes", "peak_memory_gib", "lr", "grad_norm", "time"}
SUMMARY_KEYS = {"steps", "first_loss", "final_loss", "val_loss", "tokens_per_s", "measured_step_time_s",
                "predicted_step_time_s", "peak_memory_gib", "predicted_memory_gib", "mfu", "predicted_mfu",
                "step_time_error", "tokens_per_s_error", "memory_error", "mfu_error", "warmup_steps_excluded"}


@pytest.fixture(scope="module")
def plan():
    return load_plan(PLAN_FILE)


def writer(tmp_path, plan, **kw) -> tuple[MetricsWriter, io.StringIO]:
    buf = io.StringIO()
    return MetricsWriter(tmp_path, plan, enabled=True, tensorboard=False, console=Console(file=buf, width=200), **kw), buf


def hand_flops_per_token(plan) -> float:
    """Megatron-style count written out: per layer QKV, attention core, output projection,
    SwiGLU MLP; the logits; forward + backward = 3 x forward."""
    m, s = plan.model, plan.job.seq_len
    h, f, kv = m.hidden, m.ffn_hidden, m.kv_heads * (m.hidden // m.heads)
    layer = 2 * h * (h + 2 * kv) + 4 * s * h + 2 * h * h + 2 * 3 * h * f
    return 3 * (m.layers * layer + 2 * h * m.vocab_size)


def test_metrics_jsonl_records_and_mfu_by_hand(tmp_path, plan):
    w, _ = writer(tmp_path, plan)
    tokens = plan.job.global_batch * plan.job.seq_len
    for step, t in enumerate((3.0, 2.0, 0.5, 0.6)):
        w.log_step(step, 2.5 - 0.1 * step, tokens, t, 40 << 30, 1e-4, 0.9)
    w.log_validation(3, 2.2)
    w.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["kind"] for r in records] == ["train"] * 4 + ["validation"]
    for r in records[:4]:
        assert set(r) == TRAIN_FIELDS
    assert records[4]["val_loss"] == 2.2 and records[4]["step"] == 3

    r = records[2]
    world, peak = plan.world_size, plan.machine.peak_flops(plan.job.precision)
    assert world == 16 * 8 and peak == 989e12  # dgx-h100, bf16
    tflops = tokens / 0.5 * hand_flops_per_token(plan) / world / 1e12
    assert r["tokens_per_s"] == pytest.approx(tokens / 0.5, rel=1e-12)
    assert r["model_tflops_per_device"] == pytest.approx(tflops, rel=1e-12)
    assert r["mfu"] == pytest.approx(tflops * 1e12 / peak, rel=1e-12)
    assert r["peak_memory_gib"] == 40.0 and r["lr"] == 1e-4 and r["grad_norm"] == 0.9
    # The planner's prediction uses the same definition: its MFU over its own step time.
    pred = metrics.throughput(plan, tokens, plan.prediction.step_time_s)
    assert pred["mfu"] == pytest.approx(plan.prediction.mfu, rel=1e-9)
    assert pred["tokens_per_s"] == pytest.approx(plan.prediction.tokens_per_s, rel=1e-9)


def test_summary_excludes_warm_up_and_compares_with_the_prediction(tmp_path, plan):
    w, buf = writer(tmp_path, plan)
    tokens = plan.job.global_batch * plan.job.seq_len
    times = (30.0, 9.0, 0.50, 0.70, 0.40, 0.60, 0.55)  # two slow warm-up steps, then steady
    for step, t in enumerate(times):
        w.log_step(100 + step, 3.0 - 0.1 * step, tokens, t, (30 + step) << 30, 1e-4, 1.0)
    w.log_validation(106, 2.4)
    s = w.finish({"stopped": "max steps"})
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == s
    assert not list(tmp_path.glob(".*tmp"))  # written through a temporary, then renamed
    assert SUMMARY_KEYS <= set(s)
    assert s["stopped"] == "max steps"
    assert s["steps"] == 7 and s["warmup_steps_excluded"] == 2 and s["steps_measured"] == 5
    assert s["measured_step_time_s"] == 0.55  # median of the five after warm-up
    assert s["first_loss"] == 3.0 and s["final_loss"] == pytest.approx(2.4) and s["val_loss"] == 2.4
    assert s["tokens_per_s"] == pytest.approx(tokens / 0.55)
    assert s["predicted_step_time_s"] == plan.prediction.step_time_s
    assert s["predicted_memory_gib"] == plan.prediction.memory_gib_per_device
    assert s["peak_memory_gib"] == 36.0
    assert s["step_time_error"] == pytest.approx(0.55 / plan.prediction.step_time_s - 1)
    assert s["memory_error"] == pytest.approx(36.0 / plan.prediction.memory_gib_per_device - 1)
    assert s["mfu"] == pytest.approx(metrics.throughput(plan, tokens, 0.55)["mfu"])
    table = buf.getvalue()
    for row in ("step time (s)", "tokens/s", "memory (GiB/device)", "MFU", "measured", "predicted", "error"):
        assert row in table
    assert f"{0.55 / plan.prediction.step_time_s - 1:+.1%}" in table


def test_few_steps_are_all_measured_and_a_trainer_value_wins(tmp_path, plan):
    w, _ = writer(tmp_path, plan)
    w.log_step(0, 3.0, 1000, 2.0, 1 << 30)
    w.log_step(1, float("nan"), 1000, 1.0, 1 << 30)
    s = w.finish({"val_loss": 1.5})
    assert s["warmup_steps_excluded"] == 0 and s["measured_step_time_s"] == 1.5
    assert s["final_loss"] is None  # non-finite values are written as null
    assert s["val_loss"] == 1.5
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[1]["loss"] is None and records[1]["lr"] is None


def test_disabled_writer_writes_nothing(tmp_path, plan):
    w = MetricsWriter(tmp_path / "out", plan, enabled=False)
    assert w.log_step(0, 1.0, 10, 1.0, 0, 0.1, 1.0) == {}
    assert w.log_validation(0, 1.0) == {}
    assert w.finish({}) == {}
    assert not (tmp_path / "out").exists()


def test_tensorboard_is_optional(tmp_path, plan, caplog):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        metrics._warned_no_tensorboard = False
        with caplog.at_level(logging.WARNING, logger="runtime.metrics"):
            MetricsWriter(tmp_path / "a", plan, enabled=True).close()
            MetricsWriter(tmp_path / "b", plan, enabled=True).close()
        warnings = [r for r in caplog.records if "tensorboard" in r.getMessage()]
        assert len(warnings) == 1  # one line, once per process
    else:
        w = MetricsWriter(tmp_path, plan, enabled=True, console=Console(file=io.StringIO()))
        w.log_step(0, 1.0, 10, 1.0, 0, 0.1, 1.0)
        w.finish()
        assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_peak_memory_on_cpu_is_the_process_high_water_mark():
    import torch

    before = peak_memory_bytes("cpu")
    assert before > 50 << 20  # the interpreter and torch alone
    x = torch.ones(64 << 20, dtype=torch.uint8)  # touch 64 MiB more than ever before
    x += 1
    after = peak_memory_bytes(torch.device("cpu"))
    assert after >= before
    status = Path("/proc/self/status")
    if status.exists():
        hwm = next(int(line.split()[1]) * 1024 for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        assert math.isclose(after, hwm, rel_tol=0.05)
    del x
    assert peak_memory_bytes() >= after  # never decreases
    assert "RSS" in metrics.describe_peak_memory("cpu") and "max_memory_allocated" in metrics.describe_peak_memory("cuda:0")


def test_the_summary_says_whether_the_measurement_lies_inside_the_plans_interval(tmp_path, plan):
    """summary.json and the table carry the plan's intervals (prediction.uncertainty) and
    whether the measured step time and memory lie inside them; a plan without them has none."""
    u = plan.prediction.uncertainty
    pred_t, pred_m = plan.prediction.step_time_s, plan.prediction.memory_gib_per_device
    tokens = plan.job.global_batch * plan.job.seq_len
    for factor, inside in ((1 + u.step_time / 2, True), (1 + 2 * u.step_time, False)):
        w, buf = writer(tmp_path / str(factor), plan, warmup_steps=0)
        w.log_step(0, 3.0, tokens, pred_t * factor, int(pred_m * (1 + 2 * u.memory) * 2**30), 1e-4, 1.0)
        s = w.finish()
        assert s["predicted_step_time_interval_s"] == pytest.approx([pred_t * (1 - u.step_time), pred_t * (1 + u.step_time)])
        assert s["step_time_inside_interval"] is inside
        assert s["memory_inside_interval"] is False  # 2 u above the prediction
        assert s["predicted_tokens_per_s_interval"][0] == pytest.approx(plan.prediction.tokens_per_s / (1 + u.step_time))
        assert s["uncertainty_basis"] == u.basis
        assert (" inside" if inside else " OUTSIDE") in buf.getvalue().split("step time (s)")[1].splitlines()[0]
    bare = plan.model_copy(update={"prediction": plan.prediction.model_copy(update={"uncertainty": None})})
    w, _ = writer(tmp_path / "bare", bare, warmup_steps=0)
    w.log_step(0, 3.0, tokens, pred_t, 1 << 30, 1e-4, 1.0)
    assert "step_time_inside_interval" not in w.finish()
