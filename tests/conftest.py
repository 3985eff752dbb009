"""Test-suite order: the JAX backend's in-process tests run last.

Importing JAX starts its thread pools, and a process that has them must not fork without
exec (os.fork() then warns that it "will likely lead to a deadlock"); the what-if engine's
tests fork worker processes (planner/whatif/engine.py). Running tests/jaxrt/ after every
other package keeps JAX out of the pytest process until nothing forks any more."""

import pytest


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: "/tests/jaxrt/" in str(item.path).replace("\\", "/"))


@pytest.fixture
def no_process_group_left():
    """exaplan check starts its own fake world and refuses to run inside another: a group left
    by an earlier test on this worker is ended first."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    yield
