"""The published runs' data files (calibration/data/published/*.yaml): one file per published
source, read and validated here into PublishedRun records (calibration/published_schema.py).

A file holds, at the top, the source it cites (`citation`: title, url or reference, licence
where the figures come from a repository), then what its rows share and the rows:

    citation:  {title: ..., url: ..., reference: ..., licence: ...}
    held_out:  false            # the rows' default: true = predicted, never fitted
    note:      ...              # the shared note, put before each row's own
    defaults:  {...}            # PublishedRun fields every row takes unless it sets them
    models:    {label: {...}}   # model shapes a row names by label (`model: label`)
    rows:      [{id: ..., ...}, ...]

A row is a PublishedRun (unknown fields refused, `assumed` listing every field the source does
not print) plus `held_out`. Its `source` is the citation's text unless the row gives one. A
bad file (unknown field, wrong type, no citation, an id twice) is refused with one message
naming the file, the row and the field (PublishedDataError).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from calibration.published_schema import PublishedRun
from planner.schema.errors import PlanError, format_validation_error
from planner.schema.specs import Spec

DATA_DIR = Path(__file__).parent / "data" / "published"


class PublishedDataError(PlanError):
    """A published-run data file that does not validate; the message names file, row and field."""


class Citation(Spec):
    """The published source of a file's rows."""

    title: str = Field(min_length=1, description="Title or name of the publication, repository file or page.")
    url: str | None = Field(None, description="Where it is published.")
    reference: str | None = Field(None, description="Tables, files, commit or paper reference within it.")
    licence: str | None = Field(None, description="The licence of the repository the figures come from.")

    @model_validator(mode="after")
    def _check(self) -> "Citation":
        if not (self.url or self.reference):
            raise ValueError("a citation needs a url or a reference")
        return self

    def text(self) -> str:
        return ", ".join(p for p in (self.title, self.reference, self.url) if p)


class PublishedFile(Spec):
    """One data file: its citation, what its rows share, its rows (plain mappings, validated as
    PublishedRun by `runs`)."""

    citation: Citation
    held_out: bool = False
    note: str = ""
    defaults: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    rows: list[dict[str, Any]] = Field(min_length=1)


def read_yaml(path: Path) -> Any:
    """The file's YAML; PublishedDataError naming the file where it cannot be read or parsed."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise PublishedDataError(f"{path.name}: {err}") from None


def validated(model, data: Any, where: str):
    """`data` validated as `model`; PublishedDataError naming `where` and the field otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise PublishedDataError(f"{where}: {format_validation_error(err)}") from None


def _merged(defaults: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """`row` over `defaults`, mappings (layout, model) merged one level down."""
    out = dict(defaults)
    for key, value in row.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = {**out[key], **value} if both else value
    return out


def file_runs(path: Path) -> list[tuple[PublishedRun, bool]]:
    """(record, held out) of every row of one data file, in the file's order."""
    data = validated(PublishedFile, read_yaml(path), path.name)
    out, seen = [], set()
    for index, raw in enumerate(data.rows, 1):
        where = f"{path.name}: row {raw.get('id', '?')} (row {index})"
        row = _merged(data.defaults, raw)
        held = row.pop("held_out", data.held_out)
        if not isinstance(held, bool):
            raise PublishedDataError(f"{where}: held_out: must be true or false")
        if isinstance(row.get("model"), str):
            label = row["model"]
            if label not in data.models:
                raise PublishedDataError(f"{where}: model: {label!r} is not in the file's models")
            row["model"] = {"name": label, **data.models[label]}
        row.setdefault("source", data.citation.text())
        row["note"] = " ".join(p for p in (data.note.strip(), str(row.get("note", "")).strip()) if p)
        run = validated(PublishedRun, row, where)
        if run.id in seen:
            raise PublishedDataError(f"{where}: id: {run.id!r} is already a row of this file")
        seen.add(run.id)
        out.append((run, held))
    return out


def load_runs(paths: list[Path]) -> list[tuple[PublishedRun, bool]]:
    """The rows of `paths` in order; PublishedDataError where an id repeats across files."""
    out, owner = [], {}
    for path in paths:
        for run, held in file_runs(path):
            if run.id in owner:
                raise PublishedDataError(f"{path.name}: row {run.id}: id: already a row of {owner[run.id]}")
            owner[run.id] = path.name
            out.append((run, held))
    return out


@lru_cache(maxsize=None)
def shipped_runs(names: tuple[str, ...]) -> tuple[tuple[PublishedRun, bool], ...]:
    """load_runs over the shipped files `names` (DATA_DIR), read once."""
    return tuple(load_runs([DATA_DIR / name for name in names]))
