"""Fixtures of the real-Slurm tests (`make test-slurm`): a private Slurm for the session
(tests/slurm/cluster.py) and a protein-tiny plan for the `local` machine; the helpers are in
tests/slurm/slurm_jobs.py.

These tests run only with EXAPLAN_SLURM=1 (`make test-slurm` sets it); plain `make test` skips
them. With EXAPLAN_SLURM=1 and no Slurm (or not root) they fail, so that CI notices."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import SlurmCluster, missing  # noqa: E402
from slurm_jobs import TINY, exaplan  # noqa: E402

ENABLED = os.environ.get("EXAPLAN_SLURM") == "1"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> SlurmCluster:
    if not ENABLED:
        pytest.skip("real Slurm tests: EXAPLAN_SLURM=1 (make test-slurm)")
    why = missing()
    if why:
        pytest.fail(f"EXAPLAN_SLURM=1 but no private Slurm can start: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def tiny_plan(tmp_path_factory) -> Path:
    plan = tmp_path_factory.mktemp("plan") / "tiny.yaml"
    exaplan("estimate", *TINY, "-o", str(plan))
    return plan


@pytest.fixture(scope="session")
def two_node_plan(tmp_path_factory) -> Path:
    """protein-tiny on 2 nodes x 1 rank: the local machine as one rank a node, two nodes."""
    import yaml

    from machine_models import detect_local_machine

    d = tmp_path_factory.mktemp("twonode")
    local = detect_local_machine(1)
    data = local.model_dump(mode="json")
    data.update(name="twonode", nodes=2, launch=local.launch.model_dump(mode="json"))
    (d / "twonode.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    plan = d / "two.yaml"
    exaplan("estimate", "--model", "protein-tiny", "--machine", str(d / "twonode.yaml"), "--nodes", "2", "--seq-len",
            "32", "--global-batch", "8", "--dp", "2", "--mbs", "2", "--shard", "none", "-o", str(plan))
    return plan
