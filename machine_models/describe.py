"""Complete, commented machine files: `exaplan machine show` and `exaplan machine new`.

A preset file gives only what differs from its device kind and the schema's defaults, so a copy
of it says little about the rest. `render` writes every MachineModel field, the `launch:` and
`power:` sections included, each under a comment taken from its pydantic description, with the
device kind's figures written out (so the file stands alone) and a trailing comment on any line
a caller marks (`# set by you (was 8, dgx-h100)`). Every rendered file is loaded back and
compared with the machine it describes before anyone writes it (`check_round_trip`).
"""

from __future__ import annotations

import copy
import difflib
import re
import textwrap
import types
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

import machine_models.loader as loader
# The loader's own readers: a file is read and completed here exactly as load_machine does.
from machine_models.loader import (LOCAL, PRESET_DIR, _device_kinds, _looks_like_path, _read_yaml_mapping,
                                   _with_device_kind_defaults, load_machine)
from planner.schema.errors import PlanError, format_validation_error
from planner.schema.files import read_text
from planner.schema.specs import RENAMED_MACHINE_FIELDS, MachineModel

WIDTH = 100  # columns of comments and folded text
NOTE_CHARS = 160  # a field's comment: its description's first sentence, cut to this
# Sections that MachineModel leaves out of its dump (plan files do not carry them); a machine
# file does, so they are dumped apart. launch and power are left out of the file when unset.
EXCLUDED = tuple(name for name, info in MachineModel.model_fields.items() if info.exclude)
OMITTED_WHEN_UNSET = ("launch", "power")
SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z0-9])")  # not the "e.g. " inside a sentence


@dataclass
class Source:
    """A machine and where it came from: a preset, a file, or `local`'s detection."""

    machine: MachineModel
    path: Path | None  # the file read (None: detected)
    own_keys: frozenset[str]  # top-level fields the file sets itself (the rest: device kind or defaults)


def load_source(name_or_path: str) -> Source:
    """The machine `load_machine` gives for a preset name, `local` or a path, with its file."""
    machine = load_machine(name_or_path)
    if name_or_path == LOCAL:
        if not loader.LOCAL_FILE.exists():  # detected: nothing comes from a device kind
            return Source(machine, None, frozenset(MachineModel.model_fields))
        path = loader.LOCAL_FILE
    elif _looks_like_path(name_or_path):
        path = Path(name_or_path)
    else:
        path = PRESET_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        path = Path(name_or_path)
    keys = frozenset(_read_yaml_mapping(path, what="machine file"))
    return Source(machine, path, keys)


def machine_data(machine: MachineModel) -> dict[str, Any]:
    """Every field of `machine` as plain YAML data, in schema order, the excluded sections too."""
    dumped = machine.model_dump(mode="python")
    for name in EXCLUDED:
        section = getattr(machine, name)
        dumped[name] = None if section is None else section.model_dump(mode="python")
    return {name: _plain(dumped[name]) for name in MachineModel.model_fields}


def _plain(value: Any) -> Any:
    """Enums to their values, recursively (dict keys too), so yaml.safe_dump takes them."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


@dataclass
class Comments:
    """What a rendered file says beside the values.

    marks: dotted path -> a trailing comment on that field's line (`set by you (was 8, dgx-h100)`);
    notes: top-level field -> a few words added to its description (where the figure comes from);
    before: top-level field -> comment lines of the source file kept above it (a section's sources)."""

    marks: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    before: dict[str, list[str]] = field(default_factory=dict)


def render(data: dict[str, Any], header: list[str], comments: Comments | None = None) -> str:
    """The YAML text of a machine's `data` (machine_data), `header` as its opening comment."""
    lines = [_comment(h) if h else "#" for h in header] + [""]
    _mapping(lines, MachineModel, data, 0, "", comments or Comments())
    return "\n".join(lines).rstrip() + "\n"


def _comment(text: str, indent: int = 0) -> str:
    pad = " " * indent
    return "\n".join(textwrap.wrap(text, WIDTH - indent, initial_indent=pad + "# ", subsequent_indent=pad + "#   ",
                                   break_on_hyphens=False)) or pad + "#"


def _mapping(lines: list[str], cls: type[BaseModel], data: dict, indent: int, path: str, comments: Comments) -> None:
    """The fields of one spec (`cls`), each under its comment, sections nested below."""
    pad = " " * indent
    for name, info in cls.model_fields.items():
        if name not in data:
            continue
        value, where, sub = data[name], f"{path}{name}", _core(info.annotation)
        note = _note(info, sub)
        if not path:
            note += f" [from the {comments.notes[name]}]" if name in comments.notes else ""
            lines.extend(comments.before.get(name, []))
        if value is None and not path and name in OMITTED_WHEN_UNSET:
            lines.append(_comment(f"{name}: not set. {note}", indent))
            continue
        lines.append(_comment(note, indent))
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{name}:{_mark(comments.marks, where)}")
            if _is_spec(sub):
                _mapping(lines, sub, value, indent + 2, f"{where}.", comments)
            else:
                _free_mapping(lines, value, indent + 2, f"{where}.", comments.marks)
        else:
            lines.extend(_scalar_lines(name, value, indent, _mark(comments.marks, where)))


def _free_mapping(lines: list[str], data: dict, indent: int, path: str, marks: dict[str, str]) -> None:
    """A mapping whose keys are data (peak_tflops' precisions, env names, sequence lengths)."""
    for key, value in data.items():
        where = f"{path}{key}"
        if isinstance(value, dict) and value:
            lines.append(f"{' ' * indent}{_flow(key)}:{_mark(marks, where)}")
            _free_mapping(lines, value, indent + 2, f"{where}.", marks)
        else:
            lines.extend(_scalar_lines(_flow(key), value, indent, _mark(marks, where)))


def _scalar_lines(key: str, value: Any, indent: int, mark: str) -> list[str]:
    """`key: value`, a long plain text folded (`>-`) over lines the reader can read."""
    pad = " " * indent
    if isinstance(value, str) and len(value) > WIDTH - indent - len(key) - 2 and _foldable(value):
        body = textwrap.wrap(value, WIDTH - indent - 2, break_long_words=False, break_on_hyphens=False)
        return [f"{pad}{key}: >-{mark}"] + [f"{pad}  {line}" for line in body]
    return [f"{pad}{key}: {_flow(value)}{mark}"]


def _foldable(text: str) -> bool:
    """Whether folding keeps the text exactly: one space between words, nothing at the ends."""
    return text == " ".join(text.split()) and not text.startswith(("#", "-", "?")) and "\t" not in text


def _flow(value: Any) -> str:
    """One value on one line, as PyYAML writes it (quoted where it would read back otherwise)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True)
    return text.removesuffix("\n...\n").rstrip("\n")


def _mark(marks: dict[str, str], path: str) -> str:
    return f"  # {marks[path]}" if path in marks else ""


def _note(info, core: Any) -> str:
    """A field's comment: its description's first sentence (or its section's docstring's)."""
    text = info.description
    if not text and _is_spec(core) and core.__doc__:
        text = core.__doc__.strip().split("\n\n")[0]
    first = SENTENCE_END.split(" ".join((text or "").split()), maxsplit=1)[0].rstrip(".")
    if len(first) > NOTE_CHARS:
        return first[:NOTE_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
    return first + "." if first else ""


def _is_spec(t: Any) -> bool:
    return isinstance(t, type) and get_origin(t) is None and issubclass(t, BaseModel)


def _core(annotation: Any) -> Any:
    """The type under Annotated[...] and `X | None`."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


# --------------------------------------------------------------------------------------------
# Headers and the round trip
# --------------------------------------------------------------------------------------------


def source_comments(source: Source) -> tuple[list[str], dict[str, list[str]]]:
    """The comments of the file the machine came from: its opening block (the sources, figure
    by figure) and, by top-level field, the block just above that field (a section's sources)."""
    if source.path is None:
        return [], {}
    opening: list[str] | None = None
    before: dict[str, list[str]] = {}
    block: list[str] = []
    for line in read_text(source.path, "machine file").splitlines():
        if line.startswith("#"):
            block.append(line)
            continue
        if not line.strip():  # a blank line ends the opening block; elsewhere it changes nothing
            if opening is None and block:
                opening, block = block, []
            continue
        key = re.match(r"^([A-Za-z_]\w*):", line)
        if opening is None:
            opening = block
        elif key and block:
            before[key.group(1)] = block
        block = []
    return opening or [], before


def inherited_notes(source: Source) -> dict[str, str]:
    """Top-level fields the machine takes from its device kind, each with the words that say so."""
    kind = source.machine.device_name
    figures = _device_kinds().get(kind, {})
    return {name: f"device kind {kind!r}, device_kinds.yaml" for name in figures if name not in source.own_keys}


def check_round_trip(text: str, expected: MachineModel, what: str) -> MachineModel:
    """Load `text` as load_machine_file would and insist on `expected`: nothing is written that
    would read back as another machine."""
    try:
        machine = MachineModel.model_validate(_with_device_kind_defaults(yaml.safe_load(text)))
    except ValidationError as e:
        raise PlanError(format_validation_error(e), field=what) from None
    if machine != expected:
        differ = [k for k in MachineModel.model_fields if getattr(machine, k) != getattr(expected, k)]
        raise PlanError(f"would not read back as written (fields {', '.join(differ)}): a bug, please report it",
                        field=what)
    return machine


def show_text(name_or_path: str) -> str:
    """`exaplan machine show`: the complete file of a preset, `local` or a machine file."""
    source = load_source(name_or_path)
    where = f"machine_models/{source.path.name}" if source.path and source.path.parent == PRESET_DIR else source.path
    header = [f"{source.machine.name}: the complete machine file (exaplan machine show {name_or_path}).",
              "Every MachineModel field under a line of its description (all of it: exaplan schema machine); "
              "the device kind's figures are written out and marked, so this file stands alone: "
              "exaplan plan --machine THIS_FILE reads it as the same machine.",
              f"Made from {where}." if where else "Made from this computer, detected (machine_models/loader.py)."]
    body, before = source_comments(source)
    if body:
        header += ["", f"The opening comment of {where}:"]
    text = "\n".join(_comment(h) if h else "#" for h in header)
    text += ("\n" + "\n".join(body) if body else "") + "\n"
    text += render(machine_data(source.machine), [], Comments(notes=inherited_notes(source), before=before))
    check_round_trip(text, source.machine, "machine show")
    return text


# --------------------------------------------------------------------------------------------
# `machine new`: --set overrides on a whole machine, the launch section included
# --------------------------------------------------------------------------------------------


def field_path(key: str) -> tuple[list[str], Any]:
    """The parts of a --set path, each checked against the schema; PlanError naming the field
    (and the nearest known one) otherwise. A leading `machine.` (as `plan --set` takes) is dropped."""
    parts = key.removeprefix("machine.").split(".")
    cls: Any = MachineModel
    for i, part in enumerate(parts):
        if not part:
            raise PlanError("an empty name in the path", field=key)
        if cls is MachineModel and part in RENAMED_MACHINE_FIELDS:
            raise PlanError(f"renamed to '{RENAMED_MACHINE_FIELDS[part]}'", field=key)
        if _is_spec(cls):
            if part not in cls.model_fields:
                near = difflib.get_close_matches(part, list(cls.model_fields), n=2)
                hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else \
                    f"; fields: {', '.join(cls.model_fields)}"
                raise PlanError(f"unknown field{hint}", field=key)
            cls = _core(cls.model_fields[part].annotation)
        elif get_origin(cls) is dict:
            cls = _core(get_args(cls)[1])  # a key of a mapping: any name; its value's type next
        else:
            raise PlanError(f"{'.'.join(parts[:i])} is a single value, not a section", field=key)
    return parts, cls


def _key(data: dict, part: str) -> Any:
    """The key of `data` that the path's `part` names: `64` names a head dimension, an int."""
    return next((k for k in data if str(k) == part), part)


def get_path(data: dict, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(data, dict) or _key(data, part) not in data:
            return None
        data = data[_key(data, part)]
    return data


def put_path(data: dict, parts: list[str], value: Any) -> None:
    """Set data[parts] = value, making the sections on the way (an unset launch: gets one)."""
    for part in parts[:-1]:
        if not isinstance(data.get(_key(data, part)), dict):
            data[_key(data, part)] = {}
        data = data[_key(data, part)]
    data[_key(data, parts[-1])] = value


def was(value: Any) -> str:
    """An old value in a few characters, for `# set by you (was ...)`."""
    text = "unset" if value is None else _flow(value)
    return text if len(text) <= 40 else text[:37] + "..."


def validate(data: dict[str, Any], what: str) -> MachineModel:
    try:
        return MachineModel.model_validate(data)
    except ValidationError as e:
        raise PlanError(format_validation_error(e), field=what) from None


def follow_devices(data: dict, old: dict, given: set[str], marks: dict[str, str]) -> None:
    """A launch section that started one rank per device keeps doing so when devices_per_node
    changes and its own figures were not given: `exaplan launch` refuses a plan whose ranks per
    node differ from launch.ranks_per_node."""
    launch, devices, before = data.get("launch"), data["devices_per_node"], old["devices_per_node"]
    if not isinstance(launch, dict) or devices == before or "devices_per_node" not in given:
        return
    if not isinstance(devices, int) or devices < 1:
        return  # refused by the validation, which names devices_per_node alone
    why = f"follows devices_per_node (was {before}, {old['name']})"
    for key in ("ranks_per_node", "gpus_per_node"):
        if f"launch.{key}" not in given and launch.get(key) == before:
            launch[key] = devices
            marks[f"launch.{key}"] = why
    sets = launch.get("cpu_sets") or []
    if "launch.cpu_sets" not in given and sets and len(sets) != launch.get("ranks_per_node"):
        launch["cpu_sets"] = []
        marks["launch.cpu_sets"] = (f"cleared: {old['name']}'s {len(sets)} sets were for {len(sets)} ranks; "
                                    "give one core list per rank")


def follow_scheduler(data: dict, given: set[str], marks: dict[str, str]) -> None:
    """A default scheduler given without the list of schedulers joins the list."""
    launch = data.get("launch")
    if not isinstance(launch, dict) or "launch.default_scheduler" not in given or "launch.schedulers" in given:
        return
    default, listed = launch.get("default_scheduler"), list(launch.get("schedulers") or [])
    if default is not None and default not in listed:
        launch["schedulers"] = [default, *listed]
        marks["launch.schedulers"] = f"follows launch.default_scheduler (was {was(listed or None)})"


def follow_device_kind(data: dict, old_kind: str, own_keys: frozenset[str], given: set[str]) -> list[str]:
    """A machine given another device_name takes the new kind's figures (device_kinds.yaml; the
    schema's defaults where the kind has none) for those its source took from the old kind: an
    A100's name over H100 efficiency figures would be neither. Returns the fields changed."""
    kinds = _device_kinds()
    old, new = kinds.get(old_kind, {}), kinds.get(data["device_name"], {})
    if data["device_name"] == old_kind:
        return []
    changed = []
    for name in [n for n in MachineModel.model_fields if n in old or n in new]:
        if name in own_keys or any(g == name or g.startswith(f"{name}.") for g in given):
            continue
        default = MachineModel.model_fields[name].get_default(call_default_factory=True)
        value = new.get(name, default.model_dump() if isinstance(default, BaseModel) else default)
        data[name] = _plain(value)
        changed.append(name)
    return changed


@dataclass
class Made:
    """A machine file made by `machine new` or `machine detect`: its text, the machine it holds
    (checked to read back as that machine) and one line per change."""

    text: str
    machine: MachineModel
    changes: list[str]


def apply_sets(old: dict[str, Any], overrides: list[tuple[str, Any]], like: str
               ) -> tuple[dict[str, Any], dict[str, str], set[str], list[str]]:
    """`old` (machine_data) with the --set overrides applied: the new data, the marks, the
    paths given and one line per change."""
    data = copy.deepcopy(old)
    marks, given, changes = {}, set(), []
    if data["launch"] is None and any(k.removeprefix("machine.").startswith("launch.") for k, _ in overrides):
        # A section to set fields in: what `exaplan launch` needs at least, which the --set go over.
        data["launch"] = {"schedulers": ["torchrun"], "default_scheduler": "torchrun",
                          "ranks_per_node": data["devices_per_node"]}
        marks["launch"] = f"made for your --set ({like} has none): torchrun, one rank per device"
    for key, value in overrides:
        parts, kind = field_path(key)
        if kind is str and isinstance(value, (int, float, bool)):
            value = _flow(value)  # launch.env.NCCL_IB_TIMEOUT=22: YAML read a number, the field holds text
        path, before = ".".join(parts), was(get_path(old, parts))
        put_path(data, parts, value)
        given.add(path)
        marks[path] = f"set by you (was {before})" if path == "name" else f"set by you (was {before}, {like})"
        changes.append(f"{path}: {before} -> {was(value)}")
    follow_devices(data, old, given, marks)
    follow_scheduler(data, given, marks)
    return data, marks, given, changes


def new_text(like: str, overrides: list[tuple[str, Any]], name: str | None = None,
             file_name: str = "THIS_FILE") -> Made:
    """`exaplan machine new --like LIKE --set ... [--name NAME]`: the complete file, every change
    marked in it. Without a name (given or set) the machine is named after its file."""
    source = load_source(like)
    like_name = source.machine.name
    old = machine_data(source.machine)
    data, marks, given, changes = apply_sets(old, ([("name", name)] if name else []) + list(overrides), like_name)
    notes = {k: v for k, v in inherited_notes(source).items() if k not in {g.split(".")[0] for g in given}}
    kind = data["device_name"]
    whose = f"{kind}'s figure" if kind in _device_kinds() else f"the schema's default ({kind} is no device kind)"
    for f in follow_device_kind(data, source.machine.device_name, source.own_keys, given):
        notes.pop(f, None)
        marks[f] = f"follows device_name: {whose} (was {source.machine.device_name}'s)"
    if "name" not in given:
        data["name"] = Path(file_name).stem
        marks["name"] = f"the file's name (was {like_name})"
    if "description" not in given:
        told = ", ".join(f"{k}={_flow(v)}" for k, v in overrides)
        data["description"] = (f"Made from {like_name} by exaplan machine new" + (f" ({told})" if told else "")
                               + f". {like_name}: {old['description']}")[:8192]
    machine = validate(data, "--set")
    header = [f"{machine.name}: a machine file made from {like_name} by exaplan machine new --like {like}.",
              "Every MachineModel field under a line of its description (all of it: exaplan schema machine); "
              "each figure you changed says 'set by you' and its old value. Plan on it: "
              f"exaplan plan --model protein-7b --machine {file_name}",
              f"Every other figure is {like_name}'s; the sources of {like_name}'s file follow."]
    opening, before = source_comments(source)
    text = "\n".join([*(_comment(h) for h in header), *opening])
    text += "\n" + render(machine_data(machine), [], Comments(marks, notes, before))
    return Made(text, check_round_trip(text, machine, "machine new"), changes)


def made_from_data(data: dict[str, Any], header: list[str], marks: dict[str, str], changes: list[str]) -> Made:
    """A complete file from machine data that another module assembled (machine detect)."""
    machine = validate(data, "machine detect")
    text = render(machine_data(machine), header, Comments(marks))
    return Made(text, check_round_trip(text, machine, "machine detect"), changes)
