"""The front page and the docs describe the project, not its working history (issue 48).

README.md stays a front page (at most 300 lines); no page of README.md or docs/ narrates who
changed what in which sitting: history is git's. The patterns are the forms that narration
took ("the twenty-third session", "this session", "since the seventeenth session", a lab
notebook named after an issue).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDINAL = (r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
           r"\w+teenth|twentieth|twenty-\w+|thirtieth|thirty-\w+|\d+(st|nd|rd|th))")
NARRATION = [
    re.compile(rf"\b{ORDINAL}\s+(session|sitting)s?\b", re.I),
    re.compile(r"\b(this|that|last|previous|earlier|next|a later|an earlier)\s+(session|sitting)\b", re.I),
    re.compile(r"\bissue-\d+-log\b", re.I),
    re.compile(r"\bmeasurement-history\b", re.I),
]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _narration(text: str) -> list[str]:
    return [m.group(0) for rx in NARRATION for m in rx.finditer(text)]


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines (at most 300: the rest belongs in docs/)"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_does_not_narrate_history(page):
    found = _narration(page.read_text())
    assert found == [], f"{page.relative_to(ROOT)}: {found[:5]}"


def test_the_patterns_catch_narration_and_spare_plain_text():
    """A guard on the patterns themselves."""
    assert _narration("as the twenty-third session found") == ["twenty-third session"]
    assert _narration("Since the seventeenth session, the bound") == ["seventeenth session"]
    assert _narration("measured this session on a VM") == ["this session"]
    assert _narration("see docs/issue-10-log.md") == ["issue-10-log"]
    assert _narration("an interactive Slurm session; the first step of a run") == []
