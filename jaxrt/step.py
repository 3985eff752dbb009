"""The train state on the mesh and the jit-compiled steps.

`Trainer` builds, for one plan: the model (jaxrt/model.py), the parameters initialised
directly in their sharded layout (jit with out_shardings: no device ever holds the whole
model unless the layout replicates it; the same seed gives the same weights in every
layout), AdamW through optax with the torch runtime's hyperparameters, schedule and
clipping, and two compiled functions:

    train_step(state, batches) -> (state, metrics)   state donated (updated in place);
                                                     batches: (accumulation, dp x micro-batch,
                                                     seq + 1) int32, rows split over dp
    eval_step(params, batches) -> loss

Accumulation runs the micro-batches in a `lax.scan` that sums fp32 gradients; the loss is
the mean over micro-batches and data-parallel ranks of each rank's micro-batch mean, as the
torch runtime's ranks compute it (jaxrt/model.blockwise_loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxrt import sharding as shd
from jaxrt.model import Dims, ProteinLM, blockwise_loss
from jaxrt.preflight import check_runs
from planner.schema.plan import Plan
from planner.schema.specs import Precision, Sharding

MAX_GRAD_NORM = 1.0  # runtime/trainer.py clips at 1.0 too
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.95), 1e-8, 0.1  # runtime/trainer.py's AdamW


def lr_schedule(lr: float, warmup: int, steps: int):
    """runtime/trainer.lr_at as an optax schedule of the update count: linear warm-up, then
    cosine decay to 10% over the run."""

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        warm = lr * (step + 1) / max(warmup, 1)
        frac = jnp.clip((step - warmup) / max(steps - warmup, 1), 0.0, 1.0)
        decay = lr * (0.1 + 0.9 * 0.5 * (1 + jnp.cos(math.pi * frac)))
        return jnp.where(step < warmup, warm, decay)

    return schedule


def make_optimizer(schedule) -> optax.GradientTransformation:
    """Clip by the global norm, then AdamW (decoupled decay on every parameter, as torch)."""
    return optax.chain(
        optax.clip_by_global_norm(MAX_GRAD_NORM),
        optax.adamw(schedule, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY),
    )


def compute_dtype(plan: Plan):
    return jnp.bfloat16 if plan.job.precision == Precision.bf16 else jnp.float32


@dataclass
class Shardings:
    params: object
    optimizer_params: object  # the parameter-shaped layout of AdamW's moments (and zero2's gradients)
    state: object
    batch: NamedSharding


class Trainer:
    """One plan's model, optimizer, shardings and compiled steps on `mesh`."""

    def __init__(self, plan: Plan, mesh, *, lr: float = 3e-4, warmup: int = 10, steps: int = 100):
        check_runs(plan)
        self.plan, self.mesh = plan, mesh
        self.dp, self.gas = plan.mesh.dp, plan.grad_accumulation_steps
        self.model = ProteinLM(Dims.of(plan.model), compute_dtype(plan), plan.recompute.value)
        self.rules = shd.rules_for(plan, "params")
        self.opt_rules = shd.rules_for(plan, "optimizer")
        self.schedule = lr_schedule(lr, warmup, steps)
        self.tx = make_optimizer(self.schedule)
        seq = plan.job.seq_len
        self.sample_tokens = jnp.zeros((plan.micro_batch_size, seq), jnp.int32)
        abstract = jax.eval_shape(self.model.init, jax.random.key(0), self.sample_tokens)
        logical = nn.get_partition_spec(abstract)["params"]
        shapes = nn.meta.unbox(abstract)["params"]
        self.param_shapes = shapes
        params_sh = shd.tree_shardings(logical, shapes, mesh, self.rules)
        opt_params_sh = shd.tree_shardings(logical, shapes, mesh, self.opt_rules)
        opt_shapes = jax.eval_shape(self.tx.init, shapes)
        opt_sh = _like_params(opt_shapes, shapes, opt_params_sh, mesh)
        batch_sh = NamedSharding(mesh, PartitionSpec(None, shd.DATA, None))
        self.shardings = Shardings(params_sh, opt_params_sh, {"params": params_sh, "opt_state": opt_sh}, batch_sh)
        self.train_step = jax.jit(self._train_step, in_shardings=(self.shardings.state, batch_sh),
                                  out_shardings=(self.shardings.state, None), donate_argnums=0)
        self.eval_step = jax.jit(self._eval_loss, in_shardings=(params_sh, batch_sh), out_shardings=None)

    def lr_at(self, step: int) -> float:
        """The learning rate of step `step` (0-based), as runtime/trainer.lr_at."""
        return float(self.schedule(step))

    # --------------------------------------------------------------------------- the state

    def init_state(self, seed: int) -> dict:
        """Parameters from `seed` (flax's initialisers through jax.random: the same values in
        every layout), created in their sharded layout, and AdamW's zero moments."""

        def init(key):
            params = nn.meta.unbox(self.model.init(key, self.sample_tokens))["params"]
            return {"params": params, "opt_state": self.tx.init(params)}

        return jax.jit(init, out_shardings=self.shardings.state)(jax.random.key(seed))

    def state_from_params(self, params) -> dict:
        """A state holding these (host or device) parameters and fresh AdamW moments."""
        params = jax.device_put(params, self.shardings.params)
        init = jax.jit(self.tx.init, out_shardings=self.shardings.state["opt_state"])
        return {"params": params, "opt_state": init(params)}

    # --------------------------------------------------------------------------- the steps

    def _loss(self, params, batch):
        logits = self.model.apply({"params": params}, batch[:, :-1])
        return blockwise_loss(logits, batch[:, 1:], self.dp)

    def _grads(self, params, batches):
        """Mean loss and gradients over the step's micro-batches (fp32 sums in a scan)."""
        grad_fn = jax.value_and_grad(self._loss)
        if self.gas == 1:
            return grad_fn(params, batches[0])
        if self.plan.mesh.tp == 1 and self.plan.sharding.kind in (Sharding.none, Sharding.zero1):
            return self._grads_reduced_once(params, batches)
        layout = self._grad_layout()
        return _accumulate(grad_fn, params, batches, lambda acc: jax.lax.with_sharding_constraint(acc, layout))

    def _grads_reduced_once(self, params, batches):
        """Replicated parameters with accumulation (none, zero1; no tp): each device sums its
        own micro-batches' gradients and the sum is averaged over the data-parallel devices
        once, after the last (as DDP's no_sync does). A scan under the SPMD partitioner would
        all-reduce after every micro-batch: its carry cannot stay unreduced."""
        from jax.sharding import PartitionSpec as P

        def local(params, batches):  # this device's micro-batches: (accumulation, micro-batch, seq + 1)
            grad_fn = jax.value_and_grad(lambda p, b: blockwise_loss(self.model.apply({"params": p}, b[:, :-1]),
                                                                     b[:, 1:], 1))
            return jax.lax.pmean(_accumulate(grad_fn, params, batches), shd.DATA)

        with shd.activate(None, None):  # the data axes are manual inside: no constraints on them
            return jax.shard_map(local, mesh=self.mesh, in_specs=(P(), P(None, shd.DATA, None)), out_specs=(P(), P()),
                                 check_vma=False)(params, batches)

    def _grad_layout(self):
        """Between micro-batches: zero2 and the fully sharded kinds keep the gradient sums
        sharded (reduce-scattered each micro-batch); none and zero1 keep them whole. (The
        step's final gradient is laid out as AdamW's moments: `_train_step`.)"""
        sharded = self.plan.sharding.kind in (Sharding.zero2, *shd.SHARDED_PARAMS)
        return self.shardings.optimizer_params if sharded else self.shardings.params

    def _train_step(self, state, batches):
        with shd.activate(self.mesh, self.rules):
            params = state["params"]
            loss, grads = self._grads(params, batches)
            # As AdamW's moments: zero1/zero2/fsdp reduce-scatter (zero1 without accumulation
            # too: then no rank needs the whole gradient), none all-reduces.
            grads = jax.lax.with_sharding_constraint(grads, self.shardings.optimizer_params)
            grad_norm = optax.tree.norm(grads)
            updates, opt_state = self.tx.update(grads, state["opt_state"], params)
            updates = jax.lax.with_sharding_constraint(updates, self.shardings.optimizer_params)
            params = optax.apply_updates(params, updates)
        return {"params": params, "opt_state": opt_state}, {"loss": loss, "grad_norm": grad_norm}

    def _eval_loss(self, params, batches):
        with shd.activate(self.mesh, self.rules):
            losses = jax.lax.map(lambda b: self._loss(params, b), batches)
        return jnp.mean(losses)

    def batch_array(self, host: np.ndarray):
        """A whole step's batch on one host (tests, one process) as the sharded array."""
        return jax.device_put(np.asarray(host, np.int32), self.shardings.batch)


def _accumulate(grad_fn, params, batches, layout=lambda acc: acc):
    """(mean loss, mean gradients) of `grad_fn` over the micro-batches (the leading axis of
    `batches`): fp32 sums in a `lax.scan`, the running sum laid out by `layout`."""

    def body(carry, batch):
        loss, grads = grad_fn(params, batch)
        total, acc = carry
        return (total + loss, layout(jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads))), None

    zeros = layout(jax.tree.map(jnp.zeros_like, params))
    (total, acc), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), batches)
    n = batches.shape[0]
    return total / n, jax.tree.map(lambda g: g / n, acc)


def _like_params(opt_shapes, param_shapes, opt_params_sh, mesh):
    """AdamW's state tree laid out like the parameters where it is parameter-shaped (the
    moments), replicated elsewhere (the step count)."""
    flat_params = jax.tree_util.tree_structure(param_shapes)
    replicated = NamedSharding(mesh, PartitionSpec())

    def is_params(x):
        try:
            return jax.tree_util.tree_structure(x) == flat_params
        except Exception:  # noqa: BLE001 - any non-tree leaf
            return False

    return jax.tree.map(lambda x: opt_params_sh if is_params(x) else replicated, opt_shapes, is_leaf=is_params)
