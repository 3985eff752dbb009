"""Recompute saves memory in the JAX backend's compiled step on XLA's CPU devices: under the
CPU scheduler `exaplan run --backend jax` chooses (jaxrt/launch.py), not the default one,
which placed the recomputation beside the forward pass and kept every level's memory equal."""

import os

import jax
import jax.numpy as jnp
import pytest

from jax_plans import SPECS, make_plan
from jaxrt.launch import CPU_SCHEDULER_FLAG, xla_flags
from jaxrt.sharding import build_mesh
from jaxrt.step import Trainer
from planner.schema.specs import ModelSpec


def test_xla_flags_choose_the_memory_optimized_cpu_scheduler_unless_given():
    flags = xla_flags("--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=3", 2).split()
    assert flags == ["--xla_dump_to=/tmp/x", CPU_SCHEDULER_FLAG, "--xla_force_host_platform_device_count=2"]
    mine = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    assert xla_flags(mine, 1).split() == [mine, "--xla_force_host_platform_device_count=1"]
    assert CPU_SCHEDULER_FLAG not in xla_flags("--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_DEFAULT", 1)
    assert CPU_SCHEDULER_FLAG in os.environ["XLA_FLAGS"]  # these tests run as `exaplan run` does (conftest.py)


def _temp_bytes(recompute: str) -> int:
    SPECS["mem"] = ModelSpec(name="mem", layers=3, hidden=256, heads=4, kv_heads=4, ffn_hidden=704, vocab_size=32,
                             seq_len=512, activation="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False)
    plan = make_plan(1, "none", spec="mem", recompute=recompute, precision="bf16", global_batch=2)
    trainer = Trainer(plan.model_copy(update={"backend": "jax"}), build_mesh(plan, jax.devices()[:1]))
    state = jax.eval_shape(lambda: trainer.init_state(0))
    batch = jax.ShapeDtypeStruct((1, 2, 513), jnp.int32, sharding=trainer.shardings.batch)
    return trainer.train_step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes


def test_recompute_lowers_the_compiled_steps_temporaries_on_cpu():
    if jax.default_backend() != "cpu":  # asked here, not at collection: that would start JAX's backend before other tests fork
        pytest.skip("XLA's CPU scheduler")
    none, selective, full = (_temp_bytes(level) for level in ("none", "selective", "full"))
    assert full < selective < none
    assert full < 0.75 * none
