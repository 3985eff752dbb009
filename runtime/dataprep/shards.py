"""The prepared token-shard format, shared by its writer (prepare.py) and its reader
(runtime/loader.py): names, dtypes and the checks of a prepared directory's manifest.

Prepared directory layout (all little-endian, raw numpy arrays described by the manifest):

    manifest.json            counts, skipped records per reason, sources with sha256, vocabulary
    train-00000.tokens ...   uint8 token ids, sequences (<bos> residues <eos>) back to back
    train.index              INDEX_DTYPE per sequence: shard number, length (tokens), offset
    val-00000.tokens, val.index
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from planner.schema.errors import PlanError
from planner.schema.vocab import TOKENS

FORMAT = "exaplan-protein-tokens"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
SPLIT_ALIASES = {"validation": "val", "valid": "val", "training": "train"}
MODES = ("pack", "pad")
IO_MODES = ("real", "synthetic", "io-only")
INDEX_DTYPE = np.dtype([("shard", "<u4"), ("length", "<u4"), ("offset", "<u8")])
TOKEN_DTYPE = np.uint8
MANIFEST = "manifest.json"
DEFAULT_SHARD_TOKENS = 1 << 30      # 1 GiB per shard file


def check_int(name: str, value, minimum: int) -> int:
    """`value` as an int >= minimum (bools refused); PlanError otherwise. The writer's and the
    reader's argument check."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise PlanError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def load_manifest(prepared_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a prepared directory; PlanError when there is none, it is unreadable,
    of another format or version, or made with another vocabulary."""
    directory = Path(prepared_dir)
    path = directory / MANIFEST
    if not path.is_file():
        raise PlanError(f"{directory}: not a prepared data directory (no {MANIFEST}; run prepare first)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:
        raise PlanError(f"{path}: unreadable manifest: {err}") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise PlanError(f"{path}: not an {FORMAT} v{FORMAT_VERSION} manifest")
    if manifest["vocabulary"]["tokens"] != list(TOKENS):
        raise PlanError(f"{directory}: prepared with a different vocabulary; prepare it again")
    return manifest


def split_entry(prepared_dir: str | os.PathLike, manifest: dict[str, Any], split: str) -> tuple[str, dict[str, Any]]:
    """(the split's name, its manifest entry), aliases resolved ('validation' -> 'val'), its
    index file checked for its size; PlanError for an unknown split or a bad index file."""
    split = SPLIT_ALIASES.get(split, split)
    if split not in manifest["splits"]:
        raise PlanError(f"unknown split {split!r}; expected one of {', '.join(manifest['splits'])}"
                        " ('validation' is 'val')")
    info = manifest["splits"][split]
    index_path = Path(prepared_dir) / info["index"]
    expected = int(info["sequences"]) * INDEX_DTYPE.itemsize
    if not index_path.is_file() or index_path.stat().st_size != expected:
        raise PlanError(f"{index_path}: missing or wrong size (expected {expected} bytes); prepare again")
    return split, info
