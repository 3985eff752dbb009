"""What the machine_models/*.yaml files say about each figure, read off their comments: the
comment trailing a key's line, the comment lines just above it, and the "Sources" entries of
a machine file's header ("#   field value: where it comes from", continued on deeper lines)."""

from __future__ import annotations

import re

KEY = re.compile(r"^(\s*)([^\s#:][^:#]*?):(\s.*|)$")


def _trailing(rest: str) -> str:
    """The comment after a value (`key: 1.0  # from X`), outside any quotes."""
    m = re.search(r"\s#\s?(.*)$", rest)
    return m.group(1).strip() if m and rest.count('"', 0, m.start()) % 2 == 0 else ""


def key_notes(text: str) -> dict[tuple[str, ...], dict]:
    """{key path: {"comment": trailing comment, "above": the comment lines right above}}."""
    out: dict[tuple[str, ...], dict] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = KEY.match(line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2).strip().strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(k for _, k in stack), key)
        out[path] = {"comment": _trailing(m.group(3)), "above": " ".join(pending)}
        stack.append((indent, key))
        pending = []
    return out


def note_for(notes: dict[tuple[str, ...], dict], path: tuple) -> dict:
    """The notes of `path`, else of its nearest parent (a flow mapping's keys share its line)."""
    path = tuple(str(p) for p in path)
    for i in range(len(path), 0, -1):
        if path[:i] in notes:
            return notes[path[:i]]
    return {"comment": "", "above": ""}


def source_entries(text: str) -> list[str]:
    """The "#   field value: source" entries of a file's comments, continuation lines joined."""
    entries: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^#( +)(\S.*)$", line)
        if not m:
            continue
        if len(m.group(1)) == 3:
            entries.append(m.group(2))
        elif len(m.group(1)) > 3 and entries:
            entries[-1] += " " + m.group(2)
    return [e for e in entries if ":" in e]


def entry_for(entries: list[str], path: tuple, value=None) -> str:
    """The entry that names this figure: its top-level key and its own name, best first; else
    the one whose head gives its value (two digits or more: "80 GB", "450 GB/s")."""
    top, leaf = str(path[0]), str(path[-1])
    shown = f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    shown = shown if len(shown.replace(".", "")) >= 2 else ""
    best, score = "", 0
    for e in entries:
        head = e.split(": ", 1)[0]
        s = 4 * bool(re.search(rf"\b{re.escape(leaf)}\b", head)) + 2 * bool(re.search(rf"\b{re.escape(top)}\b", head))
        if shown and re.search(rf"(?<![\d.,]){re.escape(shown)}(?![\d.,]\d)", head.replace(",", "")):
            s += 1
        if s > score:
            best, score = e, s
    return best
