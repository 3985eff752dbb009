"""reference/cli.md: every `exaplan` subcommand and option, walked from the argparse parsers
that `cli/main.py` builds (`build_parser()`), so the page cannot drift from the code."""

from __future__ import annotations

import argparse
import os
import re

from md import cell, code, table, written_by

WIDTH = "100"  # usage lines wrap at this many columns whatever the terminal


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order --help lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                out.append((name, helps.get(name) or "", sub))
    return out


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] | None = None, helptext: str = ""):
    """(command path, one-line help, parser) of the parser and every subcommand below it."""
    path = path or (parser.prog,)
    yield path, helptext, parser
    for name, h, sub in _subparsers(parser):
        yield from walk(sub, (*path, name), h)


def slug(path: tuple[str, ...]) -> str:
    return "-".join(re.sub(r"[^a-z0-9]+", "-", p.lower()).strip("-") for p in path)


def _raw(parser: argparse.ArgumentParser) -> bool:
    return issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter)


def _text(parser: argparse.ArgumentParser, text: str | None) -> str:
    """A description or epilog: verbatim in a text block where the parser keeps its layout
    (RawDescriptionHelpFormatter), else one paragraph."""
    if not text:
        return ""
    text = text % {"prog": parser.prog} if "%(prog)" in text else text
    if _raw(parser) and "\n" in text.strip():
        return "```text\n" + text.strip("\n") + "\n```\n"
    return cell(text).replace("\\|", "|") + "\n"


def _default(action: argparse.Action) -> str:
    d = action.default
    if d is None or d is argparse.SUPPRESS or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                                                   argparse._HelpAction, argparse._VersionAction)):
        return "—"
    if isinstance(d, (list, tuple)):
        d = " ".join(map(str, d))
    return code(d) if str(d) != "" else "`''`"


def _argument(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    """What follows the option string: its metavar(s), or the positional's name."""
    if action.nargs == 0:
        return "—"
    default = action.dest.upper() if action.option_strings else action.dest
    return code(formatter._format_args(action, default)) or "—"


def option_rows(parser: argparse.ArgumentParser) -> dict[str, list[list[str]]]:
    """Per argument group (its title), one row per option or positional."""
    formatter = parser._get_formatter()
    groups: dict[str, list[list[str]]] = {}
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if action.help is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            names = ", ".join(code(s) for s in action.option_strings) or code(action.metavar or action.dest)
            helptext = formatter._expand_help(action) if action.help else ""
            choices = ", ".join(code(c) for c in action.choices) if action.choices else "—"
            rows.append([names, _argument(action, formatter), _default(action), choices, cell(helptext)])
        if rows:
            groups[group.title or "options"] = rows
    return groups


def command_section(path: tuple[str, ...], helptext: str, parser: argparse.ArgumentParser) -> str:
    name = " ".join(path)
    level = "#" * min(len(path) + 1, 4)
    out = [f"{level} {name} {{#{slug(path)}}}\n"]
    if helptext:
        out.append(f"*{cell(helptext)}*\n")
    if parser.description:
        out.append(_text(parser, parser.description))
    out.append("```text\n" + parser.format_usage().strip() + "\n```\n")
    subs = _subparsers(parser)
    if subs:
        out.append(table(["subcommand", "what it does"],
                         [[f"[`{' '.join(path)} {n}`](#{slug((*path, n))})", cell(h)] for n, h, _ in subs]))
    for title, rows in option_rows(parser).items():
        out.append(f"**{cell(title)}**\n")
        out.append(table(["option", "argument", "default", "choices", "help"], rows))
    if parser.epilog:
        out.append(_text(parser, parser.epilog))
    return "\n".join(out)


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page; `parser` defaults to exaplan's own (cli.main.build_parser())."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        if parser is None:
            from cli.main import build_parser

            parser = build_parser()
        sections = [command_section(p, h, sp) for p, h, sp in walk(parser)]
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    head = ["# CLI reference\n",
            written_by("It is walked from the argparse parsers that `cli/main.py` builds (`build_parser()`): every "
                       "subcommand, its usage and every option. `exaplan COMMAND --help` prints the same."),
            "Commands: " + ", ".join(f"[{' '.join(p)}](#{slug(p)})" for p, _, _ in walk(parser) if len(p) > 1) + ".\n"]
    return "\n".join(head + sections)
