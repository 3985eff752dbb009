"""Weak scaling of the seed paper's layout (MProt-DPO, SC24): pure data parallelism + ZeRO-1,
micro-batch 8, protein-3.5b at sequence 512, Megatron-DeepSpeed. Every seed system measured
near-linear scaling up to the size it reached, so the predicted throughput per device from 1/8
of that size to all of it must stay within 5% of flat, with one micro-batch per step and
with eight.

What the communication model owes to this (planner/cost/comm.py): a data-parallel ring that
spans several dragonfly groups crosses groups on g of its N hops, so the global taper binds
only when taper < g / N (never for a machine-wide ring); before, the whole ring paid it as
soon as it left one group (Leonardo fell to 0.61x between 180 and 187 nodes).
"""

from __future__ import annotations

import pytest

from machine_models import load_framework, load_machine
from planner.cost.layout import Layouts
from planner.cost.step import evaluate
from planner.inputs import make_job
from planner.presets import get_model
from planner.seed_runs import SEED_RUNS

FRACTIONS = (8, 4, 2, 1)  # 1/8, 1/4, 1/2, 1 of each seed run's size
TOLERANCE = 0.05

# Cases that the data-parallel terms of planner/cost/step.py (not the network model) keep from
# flat. With Megatron's ZeRO-1 bucket rule (max(40M, 1M x dp) parameters) one or two buckets
# hold the whole 3.5B model at the full size and the last, never hidden, is most of the
# reduce-scatter; with fixed buckets (DeepSpeed's reduce_bucket_size, 5e8) each of the seven
# buckets' ring reduce-scatter pays a latency that grows with the ranks it spans (n - 1 hops).
DP_TERMS = "step.py: ZeRO-1's exposed bucket / per-bucket ring latency grows with the data-parallel ranks"
NOT_YET_FLAT = {("alps", 1), ("frontier", 1), ("leonardo", 1), ("pdx", 1), ("aurora", 1), ("alps", 8), ("frontier", 8)}


def per_device_tflops(machine_name: str, nodes: int, gas: int) -> float:
    model = get_model("protein-3.5b")
    machine = load_machine(machine_name)
    world = nodes * machine.devices_per_node
    job = make_job(model, machine, world, 8 * gas * world, 512, None, None, framework=load_framework("deepspeed"))
    lay = Layouts.one(dp=world, mbs=8, gas=gas, sharding="zero1")
    return float(evaluate(model, machine, job, lay).model_tflops_per_device[0])


CASES = [
    pytest.param(run.machine, run.nodes, g, id=f"{run.machine}-G{g}",
                 marks=[pytest.mark.xfail(reason=DP_TERMS, strict=False)] if (run.machine, g) in NOT_YET_FLAT else [])
    for run in SEED_RUNS for g in (1, 8)
]


@pytest.mark.parametrize("machine_name,full_nodes,gas", CASES)
def test_per_device_throughput_stays_flat_from_an_eighth_to_the_full_size(machine_name, full_nodes, gas):
    sizes = [full_nodes // f for f in FRACTIONS]
    rates = [per_device_tflops(machine_name, n, gas) for n in sizes]
    ratios = [r / rates[0] for r in rates]
    table = ", ".join(f"{n} nodes {r:.1f} TFLOP/s ({q:.3f})" for n, r, q in zip(sizes, rates, ratios))
    assert all(abs(q - 1.0) <= TOLERANCE for q in ratios), f"{machine_name}, {gas} micro-batch(es): {table}"


def test_no_cliff_where_data_parallelism_leaves_one_dragonfly_group():
    """Leonardo's (assumed) groups hold 180 nodes: the data-parallel ring at 187 nodes spans
    two and crosses 2 of its 187 hops, far under the 0.5 taper."""
    inside, across = per_device_tflops("leonardo", 180, 1), per_device_tflops("leonardo", 187, 1)
    assert across / inside > 0.98, f"180 nodes {inside:.1f}, 187 nodes {across:.1f} TFLOP/s per device"


def test_the_network_gives_data_parallelism_the_same_bandwidth_at_every_size():
    """What the topology model owes to weak scaling: from an eighth of each seed run to all of
    it, a data-parallel communicator over every rank gets the same per-rank bandwidth from
    each algorithm (the taper binds only on the share of traffic crossing groups)."""
    from planner.cost import comm
    from planner.cost.topology import link_tiers

    for run in SEED_RUNS:
        machine = load_machine(run.machine)
        tiers = link_tiers(machine)
        pls = [comm.place((run.nodes // f) * machine.devices_per_node, 1, tiers) for f in FRACTIONS]
        for alg in (comm.AL_RING, comm.AL_TREE, comm.AL_RABENSEIFNER):
            betas = [float(pl.flat_beta(comm.crossing_share(alg, pl))) for pl in pls]
            assert betas == [betas[0]] * len(betas), (run.machine, comm.ALGORITHMS[alg], betas)
