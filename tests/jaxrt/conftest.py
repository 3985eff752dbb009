"""The JAX backend's tests see 8 CPU devices (XLA reads the flags when JAX starts: nothing
before this file may import JAX; no other test package does)."""

import os

import pytest

from jaxrt.launch import xla_flags  # no JAX at its module level

# As `exaplan run --backend jax` sets them (jaxrt/launch.configure): the memory-optimized CPU
# scheduler, under which jax.checkpoint saves memory on XLA's CPU devices.
os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""), 8)

pytest.importorskip("jax", reason="the JAX backend's extra is not installed (pip install -e '.[jax]')")
