"""The JAX backend: `exaplan run PLAN --backend jax` (docs/guide/backends.md).

launch.py (JAX set-up, processes) -> trainer.py (the loop) -> step.py (state, optax, the jit
steps) over model.py (flax.linen) and sharding.py (the mesh, the logical-axis rule tables);
data.py (the torch runtime's sample stream as global arrays), checkpoint.py (orbax),
preflight.py (what is checked before JAX starts)."""
