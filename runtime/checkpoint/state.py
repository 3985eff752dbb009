"""What a checkpoint holds of each rank: its model and optimizer state in the forms DCP can
reshard across layouts, the optimizer kinds (which decide how the optimizer state is stored),
and its RNG states."""

from __future__ import annotations

import hashlib
import random
import re
import sys
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

# Sharded (not gathered) state, optimizer flattened so that it reshards across pipeline layouts.
_OPTIONS = StateDictOptions(full_state_dict=False, cpu_offload=False, flatten_optimizer_state_dict=True)

# Optimizer kinds, as recorded in meta.json.
OPT_NONE, OPT_HOOKS, OPT_TORCH, OPT_MIXED = "none", "dcp-hooks", "torch-dcp", "dcp-mixed"
OPT_ZERO, OPT_PER_RANK = "zero-consolidated", "per-rank"
DCP_KINDS = (OPT_HOOKS, OPT_TORCH, OPT_MIXED)  # optimizer state in DCP, reshardable, interchangeable


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


def optimizer_kind(optimizer) -> str:
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
    if optimizer_kind(optimizer) not in DCP_KINDS:
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
    if optimizer_kind(optimizer) not in DCP_KINDS:
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
