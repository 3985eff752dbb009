"""docs/gen/cli_page.py: the CLI reference is walked from the real parser, so every
subcommand and every option string of `exaplan` appears on the page (issue 48)."""

from __future__ import annotations

import argparse

from tests.docs import gen_pages  # noqa: F401  (docs/gen on the path)

import cli_page  # noqa: E402
from cli.main import build_parser  # noqa: E402


def _all(parser, path=("exaplan",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all(sub, (*path, name))


def test_every_subcommand_and_option_appears():
    page = cli_page.render()
    missing = []
    for path, parser in _all(build_parser()):
        if f"{{#{cli_page.slug(path)}}}" not in page or f"# {' '.join(path)} " not in page:
            missing.append(" ".join(path))
        for action in parser._actions:
            if action.help is argparse.SUPPRESS:
                continue
            for opt in action.option_strings:
                if f"`{opt}`" not in page.split(f"{{#{cli_page.slug(path)}}}", 1)[-1]:
                    missing.append(f"{' '.join(path)} {opt}")
    assert missing == []
    assert "exaplan data prepare" in page


def test_a_parser_renders_usage_defaults_choices_and_help():
    ap = argparse.ArgumentParser(prog="tool", description="Does a thing.")
    ap.add_argument("--size", type=int, default=8, metavar="N", help="how many (default %(default)s)")
    ap.add_argument("--mode", choices=["a", "b"], default="a", help="which | one")
    ap.add_argument("--fast", action="store_true", help="go <fast>")
    sub = ap.add_subparsers(dest="cmd", metavar="CMD")
    sub.add_parser("go", help="start it").add_argument("target", help="where to")
    page = cli_page.render(ap)
    assert "## tool {#tool}" in page and "### tool go {#tool-go}" in page
    assert "usage: tool [-h] [--size N]" in page
    assert "| `--size` | `N` | `8` | — | how many (default 8) |" in page
    assert "| `--mode` | `{a,b}` | `a` | `a`, `b` | which \\| one |" in page
    assert "go &lt;fast&gt;" in page
    assert "| `target` | `target` | — | — | where to |" in page
    assert "[`tool go`](#tool-go)" in page
