"""docs/gen/published_page.py: `exaplan validate --published --json` rendered by section, with
the summary figures; no file renders the line that says how to write it (issue 48)."""

from __future__ import annotations

import json

from tests.docs import gen_pages  # noqa: F401  (docs/gen on the path)

import published_page  # noqa: E402


def _row(id_, section, published, predicted, inside, unit="TFLOP/s/GPU"):
    return {"id": id_, "section": section, "model": "gpt-1.7b", "machine": "dgx-h100", "device": "NVIDIA H100 SXM5",
            "framework": "megatron", "gpus": 48, "layout": "dp48 zero1 mbs1 gas4", "unit": unit,
            "published": published, "predicted": predicted, "error": predicted / published - 1,
            "interval": [predicted * 0.9, predicted * 1.1], "inside_interval": inside, "assumed": []}


def test_rows_render_by_section_with_the_summary(tmp_path):
    stats = {"rows": 2, "median_abs_error": 0.05, "max_abs_error": 0.1, "loo_median_abs_error": None,
             "loo_max_abs_error": None, "inside_interval": 0.5}
    data = {"rows": [_row("A-one", "A", 400.0, 380.0, True), _row("B-two", "B", 0.40, 0.44, False, unit="MFU %")],
            "summary": stats, "by_device": {"NVIDIA H100 SXM5": stats}, "by_framework": {"megatron": stats},
            "held_out": {"rows": [_row("F-three", "F", 100.0, 90.0, True)], "summary": {**stats, "rows": 1}}}
    path = tmp_path / "validate-published.json"
    path.write_text(json.dumps(data))
    page = published_page.render(path)
    assert published_page.COMMAND in page
    assert "Calibration set: 2 rows, median |error| 5.0%, max 10.0%, 50.0% inside their interval." in page
    assert "### Section A {#section-a}" in page and "### Section B {#section-b}" in page
    assert "| A-one | gpt-1.7b | dgx-h100 | 48 | `dp48 zero1 mbs1 gas4` | TFLOP/s/GPU | 400 | 380 | -5.0% | " \
           "342 – 418 | yes |" in page
    assert "| 40.0% | 44.0% | +10.0% | 39.6% – 48.4% | **no** |" in page
    assert "### Section F {#held-out-f}" in page
    assert "| NVIDIA H100 SXM5 | 2 | 5.0% | 10.0% | 50.0% |" in page


def test_no_file_renders_not_recorded(tmp_path):
    page = published_page.render(tmp_path / "validate-published.json")
    assert f"Not recorded yet: run `{published_page.COMMAND}`." in page
