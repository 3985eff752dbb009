"""What the JAX backend chooses for GPUs, checked where no GPU is: the attention kernel it asks
for, and the share of the card JAX's allocator may take."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrt import model as jax_model
from jaxrt.launch import GPU_MEMORY_FRACTION, configure
from jaxrt.model import attention, attention_implementation, attention_in_use
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


def test_a_refused_cudnn_attention_runs_xlas_and_says_so(monkeypatch):
    """Where cuDNN's kernel is picked (bf16 on a GPU) and refuses the shapes, the einsums run,
    a warning says why, and `attention_in_use` (the trainer's line after the first step) no
    longer reports cuDNN. Here the refusal is real: a CPU told it is a GPU has no cuDNN."""
    monkeypatch.delenv("EXAPLAN_JAX_ATTENTION", raising=False)
    monkeypatch.setattr(jax_model, "_CUDNN_REFUSED", [])
    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, 16, 2, 64), jnp.bfloat16) for i in range(3))
    expected = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    monkeypatch.setattr(jax_model.jax, "default_backend", lambda: "gpu")
    assert attention_in_use(jnp.bfloat16) == "cudnn"  # picked, not yet refused
    with pytest.warns(UserWarning, match="cuDNN attention does not run here"):
        out = attention(q, k, v)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(expected, np.float32))
    assert attention_in_use(jnp.bfloat16).startswith("xla (cuDNN refused: ")
    assert attention_in_use(jnp.float32) == "xla"  # never picked for fp32


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
