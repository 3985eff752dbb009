"""Import the page generators of docs/gen/ (not a package: mkdocs-gen-files runs them as scripts)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "docs" / "gen"
for p in (str(GEN), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)
