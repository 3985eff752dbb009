"""The one error type that the command line turns into a clear message and exit code 2."""

from __future__ import annotations

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
