"""Reading and writing the files a command is given, safely.

Every command that reads a YAML or JSON input goes through `read_text` and `load_yaml`: a
special file (a device such as /dev/zero, a FIFO, a directory) is refused before it is opened,
a file over `MAX_INPUT_BYTES` is refused before it is read, and a document nested deeper than
`MAX_NESTING` is refused from the parser's event stream before anything is constructed (PyYAML
and json build nested values recursively: ~900 levels end in a RecursionError).

Every command that writes a file goes through `check_target` (before the work, so a refusal
costs nothing) and `write_new` (after it): an existing file is replaced only with `--force`, a
symlink or a non-regular target (a device, a FIFO, a directory) never, and the bytes go to a
temporary file in the same directory, renamed over the target in one step, so a failure leaves
the old file (or none) and never half of a new one.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from planner.schema.errors import PlanError

MAX_INPUT_BYTES = 64 * 2**20  # a plan, machine, model or kernels file: the largest committed is ~60 kB
MAX_NESTING = 64  # levels of mappings and sequences; the deepest committed file has 7
FORCE_FLAG = "--force"


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_text(path: str | Path, what: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`; PlanError naming the file
    otherwise (missing, unreadable, special, too large, binary)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise PlanError(f"cannot read {what}: {e.strerror}", field=str(path)) from None
    kind = _kind(st.st_mode)
    if kind:
        raise PlanError(f"cannot read {what}: {kind}, not a file", field=str(path))
    if st.st_size > max_bytes:
        raise PlanError(f"cannot read {what}: {st.st_size:,} bytes (at most {max_bytes:,})", field=str(path))
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise PlanError(f"cannot read {what}: {e.strerror}", field=str(path)) from None
    if len(raw) > max_bytes:  # grew after the stat
        raise PlanError(f"cannot read {what}: over {max_bytes:,} bytes", field=str(path))
    if b"\0" in raw:
        raise PlanError(f"cannot read {what}: a binary file, not YAML or JSON text", field=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"cannot read {what}: not UTF-8 text", field=str(path)) from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"malformed YAML{where}: {problem}"


def check_nesting(text: str, field: str, max_depth: int = MAX_NESTING) -> None:
    """PlanError when the YAML (or JSON) text nests collections deeper than `max_depth`,
    found from PyYAML's event stream, which is not recursive. The stream comes from libyaml
    where PyYAML has it (the pure-Python parser doubled the time of every machine and plan
    load); where libyaml refuses the text, PyYAML's own parser decides, so a malformed file is
    worded as PyYAML words it."""
    if _FAST_EVENTS is not yaml.SafeLoader:
        try:
            return _check_events(text, field, max_depth, _FAST_EVENTS)
        except yaml.YAMLError:
            pass
    try:
        _check_events(text, field, max_depth, yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise PlanError(_yaml_problem(e), field=field) from None


_FAST_EVENTS = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_events(text: str, field: str, max_depth: int, loader) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                mark = event.start_mark
                raise PlanError(f"nested more than {max_depth} levels deep (line {mark.line + 1}); "
                                "no exaplan file needs more than a few", field=field)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):  # aliases nest and multiply beyond what the events show
            mark = event.start_mark
            raise PlanError(f"a YAML alias (*{event.anchor}, line {mark.line + 1}): exaplan files are written "
                            "out in full, without anchors and aliases", field=field)


def load_yaml(text: str, field: str, max_depth: int = MAX_NESTING) -> Any:
    """yaml.safe_load of `text` (JSON is YAML) with its nesting bounded; errors name `field`."""
    check_nesting(text, field, max_depth)
    if _FAST_EVENTS is not yaml.SafeLoader:  # libyaml's parser, PyYAML's safe constructor: the same values
        try:
            return yaml.load(text, Loader=yaml.CSafeLoader)
        except yaml.YAMLError:
            pass  # worded as PyYAML words it, below
        except RecursionError:
            raise PlanError(f"nested too deeply (over {max_depth} levels)", field=field) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlanError(_yaml_problem(e), field=field) from None
    except RecursionError:  # a last guard: the events above bound the nesting
        raise PlanError(f"nested too deeply (over {max_depth} levels)", field=field) from None


def load_yaml_file(path: str | Path, what: str, max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """read_text + load_yaml: a YAML or JSON file, bounded, errors naming the file."""
    return load_yaml(read_text(path, what, max_bytes), str(path))


def check_target(path: str | Path, what: str, force: bool = False, flag: str = FORCE_FLAG) -> Path:
    """Refuse, before any work, an output path that must not be written: empty, a symlink, a
    directory, a device or FIFO, or an existing file without `force` (`flag` names the option
    that allows it). Returns the path."""
    if str(path) == "":
        raise PlanError(f"an empty path for {what}", field=what)
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as e:
        raise PlanError(f"cannot write {what}: {e.strerror}", field=str(path)) from None
    if stat.S_ISLNK(st.st_mode):
        raise PlanError(f"{what} is a symbolic link: give the path of a regular file (nothing is written "
                        "through a link)", field=str(path))
    kind = _kind(st.st_mode)
    if kind:
        raise PlanError(f"{what} is {kind}: give the path of a regular file", field=str(path))
    if not force:
        raise PlanError(f"{what} exists: give {flag} to replace it, or another path", field=str(path))
    return path


def write_new(path: str | Path, data: str | bytes, what: str, force: bool = False, flag: str = FORCE_FLAG,
              mode: int | None = None) -> Path:
    """Write `data` to `path` atomically (a temporary file in the same directory, renamed over
    it) after `check_target`. PlanError naming the path when its directory is missing or cannot
    be written; nothing is left behind on failure."""
    path = check_target(path, what, force, flag)
    raw = data.encode() if isinstance(data, str) else data
    parent = path.parent
    if not parent.is_dir():
        raise PlanError(f"cannot write {what}: no directory {parent} (create it first)", field=str(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name[:100]}.", suffix=".tmp")
    except OSError as e:
        raise PlanError(f"cannot write {what}: {e.strerror}", field=str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        check_target(path, what, force, flag)  # still not a link or a device (a race)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise PlanError(f"cannot write {what}: {e.strerror}", field=str(path)) from None
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
