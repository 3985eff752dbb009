"""exaplan whatif: the table, JSON and CSV carry the same points; bad input is one message,
exit 2 and nothing written; a deadline nothing meets says the best achievable (exit 0); the
capacity alias still answers; no progress bar when stderr is not a terminal."""

import csv
import json
import sys

import pytest

from cli.main import main

BASE = ["whatif", "--model", "protein-7b", "--machine", "dgx-h100,dgx-a100-80gb", "--nodes", "2:8", "--tokens", "1e11",
        "--global-batch", "1024"]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_and_csv_carry_the_same_points(capsys, tmp_path):
    path = tmp_path / "points.csv"
    rc, out, err = run(capsys, *BASE, "--deadline-days", "5", "--fastest", "--json", "--csv", str(path),
                       "--vary", "machine.nic_gbit_s=x1,x2")
    assert rc == 0 and err == ""
    data = json.loads(out)
    assert set(data) >= {"points", "inputs", "command", "deadline", "fastest", "knees", "warnings", "device_status"}
    points = data["points"]
    assert len(points) == 2 * 3 * 2  # machines x node counts x varied values
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(points)
    for p, r in zip(points, rows):
        assert (r["machine"], int(r["nodes"]), r["vary:machine.nic_gbit_s"]) == (
            p["machine"], p["nodes"], p["varied"]["machine.nic_gbit_s"])
        assert float(r["days"]) == pytest.approx(p["days"]) and float(r["energy_kwh"]) == pytest.approx(p["energy_kwh"])
    assert data["command"].startswith("exaplan whatif")
    assert data["device_status"]["NVIDIA H100 SXM5"] == "fitted"
    assert len(data["deadline"]) == 4 and data["fastest"][0]["by_nodes"]


def test_the_table_marks_knees_and_answers(capsys):
    rc, out, _ = run(capsys, *BASE, "--deadline-days", "1e-6", "--knee", "0.99")
    assert rc == 0
    assert "dgx-h100" in out and "knee" in out and "global batch 1,024 sequences" in out
    assert "no node count tried meets 1e-06 days; the best achievable is" in out


@pytest.mark.parametrize("bad, option", [
    (["--nodes", "8:2"], "nodes"), (["--nodes", "2:x"], "nodes"), (["--tokens", "1e400"], "tokens"),
    (["--tokens", "nan"], "tokens"), (["--deadline-days", "-1"], "deadline-days"),
    (["--machine", "dgx-h10"], "machine"), (["--vary", "machine.nic_gbit=x2"], "machine.nic_gbit"),
    (["--vary", "machine.nic_gbit_s=xtwo"], "vary"), (["--model", "protein-7"], "model"),
])
def test_bad_input_is_one_message_exit_2_and_nothing_written(capsys, tmp_path, bad, option):
    argv = list(BASE)
    for i in range(0, len(bad), 2):
        if bad[i] in argv:
            argv[argv.index(bad[i]) + 1] = bad[i + 1]
        else:
            argv += bad[i:i + 2]
    path = tmp_path / "out.csv"
    rc, out, err = run(capsys, *argv, "--csv", str(path), "--report", str(tmp_path / "r.html"))
    assert rc == 2 and out == ""
    assert err.startswith(f"exaplan whatif: error: {option}:") and err.count("\n") == 1
    assert "did you mean" in err or option not in ("machine", "model", "machine.nic_gbit")
    assert list(tmp_path.iterdir()) == []


def test_conflicting_batch_options_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main([*BASE, "--batch-per-rank", "8"])
    assert e.value.code == 2
    assert "--batch-per-rank: not allowed with argument --global-batch" in capsys.readouterr().err


def test_report_needs_the_report_module(capsys, tmp_path, monkeypatch):
    """An install without the report package (a broken one: report/ ships with exaplan) says
    so before any work: exit 2, nothing written."""
    monkeypatch.setitem(sys.modules, "report.whatif", None)  # makes `from report.whatif import ...` fail
    rc, _, err = run(capsys, *BASE, "--report", str(tmp_path / "r.html"))
    assert rc == 2 and "the report needs report/whatif.py" in err and list(tmp_path.iterdir()) == []


def test_capacity_is_an_alias_of_whatif(capsys):
    rc, out, _ = run(capsys, "capacity", "--model", "protein-7b", "--machine", "dgx-h100", "--tokens", "1e11",
                     "--nodes", "2,4,8", "--global-batch", "1024", "--deadline-days", "5", "--json")
    assert rc == 0
    cap = json.loads(out)
    rc, out, _ = run(capsys, *BASE[:4], "dgx-h100", *BASE[5:], "--deadline-days", "5", "--json")
    what = json.loads(out)
    assert [r["days"] for r in cap["rows"]] == [p["days"] for p in what["points"]]
    assert cap["fewest_nodes"] == what["deadline"][0]["fewest"]["nodes"]


def test_compile_answers_for_compiled_blocks(capsys):
    """whatif --compile (and capacity --compile): the same sweep with exaplan's blocks compiled
    is faster at every point on a GPU machine (the eager surplus gone); a fused framework with
    --compile is exit 2."""
    argv = ["whatif", "--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "8,16", "--tokens", "1e12", "--json"]
    days = {}
    for extra in ([], ["--compile"]):
        rc, out, _ = run(capsys, *argv, *extra)
        assert rc == 0
        days[bool(extra)] = [p["days"] for p in json.loads(out)["points"]]
    assert all(0.6 < c / e < 0.9 for e, c in zip(days[False], days[True])), days
    cap = {}
    for extra in ([], ["--compile"]):  # capacity's own batch rule (8 sequences a rank)
        rc, out, _ = run(capsys, "capacity", "--model", "protein-7b", "--machine", "dgx-h100", "--tokens", "1e12",
                         "--nodes", "8", *extra, "--json")
        assert rc == 0
        cap[bool(extra)] = json.loads(out)["rows"][0]["days"]
    assert 0.6 < cap[True] / cap[False] < 0.9
    rc, _, err = run(capsys, *argv, "--framework", "megatron", "--compile")
    assert rc == 2 and "compile:" in err


def test_small_figures_keep_two_significant_digits(capsys):
    """A small model trained on few tokens: rates, MFU, days and energy below the table's
    usual rounding print two significant digits instead of zeros."""
    argv = ["whatif", "--model", "protein-small", "--machine", "frontier", "--nodes", "64", "--tokens", "1e9"]
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0
    p = json.loads(out)["points"][0]
    assert p["days"] < 0.005 and p["mfu"] < 0.1 and p["tflops_per_device"] < 10  # the case this checks
    rc, out, _ = run(capsys, *argv)
    row = next(line for line in out.splitlines() if line.lstrip().startswith("frontier"))
    assert f"{p['days']:.2g} (" in row and f"{p['tflops_per_device']:.2g}" in row and f"{100 * p['mfu']:.2g}%" in row
    assert "0.00 (" not in row and " 0% " not in row
