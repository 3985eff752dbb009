"""Check `exaplan export --to maxtext` with MaxText 0.2.5's own code.

The exported overrides.yml is loaded by MaxText's config loader, `maxtext.configs.pyconfig.
initialize(["", overrides.yml, ...])`: omegaconf resolves its base_config chain (base.yml,
post_train/dpo.yml), the keys go through types.MaxTextConfig (pydantic), which rejects unknown
keys and runs MaxText's own validation (the pipeline's layer and microbatch asserts, the batch
arithmetic of calculate_global_batch_sizes, the DCN-needs-slices check, ...). The mesh is then
built by `maxtext_utils.create_device_mesh(config, devices)`, which fills and checks the ici_*
degrees against the devices of a slice and the dcn_* ones against the slices
(`max_utils.fill_unspecified_mesh_axes`) and lays devices out through jax's
create_hybrid_device_mesh, as on the plan's machine: the devices are stand-ins carrying what
jax reads from a GPU (id = the plan's global rank, slice_index = its node, platform gpu), so any
world size is built. A single-node plan of at most 8 devices is also built on real jax CPU
devices into a jax.sharding.Mesh.

What comes back is what MaxText derived: its mesh shape per axis, the device (rank) at every
mesh position, the batch sizes, microbatches and accumulation, the model's shape. `check`
compares the model and the rank placement with the plan (PlanError on a difference) and returns
the degrees and the batch split as export.base.Derived.

MaxText runs in a separate Python process (started once, kept for the session): its package
and the pinned modules it imports live in .venv/frameworks/maxtext-0.2.5 (export/fetch_maxtext),
jax must see CPU devices only, and nothing of it lands on this process's sys.path. The process
passes pyconfig two keys beside the file: skip_jax_distributed_system (no cluster here) and
internal_compile_num_devices = the plan's world (MaxText's own way to set the device count it
validates against without the devices).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from export.base import Derived
from export.fetch_maxtext import DEST, MAXTEXT, ready
from planner.schema.errors import PlanError

ROOT = Path(__file__).resolve().parents[1]
REAL_DEVICES = 8  # host devices the process gets: single-node plans up to this size also get a real Mesh
TIMEOUT_S = 300
_VENV_MODULES = ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint", "pydantic", "yaml", "numpy", "absl")


def missing() -> str | None:
    if not ready():
        return f"MaxText {MAXTEXT} is not unpacked in {DEST} (python -m export.fetch_maxtext)"
    absent = [m for m in _VENV_MODULES if importlib.util.find_spec(m.split(".")[0]) is None]
    if absent:
        return f"MaxText's config code needs {', '.join(absent)} in this environment"
    return None


def check(exported, plan) -> Derived:
    from export.maxtext import CONFIG

    out = run(exported.files[CONFIG], world=plan.world_size, nodes=plan.nodes)
    if "error" in out:
        raise PlanError(f"MaxText {MAXTEXT} refuses {CONFIG}: {out['error']}", field="check")
    return derive(out, plan)


def derive(out: dict, plan) -> Derived:
    """The Derived of MaxText's values; PlanError where its model or rank placement is not the plan's."""
    import numpy as np

    m = plan.model
    shape = {"num_decoder_layers": m.layers, "emb_dim": m.hidden, "num_query_heads": m.heads,
             "num_kv_heads": m.kv_heads, "head_dim": m.head_dim, "mlp_dim": m.ffn_hidden, "vocab_size": m.vocab_size,
             "max_target_length": plan.job.seq_len, "logits_via_embedding": m.tied_embeddings,
             "use_dpo": plan.job.workload.value == "dpo"}
    wrong = {k: (out[k], v) for k, v in shape.items() if out[k] != v}
    if wrong:
        raise PlanError("MaxText reads another model: " + ", ".join(f"{k} {a} (plan {b})" for k, (a, b) in wrong.items()),
                        field="check")
    axes = dict(zip(out["mesh_axes"], out["shape"]))
    extra = {a: n for a, n in axes.items() if n > 1 and a not in ("stage", "data", "fsdp", "context", "tensor", "tensor_sequence")}
    if extra:
        raise PlanError(f"MaxText's mesh uses axes the plan has not: {extra}", field="check")
    if int(np.prod(out["ici"])) != plan.ranks_per_node or int(np.prod(out["dcn"])) != plan.nodes:
        raise PlanError(f"MaxText's ici degrees multiply to {int(np.prod(out['ici']))} (devices per node "
                        f"{plan.ranks_per_node}), its dcn degrees to {int(np.prod(out['dcn']))} (nodes {plan.nodes})", field="check")
    zero1 = plan.sharding.kind.value == "zero1"
    dp_replicate, dp_shard = (1, axes["data"]) if zero1 else (axes["data"], axes["fsdp"])
    if zero1 and axes["fsdp"] != 1:
        raise PlanError("zero1: MaxText's fsdp axis must be 1", field="check")
    # The rank at every position of MaxText's mesh, in the plan's axis order (pp, dp_replicate,
    # dp_shard, cp, tp), must be the plan's row-major rank: the same devices in every group.
    ids = np.asarray(out["ids"]).reshape(out["shape"])
    order = [out["mesh_axes"].index(a) for a in ("stage", "data", "fsdp", "context", "tensor", "tensor_sequence")]
    rest = [i for i in range(ids.ndim) if i not in order]
    placed = ids.transpose(rest + order).reshape(axes["stage"], dp_replicate, dp_shard, axes["context"],
                                                 axes["tensor"] * axes["tensor_sequence"])
    if not np.array_equal(placed.ravel(), np.arange(plan.world_size)):
        first = int(np.flatnonzero(placed.ravel() != np.arange(plan.world_size))[0])
        raise PlanError(f"MaxText puts rank {int(placed.ravel()[first])} where the plan has rank {first}", field="mesh")
    if out.get("real_shape") is not None and out["real_shape"] != out["shape"]:
        raise PlanError(f"MaxText's mesh on real devices is {out['real_shape']}, on the plan's {out['shape']}", field="check")
    dp = axes["data"] * axes["fsdp"]
    if out["using_pipeline_parallelism"]:
        micro = out["num_pipeline_microbatches"]
        accumulation = micro * out["gradient_accumulation_steps"]
        micro_batch, rem = divmod(out["micro_batch_size_to_train_on"], micro * dp)
        vpp = out["num_pipeline_repeats"]
    else:
        accumulation = out["gradient_accumulation_steps"]
        micro_batch, rem = divmod(out["micro_batch_size_to_train_on"], dp)
        vpp = 1
    if rem:
        raise PlanError(f"MaxText's forward pass of {out['micro_batch_size_to_train_on']} sequences does not split over "
                        f"{dp} data-parallel ranks", field="check")
    return Derived(tp=axes["tensor"] * axes["tensor_sequence"], pp=axes["stage"], vpp=vpp, cp=axes["context"], dp=dp,
                   micro_batch=micro_batch, accumulation=accumulation, global_batch=out["global_batch_size_to_train_on"])


# ---- the MaxText process ---------------------------------------------------------------------------

_lock = threading.Lock()
_proc: subprocess.Popen | None = None
_log = None


def run(config_text: str, world: int, nodes: int) -> dict:
    """MaxText's reading of one config file (a dict with "error" where MaxText refuses it)."""
    global _proc
    with _lock:
        for attempt in range(2):
            if _proc is None or _proc.poll() is not None:
                _start()
            try:
                _proc.stdin.write(json.dumps({"config": config_text, "world": world, "nodes": nodes}) + "\n")
                _proc.stdin.flush()
                line = _proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if line:
                return json.loads(line)
            _stop()
        raise PlanError(f"MaxText's process died: {_tail()}", field="check")


def _start() -> None:
    global _proc, _log
    _log = tempfile.TemporaryFile(mode="w+")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={REAL_DEVICES}",
               PYTHONPATH=os.pathsep.join([str(DEST), str(DEST / "deps"), str(ROOT)]), TF_CPP_MIN_LOG_LEVEL="3",
               HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    _proc = subprocess.Popen([sys.executable, "-m", "export.check_maxtext", "--serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=_log, text=True, env=env, cwd=tempfile.gettempdir())
    atexit.register(_stop)


def _stop() -> None:
    global _proc
    if _proc is not None:
        try:
            _proc.stdin.close()
            _proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            _proc.kill()
        _proc = None


def _tail() -> str:
    if _log is None:
        return ""
    _log.seek(0)
    return " | ".join(_log.read().strip().splitlines()[-5:])


def _serve() -> None:
    """Run in the MaxText process: one JSON request a line on stdin, one answer a line on the
    original stdout (MaxText's own prints go to stderr)."""
    import unittest  # noqa: F401 - pyconfig re-raises its config errors (instead of sys.exit(2)) when this is loaded

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import logging

    logging.disable(logging.WARNING)
    from maxtext.configs import pyconfig  # noqa: F401 - imported once, before the first request
    from maxtext.utils import maxtext_utils  # noqa: F401

    for line in sys.stdin:
        req = json.loads(line)
        try:
            out = _read(req["config"], req["world"], req["nodes"])
        except Exception as e:  # noqa: BLE001 - MaxText's refusal, whatever its type, goes back as text
            out = {"error": f"{type(e).__name__}: {e}".strip()[:2000]}
        answers.write(json.dumps(out) + "\n")
        answers.flush()


class _Device:
    """A device as jax's mesh builders read one on a GPU machine: id, slice (node), process."""

    platform = "gpu"
    device_kind = "exaplan stand-in GPU"

    def __init__(self, rank: int, node: int):
        self.id = rank
        self.slice_index = node
        self.process_index = node

    def __repr__(self) -> str:
        return f"rank{self.id}"


def _read(config_text: str, world: int, nodes: int) -> dict:
    import jax
    import numpy as np

    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils

    with tempfile.TemporaryDirectory(prefix="exaplan-maxtext-") as tmp:
        path = Path(tmp) / "overrides.yml"
        path.write_text(config_text)
        cfg = pyconfig.initialize(["", str(path), "skip_jax_distributed_system=true", "internal_compile=true",
                                   f"internal_compile_num_devices={world}", f"base_output_directory={tmp}"])
    per_node = world // nodes
    devices = [_Device(r, r // per_node) for r in range(world)]
    mesh = maxtext_utils.create_device_mesh(cfg, devices=devices)
    real_shape = None
    if nodes == 1 and world <= len(jax.devices()):
        real = jax.sharding.Mesh(maxtext_utils.create_device_mesh(cfg, devices=jax.devices()[:world]), cfg.mesh_axes)
        real_shape = [int(real.shape[a]) for a in cfg.mesh_axes]
    keys = ("num_decoder_layers", "emb_dim", "num_query_heads", "num_kv_heads", "head_dim", "mlp_dim", "vocab_size",
            "max_target_length", "logits_via_embedding", "use_dpo", "global_batch_size_to_train_on",
            "micro_batch_size_to_train_on", "gradient_accumulation_steps", "num_pipeline_microbatches",
            "num_pipeline_repeats", "using_pipeline_parallelism", "num_slices", "shard_optimizer_over_data",
            "scan_layers", "set_remat_policy_on_pipeline_iterations", "context_parallel_strategy")
    out = {k: _plain(getattr(cfg, k)) for k in keys}
    out.update({"mesh_axes": list(cfg.mesh_axes), "shape": [int(n) for n in mesh.shape],
                "ids": np.vectorize(lambda d: d.id, otypes=[np.int64])(mesh).ravel().tolist(),
                "ici": [int(n) for n in cfg.ici_parallelism], "dcn": [int(n) for n in cfg.dcn_parallelism],
                "real_shape": real_shape, "dtype": str(cfg.dtype), "weight_dtype": str(cfg.weight_dtype),
                "remat_policy": cfg.remat_policy, "tensors_on_device": list(getattr(cfg, "tensors_on_device", None) or []),
                "mlp_activations": list(cfg.mlp_activations), "decoder_block": cfg.decoder_block.value,
                "matmul_precision": str(cfg.matmul_precision), "dpo_algo": _dpo_algo(cfg)})
    return out


def _dpo_algo(cfg):
    if not cfg.use_dpo:
        return None
    dpo = cfg.dpo
    return dpo["algo"] if isinstance(dpo, dict) else dpo.algo


def _plain(v):
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        sys.exit("usage: python -m export.check_maxtext --serve (started by export.check_maxtext.run)")
