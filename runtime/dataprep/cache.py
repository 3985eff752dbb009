"""A prepared data directory for every rank of a job (`ensure_prepared`: FASTA input is
prepared once, by rank 0, into a cache that the other ranks wait for), and `describe`, a few
lines about a prepared directory. Used by the trainer and by `exaplan run` before any rank
starts."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from planner.schema.errors import PlanError
from planner.schema.vocab import TOKENS
from runtime.dataprep.prepare import prepare, sample_fasta_path
from runtime.dataprep.shards import FORMAT, FORMAT_VERSION, MANIFEST, load_manifest, split_entry


def _fasta_list(data) -> list[str]:
    if isinstance(data, (list, tuple)):
        paths = [os.fspath(p) for p in data]
    else:
        text = os.fspath(data)
        paths = [text] if os.path.exists(text) else [p.strip() for p in text.split(",") if p.strip()]
    if not paths:
        raise PlanError("no FASTA files given", field="data")
    return paths


def _cache_matches(cache: Path, paths: list[str], max_len: int, val_fraction: float, seed: int) -> bool:
    """Whether `cache` was prepared from exactly these files (path, size, not modified since)
    with these options."""
    try:
        manifest_path = cache / MANIFEST
        manifest = json.loads(manifest_path.read_text())
        made = manifest_path.stat().st_mtime
        if (manifest.get("format"), manifest.get("version")) != (FORMAT, FORMAT_VERSION):
            return False
        if (manifest["max_len"], manifest["val_fraction"], manifest["seed"]) != (max_len, val_fraction, seed):
            return False
        if manifest["vocabulary"]["tokens"] != list(TOKENS):
            return False
        sources = manifest["sources"]
        if [s["path"] for s in sources] != [os.path.abspath(p) for p in paths]:
            return False
        for src, p in zip(sources, paths):
            st = os.stat(p)
            if st.st_size != src["bytes"] or st.st_mtime > made:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _broadcast_nonce() -> str | None:
    """A token from global rank 0 to all ranks when torch.distributed is running (None otherwise).
    A process that has not imported torch.distributed has no process group: `exaplan run`'s
    launcher prepares the data before it starts the ranks, and importing torch there only to
    find that out cost it about 2 s a run."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    obj = [secrets.token_hex(8) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    return obj[0]


def ensure_prepared(data: str | os.PathLike | list | None, cache_dir: str | os.PathLike, *, rank: int = 0,
                    max_len: int = 1024, val_fraction: float = 0.05, seed: int = 0, progress: bool | None = None,
                    timeout_s: float = 24 * 3600.0, poll_s: float = 0.5) -> Path:
    """A prepared directory for `data`, for every rank of a job.

    `data`: None (the shipped sample), a prepared directory (returned as is), or FASTA
    file(s): a list or a comma-separated string. FASTA input is prepared into `cache_dir` by
    rank 0, unless `cache_dir` already holds these very files (same paths and sizes, not
    modified since) prepared with the same options; the other ranks wait until it is there
    (`cache_dir` must be on a filesystem that all ranks see). Under torch.distributed, a
    PlanError on rank 0 reaches the waiting ranks too (through a marker file next to
    `cache_dir`), so no rank hangs; the only collective is one small broadcast at the start,
    so a long preparation does not run into collective timeouts.
    """
    if data is not None and not isinstance(data, (list, tuple)) and os.path.isdir(os.fspath(data)):
        d = Path(os.fspath(data)).resolve()
        if not (d / MANIFEST).is_file():
            raise PlanError(f"{d}: a directory without {MANIFEST}: not a prepared data directory", field="data")
        return d
    paths = [str(sample_fasta_path())] if data is None else _fasta_list(data)
    cache = Path(os.fspath(cache_dir)).resolve()
    error_file = cache.parent / f".{cache.name}.error"
    nonce = _broadcast_nonce()
    if rank == 0:
        try:
            if error_file.exists():
                error_file.unlink()
            if not _cache_matches(cache, paths, max_len, val_fraction, seed):
                prepare(paths, str(cache), max_len=max_len, val_fraction=val_fraction, seed=seed,
                        progress=True if progress is None else progress, overwrite=True)
        except PlanError as err:
            if nonce is not None:
                error_file.parent.mkdir(parents=True, exist_ok=True)
                error_file.write_text(json.dumps({"nonce": nonce, "error": str(err)}))
            raise
        return cache
    deadline = time.monotonic() + timeout_s
    while True:
        if _cache_matches(cache, paths, max_len, val_fraction, seed):
            return cache
        if nonce is not None and error_file.exists():
            try:
                info = json.loads(error_file.read_text())
            except (OSError, ValueError):
                info = {}
            if info.get("nonce") == nonce:
                raise PlanError(f"rank 0 could not prepare the data: {info.get('error')}", field="data")
        if time.monotonic() > deadline:
            raise PlanError(f"rank {rank}: waited {timeout_s:.0f} s for rank 0 to prepare {cache}", field="data")
        time.sleep(poll_s)


def prepared_manifest(prepared_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a prepared directory, checked as the loader checks it (format, version,
    vocabulary, the train split's index file); PlanError otherwise."""
    manifest = load_manifest(prepared_dir)
    split_entry(prepared_dir, manifest, "train")
    return manifest


def describe(prepared_dir: str | os.PathLike) -> str:
    """A few lines about a prepared directory (for `exaplan data info`)."""
    m = prepared_manifest(prepared_dir)
    lines = [f"{Path(prepared_dir)}: {m['sequences']:,} sequences, {m['residues']:,} residues, {m['tokens']:,} tokens "
             f"(max_len {m['max_len']}, val_fraction {m['val_fraction']}, split seed {m['seed']})"]
    for name, info in m["splits"].items():
        lines.append(f"  {name:5s} {info['sequences']:>12,} sequences {info['tokens']:>15,} tokens "
                     f"in {len(info['shards'])} shard(s)")
    skipped = ", ".join(f"{k} {v:,}" for k, v in m["skipped"].items() if v) or "none"
    lines.append(f"  skipped: {skipped}")
    for ex in m["skipped_examples"][:5]:
        lines.append(f"    {os.path.basename(ex['file'])}:{ex['line']} {ex['id']!r}: {ex['reason']} ({ex['detail']})")
    for src in m["sources"]:
        lines.append(f"  source {src['path']} ({src['bytes']:,} bytes, sha256 {src['sha256'][:16]}...)")
    return "\n".join(lines)


__all__ = ["describe", "ensure_prepared", "prepared_manifest"]
