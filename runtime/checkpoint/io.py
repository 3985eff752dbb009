"""Saving and loading a checkpoint, collectively over the ranks of a process group: DCP
writes and reshards the model and optimizer state; meta.json, the COMPLETE marker, each
rank's RNG states and the optimizer states DCP cannot hold are files beside it (the layout
and the guarantees: runtime/checkpoint/__init__.py)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from planner.schema.errors import PlanError
from runtime.checkpoint.paths import COMPLETE, META, OPTIM_DIR, RNG_DIR, TMP_SUFFIX, prune, resolve, step_dir_name
from runtime.checkpoint.state import (DCP_KINDS, OPT_NONE, OPT_PER_RANK, OPT_ZERO, load_model_state,
                                      load_optimizer_state_from_checkpoint, model_state_for_checkpoint,
                                      optimizer_kind, optimizer_state_for_checkpoint, reseed, rng_state,
                                      set_rng_state)

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


# --------------------------------------------------------------------------------------------
# Process group helpers
# --------------------------------------------------------------------------------------------


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank_world(group=None) -> tuple[int, int]:
    if _distributed():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns that it assumes a single process when no process group is up: that is meant."""
    with warnings.catch_warnings():
        if not _distributed():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier(group=None) -> None:
    if _distributed():
        dist.barrier(group=group)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _json_default(o):
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, torch.Tensor) and o.numel() == 1:
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, default=_json_default)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _torch_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _write_rank_items(tmp: Path, rank: int, optimizer, kind: str, group=None) -> None:
    """What each rank stores outside DCP: its RNG states, and the optimizer state when DCP
    cannot hold it (a collective for ZeroRedundancyOptimizer)."""
    _torch_save(rng_state(), tmp / RNG_DIR / f"rank-{rank:05d}.pt")
    if kind == OPT_ZERO:
        optimizer.consolidate_state_dict(to=0)
        if rank == 0:
            _torch_save(optimizer.state_dict(), tmp / OPTIM_DIR / "zero-full.pt")
    elif kind == OPT_PER_RANK:
        _torch_save(optimizer.state_dict(), tmp / OPTIM_DIR / f"rank-{rank:05d}.pt")


# --------------------------------------------------------------------------------------------
# Save and load
# --------------------------------------------------------------------------------------------


def save(
    dir: str | Path,
    step: int,
    model_parts: Sequence[nn.Module],
    optimizer=None,
    extra: dict | None = None,
    *,
    keep: int = 2,
    process_group=None,
) -> Path:
    """Save model parts, optimizer, `extra` and every rank's RNG states as `dir/step-XXXXXXXX`.

    Collective: every rank of `process_group` (default: the world) calls it with its own
    model parts (a pipeline stage passes all its chunks) and optimizer. `extra` must be
    JSON-serialisable and global (rank 0's is stored): step, data position, seed. Returns the
    final folder, which exists on return on every rank. Keeps the newest `keep` (>= 1)."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    dir = Path(dir)
    rank, world = _rank_world(process_group)
    final = dir / step_dir_name(step)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    kind = optimizer_kind(optimizer)
    extra = {k: v for k, v in (extra or {}).items() if k != "_resume"}  # load()'s report is not state
    extra.setdefault("step", int(step))
    try:
        json.dumps(extra, default=_json_default)
    except TypeError as e:
        raise PlanError(f"extra must be JSON-serialisable: {e}", field="checkpoint.extra") from None

    if rank == 0:
        dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by an interrupted save of this step
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier(process_group)

    state: dict[str, Any] = {"model": model_state_for_checkpoint(model_parts)}
    optim_state = optimizer_state_for_checkpoint(optimizer, model_parts)
    if optim_state is not None:
        state["optimizer"] = optim_state
    with _quiet_single_process():
        dcp.save(state, checkpoint_id=tmp, process_group=process_group, no_dist=not _distributed())
    _write_rank_items(tmp, rank, optimizer, kind, process_group)
    _fault_in_save(rank, step)
    _barrier(process_group)  # every rank's files are written

    if rank == 0:
        meta = {
            "format_version": FORMAT_VERSION,
            "step": int(step),
            "world_size": world,
            "optimizer": kind,
            "saved_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__,
            "extra": extra,
        }
        _write_json(tmp / META, meta)
        _write_json(tmp / COMPLETE, {"step": int(step), "world_size": world})
        _fsync_dir(tmp)
        old = None
        if final.exists():  # saving the same step again: replace it
            old = final.with_name(final.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            final.rename(old)
        tmp.rename(final)
        _fsync_dir(dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        prune(dir, keep, final)
    _barrier(process_group)  # nobody returns before the checkpoint is in place
    return final


def _checkpoint_keys(path: Path) -> set[str]:
    """The flattened keys DCP stored ("model.layers.0.attention.wq.weight", "optimizer.state...")."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    except Exception as e:
        raise PlanError(f"cannot read the DCP metadata of {path}: {e}", field="checkpoint") from None


def load(
    path: str | Path,
    model_parts: Sequence[nn.Module],
    optimizer=None,
    *,
    seed: int | None = None,
    restore_rng: bool = True,
    strict: bool = True,
    process_group=None,
) -> dict[str, Any]:
    """Load a checkpoint into this layout's model parts and optimizer, resharding as needed.

    `path`: a checkpoint folder, or a folder of checkpoints (its latest complete one).
    Collective, like `save`. Model parts and optimizer must be built (materialised, sharded)
    for the new layout first; an optimizer of `None` loads the model only. Returns the saved
    `extra` (with "step") plus "_resume": a dict with path, step, saved_world_size,
    world_size, optimizer kind and "rng": what happened to the RNG states ("restored", or
    "reseeded from (seed, step, rank)" when the world size changed; `seed` defaults to
    extra["seed"], else 0). With `strict`, a model whose parameters (over all ranks) differ
    from the checkpoint's is refused. Raises PlanError for a missing or incomplete
    checkpoint, or one that does not fit the model."""
    path = resolve(path)
    rank, world = _rank_world(process_group)
    meta = _read_meta(path)
    step, saved_world, saved_kind = int(meta["step"]), int(meta["world_size"]), meta["optimizer"]
    kind = optimizer_kind(optimizer)
    _check_optimizer_fits(path, kind, saved_kind, saved_world, world)
    _load_states(path, model_parts, optimizer, kind, saved_kind, rank, strict, process_group)

    extra = dict(meta.get("extra") or {})
    extra.setdefault("step", step)
    rng = "not restored (restore_rng=False)"
    if restore_rng:
        rng = _restore_rng(path, rank, world, saved_world, step, seed, extra)
    extra["_resume"] = {
        "path": str(path),
        "step": step,
        "saved_world_size": saved_world,
        "world_size": world,
        "resharded": saved_world != world,
        "optimizer": kind,
        "rng": rng,
    }
    _barrier(process_group)
    return extra


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as e:
        raise PlanError(f"unreadable {META} in {path}: {e}", field="checkpoint") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise PlanError(f"checkpoint format {meta.get('format_version')!r} is not supported (this runtime reads {FORMAT_VERSION})",
                        field="checkpoint")
    return meta


def _check_optimizer_fits(path: Path, kind: str, saved_kind: str, saved_world: int, world: int) -> None:
    """PlanError unless the saved optimizer state can load into this run's optimizer (of `kind`)."""
    if kind == OPT_NONE:
        return
    if saved_kind == OPT_NONE:
        raise PlanError(f"{path} holds no optimizer state (saved without an optimizer)", field="checkpoint")
    compatible = (kind in DCP_KINDS and saved_kind in DCP_KINDS) or kind == saved_kind
    if not compatible:
        raise PlanError(f"{path} holds optimizer state of kind {saved_kind!r}; this run's optimizer is {kind!r}",
                        field="checkpoint")
    if kind == OPT_PER_RANK and saved_world != world:
        raise PlanError(
            f"{path} holds a per-rank optimizer state from {saved_world} ranks, which cannot be resharded onto "
            f"{world}: give the optimizer dcp_state_dict()/load_dcp_state_dict() to make it layout-independent",
            field="checkpoint")


def _load_states(path: Path, model_parts: Sequence[nn.Module], optimizer, kind: str, saved_kind: str, rank: int,
                 strict: bool, process_group) -> None:
    """The model state, and the optimizer's (through DCP, resharded, or from its own files)."""
    saved_keys = _checkpoint_keys(path)
    state: dict[str, Any] = {"model": model_state_for_checkpoint(model_parts)}
    if strict:
        _check_model_keys(path, set(state["model"]), saved_keys, process_group)
    template = None
    if kind in DCP_KINDS:
        template = optimizer_state_for_checkpoint(optimizer, model_parts)
        requested = template
        if kind != saved_kind:
            # Another optimizer kind saved it: its moments load, hyper-parameters stay ours.
            requested = {k: v for k, v in template.items()
                         if not (k.startswith("param_groups.") and f"optimizer.{k}" not in saved_keys)}
        state["optimizer"] = requested
    try:
        with _quiet_single_process():
            dcp.load(state, checkpoint_id=path, process_group=process_group, no_dist=not _distributed())
    except Exception as e:  # DCP gathers every rank's failure into one exception
        first = str(e).strip().splitlines()
        raise PlanError(f"cannot load {path}: {first[-1] if first else type(e).__name__}", field="checkpoint") from e
    load_model_state(model_parts, state["model"])
    if template is not None:
        template.update(state["optimizer"])  # DCP replaced the non-tensor values in the dict
        load_optimizer_state_from_checkpoint(optimizer, model_parts, template)
    elif kind == OPT_ZERO:
        optimizer.load_state_dict(torch.load(path / OPTIM_DIR / "zero-full.pt", weights_only=False))
    elif kind == OPT_PER_RANK:
        optimizer.load_state_dict(torch.load(path / OPTIM_DIR / f"rank-{rank:05d}.pt", weights_only=False))


def _restore_rng(path: Path, rank: int, world: int, saved_world: int, step: int, seed: int | None,
                 extra: dict[str, Any]) -> str:
    """This rank's saved RNG states on the same world size, else a reseed from (seed, step,
    rank); what was done, in words."""
    rng_file = path / RNG_DIR / f"rank-{rank:05d}.pt"
    if saved_world == world and rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
        return "restored"
    s = seed if seed is not None else int(extra.get("seed", 0))
    reseed(s, step, rank)
    rng = (f"reseeded from (seed={s}, step={step}, rank={rank}): the checkpoint was saved by {saved_world} "
           f"ranks, this run has {world}")
    if rank == 0:
        log.info("checkpoint %s: RNG states %s", path, rng)
    return rng


def _check_model_keys(path: Path, mine: set[str], saved_keys: set[str], group=None) -> None:
    """The union over ranks of the model keys must equal the checkpoint's model keys."""
    keys = set(mine)
    if _distributed():
        gathered: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, sorted(mine), group=group)
        keys = set().union(*map(set, gathered))
    saved = {k[len("model."):] for k in saved_keys if k.startswith("model.")}
    missing, unexpected = sorted(keys - saved), sorted(saved - keys)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} parameters not in the checkpoint (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} checkpoint parameters not in the model (e.g. {', '.join(unexpected[:3])})")
        raise PlanError(f"{path} does not fit this model: {'; '.join(parts)}", field="checkpoint")


def _fault_in_save(rank: int, step: int) -> None:
    """Test hook: EXAPLAN_FAULT_KILL_IN_SAVE=RANK:STEP SIGKILLs that rank in the middle of
    saving the checkpoint of that step (its shards written, the folder not yet complete), as
    a node lost during a save would (tests/runtime/test_soak.py)."""
    spec = os.environ.get("EXAPLAN_FAULT_KILL_IN_SAVE")
    if spec:
        kill_rank, kill_step = (int(x) for x in spec.split(":"))
        if rank == kill_rank and step == kill_step:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


def full_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The whole model's weights in checkpoint `path`, in this process alone (no process
    group): canonical name -> full fp32 CPU tensor, read by DCP from its metadata's shapes,
    whatever layout wrote them. For a reader outside the torch runtime (the JAX backend's
    --init, jaxrt/checkpoint.py)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(path))
    entries = reader.read_metadata().state_dict_metadata
    state = {key: torch.empty(tuple(md.size), dtype=md.properties.dtype) for key, md in entries.items()
             if key.startswith("model.") and isinstance(md, TensorStorageMetadata)}
    if not state:
        raise PlanError(f"{path}: no model weights in this checkpoint", field="--init")
    dcp.load(state, storage_reader=reader, no_dist=True)
    return {key[len("model."):]: value.float() for key, value in state.items()}
