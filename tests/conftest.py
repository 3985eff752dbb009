"""Test-suite order: the JAX backend's in-process tests run last.

Importing JAX starts its thread pools, and a process that has them must not fork without
exec (os.fork() then warns that it "will likely lead to a deadlock"); the what-if engine's
tests fork worker processes (planner/whatif/engine.py). Running tests/jaxrt/ after every
other package keeps JAX out of the pytest process until nothing forks any more."""

import os
import tempfile

import pytest


def pytest_configure(config):
    """What exaplan caches on disk (planner/cost/topology.py cache_dir) goes to a folder of the
    test run's own, for the tests and the commands they start, never the user's."""
    os.environ["EXAPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="exaplan-test-cache-")


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


@pytest.fixture(autouse=True)
def _no_columns_from_the_test_runner(monkeypatch):
    """pytest-xdist workers inherit COLUMNS=80 from the controlling terminal, and exaplan's tables
    follow COLUMNS when it is set (cli/common.py console): tests see the width a pipe gets, unless
    they set COLUMNS themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)
