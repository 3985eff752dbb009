"""Measured kernels (planner/schema/kernels.py, compute.measured_kernels): a device kind's
measurement of exaplan's runtime replaces the fitted attention and elementwise figures for the
exaplan profile on a GPU, and adds the weights' traffic per micro-batch; never for another
profile, on a CPU, or where the kind has no measurement."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from machine_models import load_framework, load_machine
from planner.cost import compute, flops
from planner.cost.layout import Layouts
from planner.presets import get_model
from planner.schema.kernels import RuntimeKernels
from planner.schema.specs import Precision, TrainingJob

MODEL = get_model("protein-3.5b")
H100 = load_machine("dgx-h100")
TABLE = RuntimeKernels(source="test", attention_tflops={64: {512: 100.0, 2048: 300.0}, 128: {512: 200.0, 2048: 400.0}},
                       elementwise_efficiency=0.8)


def _job(framework="exaplan", seq=2048, **update) -> TrainingJob:
    profile = load_framework(framework, compiled=framework == "exaplan").model_copy(update=update)
    return TrainingJob(global_batch=8, seq_len=seq, precision=Precision.bf16, framework=profile)


def test_the_table_interpolates_in_log_sequence_at_the_nearest_head_dimension():
    assert TABLE.attention_rate_tflops(128, 512) == 200.0 and TABLE.attention_rate_tflops(128, 2048) == 400.0
    assert TABLE.attention_rate_tflops(128, 1024) == pytest.approx(300.0)  # halfway in log(sequence)
    assert TABLE.attention_rate_tflops(96, 2048) == 400.0  # 96 is nearer 128 than 64 on a log scale
    assert TABLE.attention_rate_tflops(80, 2048) == 300.0
    assert TABLE.attention_rate_tflops(128, 65536) == 400.0  # past the longest: it stays
    assert TABLE.attention_rate_tflops(128, 128) == pytest.approx(50.0)  # below the shortest: in proportion


@pytest.mark.parametrize("table", [{}, {128: {}}, {128: {0: 1.0}}, {128: {512: -1.0}}])
def test_a_bad_table_is_refused(table):
    with pytest.raises(ValidationError):
        RuntimeKernels(source="x", attention_tflops=table, elementwise_efficiency=0.5)


def test_the_h100_and_h200_carry_the_measurement_and_the_exaplan_and_jax_profiles_charge_it():
    assert H100.runtime_kernels is not None and load_machine("dgx-h200").runtime_kernels is not None
    # the same chip: the H200's own measurement within 1% of the H100's attention from 4k tokens (3% at 2k)
    h200 = load_machine("dgx-h200").runtime_kernels
    for hd in (64, 128):
        for seq in (4096, 8192, 16384):
            assert h200.attention_rate_tflops(hd, seq) == pytest.approx(H100.runtime_kernels.attention_rate_tflops(hd, seq), rel=0.02)
    assert load_machine("dgx-a100-80gb").runtime_kernels is None and load_machine("frontier").runtime_kernels is None
    # the GH200 (Alps) carries the H100's, copied (the same die; no GH200 lent), and says so
    gh200 = load_machine("alps").runtime_kernels
    assert gh200.source.startswith("copied from NVIDIA H100 SXM5")
    assert gh200.attention_tflops == H100.runtime_kernels.attention_tflops
    assert gh200.elementwise_efficiency == H100.runtime_kernels.elementwise_efficiency
    assert compute.measured_kernels(H100, _job()) is H100.runtime_kernels
    for other in ("megatron", "deepspeed"):
        assert compute.measured_kernels(H100, _job(other)) is None, other
    # the JAX backend runs cuDNN's flash attention and fused elementwise work too (docs/validation/
    # gpu.md, "The JAX backend on a GPU": five H100 runs within 6%)
    assert compute.measured_kernels(H100, _job("jax")) is H100.runtime_kernels
    assert compute.measured_kernels(load_machine("local", ranks=2), _job()) is None  # a CPU: its own fitted figures
    assert compute.measured_kernels(H100.model_copy(update={"runtime_kernels": None}), _job()) is None


def test_attention_is_the_forward_flops_over_the_measured_rate():
    machine = H100.model_copy(update={"runtime_kernels": TABLE})
    lay = Layouts.one(dp=1, mbs=4)
    t = float(compute.attention_core_time(MODEL, machine, _job(seq=2048), lay)[0])
    causal_forward_flops = 4.0 * 2048 * 2048 * MODEL.head_dim / 2 * MODEL.heads * 4
    assert t == pytest.approx(causal_forward_flops / (TABLE.attention_rate_tflops(MODEL.head_dim, 2048) * 1e12), rel=1e-12)
    # context parallelism: the kernel sees the local queries against every key, at the local rate
    cp = Layouts.one(dp=1, mbs=4, cp=2)
    t_cp = float(compute.attention_core_time(MODEL, machine, _job(seq=2048), cp)[0])
    assert t_cp == pytest.approx(causal_forward_flops / 2 / (TABLE.attention_rate_tflops(MODEL.head_dim, 1024) * 1e12))


def test_elementwise_work_runs_at_the_measured_fraction():
    machine = H100.model_copy(update={"runtime_kernels": TABLE})
    lay = Layouts.one(dp=1, mbs=4)
    j, fitted = _job(), _job(measured_kernels=False)
    nbytes = compute.elementwise_bytes(MODEL, machine, j, lay)
    measured = float(compute.elementwise_time(machine, nbytes, j)[0])
    assert measured == pytest.approx(float(nbytes[0]) / (machine.memory_bandwidth_gbyte_s * 1e9 * 0.8), rel=1e-12)
    assert float(compute.elementwise_time(machine, nbytes, fitted)[0]) == pytest.approx(
        measured * 0.8 / machine.elementwise_efficiency, rel=1e-12)


def test_the_weights_move_their_bytes_each_micro_batch_unless_fsdp_casts_them():
    lay = Layouts.one(dp=1, mbs=4)
    params = flops.layer_params(MODEL)
    t = float(compute.weight_traffic_time(H100, _job(), params, lay)[0])
    assert t == pytest.approx(24.0 * params / (H100.memory_bandwidth_gbyte_s * 1e9 * compute.EAGER_BANDWIDTH_FRACTION))
    assert t * 1e12 / params == pytest.approx(8.1, abs=0.1)  # ps a parameter: 8.0 measured by kernel name on an H100
    fsdp = Layouts.one(dp=8, mbs=4, sharding="fsdp")
    assert float(compute.weight_traffic_time(H100, _job(), params, fsdp)[0]) == 0.0
    assert float(compute.weight_traffic_time(H100, _job("megatron"), params, lay)[0]) == 0.0
    # in the block's forward + backward, once a micro-batch
    with_w = compute.layer_times(MODEL, H100, _job(), lay)[1]
    without = compute.layer_times(MODEL, H100, _job(weight_bytes_per_param=0.0), lay)[1]
    assert float(with_w[0] - without[0]) == pytest.approx(t, rel=1e-9)


def test_explain_says_which_kernel_rates_a_plan_charges():
    from pathlib import Path

    from planner.report import kernels_line
    from planner.schema.plan import load_plan

    plans = Path(__file__).resolve().parents[2] / "plans"
    h100 = load_plan(plans / "gpu" / "protein-3.5b_1xh100.yaml")
    assert h100.job.framework.measured_kernels and "measured for exaplan's runtime" in kernels_line(h100)
    assert H100.runtime_kernels.source in kernels_line(h100)
    aurora = load_plan(plans / "protein-3.5b_aurora_3200n.yaml")
    assert kernels_line(aurora).startswith("the fitted figures of Intel Max 1550 tile")


def test_eager_surplus_streams_at_the_measured_rate_where_there_is_one():
    lay = Layouts.one(dp=1, mbs=4)
    eager = TrainingJob(global_batch=8, seq_len=512, precision=Precision.bf16, framework=load_framework("exaplan"))
    copy_rate = compute.eager_extra_time(MODEL, H100.model_copy(update={"runtime_kernels": TABLE}), eager, lay)
    measured = compute.eager_extra_time(MODEL, H100, eager, lay)
    assert TABLE.eager_surplus_efficiency is None and H100.runtime_kernels.eager_surplus_efficiency == 0.63
    assert float(measured[0]) == pytest.approx(float(copy_rate[0]) * compute.EAGER_BANDWIDTH_FRACTION / 0.63, rel=1e-12)
