"""docs/gen/figures_page.py: every figure of device_kinds.yaml, frameworks.yaml and the machine
files appears on the page, per device kind, framework and machine, with its status (issue 48)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.docs import gen_pages  # noqa: F401  (docs/gen on the path)

import figures_page  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "machine_models"


def _numbers(data, path=()):
    """Every number (or null) of a YAML file, a mapping keyed by numbers counted once."""
    if isinstance(data, dict):
        if data and all(isinstance(k, (int, float)) and isinstance(v, (int, float)) for k, v in data.items()):
            yield path
            return
        for k, v in data.items():
            yield from _numbers(v, (*path, k))
    elif isinstance(data, list):
        if data and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data):
            yield path
    elif data is None or (isinstance(data, (int, float)) and not isinstance(data, bool)):
        yield path


def _expected():
    kinds = yaml.safe_load((MODELS / "device_kinds.yaml").read_text())
    frameworks = yaml.safe_load((MODELS / "frameworks.yaml").read_text())
    for kind, block in kinds.items():
        yield from ((kind, p) for p in _numbers(block))
    for name, block in frameworks.items():
        yield from ((name, p) for p in _numbers(block))
    for f in sorted(MODELS.glob("*.yaml")):
        if f.name not in figures_page.NOT_MACHINES:
            yield from ((f.stem, p) for p in _numbers(yaml.safe_load(f.read_text())) if p[0] != "launch")


def test_every_figure_of_the_files_appears():
    page = figures_page.render()
    expected = list(_expected())
    assert len(expected) > 300
    missing = [f"{where}: {'.'.join(map(str, p))}" for where, p in expected
               if f"| `{'.'.join(map(str, p))}` | {where} |" not in page]
    assert missing == []


def test_statuses_come_from_the_files():
    page = figures_page.render()
    assert "| `matmul_efficiency.peak_fraction` | NVIDIA H100 SXM5 | fraction | 0.696 | fitted |" in page
    assert "| `matmul_efficiency.peak_fraction` | NVIDIA GH200 | fraction | 0.696 | copied | copied from NVIDIA H100 SXM5 |" in page
    assert "| `overlap.tp` | NVIDIA H100 SXM5 | fraction | 0 | assumed |" in page
    assert "| `overlap_dp` | megatron | fraction | 1 | fitted |" in page
    assert "| `intra_node_latency_us` | dgx-h100 | µs | 2.5 | assumed |" in page
    assert "| `memory_bandwidth_gbyte_s` | dgx-h100 | GB/s | 3350 | published | memory_bandwidth_gbyte_s 3350: NVIDIA" in page


def test_the_status_reads_what_the_source_says_first():
    assert figures_page.status_of("x 3: estimates (NVSwitch); to be fitted.") == "assumed"
    assert figures_page.status_of("x 0.57: " + "each group has 4 links of 200 Gb/s; " * 4 + "It was an assumed 0.5.") == \
        "published"
    assert figures_page.status_of("") == "not cited"
