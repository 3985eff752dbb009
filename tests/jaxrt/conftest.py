"""The JAX backend's tests see 8 CPU devices (XLA reads the flag when JAX starts: nothing
before this file may import JAX; no other test package does)."""

import os

import pytest

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

pytest.importorskip("jax", reason="the JAX backend's extra is not installed (pip install -e '.[jax]')")
