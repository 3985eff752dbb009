"""Markdown helpers the generated pages share: table cells, tables, the "written by" note."""

from __future__ import annotations

import html


def cell(text) -> str:
    """One table cell: on one line, its pipes and HTML escaped (`<FILE>` stays visible)."""
    s = "—" if text is None or text == "" else str(text)
    s = " ".join(s.split())
    return html.escape(s, quote=False).replace("|", "\\|").replace("*", "\\*")


def code(text) -> str:
    """A cell in code type (backticks), or a dash when empty."""
    if text is None or text == "":
        return "—"
    s = " ".join(str(text).split()).replace("|", "\\|")
    return f"``{s}``" if "`" in s else f"`{s}`"


def table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    """A Markdown table of cells already escaped (cell/code); columns in `right` right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def written_by(text: str) -> str:
    """The note at the top of every generated page: what wrote the data it renders."""
    return f'!!! note "Generated"\n    This page is generated when the site builds (`docs/gen/`). {text}\n'



def pct(x, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def num(x, digits: int = 4) -> str:
    """A figure as written: integers plain, others to `digits` significant digits."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10000 else str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}" if x == x else "nan"
    return str(x)
