"""What every exporter shares: the result (files and the batch split the framework should
derive), writing a folder safely, the collective environment. The registry of targets is
export/registry.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from planner.schema.errors import PlanError
from planner.schema.plan import Plan

EXPORT_DIR = "{export_dir}"

@dataclass(frozen=True)
class Derived:
    """What the framework should derive from the exported files: the degrees and the batch
    split. The framework checks (export/check_*.py) compute the same from the framework's own
    code, and the tests require the two to equal the plan's."""

    tp: int
    pp: int
    vpp: int
    cp: int
    dp: int
    micro_batch: int
    accumulation: int
    global_batch: int

    @staticmethod
    def of(plan: Plan) -> "Derived":
        return Derived(tp=plan.mesh.tp, pp=plan.mesh.pp, vpp=plan.pipeline.virtual_stages, cp=plan.mesh.cp,
                       dp=plan.mesh.dp, micro_batch=plan.micro_batch_size,
                       accumulation=plan.grad_accumulation_steps, global_batch=plan.job.global_batch)


@dataclass
class Export:
    """One target's files for one plan: relative path -> text, with what the framework should
    derive from them and notes for the user (printed by `exaplan export`, written to README)."""

    target: str
    files: dict[str, str]
    derived: Derived
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)  # package -> the pinned version the files are for
    # The words each rank passes to the framework's entry point (`exaplan launch --framework`);
    # EXPORT_DIR in a word stands for the folder the files were written to.
    argv: list[str] = field(default_factory=list)
    entry: str | None = None  # the framework's usual entry point (pretrain_gpt.py, torchtitan.train), a hint

    def argv_in(self, folder: str | Path) -> list[str]:
        return [w.replace(EXPORT_DIR, str(Path(folder).resolve())) for w in self.argv]

    def entry_in(self, folder: str | Path) -> str | None:
        return None if self.entry is None else self.entry.replace(EXPORT_DIR, str(Path(folder).resolve()))


def write_export(export: Export, out_dir: str | Path, plan_path: str | Path | None = None,
                 force: bool = False) -> list[Path]:
    """Write the files into `out_dir`: a new folder, an empty one, or with `force` one that holds
    only the files of an earlier export of the same target (they are replaced). Anything else
    in it: PlanError, nothing written. Written into a temporary folder beside it first, then
    moved, so an error leaves nothing half-written."""
    out = Path(out_dir)
    names = _named_files(export, plan_path)
    check_folder(export, out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, text in names.items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if name.endswith(".sh"):
                path.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / n for n in names]


def _named_files(export: Export, plan_path) -> dict[str, str]:
    """The export's files and its record, exaplan-export.json (what `check_folder` reads back)."""
    names = dict(export.files)
    names["exaplan-export.json"] = json.dumps({
        "target": export.target, "plan": str(plan_path) if plan_path else None, "files": sorted(export.files),
        "derived": export.derived.__dict__, "versions": export.versions, "notes": export.notes}, indent=1) + "\n"
    return names


def check_folder(export: Export, out_dir: str | Path, force: bool = False) -> None:
    """PlanError unless `out_dir` is new or empty, or, with `force`, an earlier export of the
    same target; never a symlink."""
    out = Path(out_dir)
    if out.is_symlink():
        raise PlanError(f"{out} is a symbolic link: give a folder (nothing is written through a link)", field="output")
    if not out.exists():
        return
    if not out.is_dir():
        raise PlanError(f"{out} exists and is not a folder", field="output")
    marker = out / "exaplan-export.json"
    theirs = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    if not theirs:
        return
    try:
        previous = json.loads(marker.read_text()).get("target")
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous != export.target or not theirs <= _previous_files(marker):
        raise PlanError(f"{out} exists and holds other files ({', '.join(sorted(theirs)[:3])}"
                        f"{', ...' if len(theirs) > 3 else ''}); give a new or empty folder", field="output")
    if not force:
        raise PlanError(f"{out} holds an earlier {export.target} export: give --force to replace it, or a new "
                        "folder", field="output")


def _previous_files(marker: Path) -> set[str]:
    """The files an earlier export listed (its own files may differ from this one's)."""
    try:
        data = json.loads(marker.read_text())
        return set(data.get("files", [])) | {"exaplan-export.json"}
    except (OSError, ValueError):
        return set()


def env_script(plan: Plan) -> str:
    """env.sh: the collective library's environment the plan chose (planner/emit.py), to source
    before the framework starts; the values were checked on load (planner/schema/launch.py)."""
    import shlex

    lines = [f"# The collective environment of the plan ({plan.collectives.library}): source before the job starts.",
             f"# {plan.provenance.command}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(plan.collectives.env.items())]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def environment(values: dict[str, str], unset: tuple[str, ...] = ()):
    """os.environ with `values` set and `unset` removed for the block, then as it was (the
    framework checks set the rendezvous and world-size variables their config code reads)."""
    saved = {k: os.environ.get(k) for k in [*values, *unset]}
    for k in unset:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


FETCH_MARKER = ".exaplan-fetched.json"  # what export.fetch_* unpacked into a folder, and at which version


def fetch_marker(dest: Path) -> dict:
    """The record export.fetch_* left in `dest` ({} where none, or unreadable)."""
    try:
        return json.loads((dest / FETCH_MARKER).read_text())
    except (OSError, ValueError):
        return {}
