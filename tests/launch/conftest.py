"""Fixtures of the launch tests: a machine file for this computer with a launch: section, a
protein-tiny plan for it, a folder of fake cluster commands (tests/launch/fake_scheduler.py).
The helpers they use are in tests/launch/launch_scripts.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_scripts import FAKES, HERE, TINY, exaplan, write_testbox  # noqa: E402


@pytest.fixture(scope="session")
def testbox(tmp_path_factory) -> Path:
    return write_testbox(tmp_path_factory.mktemp("machine") / "testbox.yaml")


@pytest.fixture(scope="session")
def tiny_plan(testbox) -> Path:
    plan = testbox.parent / "tiny.yaml"
    exaplan("estimate", *TINY, "--machine", str(testbox), "-o", str(plan))
    return plan


@pytest.fixture(scope="session")
def fakebin(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fakebin")
    for name in FAKES:
        shim = d / name
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_scheduler.py'} {name} \"$@\"\n")
        shim.chmod(0o755)
    return d
