"""The cost model's kernel terms against kernels timed on a GPU (calibration/kernel_check.py,
`exaplan validate --kernels`), on the H100 file benchmarks/gpu_kernels.py wrote
(docs/gpu/2026-11-26-h100-kernels.json), and the benchmark's own refusal without a GPU."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from calibration import kernel_check as kc
from cli.main import main
from machine_models import load_machine
from planner.cost import compute

H100_FILE = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "2026-11-26-h100-kernels.json"


@pytest.fixture(scope="module")
def h100():
    return kc.load(H100_FILE)


def test_cards_map_to_the_presets_of_their_device_kind():
    assert kc.preset_for("NVIDIA H100 80GB HBM3") == "dgx-h100"
    assert kc.preset_for("NVIDIA H200") == "dgx-h200"
    assert kc.preset_for("NVIDIA GH200 480GB") == "alps"
    assert kc.preset_for("NVIDIA A100-SXM4-80GB") == "dgx-a100-80gb"
    assert kc.preset_for("AMD Instinct MI300X") is None


def test_every_part_of_the_file_is_compared(h100):
    rows = kc.compare(h100, load_machine("dgx-h100"))
    assert {r.part for r in rows} == {"gemm", "attention", "elementwise", "loss", "step"}
    assert all(r.measured_ms > 0 and r.model_ms > 0 for r in rows)
    # 9 section A blocks + 12 squares; 3 backends x 2 head dims x 6 sequences
    assert sum(r.part == "gemm" for r in rows) == 21
    assert sum(r.part == "attention" for r in rows) == 36


def test_a_blocks_model_time_is_the_cost_models_gemm_time_over_its_twelve_gemms(h100):
    m = load_machine("dgx-h100")
    block = h100["gemm"]["section_a_blocks"][0]
    job = kc._job(4096)
    expected = sum(float(compute.gemm_time(m, job, g["m"], g["n"], g["k"])) for g in block["gemms"].values()) * 1e3
    row = next(r for r in kc.gemm_rows(h100, m) if r.case == f"block h{block['hidden']} tp{block['tp']}")
    assert len(block["gemms"]) == 12
    assert row.model_ms == pytest.approx(expected)
    assert row.measured_ms == pytest.approx(block["forward_backward_ms"])


def test_attention_model_time_grows_with_batch_and_with_the_square_of_a_long_sequence():
    m = load_machine("dgx-h100")
    one, two = kc.attention_model_ms(m, 4096, 128, 16, 1), kc.attention_model_ms(m, 4096, 128, 16, 2)
    assert two == pytest.approx(2 * one)
    # beyond the fused kernel's saturation the rate is constant: time ~ s^2 per sequence
    assert kc.attention_model_ms(m, 8192, 128, 16, 1) == pytest.approx(4 * one)


def test_the_machines_figures_move_the_model_side_only(h100):
    """A part of the kind with twice the memory bandwidth speeds the elementwise and loss
    predictions by the share of their time that scales with it (compute.elementwise_bandwidth:
    s / 2 + 1 - s of the time); the measured side is the file's."""
    from planner.cost.compute import ELEMENTWISE_BANDWIDTH_SHARE as s

    m = load_machine("dgx-h100")
    fast = m.model_copy(update={"memory_bandwidth_gbyte_s": 2 * m.memory_bandwidth_gbyte_s})
    for part in (kc.elementwise_rows, kc.loss_rows):
        for a, b in zip(part(h100, m), part(h100, fast)):
            assert b.model_ms == pytest.approx(a.model_ms * (s / 2 + 1 - s))
            assert b.measured_ms == a.measured_ms


def test_exaplans_compiled_block_is_predicted_within_ten_percent_of_the_h100s_wall_time(h100):
    """Held-out check (nothing was fitted to these runs): exaplan's own block as its one-GPU
    protein-3.5b plan runs it, compiled, 4 blocks forward + backward on the H100."""
    rows = {r.case: r for r in kc.step_rows(h100, load_machine("dgx-h100"))}
    assert abs(rows["compiled wall"].ratio - 1) < 0.10
    assert rows["eager wall"].model_ms > rows["compiled wall"].model_ms  # eager's surplus traffic is charged


def test_summary_groups_by_kind(h100):
    s = kc.summary(kc.compare(h100, load_machine("dgx-h100")))
    assert {"gemm block", "gemm square", "attention flash", "attention cudnn", "elementwise", "loss megatron",
            "step wall"} <= set(s)
    assert s["gemm block"]["cases"] == 9
    assert all(v["min"] <= v["median"] <= v["max"] for v in s.values())


def test_cli_prints_the_table_and_json(capsys):
    assert main(["validate", "--kernels", str(H100_FILE)]) == 0
    out = capsys.readouterr().out
    assert "model / measured" in out and "dgx-h100" in out
    assert main(["validate", "--kernels", str(H100_FILE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["machine"] == "dgx-h100" and len(data["rows"]) > 60


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read"),
    ({"gemm": {}}, "device.device"),
    ({"device": {"device": "AMD Instinct MI300X"}}, "--machine"),
])
def test_bad_kernel_files_exit_2_naming_the_field(tmp_path, capsys, content, needle):
    path = tmp_path / "k.json"
    if content is not None:
        path.write_text(json.dumps(content))
    assert main(["validate", "--kernels", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_file_missing_a_field_names_it(h100, tmp_path, capsys):
    data = copy.deepcopy(h100)
    del data["loss"][0]["megatron_ops_ms"]
    path = tmp_path / "k.json"
    path.write_text(json.dumps(data))
    assert main(["validate", "--kernels", str(path)]) == 2
    assert "megatron_ops_ms" in capsys.readouterr().err


def test_the_benchmark_refuses_without_a_gpu(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from benchmarks import gpu_kernels

    assert gpu_kernels.main(["--out", str(tmp_path)]) == 2
    assert "CUDA" in capsys.readouterr().err
    assert not (tmp_path / "gpu_kernels.json").exists()


def test_a_file_with_some_parts_compares_those():
    """The second H100 file holds exaplan's block alone (with its kernels by name): only step
    rows, and the per-parameter casts and gradient accumulation among the named kernels."""
    data = kc.load(H100_FILE.with_name("2026-11-26-h100-kernels-step.json"))
    rows = kc.compare(data, load_machine("dgx-h100"))
    assert rows and {r.part for r in rows} == {"step"}
    compiled = next(s for s in data["step"] if s["mode"] == "compiled")
    names = [k for k, _ in compiled["top_kernels_ms"]]
    assert any("to_copy" in n for n in names) and any("CUDAFunctor_add<float>" in n for n in names)


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "k.png"
    assert main(["validate", "--kernels", str(H100_FILE), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
