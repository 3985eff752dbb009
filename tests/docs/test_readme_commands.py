"""The README's example commands run as written (nanoGPT's habit: documented runs are executable).

Every ```bash block of README.md carries a marker on the line before it:
`<!-- docs-test: fast -->` (run here, in `make test`), `<!-- docs-test: slow -->` (run in
`make test-all`) or `<!-- docs-test: skip (why) -->`. A block without a marker fails the
suite, so a new example cannot go untested by accident. Each block runs as one bash script
(`set -euo pipefail`) in a fresh directory with the virtualenv's `exaplan` first on PATH, so
later lines may use the files earlier lines wrote.

The ```console example at the top (a command after `$ `, then its output) is run too, and the
rows of its layout table must be what the command prints today.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*docs-test:\s*(fast|slow|skip)\b(.*?)-->")
FENCE = re.compile(r"^```(\w*)\s*$")


def readme_blocks(text: str) -> list[tuple[int, str, str, str]]:
    """(line, language, marker or '', body) of every fenced block, in order."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark = MARKER.search(prev)
        blocks.append((start + 1, lang, mark.group(1) if mark else "", "\n".join(lines[start + 1:j])))
        i = j + 1
    return blocks


BLOCKS = readme_blocks(README.read_text())
BASH = [b for b in BLOCKS if b[1] == "bash"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_every_bash_block_has_a_marker():
    unmarked = [line for line, _, mark, _ in BASH if not mark]
    assert BASH, "README.md has no ```bash example"
    assert unmarked == [], f"README.md bash blocks without <!-- docs-test: ... --> at lines {unmarked}"


def test_the_marker_parser_sees_each_kind():
    """A guard on the parser: a marked block, an unmarked one and another language."""
    text = "<!-- docs-test: slow -->\n```bash\necho a\n```\n\n```bash\necho b\n```\n```console\n$ x\n```\n"
    got = [(lang, mark, body) for _, lang, mark, body in readme_blocks(text)]
    assert got == [("bash", "slow", "echo a"), ("bash", "", "echo b"), ("console", "", "$ x")]


def _run_block(body: str, tmp_path: Path, timeout_s: int) -> None:
    script = "set -euo pipefail\n" + body + "\n"
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=timeout_s)
    assert p.returncode == 0, f"exit {p.returncode}\n--- script\n{body}\n--- stdout\n{p.stdout[-3000:]}\n" \
                              f"--- stderr\n{p.stderr[-3000:]}"


@pytest.mark.parametrize("line,body", [(b[0], b[3]) for b in BASH if b[2] == "fast"],
                         ids=[f"README-line-{b[0]}" for b in BASH if b[2] == "fast"])
def test_fast_readme_block_runs(line, body, tmp_path):
    _run_block(body, tmp_path, timeout_s=300)


@pytest.mark.slow
@pytest.mark.parametrize("line,body", [(b[0], b[3]) for b in BASH if b[2] == "slow"],
                         ids=[f"README-line-{b[0]}" for b in BASH if b[2] == "slow"])
def test_slow_readme_block_runs(line, body, tmp_path):
    _run_block(body, tmp_path, timeout_s=1800)


def _console_command(body: str) -> tuple[str, list[str]]:
    """The `$ ` command of a console block (with its `\\` continuations) and the output lines."""
    lines = body.splitlines()
    assert lines and lines[0].startswith("$ "), "a console block starts with '$ command'"
    cmd, k = lines[0][2:], 1
    while cmd.endswith("\\"):
        cmd = cmd[:-1] + " " + lines[k].strip()
        k += 1
    return cmd, lines[k:]


def _table_rows(lines: list[str]) -> list[str]:
    """The data rows of a rich table (`│ 1 │ ... │`), whitespace-normalised."""
    return [" ".join(l.split()) for l in lines if re.match(r"^│ \d+ │", l)]


def test_readme_console_example_prints_what_it_shows(tmp_path):
    consoles = [b for b in BLOCKS if b[1] == "console"]
    assert consoles, "README.md shows no console example"
    for _, _, _, body in consoles:
        cmd, shown = _console_command(body)
        assert cmd.startswith("exaplan "), cmd
        env = _env()
        env["COLUMNS"] = "200"
        p = subprocess.run(["bash", "-c", cmd + " -o plan.yaml"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        rows = _table_rows(shown)
        assert rows, "the console example shows no table rows"
        assert _table_rows(p.stdout.splitlines())[:len(rows)] == rows
        first = shown[0]
        assert first == p.stdout.splitlines()[0], (first, p.stdout.splitlines()[0])
