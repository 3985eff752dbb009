"""The one error type that the command line turns into a clear message and exit code 2."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is imported by what raises it, not by `exaplan --help`
    from pydantic import ValidationError


class PlanError(ValueError):
    """Bad input or an impossible request; `str(err)` is the message shown to the user.

    `field` names the offending field (dotted path) when there is one.
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem, each naming its dotted field path."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        loc = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(lines)


MAX_NAME_OR_PATH = 4096  # characters of a preset name or a file path given on the command line


def check_name_or_path(text: str, field: str) -> str:
    """`text` when it can be a preset name or a file path; PlanError naming `field` when it is
    too long for any file system or holds a NUL or another control character (which the OS
    refuses with a traceback-shaped OSError or ValueError)."""
    if len(text) > MAX_NAME_OR_PATH:
        raise PlanError(f"a name or path of {len(text):,} characters (at most {MAX_NAME_OR_PATH})", field=field)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise PlanError(f"{text[:40]!r} holds a control character", field=field)
    return text
