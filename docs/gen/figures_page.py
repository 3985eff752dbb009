"""reference/figures.md: every figure of the model (each number of machine_models/device_kinds.yaml,
frameworks.yaml and the machine files), its unit and value per device kind, framework or
machine, whether it is fitted, copied, measured, published or assumed, and its source, read
off the files' own `# fit:` lines and comments (machine_models/loader.py device_kind_status)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from md import cell, code, num, table, written_by
from yaml_notes import entry_for, key_notes, note_for, source_entries

MODELS = Path(__file__).resolve().parents[2] / "machine_models"
NOT_MACHINES = {"device_kinds.yaml", "frameworks.yaml", "uncertainty.yaml"}
SKIP_MACHINE_BLOCKS = {"launch"}  # how jobs start, not figures of the model
FITTED_BY_KIND = {"matmul_efficiency", "attention_efficiency_factor", "elementwise_efficiency"}
FITTED_BY_FRAMEWORK = {("overlap", "dp"), ("step_overhead_s",), ("overlap_dp",)}
UNITS = [("_gbyte_s", "GB/s"), ("_gbit_s", "Gb/s"), ("_tflops", "TFLOP/s"), ("_gib", "GiB"), ("_us", "µs"),
         ("_mb", "MB"), ("_w", "W"), ("_s", "s"), ("bytes_per", "bytes"), ("_params", "parameters"),
         ("_per_rank", "parameters per rank"), ("efficiency", "fraction"), ("fraction", "fraction"),
         ("factor", "fraction"), ("taper", "fraction"), ("half_dim", "GEMM dim (MNK)^(1/3)"), ("gflops", "GFLOP/s")]
HEADER = ["figure", "where", "unit", "value", "status", "source"]


def unit(path: tuple) -> str:
    names = [str(p) for p in path]
    if names[0] == "overlap" or names[-1].startswith("overlap"):
        return "fraction"
    if "attention_tflops" in names:
        return "TFLOP/s by sequence length"
    if names[0] == "peak_tflops":
        return "TFLOP/s"
    for name in reversed(names):
        for suffix, u in UNITS:
            if name.endswith(suffix) or suffix in name:
                return u
    return "count" if names[-1] in ("nodes", "devices_per_node", "nics_per_node", "nodes_per_group") else "—"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def leaves(data, path: tuple = ()):
    """(path, value) of every figure: numbers, lists of numbers, nulls; a mapping keyed by numbers
    (a table such as attention_tflops' by sequence length) is one figure."""
    if isinstance(data, dict):
        if data and all(_is_number(k) for k in data) and all(_is_number(v) for v in data.values()):
            yield path, data
            return
        for k, v in data.items():
            yield from leaves(v, (*path, k))
    elif _is_number(data) or data is None or (isinstance(data, list) and data and all(_is_number(x) for x in data)):
        yield path, data


def value(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}: {num(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(num(x) for x in v)
    return num(v)


def status_of(text: str) -> str:
    """A figure's status from what its source says first (the head and the first 100
    characters after it: later sentences may tell its history)."""
    head, _, rest = text.partition(": ")
    t = (rest[:100] if rest else head[:100]).lower()
    if not t.strip():
        return "not cited"
    if re.search(r"estimat|assum|guess|to be fitted|not fitted|not measured|not a specific|sized to|default", t):
        return "assumed"
    if re.search(r"copied|borrow", t):
        return "copied"
    if re.search(r"\bfit\b|fitted", t):
        return "fitted"
    if re.search(r"measured", t):
        return "measured"
    return "published"


def _row(path: tuple, where: str, v, status: str, source: str) -> list[str]:
    return [code(".".join(map(str, path))), cell(where), cell(unit(path)), cell(value(v)), cell(status), cell(source)]


def _kind_fits(text: str) -> dict[str, str]:
    """Each kind's `# fit:` lines (its fit's command, date and errors), joined."""
    fits: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        key = re.match(r"^([^\s#][^:]*):\s*$", line)
        if key:
            current = key.group(1).strip()
        elif current and re.match(r"^\s+# fit:", line):
            fits.setdefault(current, []).append(line.split("# fit:", 1)[1].strip())
    return {k: " ".join(v) for k, v in fits.items()}


def device_kind_rows() -> list[tuple[tuple, list[str]]]:
    from machine_models.loader import device_kind_status

    text = (MODELS / "device_kinds.yaml").read_text()
    status, notes, fits = device_kind_status(), key_notes(text), _kind_fits(text)
    framework_fit = next((ln.split("# fit:", 1)[1].strip() for ln in text.splitlines()
                          if ln.startswith("# fit: framework")), "")
    rows = []
    for kind, block in yaml.safe_load(text).items():
        kstatus = status.get(kind, "unfitted")
        for path, v in leaves(block):
            note = note_for(notes, (kind, *path))
            own = note["comment"] or note["above"]
            if path[0] in FITTED_BY_KIND:
                st = {"fitted": "fitted", "unfitted": "assumed"}.get(kstatus, "copied")
                src = {"fitted": fits.get(kind, ""), "unfitted": "first guess (device_kinds.yaml header)"}.get(
                    kstatus, kstatus)
            elif tuple(path) in FITTED_BY_FRAMEWORK:
                st, src = "fitted", framework_fit
            elif path[0] == "overlap":
                st, src = "assumed", "the schema's default; not fitted (device_kinds.yaml header)"
            elif path[0] == "runtime_kernels":
                src = str(block["runtime_kernels"].get("source", ""))
                st = "copied" if src.startswith("copied") or "copied" in own else "measured"
                src = f"{src}{'; ' + own if own and own != src else ''}"
            else:
                st, src = ("copied" if kstatus.startswith("copied") else "published"), own
            rows.append((path, _row(path, kind, v, st, src)))
    return rows


def framework_rows() -> list[tuple[tuple, list[str]]]:
    text = (MODELS / "frameworks.yaml").read_text()
    notes = key_notes(text)
    rows = []
    for name, block in yaml.safe_load(text).items():
        lines = text.split(f"\n{name}:", 1)[1].split("\n\n")[0] if f"\n{name}:" in text else ""
        fit = next((ln.split("fit:", 1)[1].strip() for ln in lines.splitlines() if "# fit:" in ln), "")
        cpu_fit = next((ln.split("cpu fit:", 1)[1].strip() for ln in lines.splitlines() if "# cpu fit:" in ln), "")
        for path, v in leaves(block):
            note = note_for(notes, (name, *path))
            own = note["comment"] or note["above"]
            if tuple(path) in FITTED_BY_FRAMEWORK and v is None:
                st, src = "the machine's", "null: the machine's own figure (its device kind's, or a calibration's)"
            elif tuple(path) in FITTED_BY_FRAMEWORK and fit:
                st, src = "fitted", fit
            elif path[0] == "cpu_figures":
                st, src = "fitted", f"on a CPU workstation: {cpu_fit}"
            elif v is None:
                st, src = "not set", own
            else:
                st, src = status_of(own), own
            rows.append((path, _row(path, name, v, st, src)))
    return rows


def machine_rows() -> list[tuple[tuple, list[str]]]:
    rows = []
    for path_ in sorted(MODELS.glob("*.yaml")):
        if path_.name in NOT_MACHINES:
            continue
        text = path_.read_text()
        data, notes, entries = yaml.safe_load(text), key_notes(text), source_entries(text)
        for path, v in leaves(data):
            if path[0] in SKIP_MACHINE_BLOCKS:
                continue
            note = note_for(notes, path)
            src = entry_for(entries, path, v) or note["comment"]
            st = status_of(src) if src else "see the file"
            src = src or f"no comment names it: the header of machine_models/{path_.name} cites the machine's sources"
            rows.append((path, _row(path, path_.stem, v, st, src)))
    return rows


def _grouped(rows: list[tuple[tuple, list[str]]]) -> list[list[str]]:
    """Rows of one figure together (its value per kind, framework or machine side by side), in
    the order the figures first appear."""
    order: dict[tuple, int] = {}
    for path, _ in rows:
        order.setdefault(path, len(order))
    return [r for _, r in sorted(rows, key=lambda pr: order[pr[0]])]


def render() -> str:
    head = ["# Model figures\n",
            written_by("It reads `machine_models/device_kinds.yaml`, `machine_models/frameworks.yaml` and the machine "
                       "files `machine_models/*.yaml`, whose fitted figures `exaplan validate --published --refit` "
                       "writes (with their `# fit:` lines) and whose other figures cite their sources in comments."),
            "Status: **fitted** (to published runs, or to local runs for `cpu_figures`), **copied** (another device "
            "kind's fit), **measured** (a benchmark's measurement, not fitted), **published** (a datasheet, paper or "
            "documentation the file cites), **assumed** (a first guess or estimate), **not cited** (no comment names the "
            "figure), **see the file** (a machine file's header cites its sources without naming this field), **the machine's** (the framework takes the machine's own figure), **not set** "
            "(null: the figure does not apply). The status is read off the file's words; the source column quotes "
            "them.\n"]
    sections = [("Device kinds", "device-kinds", "`machine_models/device_kinds.yaml`: every machine with the kind "
                 "inherits these unless it sets them.", device_kind_rows()),
                ("Frameworks", "frameworks", "`machine_models/frameworks.yaml`: what `--framework NAME` applies.",
                 framework_rows()),
                ("Machines", "machines", "The machine presets, `machine_models/NAME.yaml` (`--machine NAME`).",
                 machine_rows())]
    out = head
    for title, anchor, what, rows in sections:
        out += [f"## {title} {{#{anchor}}}\n", what + "\n", table(HEADER, _grouped(rows))]
    return "\n".join(out)
