"""Checkpoints of the JAX backend with orbax-checkpoint.

OUT/checkpoints/step_NNNNNNNN/ holds two items: `state` (parameters and AdamW state, each
process writing its own shards; orbax's StandardCheckpointHandler) and `meta` (JSON: the
step, the loader's position, the plan's hash and layout). orbax writes a step under a
temporary name and renames it when every process has finished, so a step directory that
exists is complete. Restoring reads into the current layout's shardings, so a run may
resume on another layout of the same model.

`load_torch_weights` reads the model weights of a torch runtime checkpoint (a user moving
between backends; needs torch).
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from jaxrt.preflight import STEP_PREFIX
from planner.schema.errors import PlanError

def manager(ckpt_dir: Path, keep: int | None = None) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, step_prefix=STEP_PREFIX,
                                           step_format_fixed_length=8, enable_async_checkpointing=False)
    return ocp.CheckpointManager(Path(ckpt_dir).absolute(), options=options, item_names=("state", "meta"))


def save(mgr: ocp.CheckpointManager, step: int, state, meta: dict) -> None:
    """Save (every process calls it) and wait until the step is complete on disk."""
    mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
             force=True)
    mgr.wait_until_finished()


def restore(mgr: ocp.CheckpointManager, like, step: int | None = None):
    """(state, meta) of `step` (default the latest), the state laid out as `like` is."""
    step = mgr.latest_step() if step is None else step
    if step is None:
        raise PlanError(f"no complete checkpoint in {mgr.directory} to resume from", field="--resume")
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
    got = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                    meta=ocp.args.JsonRestore()))
    return got["state"], got["meta"]


def load_torch_weights(path: str | Path, params_like):
    """The model weights of a torch runtime checkpoint (a checkpoint folder, a folder of them
    or a run folder, any layout) as this backend's parameter tree, on the host."""
    try:
        from runtime import checkpoint as torch_ckpt
        from runtime.dpo import resolve_checkpoint
    except ImportError as e:  # pragma: no cover - torch missing
        raise PlanError(f"reading a torch checkpoint needs torch ({e})", field="--init") from None
    from jaxrt.model import from_torch_state

    state = torch_ckpt.full_model_state(resolve_checkpoint(str(path)))  # full fp32 tensors by torch name
    return from_torch_state(state, params_like)
