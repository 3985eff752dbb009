"""Benchmark results: benchmarks/record.py writes a record of a benchmark's run (machine,
date, command, figures, tables) and docs/gen/results_page.py renders it; a benchmark with no
record renders the line that says how to record it (issue 48)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.docs import gen_pages  # noqa: F401  (docs/gen on the path)

import results_page  # noqa: E402
from benchmarks import record  # noqa: E402

SEARCH = [{"model": "protein-tiny", "machine": "dgx-h100", "nodes": 2, "ranks": 16, "global_batch": 64, "cold_s": 0.25,
           "best_s": 0.125, "repeats": 3, "legal_layouts": 1200, "layouts_scored": 4800, "layouts_scored_per_s": 38400.0,
           "legal_layouts_per_s": 9600.0, "chosen_layout": "dp16 ddp | mbs4", "step_time_s": 0.5, "mfu": 0.41}]


def test_a_written_record_renders_with_machine_date_command_and_figures(tmp_path):
    rec = record.make_record("search", ["python", "-m", "planner.bench", "--json"], SEARCH, wall_s=1.5, exit_code=0,
                             date="2026-01-02 03:04 UTC")
    record.write(rec, tmp_path / "bench-search.json")
    back = json.loads((tmp_path / "bench-search.json").read_text())
    assert back["machine"]["cores"] >= 1 and back["machine"]["cpu"]
    assert back["figures"] == SEARCH
    page = results_page.render(tmp_path)
    section = page.split("{#search}")[1].split("\n## ")[0]
    assert "2026-01-02 03:04 UTC" in section and "`python -m planner.bench --json`" in section
    assert f"{back['machine']['cpu']}, {back['machine']['cores']} cores" in section
    assert "| protein-tiny on 2 x dgx-h100 | 16 | 64 | 0.125 (of 3) | 0.250 | 1,200 | 4,800 | 38,400 | " \
           "dp16 ddp \\| mbs4 | 0.500 | 41.0% |" in section


def test_a_missing_record_says_how_to_record_it(tmp_path):
    page = results_page.render(tmp_path)
    for name, (_, target, _) in results_page.BENCHMARKS.items():
        assert f"Not recorded yet: run `{target}`." in page.split(f"{{#{name}}}")[1].split("\n## ")[0]


def test_an_unreadable_record_says_so(tmp_path):
    (tmp_path / "bench-jax.json").write_text("{not json")
    assert "cannot be read" in results_page.section("jax", tmp_path)


def test_the_recorder_runs_the_command_and_records_its_stdout(tmp_path, capsys):
    out = tmp_path / "r" / "bench-search.json"
    cmd = [sys.executable, "-c", f"import json; print(json.dumps({SEARCH!r}))"]
    assert record.main(["search", "--out", str(out), "--", *cmd]) == 0
    rec = json.loads(out.read_text())
    import shlex

    assert shlex.split(rec["command"]) == cmd and rec["exit_code"] == 0
    assert "protein-tiny on 2 x dgx-h100" in capsys.readouterr().out  # the tables, printed


def test_the_recorder_keeps_the_old_record_when_there_are_no_figures(tmp_path, capsys):
    out = tmp_path / "bench-runtime.json"
    out.write_text("old\n")
    assert record.main(["runtime", "--out", str(out), "--figures", str(tmp_path / "none.json"), "--",
                        sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert out.read_text() == "old\n"
    assert "no figures to record" in capsys.readouterr().err


def test_the_recorder_needs_a_command(capsys):
    with pytest.raises(SystemExit) as e:
        record.main(["search", "--out", "x.json"])
    assert e.value.code == 2 and "after --" in capsys.readouterr().err


def test_runtime_results_become_the_benchmark_table():
    from benchmarks import summary

    run = {"step_times_s": [0.3, 0.2, 0.2, 0.1], "startup_to_first_step_s": 2.0, "wall_s": 5.0}
    figures = {"config": {"model": "protein-small", "global_batch": 4, "seq_len": 128, "ranks": 2, "cores": 2,
                          "rounds": 1, "steps": 4, "warmup": 1, "started": "2026-01-01 00:00:00"},
               "layouts": {"ddp": summary.layout_result({"plan": "p.yaml", "exaplan": [run], "torch": [run]}, 1)},
               "failures": [{"layout": "fsdp", "error": "boom\nmore"}]}
    rec = record.make_record("runtime", ["x"], figures, wall_s=1.0, exit_code=1)
    assert "runs" not in rec["figures"]["layouts"]["ddp"]
    page = results_page.render_record(rec)
    assert "| ddp | 100.0 / 100.0 | 1.000 |" in page and "Failed (fsdp): boom" in page and "exit code 1" in page


def test_the_commands_benchmark_times_fresh_processes_and_renders_against_its_targets(monkeypatch):
    """planner.bench --commands: each command in fresh processes (a child that sleeps 0.2 s and
    holds 64 MB shows as such), then a row of the "Whole commands" table beside its targets."""
    from planner import bench

    hold = [sys.executable, "-c", "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
                                  "time.sleep(0.2)"]
    got = bench.time_command(hold, repeats=2)
    # (no upper bound on the peak: Linux counts in a child's ru_maxrss the pages it shared with
    # its parent at fork, and a pytest worker is large; the benchmark runs from a small process)
    assert got["runs"] == 2 and 0.2 <= got["wall_s"] < 5 and got["peak_mb"] >= 64, got
    with pytest.raises(SystemExit, match="exit code 3"):
        bench.time_command([sys.executable, "-c", "raise SystemExit(3)"], repeats=1)
    commands = [bench.Command("exaplan --help", ("--help",), 0.3),
                bench.Command("a plan", ("plan", "--model", "protein-tiny", "--machine", "local", "--nodes", "1", "-o",
                                         "{tmp}/x.yaml", "--force"), 1.0, 250),
                bench.Command("prepare", ("data", "prepare", "{tmp}/big.fasta", "-o", "{tmp}/p-{run}", "--json"),
                              reads="big.fasta", target_mb_per_cpu_s=200)]
    rows = bench.run_commands(repeats=2, commands=commands, fasta_copies=2)
    assert [r["command"] for r in rows] == ["exaplan --help", "exaplan plan --model protein-tiny --machine local --nodes 1 -o TMP/x.yaml --force",
                                            "exaplan data prepare TMP/big.fasta -o TMP/p --json"]
    prep = rows[2]
    assert prep["cpu_s"] > 0 and prep["mb_per_cpu_s"] == pytest.approx(prep["input_mb"] / prep["cpu_s"])
    assert 2.5 < prep["input_mb"] < 3.5, prep  # two copies of the 1.5 MB sample, rewrapped
    rec = record.make_record("commands", ["x"], rows, wall_s=1.0, exit_code=0)
    page = results_page.render_record(rec)
    assert "per core (target 200)" in page and "generated FASTA (3 MB" in page, page
    assert "| exaplan --help | `exaplan --help` |" in page and "| 0.3 |" in page and "| 250 |" in page, page


def test_the_generated_fasta_is_copies_of_the_sample_with_distinct_ids(tmp_path):
    """planner.bench.write_fasta: every record of the sample once per copy, ids suffixed with the
    copy, sequences unchanged and wrapped at 60; the .gz beside it holds the same bytes."""
    import gzip

    from planner import bench

    bench.write_fasta(tmp_path / "f.fasta", copies=3)
    text = (tmp_path / "f.fasta").read_bytes()
    assert gzip.decompress((tmp_path / "f.fasta.gz").read_bytes()) == text

    def records(data: bytes) -> list[tuple[str, str]]:
        out = []  # split at line starts only: a description may hold ">" ("(1->2)glucan")
        for chunk in ("\n" + data.decode()).split("\n>")[1:]:
            head, _, body = chunk.partition("\n")
            out.append((head.split()[0], body.replace("\n", "")))
        return out

    sample = records(gzip.decompress(bench.SAMPLE_FASTA.read_bytes()))
    got = records(text)
    assert len(got) == 3 * len(sample) and len({i for i, _ in got}) == len(got)
    assert got[len(sample) * 2 + 5] == (sample[5][0] + "_2", sample[5][1])
    assert max(len(line) for line in text.decode().splitlines() if not line.startswith(">")) == 60


def test_every_benchmarked_command_is_one_exaplan_takes():
    """planner.bench.COMMANDS, as exaplan's own parser reads them (a typo or an argument out of
    place would fail only in `make bench`)."""
    from cli.main import build_parser
    from planner import bench

    for c in bench.COMMANDS:
        if c.args == ("--help",):
            continue
        args = build_parser().parse_args([a.replace("{tmp}", "/tmp/x").replace("{run}", "0") for a in c.args])
        assert args.command == c.args[0], c
