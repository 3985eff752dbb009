"""What the JAX backend chooses for GPUs, checked where no GPU is: the attention kernel it asks
for, and the share of the card JAX's allocator may take."""

import os

import jax.numpy as jnp
import pytest

from jaxrt.launch import GPU_MEMORY_FRACTION, configure
from jaxrt.model import attention_implementation
from planner.schema.plan import load_plan

PLAN = "plans/gpu/protein-3.5b_1xh100_jax.yaml"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_attention_is_xlas_on_a_cpu(monkeypatch, dtype):
    monkeypatch.delenv("EXAPLAN_JAX_ATTENTION", raising=False)
    assert attention_implementation(dtype) == "xla"


def test_attention_kernel_can_be_chosen(monkeypatch):
    monkeypatch.setenv("EXAPLAN_JAX_ATTENTION", "cuDNN")
    assert attention_implementation(jnp.float32) == "cudnn"
    monkeypatch.setenv("EXAPLAN_JAX_ATTENTION", "flash")
    with pytest.raises(ValueError, match="EXAPLAN_JAX_ATTENTION=.flash.: expected xla or cudnn"):
        attention_implementation(jnp.bfloat16)


def test_jax_may_take_the_card_less_the_planners_reserve(monkeypatch):
    """JAX's GPU allocator takes 75% of the card unless told: the H100 plan's 70.5 GiB measured
    peak (77.4 predicted, 3.9 of it the reserve) needs 0.95; a user's own setting stays."""
    plan = load_plan(PLAN)
    for key in ["XLA_PYTHON_CLIENT_MEM_FRACTION", *plan.collectives.env]:  # configure sets them: restored after
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    monkeypatch.setenv("EXAPLAN_JAX_CACHE", "off")
    assert configure(plan, 1) == 1
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == GPU_MEMORY_FRACTION == "0.95"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".8")
    configure(plan, 1)
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == ".8"
