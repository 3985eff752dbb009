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

The package: paths.py (step folders, markers, finding and pruning checkpoints), state.py
(model and optimizer state in DCP's reshardable forms, optimizer kinds, RNG states), io.py
(`save` and `load`); the names below are its API (`from runtime import checkpoint`).
"""

from __future__ import annotations

import importlib

from runtime.checkpoint.paths import (COMPLETE, META, OPTIM_DIR, RNG_DIR, TMP_SUFFIX, checkpoint_step, is_complete, latest,
                                      list_checkpoints, prune, resolve, step_dir_name)

# io.py and state.py import torch: loaded when first used, so that `exaplan run` can look for
# checkpoints (paths.py) before it starts the ranks without importing torch itself.
_LAZY = {name: "runtime.checkpoint.io" for name in ("FORMAT_VERSION", "full_model_state", "load", "save")} | {
    name: "runtime.checkpoint.state" for name in (
        "DCP_KINDS", "OPT_HOOKS", "OPT_MIXED", "OPT_NONE", "OPT_PER_RANK", "OPT_TORCH", "OPT_ZERO", "load_model_state",
        "load_optimizer_state_from_checkpoint", "model_state_for_checkpoint", "optimizer_kind",
        "optimizer_state_for_checkpoint", "reseed", "rng_state", "set_rng_state")}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'runtime.checkpoint' has no attribute {name!r}")

__all__ = [
    "COMPLETE", "DCP_KINDS", "FORMAT_VERSION", "META", "OPTIM_DIR", "OPT_HOOKS", "OPT_MIXED", "OPT_NONE", "OPT_PER_RANK",
    "OPT_TORCH", "OPT_ZERO", "RNG_DIR", "TMP_SUFFIX", "checkpoint_step", "is_complete", "latest", "list_checkpoints",
    "load", "load_model_state", "load_optimizer_state_from_checkpoint", "model_state_for_checkpoint",
    "optimizer_kind", "optimizer_state_for_checkpoint", "prune", "reseed", "resolve", "rng_state", "save",
    "set_rng_state", "step_dir_name",
]
