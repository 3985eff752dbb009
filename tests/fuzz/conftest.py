"""The fuzz tests: their examples counted at the end of the session."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fuzz_harness import COUNTS, DEEP, EXITS  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    if COUNTS:
        total = sum(COUNTS.values())
        terminalreporter.write_line(f"fuzz ({'deep' if DEEP else 'fast'}): {total} examples over {len(COUNTS)} tests: "
                                    + ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
                                    + "; exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(EXITS.items())))
