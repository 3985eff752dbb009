"""The repository's rules (docs/architecture.md), checked by parsing every module with `ast`:

- planner/ imports neither runtime/, calibration/, cli/ nor torch;
- runtime/ imports from planner/ only the schema (planner.schema.*), and runtime/dataprep/
  nothing from the rest of runtime/;
- machine_models/ imports from the rest of exaplan only the schema;
- calibration/ may import planner/, runtime/ and machine_models/; only cli/ imports calibration/;
- launch/ imports from exaplan only planner/schema/ and machine_models/ (no torch); only cli/
  imports launch/;
- report/ imports from exaplan only planner/ (planner.whatif included) and machine_models/ (no
  torch); only cli/ imports report/;
- jaxrt/ (the JAX backend) imports no torch; from the planner only the schema; from the
  runtime only its torch-free modules (the loader and data preparation, metrics, launcher
  detection, walltime, run lock, options and preflight checks; runtime.checkpoint and
  runtime.dpo only lazily, to read a torch checkpoint's weights); only cli/ imports jaxrt/;
- export/ (the plan in the frameworks' own terms) imports from exaplan only planner/schema/ and
  machine_models/ (the frameworks' own packages in its check_* modules); only cli/ imports export/;
- benchmarks/ (the hand-written torch loops `make bench-runtime` compares against) imports from
  exaplan only the model (runtime.model) and the model presets (planner.presets); nothing
  imports benchmarks/;
- no import cycles between files. Every import counts: one inside a function (a lazy import
  still ties the files together), one under `if TYPE_CHECKING:` (a type-only import too: neither
  file reads or type-checks without the other), and `importlib.import_module` of a module of
  ours (named by a string literal; where the argument is not a literal, every string in the
  file that names a module of ours);
- files of at most 500 lines, functions of at most 80 unless the docstring says why
  ("Why one function: ...").
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "runtime", "calibration", "machine_models", "cli", "launch", "report", "benchmarks", "jaxrt", "export")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
LONG_FUNCTION_NOTE = "Why one function:"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom, wherever it stands: at the top, inside a function or a class,
    under `if TYPE_CHECKING:`."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _dynamic_imports(tree: ast.AST) -> set[str]:
    """Modules of ours that `importlib.import_module(...)` (or `__import__`) may load: its
    literal argument; for an argument computed at run time (a name looked up in a table), every
    string constant of the file that names a module of ours."""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))]
    literal = [c.args[0].value for c in calls if c.args and isinstance(c.args[0], ast.Constant)
               and isinstance(c.args[0].value, str)]
    if len(literal) == len(calls):
        return set(literal)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return set(literal) | {s for s in strings if s in MODULES}


def _imported(module: str, path: Path) -> set[str]:
    """Fully qualified names this module imports (`from a.b import c` gives a.b.c when that
    is a module of ours, else a.b)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = module.split(".")
            anchor = anchor if is_package else anchor[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        for a in node.names:
            full = f"{base}.{a.name}"
            names.add(full if full in MODULES else base)
    return names | _dynamic_imports(tree)


IMPORTS = {m: _imported(m, p) for m, p in MODULES.items()}


def _ours(name: str) -> str | None:
    """The module of ours that an imported name lives in (longest prefix), or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in MODULES:
            return cand
    return None


def _top(name: str) -> str:
    return name.split(".")[0]


def _violations(rule) -> list[str]:
    return [f"{m} imports {n}" for m, names in sorted(IMPORTS.items()) for n in sorted(names) if rule(m, n)]


def test_the_parser_sees_the_known_imports():
    """A guard on the checker itself: imports we know exist are found."""
    assert "planner.schema.plan" in IMPORTS["runtime.mesh"]
    assert any(_top(n) == "torch" for n in IMPORTS["runtime.trainer"])
    assert any(_top(n) == "calibration" for n in IMPORTS["cli.validate"])
    assert "report.plots" in IMPORTS["report.whatif"]
    assert "planner.whatif" in IMPORTS["report.plots"]  # under `if TYPE_CHECKING:`
    assert {"runtime.checkpoint.io", "runtime.checkpoint.state"} <= IMPORTS["runtime.checkpoint"]  # import_module


def test_the_parser_sees_lazy_type_only_and_dynamic_imports():
    """A guard on the checker: each way of tying two files together is an edge of the graph."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from planner.search.pins import Pins\n"
        "def f():\n    from planner.schema.plan import Plan\n"
        "def g():\n    import importlib\n    return importlib.import_module('runtime.checkpoint.io')\n"
        "TABLE = {'x': 'runtime.mesh'}\n"
        "def h(name):\n    return importlib.import_module(TABLE[name])\n")
    tree = ast.parse(source)
    found = {node.module for node in _import_nodes(tree) if isinstance(node, ast.ImportFrom)}
    assert {"planner.search.pins", "planner.schema.plan"} <= found
    assert _dynamic_imports(tree) == {"runtime.checkpoint.io", "runtime.mesh"}


def test_planner_imports_neither_runtime_calibration_cli_nor_torch():
    bad = {"runtime", "calibration", "cli", "torch"}
    assert _violations(lambda m, n: _top(m) == "planner" and _top(n) in bad) == []


def test_runtime_imports_only_the_schema_from_the_planner():
    def rule(m, n):
        if _top(m) != "runtime":
            return False
        if _top(n) in ("calibration", "cli"):
            return True
        return _top(n) == "planner" and not (n == "planner.schema" or n.startswith("planner.schema."))

    assert _violations(rule) == []


def test_dataprep_imports_nothing_else_of_the_runtime():
    def rule(m, n):
        inside = m.startswith("runtime.dataprep")
        return inside and _top(n) == "runtime" and not n.startswith("runtime.dataprep")

    assert _violations(rule) == []


def test_machine_models_import_only_the_schema():
    def rule(m, n):
        if _top(m) != "machine_models" or _top(n) not in PACKAGES:
            return False
        return not (_top(n) == "machine_models" or n == "planner.schema" or n.startswith("planner.schema."))

    assert _violations(rule) == []


def test_only_the_cli_imports_calibration():
    assert _violations(lambda m, n: _top(n) == "calibration" and _top(m) not in ("calibration", "cli")) == []
    assert _violations(lambda m, n: _top(n) == "cli" and _top(m) != "cli") == []


def test_launch_imports_only_the_schema_and_machine_models():
    def rule(m, n):
        if _top(m) != "launch":
            return False
        if _top(n) == "torch" or _top(n) in ("runtime", "calibration", "cli"):
            return True
        return _top(n) == "planner" and not (n == "planner.schema" or n.startswith("planner.schema."))

    assert _violations(rule) == []
    assert _violations(lambda m, n: _top(n) == "launch" and _top(m) not in ("launch", "cli")) == []


def test_export_imports_only_the_schema_and_machine_models():
    def rule(m, n):
        if _top(m) != "export":
            return False
        if _top(n) in ("runtime", "calibration", "cli", "launch", "report", "jaxrt", "benchmarks"):
            return True
        return _top(n) == "planner" and not (n == "planner.schema" or n.startswith("planner.schema."))

    assert _violations(rule) == []
    assert _violations(lambda m, n: _top(n) == "export" and _top(m) not in ("export", "cli")) == []


def test_report_imports_only_the_planner_and_machine_models():
    def rule(m, n):
        return _top(m) == "report" and (_top(n) == "torch" or _top(n) in ("runtime", "calibration", "cli", "launch"))

    assert _violations(rule) == []
    assert _violations(lambda m, n: _top(n) == "report" and _top(m) not in ("report", "cli")) == []


JAXRT_MAY_IMPORT = ("runtime.loader", "runtime.dataprep", "runtime.metrics", "runtime.launch", "runtime.walltime",
                    "runtime.runlock", "runtime.options", "runtime.preflight", "runtime.checkpoint", "runtime.dpo")


def test_jaxrt_imports_no_torch_and_only_the_torch_free_runtime():
    def rule(m, n):
        if _top(m) != "jaxrt":
            return False
        if _top(n) in ("torch", "calibration", "cli", "launch", "report", "benchmarks"):
            return True
        if _top(n) == "planner":
            return not (n == "planner.schema" or n.startswith("planner.schema."))
        return _top(n) == "runtime" and not any(n == a or n.startswith(a + ".") for a in JAXRT_MAY_IMPORT)

    assert _violations(rule) == []
    assert _violations(lambda m, n: _top(n) == "jaxrt" and _top(m) not in ("jaxrt", "cli")) == []


def test_benchmarks_import_only_the_model_and_its_presets():
    """Plain torch against which `exaplan run` is measured: none of the runtime's parallelism."""
    def rule(m, n):
        return _top(m) == "benchmarks" and _top(n) in PACKAGES and _top(n) != "benchmarks" and n not in (
            "runtime.model", "planner.presets")

    assert _violations(rule) == []
    assert _violations(lambda m, n: _top(n) == "benchmarks" and _top(m) != "benchmarks") == []


def test_no_import_cycles_between_files():
    g = nx.DiGraph()
    for m, names in IMPORTS.items():
        g.add_node(m)
        for n in names:
            target = _ours(n)
            if target and target != m:
                g.add_edge(m, target)
    cycles = list(nx.simple_cycles(g))
    assert cycles == [], "\n".join(" -> ".join(c + [c[0]]) for c in cycles[:10])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_files_and_functions_are_short(module):
    path = MODULES[module]
    text = path.read_text()
    lines = text.count("\n") + (not text.endswith("\n") and bool(text))
    assert lines <= MAX_FILE_LINES, f"{path.relative_to(ROOT)}: {lines} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            assert n <= MAX_FUNCTION_LINES or LONG_FUNCTION_NOTE in doc, (
                f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines and no '{LONG_FUNCTION_NOTE}' in its "
                "docstring")
