"""What every fuzz test shares: the hypothesis settings (a bounded number of examples in
`make test`, more in `make test-all`), hostile values, and `call`, which runs `exaplan` in
process and checks the contract of bad input: exit 0 or 2, never a traceback, a message on
stderr for 2, and nothing written (no output path, no temporary file) when it fails.

EXAPLAN_FUZZ=deep (make test-all) runs EXAPLAN_FUZZ_DEEP examples per test (default 300) with
a fresh random seed; otherwise EXAPLAN_FUZZ_EXAMPLES (default 25) with a fixed seed, so that
`make test` is fast and reproducible."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cli.main import main

DEEP = os.environ.get("EXAPLAN_FUZZ") == "deep"
EXAMPLES = int(os.environ.get("EXAPLAN_FUZZ_DEEP" if DEEP else "EXAPLAN_FUZZ_EXAMPLES", 300 if DEEP else 25))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not DEEP, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

# Examples run, per test, and the exit codes seen (printed at the end of the session by conftest.py).
COUNTS: dict[str, int] = {}
EXITS: dict[int, int] = {}

# Numbers as a user types them: edge cases first, then anything.
NUMBER_WORDS = ["0", "-1", "1", "2", "3", "8", "64", "1000000", "nan", "NaN", "inf", "-inf", "1e400", "1e30", "1e12",
                "1000000000000000000000000000000", "1.5", "0.5", "1e-300", "-0", "", " ", "abc", "0x10", "1_000",
                "\u0663", "9" * 400]
numbers = (st.sampled_from(NUMBER_WORDS) | st.integers(-2**70, 2**70).map(str)
           | st.floats(allow_nan=True, allow_infinity=True).map(repr))
texts = st.text(max_size=40) | st.sampled_from(["x" * 20000, "a/" * 3000, "../../etc/passwd", "$(touch PWNED)", "\x00"])
# Values of --set FIELD=VALUE and of spec fields: read as YAML.
YAML_WORDS = ["null", "~", "true", "false", "[]", "{}", "[1, 2]", "{a: 1}", "[ring, tree]", "'x'", "-", ": :", "[",
              "ring", "nccl", "fat-tree", "dragonfly", "gelu", "rope", "1e12", ".inf", ".nan", "-.inf"]
yaml_values = st.sampled_from(YAML_WORDS) | numbers | texts


def count(test: str) -> None:
    COUNTS[test] = COUNTS.get(test, 0) + 1


def call(argv: list[str], outputs=(), cwd: Path | None = None) -> tuple[int, str, str]:
    """Run `exaplan *argv` in process; assert the contract; return (rc, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as e:  # argparse: --help (0) and usage errors (2)
                rc = 0 if e.code is None else e.code
    finally:
        os.chdir(old)
    o, e = out.getvalue(), err.getvalue()
    where = f"exaplan {' '.join(map(str, argv))[:400]!r} -> {rc}\nstdout: {o[-800:]}\nstderr: {e[-800:]}"
    EXITS[rc] = EXITS.get(rc, 0) + 1
    assert rc in (0, 2), where
    assert "Traceback" not in e, where
    if rc == 2:
        assert e.strip(), where
        for p in outputs:
            assert not Path(p).exists(), f"{p} written by a command that failed\n{where}"
    for p in outputs:
        parent = Path(p).parent
        if parent.is_dir():
            assert not [x.name for x in parent.iterdir() if x.name.endswith((".tmp", ".part"))], where
    return rc, o, e


def dotted_fields(data, prefix: str = "") -> list[str]:
    """Every leaf of a nested dict as a dotted path (lists count as leaves)."""
    out = []
    for k, v in data.items():
        path = f"{prefix}{k}"
        out += dotted_fields(v, path + ".") if isinstance(v, dict) and v else [path]
    return out


def set_dotted(data: dict, path: str, value) -> None:
    parts = path.split(".")
    for p in parts[:-1]:
        data = data.setdefault(p, {}) if isinstance(data.get(p), dict) else data.__setitem__(p, {}) or data[p]
    data[parts[-1]] = value
