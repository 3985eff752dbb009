"""Checkpoints that any layout can resume: torch.distributed.checkpoint (DCP) underneath.

On disk, one checkpoint is a folder `step-00000123/` holding

    .metadata, __<rank>_0.distcp   DCP: the model and the optimizer state, keyed by canonical
                                  fully-qualified names ("layers.3.attention.wq.weight"), each
                                  rank writing its own shards; DCP reshards them on load
    meta.json                     format, step, world size, optimizer kind, the caller's `extra`
    rng/rank-00003.pt             each rank's RNG states (python, numpy, torch, cuda)
    optimizer/...                 only for optimizers DCP cannot reshard (see below)
    COMPLETE                      written by rank 0 last: the checkpoint is whole

Saving is atomic: every rank writes into `step-00000123.tmp/`; after a barrier rank 0 writes
`meta.json` and `COMPLETE`, then renames the folder to `step-00000123/`. A crash during a save
leaves a `.tmp` folder that `latest` ignores (and the next save of that step removes), so the
previous checkpoint stays the latest. The newest `keep` checkpoints are kept.

Layout independence. Model state comes from DCP's `get_model_state_dict` per model part
(sharded: DTensor shards for FSDP2/TP, plain tensors otherwise), so a pipeline stage's parts
each contribute their own keys and a DDP/compile/activation-checkpoint wrapper adds no prefix.
The optimizer state is saved in DCP's flattened form (`state.<fqn>.exp_avg`,
`param_groups.<fqn>.lr`), the form that reshards across data, tensor and pipeline layouts.
Optimizers, in order of preference:

* an object with `dcp_state_dict()` / `load_dcp_state_dict(state)` (duck-typed hooks, as
  runtime/parallel/zero.py's ZeroOptimizer has): `dcp_state_dict()` returns a nested dict of tensors
  or DTensors keyed by canonical parameter names whose global shapes do not depend on the
  layout, so that DCP can reshard it; on load it is called for a template, DCP fills the
  template in place, and `load_dcp_state_dict` receives the filled template;
* a `torch.optim.Optimizer`, params plain or DTensor (FSDP2, TP): DCP's
  `get_optimizer_state_dict` / `set_optimizer_state_dict`, one optimizer over all the parts
  of a pipeline rank or a list with one per part (each element torch or with hooks).
  Both forms flatten to the same DCP keys (`optimizer.state.<fqn>.exp_avg`), so a checkpoint
  written under ZeRO loads under FSDP2 and back; the hyper-parameters (lr, betas, weight
  decay) then stay those of the running optimizer;
* `torch.distributed.optim.ZeroRedundancyOptimizer`: consolidated on rank 0 and stored whole
  (`optimizer/zero-full.pt`); every rank loads it and keeps its partition, so it resumes on
  any data-parallel world size (the parameter order must be the same: no pipeline or TP);
* anything else with `state_dict()` / `load_state_dict()`: one file per rank
  (`optimizer/rank-00003.pt`), layout-dependent: it resumes only on the same world size.

RNG states are per rank. Resumed on the same world size, each rank gets its states back; on
a different world size there is no rank to inherit them, so every rank is reseeded from
(seed, step, rank) (see `reseed`) and the returned info says so. The data position in `extra`
is global (rank 0's `extra` is stored): any world size continues from it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import random
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from planner.schema.errors import PlanError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
COMPLETE = "COMPLETE"
META = "meta.json"
RNG_DIR = "rng"
OPTIM_DIR = "optimizer"
TMP_SUFFIX = ".tmp"
_STEP_RE = re.compile(r"^step-(\d{8,})$")

# Sharded (not gathered) state, optimizer flattened so that it reshards across pipeline layouts.
_OPTIONS = StateDictOptions(full_state_dict=False, cpu_offload=False, flatten_optimizer_state_dict=True)

# Optimizer kinds, as recorded in meta.json.
OPT_NONE, OPT_HOOKS, OPT_TORCH, OPT_MIXED = "none", "dcp-hooks", "torch-dcp", "dcp-mixed"
OPT_ZERO, OPT_PER_RANK = "zero-consolidated", "per-rank"
_DCP_KINDS = (OPT_HOOKS, OPT_TORCH, OPT_MIXED)  # optimizer state in DCP, reshardable, interchangeable


# --------------------------------------------------------------------------------------------
# Finding checkpoints
# --------------------------------------------------------------------------------------------


def step_dir_name(step: int) -> str:
    return f"step-{int(step):08d}"


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint folder name (`step-00000123` -> 123), None for other names."""
    m = _STEP_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return checkpoint_step(path) is not None and (path / COMPLETE).is_file() and (path / META).is_file()


def list_checkpoints(dir: str | Path) -> list[Path]:
    """The complete checkpoints under `dir`, oldest step first (`.tmp` folders ignored)."""
    dir = Path(dir)
    if not dir.is_dir():
        return []
    found = [p for p in dir.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: checkpoint_step(p))


def latest(dir: str | Path) -> Path | None:
    """The newest complete checkpoint under `dir` (highest step), or None."""
    found = list_checkpoints(dir)
    return found[-1] if found else None


def resolve(path: str | Path) -> Path:
    """A checkpoint folder, or a folder of checkpoints (its latest); PlanError if none."""
    path = Path(path)
    if not path.exists():
        raise PlanError(f"no checkpoint at {path}", field="checkpoint")
    if checkpoint_step(path) is None and not path.name.endswith(TMP_SUFFIX):
        found = latest(path)
        if found is None:
            partial = sorted(p.name for p in path.iterdir() if p.name.startswith("step-")) if path.is_dir() else []
            extra = f" (only incomplete ones: {', '.join(partial)})" if partial else ""
            raise PlanError(f"no complete checkpoint in {path}{extra}", field="checkpoint")
        return found
    if not is_complete(path):
        why = ("an interrupted save (a .tmp folder)" if path.name.endswith(TMP_SUFFIX)
               else f"it has no {COMPLETE} marker: the save did not finish")
        newest = latest(path.parent)
        hint = f"; the latest complete checkpoint is {newest}" if newest else ""
        raise PlanError(f"incomplete checkpoint {path}: {why}{hint}", field="checkpoint")
    return path


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
# Model and optimizer state
# --------------------------------------------------------------------------------------------


def model_state_for_checkpoint(model_parts: Sequence[nn.Module]) -> dict[str, Any]:
    """This rank's model state: canonical FQN -> tensor/DTensor shard, over all its parts."""
    out: dict[str, Any] = {}
    for part in model_parts:
        sd = get_model_state_dict(part, options=_OPTIONS)
        clash = out.keys() & sd.keys()
        if clash:
            raise ValueError(f"model parts share parameter names: {sorted(clash)[:3]}")
        out.update(sd)
    return out


def load_model_state(model_parts: Sequence[nn.Module], state: dict[str, Any]) -> None:
    """Load the state produced by `model_state_for_checkpoint` (after DCP filled it in)."""
    for part in model_parts:
        keys = get_model_state_dict(part, options=_OPTIONS).keys()
        set_model_state_dict(part, {k: state[k] for k in keys}, options=_OPTIONS)


class _Parts(nn.Module):
    """Several model parts as one module, for one optimizer over all of them; its child names
    (`_part0.`) are stripped from the optimizer's keys so that they stay canonical."""

    def __init__(self, parts: Sequence[nn.Module]):
        super().__init__()
        for i, p in enumerate(parts):
            self.add_module(f"_part{i}", p)


_PART_PREFIX = re.compile(r"^(state|param_groups)\._part\d+\.")


def _has_hooks(opt) -> bool:
    return callable(getattr(opt, "dcp_state_dict", None)) and callable(getattr(opt, "load_dcp_state_dict", None))


def _one_kind(opt) -> str:
    # Not imported here (2 s of TorchScript): an instance exists only if its module is loaded.
    zro = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    if _has_hooks(opt):
        return OPT_HOOKS
    if zro is not None and isinstance(opt, zro.ZeroRedundancyOptimizer):
        return OPT_ZERO
    if isinstance(opt, torch.optim.Optimizer):
        return OPT_TORCH
    if callable(getattr(opt, "state_dict", None)) and callable(getattr(opt, "load_state_dict", None)):
        return OPT_PER_RANK
    raise TypeError(f"cannot checkpoint an optimizer of type {type(opt).__name__}")


def _optimizer_kind(optimizer) -> str:
    """none, dcp-hooks, torch-dcp, dcp-mixed (a list of both), zero-consolidated or per-rank."""
    if optimizer is None:
        return OPT_NONE
    if isinstance(optimizer, (list, tuple)):
        kinds = {_one_kind(o) for o in optimizer}
        if not optimizer or not kinds <= {OPT_TORCH, OPT_HOOKS}:
            raise TypeError("a list of optimizers (one per model part) must hold torch optimizers or "
                            "optimizers with dcp_state_dict()/load_dcp_state_dict()")
        return kinds.pop() if len(kinds) == 1 else OPT_MIXED
    return _one_kind(optimizer)


def _optim_pairs(model_parts: Sequence[nn.Module], optimizer) -> list[tuple[nn.Module, Any, bool]]:
    """(module, optimizer, strip prefixes): one optimizer per part, or one optimizer over all
    the parts (then, for DCP's helpers, the parts are wrapped in `_Parts`)."""
    if isinstance(optimizer, (list, tuple)):
        if len(optimizer) != len(model_parts):
            raise ValueError(f"{len(optimizer)} optimizers for {len(model_parts)} model parts")
        return [(m, o, False) for m, o in zip(model_parts, optimizer)]
    if len(model_parts) == 1:
        return [(model_parts[0], optimizer, False)]
    return [(_Parts(model_parts), optimizer, True)]


def _merge(into: dict, new: dict, path: str = "") -> None:
    for k, v in new.items():
        if k in into:
            if isinstance(into[k], dict) and isinstance(v, dict):
                _merge(into[k], v, f"{path}{k}.")
                continue
            raise ValueError(f"optimizer state key {path}{k!r} appears twice (a parameter in two parts?)")
        into[k] = v


def optimizer_state_for_checkpoint(optimizer, model_parts: Sequence[nn.Module]) -> dict[str, Any] | None:
    """This rank's optimizer state in a layout-independent form that DCP can reshard, or
    None when the optimizer offers none (ZeroRedundancyOptimizer, per-rank objects).

    Per optimizer: `dcp_state_dict()` when it has the hooks, else DCP's flattened
    `get_optimizer_state_dict` (keys `state.<fqn>.<name>`, `param_groups.<fqn>.<name>`).
    Both flatten to the same DCP keys (`optimizer.state.<fqn>.exp_avg`), so a checkpoint of
    one kind loads into the other (the hyper-parameters then stay the running optimizer's)."""
    if _optimizer_kind(optimizer) not in _DCP_KINDS:
        return None
    out: dict[str, Any] = {}
    for module, opt, strip in _optim_pairs(model_parts, optimizer):
        if _has_hooks(opt):
            sd = opt.dcp_state_dict()
        else:
            sd = get_optimizer_state_dict(module, opt, options=_OPTIONS)
            if strip:
                sd = {_PART_PREFIX.sub(r"\1.", k): v for k, v in sd.items()}
        _merge(out, sd)
    return out


def load_optimizer_state_from_checkpoint(optimizer, model_parts: Sequence[nn.Module], state: dict[str, Any]) -> None:
    """Load what `optimizer_state_for_checkpoint` produced, after DCP filled it in. An
    optimizer with hooks receives the whole dict (it picks its own parameters' entries)."""
    if _optimizer_kind(optimizer) not in _DCP_KINDS:
        raise TypeError("this optimizer has no DCP state")
    for module, opt, strip in _optim_pairs(model_parts, optimizer):
        if _has_hooks(opt):
            opt.load_dcp_state_dict(state)
            continue
        own = get_optimizer_state_dict(module, opt, options=_OPTIONS).keys()
        mine = {k: state[_PART_PREFIX.sub(r"\1.", k) if strip else k] for k in own}
        set_optimizer_state_dict(module, opt, mine, options=_OPTIONS)


# --------------------------------------------------------------------------------------------
# RNG states
# --------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's RNG states: python, numpy (global), torch CPU and, if used, CUDA."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def reseed(seed: int, step: int, rank: int) -> int:
    """Seed python, numpy and torch (all devices) from (seed, step, rank); returns the seed
    used. Deterministic: the same triple gives the same streams on every run."""
    digest = hashlib.sha256(f"exaplan-rng:{seed}:{step}:{rank}".encode()).digest()
    s = int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
    random.seed(s)
    np.random.seed(s % (1 << 32))
    torch.manual_seed(s)
    return s


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


def _prune(dir: Path, keep: int, current: Path) -> None:
    """Keep `current` and the newest keep-1 other complete checkpoints; remove older ones and
    leftovers of interrupted saves of earlier steps."""
    step = checkpoint_step(current)
    others = [p for p in list_checkpoints(dir) if p != current]
    for p in others[: max(len(others) - (keep - 1), 0)]:
        shutil.rmtree(p, ignore_errors=True)
    for p in dir.iterdir():
        name = p.name
        if name.endswith(TMP_SUFFIX) or name.endswith(".old"):
            s = checkpoint_step(p.with_name(name.rsplit(".", 1)[0]))
            if s is not None and s <= step and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


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
    kind = _optimizer_kind(optimizer)
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
        _prune(dir, keep, final)
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
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as e:
        raise PlanError(f"unreadable {META} in {path}: {e}", field="checkpoint") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise PlanError(f"checkpoint format {meta.get('format_version')!r} is not supported (this runtime reads {FORMAT_VERSION})",
                        field="checkpoint")
    step, saved_world, saved_kind = int(meta["step"]), int(meta["world_size"]), meta["optimizer"]
    kind = _optimizer_kind(optimizer)

    if kind != OPT_NONE:
        if saved_kind == OPT_NONE:
            raise PlanError(f"{path} holds no optimizer state (saved without an optimizer)", field="checkpoint")
        compatible = (kind in _DCP_KINDS and saved_kind in _DCP_KINDS) or kind == saved_kind
        if not compatible:
            raise PlanError(f"{path} holds optimizer state of kind {saved_kind!r}; this run's optimizer is {kind!r}",
                            field="checkpoint")
        if kind == OPT_PER_RANK and saved_world != world:
            raise PlanError(
                f"{path} holds a per-rank optimizer state from {saved_world} ranks, which cannot be resharded onto "
                f"{world}: give the optimizer dcp_state_dict()/load_dcp_state_dict() to make it layout-independent",
                field="checkpoint")

    saved_keys = _checkpoint_keys(path)
    state: dict[str, Any] = {"model": model_state_for_checkpoint(model_parts)}
    if strict:
        _check_model_keys(path, set(state["model"]), saved_keys, process_group)
    template = None
    if kind in _DCP_KINDS:
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

    extra = dict(meta.get("extra") or {})
    extra.setdefault("step", step)
    rng = "not restored (restore_rng=False)"
    if restore_rng:
        rng_file = path / RNG_DIR / f"rank-{rank:05d}.pt"
        if saved_world == world and rng_file.is_file():
            set_rng_state(torch.load(rng_file, weights_only=False))
            rng = "restored"
        else:
            s = seed if seed is not None else int(extra.get("seed", 0))
            reseed(s, step, rank)
            rng = (f"reseeded from (seed={s}, step={step}, rank={rank}): the checkpoint was saved by {saved_world} "
                   f"ranks, this run has {world}")
            if rank == 0:
                log.info("checkpoint %s: RNG states %s", path, rng)
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
