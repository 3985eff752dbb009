"""Machine models: presets load and validate, local detection, user files, clear errors."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import yaml

import machine_models.loader as loader
from cli.main import main as cli_main
from machine_models import detect_local_machine, list_machines, load_machine
from planner.schema.errors import PlanError
from planner.schema.specs import CollectiveLibrary, MachineModel, MatmulEfficiency, Precision, TopologyKind

PRESETS = ["aurora", "alps", "frontier", "leonardo", "pdx", "dgx-a100-80gb", "dgx-a100-40gb", "dgx-h100", "grand-teton-h100"]

# (devices per node, memory per device GiB, node injection GB/s, library) from MProt-DPO, SC24
SEEDS = {
    "aurora": (12, 64, 200, "oneccl"),
    "alps": (4, 96, 100, "nccl"),
    "frontier": (8, 64, 100, "rccl"),
    "leonardo": (4, 64, 50, "nccl"),
    "pdx": (8, 80, 400, "nccl"),
}


@pytest.fixture
def no_local_file(monkeypatch, tmp_path):
    """Point the calibrated-local file at a path that does not exist."""
    monkeypatch.setattr(loader, "LOCAL_FILE", tmp_path / "local.yaml")


def test_list_machines_has_every_preset_and_local():
    names = list_machines()
    assert set(PRESETS) <= set(names)
    assert "local" in names
    assert "device_kinds" not in names


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_is_sane(name):
    m = load_machine(name)
    assert isinstance(m, MachineModel)
    assert m.name == name
    assert m.description, "every preset says where its figures come from"
    assert not m.calibrated
    bf16, fp32 = m.peak_flops(Precision.bf16), m.peak_flops(Precision.fp32)
    assert 100e12 < bf16 < 2000e12 and fp32 < bf16
    assert 1000 <= m.memory_bandwidth_gbyte_s <= 5000
    assert m.collective_library != CollectiveLibrary.gloo
    assert m.intra_node_bandwidth_gbyte_s * m.devices_per_node > m.node_injection_gbyte_s
    assert 0 < m.matmul_efficiency.peak_fraction < 1
    if m.topology == TopologyKind.dragonfly:
        assert 0 < m.global_bandwidth_taper <= 1  # Leonardo's Dragonfly+ is untapered (1.0)
    assert m.model_dump() == MachineModel.model_validate(m.model_dump()).model_dump()


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_systems_match_seeds_table(name):
    devices, memory_gib, injection_gbyte_s, library = SEEDS[name]
    m = load_machine(name)
    assert m.devices_per_node == devices
    assert m.device_memory_gib == memory_gib
    assert m.node_injection_gbyte_s == pytest.approx(injection_gbyte_s)
    assert m.collective_library.value == library


def test_preset_files_start_with_a_source_comment():
    for name in PRESETS:
        text = (loader.PRESET_DIR / f"{name}.yaml").read_text()
        assert text.startswith("#") and "Sources" in text, name


def test_device_kind_figures_are_inherited_and_overridable(tmp_path):
    kinds = yaml.safe_load(loader.DEVICE_KINDS_FILE.read_text())
    for name in PRESETS:
        m = load_machine(name)
        assert m.device_name in kinds, f"{name}: device kind {m.device_name!r} has no efficiency figures"
        assert m.matmul_efficiency.peak_fraction == kinds[m.device_name]["matmul_efficiency"]["peak_fraction"]
    data = yaml.safe_load((loader.PRESET_DIR / "pdx.yaml").read_text())
    data["overlap"] = {"dp": 0.5}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    m = load_machine(str(path))
    assert m.overlap.dp == 0.5  # the file wins
    assert m.overlap.cp == kinds["NVIDIA H100 SXM5"]["overlap"]["cp"]  # the rest from the kind


def test_user_yaml_path(tmp_path):
    data = yaml.safe_load((loader.PRESET_DIR / "frontier.yaml").read_text())
    data.pop("name")
    data["nodes"] = 16
    path = tmp_path / "my-cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    m = load_machine(str(path))
    assert m.nodes == 16 and m.name == "my-cluster"
    assert load_machine(path).nodes == 16  # a Path works too


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ndevices_per_node: 8\npeak_tflops: {bf16: 1, fp32: [\n")
    with pytest.raises(PlanError) as err:
        load_machine(str(path))
    msg = str(err.value)
    assert str(path) in msg and "malformed YAML" in msg and "line" in msg


def test_misspelt_field_is_named_with_a_suggestion(tmp_path):
    data = yaml.safe_load((loader.PRESET_DIR / "alps.yaml").read_text())
    data["peak_tflop"] = data.pop("peak_tflops")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError) as err:
        load_machine(str(path))
    msg = str(err.value)
    assert str(path) in msg and "peak_tflop" in msg and "did you mean 'peak_tflops'" in msg


def test_renamed_bandwidth_field_names_its_new_name(tmp_path):
    data = yaml.safe_load((loader.PRESET_DIR / "alps.yaml").read_text())
    data["nic_gbps"] = data.pop("nic_gbit_s")
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError) as err:
        load_machine(str(path))
    assert "nic_gbps: renamed to 'nic_gbit_s'" in str(err.value)


def test_nested_misspelt_field_and_bad_value_are_named(tmp_path):
    data = yaml.safe_load((loader.PRESET_DIR / "alps.yaml").read_text())
    data["overlap"] = {"dpp": 0.5}
    data["nodes"] = -3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError) as err:
        load_machine(str(path))
    msg = str(err.value)
    assert "overlap.dpp" in msg and "nodes" in msg


def test_missing_file_and_unknown_name(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(PlanError, match="cannot read machine file") as err:
        load_machine(str(missing))
    assert str(missing) in str(err.value)
    with pytest.raises(PlanError, match="unknown machine 'frontierr'") as err:
        load_machine("frontierr")
    assert "frontier" in str(err.value)


def test_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(PlanError, match="expected a mapping"):
        load_machine(str(path))


def test_local_detection_is_sane(no_local_file):
    m = load_machine("local")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert m.devices_per_node == 2 and m.nodes == 1
    assert m.topology == TopologyKind.single_node
    assert m.collective_library == CollectiveLibrary.gloo and [a.value for a in m.algorithms] == ["ring"]
    assert not m.flash_attention and not m.calibrated
    assert 0.1 < m.device_memory_gib * 2 < 16384
    # fp32 achieved at a 2048 GEMM: 65 GFLOP/s per core (AVX2), 150 with AVX-512, split
    # between the ranks
    per_core = 150e9 if "avx512f" in loader._cpu_flags() else 65e9
    achieved = m.peak_flops(Precision.fp32) * loader._efficiency(m.matmul_efficiency, 2048)
    assert achieved == pytest.approx(per_core * cores / 2, rel=1e-6)
    ratio = m.peak_flops(Precision.fp32) / m.peak_flops(Precision.bf16)
    assert 100 < ratio < 400
    assert m.intra_node_latency_us > 100  # gloo on loopback: milliseconds, not microseconds
    assert m.overlap.dp < 0.5 and m.memory_reserve_gib < 1


def test_local_gemm_default_follows_the_cpu_flags(no_local_file, monkeypatch):
    monkeypatch.setattr(loader, "_cpu_flags", lambda: {"avx2", "fma"})
    avx2 = load_machine("local")
    monkeypatch.setattr(loader, "_cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    avx512 = load_machine("local")
    assert avx512.peak_flops(Precision.fp32) / avx2.peak_flops(Precision.fp32) == pytest.approx(150 / 65)


def test_local_honours_ranks(no_local_file):
    two, four = load_machine("local"), load_machine("local", ranks=4)
    assert four.devices_per_node == 4
    assert four.device_memory_gib == pytest.approx(two.device_memory_gib / 2, rel=1e-3)
    assert four.peak_flops(Precision.fp32) == pytest.approx(two.peak_flops(Precision.fp32) / 2)
    assert detect_local_machine(3).devices_per_node == 3
    with pytest.raises(PlanError, match="ranks"):
        detect_local_machine(0)


def test_calibrated_local_file_is_preferred(monkeypatch, tmp_path):
    calibrated = detect_local_machine(2).model_copy(update={"calibrated": True, "description": "measured"})
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(calibrated.model_dump(mode="json")))
    monkeypatch.setattr(loader, "LOCAL_FILE", path)
    m = load_machine("local")
    assert m.calibrated and m.description == "measured"
    resplit = load_machine("local", ranks=4)
    assert resplit.calibrated and resplit.devices_per_node == 4
    assert resplit.peak_flops(Precision.fp32) == pytest.approx(m.peak_flops(Precision.fp32) / 2)


def test_shipped_package_has_no_stray_local_file():
    """local.yaml is written by a calibration on the user's machine, never shipped."""
    tracked = Path(loader.PRESET_DIR / "local.yaml")
    if tracked.exists():
        assert yaml.safe_load(tracked.read_text()).get("calibrated") is True


# --- device kinds: unknown names warn, status of each kind, `exaplan list --devices` ----------


def _frontier_with_device_name(tmp_path, device_name: str, **fields) -> Path:
    data = yaml.safe_load((loader.PRESET_DIR / "frontier.yaml").read_text())
    data.update(device_name=device_name, **fields)
    path = tmp_path / "my-frontier.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_misspelt_device_name_warns_with_the_closest_kind(tmp_path):
    path = _frontier_with_device_name(tmp_path, "AMD Instinct MI250X GCD")
    with pytest.warns(loader.UnknownDeviceKindWarning) as caught:
        m = load_machine(str(path))
    assert len(caught) == 1, "one warning per load"
    msg = str(caught[0].message)
    assert "'AMD Instinct MI250X GCD'" in msg and "closest known: 'AMD MI250X GCD'" in msg
    assert "generic schema defaults" in msg and "matmul_efficiency" in msg
    assert caught[0].filename == str(path)  # points at the machine file
    # ...and the machine really got the schema's defaults, not the MI250X figures
    assert m.matmul_efficiency == MatmulEfficiency()
    assert m.step_overhead_s == MachineModel.model_fields["step_overhead_s"].default


def test_unknown_device_name_with_every_kind_figure_does_not_warn(tmp_path):
    figures = dict(matmul_efficiency={"peak_fraction": 0.5, "half_dim": 100.0}, attention_efficiency_factor=0.4,
                   overlap={"dp": 0.5}, step_overhead_s=0.01)
    path = _frontier_with_device_name(tmp_path, "AMD Instinct MI250X GCD", **figures)
    with warnings.catch_warnings():
        warnings.simplefilter("error", loader.UnknownDeviceKindWarning)
        m = load_machine(str(path))
    assert m.matmul_efficiency.peak_fraction == 0.5 and m.step_overhead_s == 0.01


def test_presets_name_known_device_kinds_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", loader.UnknownDeviceKindWarning)
        for name in PRESETS:
            load_machine(name)


def test_device_kind_status_reads_the_fit_comments(monkeypatch, tmp_path):
    kinds = tmp_path / "device_kinds.yaml"
    kinds.write_text(
        "# fit: framework fsdp: {overlap_dp: 0.271}  (a header line, not a kind's)\n\n"
        "Fitted GPU:\n"
        "  # fit: `exaplan validate --published --refit`, 2026-11-22:\n"
        "  # fit: median |error| 3.1% (max 19.5%) over 13 published rows; leave-one-out median 4.6%.\n"
        "  attention_efficiency_factor: 0.2\n\n"
        "Copied GPU:\n"
        "  # fit: copied from Fitted GPU (same GPU, no published rows of its own).\n"
        "  # fit: median |error| 3.1% (max 19.5%) over 13 published rows.\n"
        "  attention_efficiency_factor: 0.2\n\n"
        "Guessed GPU:\n"
        "  # fit: `exaplan validate --published --refit`: the other figures are first guesses (no published rows).\n"
        "  attention_efficiency_factor: 0.5\n\n"
        "Bare GPU:\n"
        "  attention_efficiency_factor: 0.5\n")
    monkeypatch.setattr(loader, "DEVICE_KINDS_FILE", kinds)
    assert loader.device_kind_status() == {"Fitted GPU": "fitted", "Copied GPU": "copied from Fitted GPU",
                                           "Guessed GPU": "unfitted", "Bare GPU": "unfitted"}


def test_device_kind_status_of_the_shipped_kinds():
    status = loader.device_kind_status()
    kinds = yaml.safe_load(loader.DEVICE_KINDS_FILE.read_text())
    assert set(status) == set(kinds)
    for kind, s in status.items():
        assert s in ("fitted", "unfitted") or (s.startswith("copied from ") and s[len("copied from "):] in kinds), (kind, s)
    for name in PRESETS:
        assert load_machine(name).device_name in status


def test_list_devices_json(capsys):
    assert cli_main(["list", "--devices", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["devices"]
    by_name = {r["name"]: r for r in rows}
    assert {k: r["status"] for k, r in by_name.items()} == loader.device_kind_status()
    for name in PRESETS:
        kind = load_machine(name).device_name
        assert name in by_name[kind]["presets"], (name, kind)
    assert "local" not in {p for r in rows for p in r["presets"]}
    measured = {k for k, r in by_name.items() if r["runtime_kernels"] and not r["runtime_kernels"].startswith("copied")}
    assert measured == {load_machine(n).device_name for n in ("dgx-h100", "dgx-h200")}
    assert by_name[load_machine("alps").device_name]["runtime_kernels"].startswith("copied from NVIDIA H100")
    assert "h100-kernels.json" in by_name[load_machine("dgx-h100").device_name]["runtime_kernels"]


def test_list_devices_text(capsys):
    assert cli_main(["list", "--devices"]) == 0
    out = capsys.readouterr().out
    for kind, s in loader.device_kind_status().items():
        line = next(line for line in out.splitlines() if line.startswith(f"device {kind} "))
        assert s in line
    assert "frontier" in next(line for line in out.splitlines() if "AMD MI250X GCD" in line)
    assert "kernels measured" in next(line for line in out.splitlines() if "H100" in line)
    assert "kernels measured" not in next(line for line in out.splitlines() if "AMD MI250X GCD" in line)
    assert "kernels copied" in next(line for line in out.splitlines() if "GH200" in line)
