"""The link tiers kept on disk (planner/cost/topology.py): what is read back is what the graph
gives; a damaged or unwritable cache is derived again, never trusted; "off" keeps nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from machine_models import list_machines, load_machine
from planner.cost import topology
from planner.cost.topology import link_tiers, network_key, tiers_from_graph


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EXAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    topology._tiers_cached.cache_clear()
    yield tmp_path / "cache" / "link-tiers"
    topology._tiers_cached.cache_clear()


def test_every_machine_reads_back_the_graphs_tiers(cache):
    names = list_machines()
    assert len(names) > 5
    for name in names:
        m = load_machine(name)
        first = link_tiers(m)
        topology._tiers_cached.cache_clear()  # the second comes from the file
        assert link_tiers(m) == first == tiers_from_graph(network_key(m)), name
    assert len(list(cache.glob("*.json"))) == len({network_key(load_machine(n)) for n in names})
    assert not list(cache.glob(".tiers-*"))  # no temporary file left


@pytest.mark.parametrize("damage", ["", "{", '{"intra_bandwidth_Bps": "fast"}', "[1, 2]", '{"nope": 1.0}'])
def test_a_damaged_cache_file_is_derived_again(cache, damage):
    m = load_machine("frontier")
    want = tiers_from_graph(network_key(m))
    link_tiers(m)
    (path,) = cache.glob("*.json")
    path.write_text(damage)
    topology._tiers_cached.cache_clear()
    assert link_tiers(m) == want
    assert json.loads(path.read_text())["node_injection_Bps"] == want.node_injection_Bps  # rewritten whole


def test_off_keeps_nothing_and_an_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    m = load_machine("aurora")
    want = tiers_from_graph(network_key(m))
    monkeypatch.setenv("EXAPLAN_CACHE_DIR", "off")
    topology._tiers_cached.cache_clear()
    assert topology.cache_dir() is None and link_tiers(m) == want
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EXAPLAN_CACHE_DIR", str(blocker / "cache"))
    topology._tiers_cached.cache_clear()
    assert link_tiers(m) == want
    topology._tiers_cached.cache_clear()


def test_a_warm_cache_keeps_networkx_out_of_a_plan(cache):
    """The point of the cache: with the tiers on disk, planning imports no networkx."""
    env = dict(os.environ, EXAPLAN_CACHE_DIR=str(cache.parent))
    code = ("import sys; from cli.main import main; rc = main(['plan', '--model', 'protein-tiny', '--machine', "
            "'dgx-h100', '--nodes', '1', '--no-write', '--json']); print('networkx' in sys.modules, file=sys.stderr)")
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert [r.stderr.strip().splitlines()[-1] for r in runs] == ["True", "False"], [r.stderr[-500:] for r in runs]
