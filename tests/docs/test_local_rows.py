"""docs/gen/local_page.py: the validation.csv of `exaplan validate --local` rendered as a table
with its summary; no file renders the line that says how to write it (issue 48)."""

from __future__ import annotations

import csv

from tests.docs import gen_pages  # noqa: F401  (docs/gen on the path)

import local_page  # noqa: E402

COLUMNS = ["name", "status", "estimate_args", "predicted_step_time_s", "measured_step_time_s", "step_time_error",
           "predicted_memory_net_gib", "measured_memory_net_gib", "memory_error", "predicted_compute_s", "predicted_dp_s"]


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def test_the_csv_renders_with_its_summary(tmp_path):
    folder = tmp_path / "validate-local"
    rows = [{"name": n, "status": "ok", "estimate_args": f"--dp 2 --mbs {i}", "predicted_step_time_s": p,
             "measured_step_time_s": m, "step_time_error": m / p - 1, "predicted_memory_net_gib": 0.5,
             "measured_memory_net_gib": 0.55, "memory_error": 0.1, "predicted_compute_s": 0.2, "predicted_dp_s": 0}
            for i, (n, p, m) in enumerate([("a", 1.0, 1.1), ("b", 2.0, 1.9), ("c", 3.0, 3.3)], 1)]
    rows.append({"name": "d", "status": "failed", "estimate_args": "--pp 2"})
    _write(folder / "validation.csv", rows)
    _write(folder / "arrival" / "validation.csv", rows[:1])
    page = local_page.render(folder)
    assert local_page.COMMAND in page
    assert "3 of 4 layouts measured, median |step-time error| 10.0%, max 10.0% (a), Spearman 1.00" in page
    assert "| a | ok | `--dp 2 --mbs 1` | 1.000 | 1.100 | +10.0% | 0.50 | 0.55 | +10.0% | compute 0.200 |" in page
    assert "| d | failed | `--pp 2` | — |" in page
    assert "## `docs/validate-local/arrival` {#validate-local-arrival}" in page


def test_no_csv_renders_not_recorded(tmp_path):
    assert f"Not recorded yet: run `{local_page.COMMAND}`." in local_page.render(tmp_path / "validate-local")


def test_spearman_of_ties_and_order():
    assert local_page.spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert local_page.spearman([1, 2], [1, 2]) is None
    assert abs(local_page.spearman([1, 1, 2, 3], [1, 2, 3, 4]) - 0.9487) < 1e-3
