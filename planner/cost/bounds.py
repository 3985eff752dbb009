"""Bounds the search prunes by (planner.search.search._promising_rows): per row of a layout
space, a step time and a memory that no scoring of the row can go below, computed from the
units' compute and the meshes' costs alone (no row-level work beyond two gathers).

Why they hold: a row's step is (m + (p - 1)/v) x (compute + cp + pp + tp per micro-batch) + its
exposed data-parallel terms + the optimizer (step._Rows.step), every term >= 0; each exposed F,
K and S term is paid at least once and is at least max(traffic x (1 - overlap.dp), floor)
(step._interfered). Its memory is the model states + gradients + activations + reserve
(step._row_memory), the parameters less at most their autocast copies.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.cost.dp import mesh_costs
from planner.cost.layout import Layouts, Space
from planner.cost.step import GIB, ddp_buckets, micro_batch_compute, offered_algorithms
from planner.cost.topology import link_tiers
from planner.schema.figures import framework_machine
from planner.schema.specs import MachineModel, ModelSpec, TrainingJob


def _unit_step_bound(model: ModelSpec, machine: MachineModel, job: TrainingJob, units: Layouts) -> np.ndarray:
    """Per unit (on the framework's machine), a step time no row of it can beat: its
    micro-batches' compute with the pipeline's fill and drain, (m + (p - 1)/v) x compute per
    micro-batch. Every other term of a row's step (tp, cp and pp traffic, the exposed
    data-parallel traffic, the optimizer) only adds to it (_Rows.step)."""
    u = replace(units, mbs=units.mbs * job.sequences_per_sample) if job.sequences_per_sample > 1 else units
    compute_mb, _ = micro_batch_compute(model, machine, job, u)
    return (units.gas + (units.pp - 1) / units.vpp) * compute_mb


def row_bounds(model: ModelSpec, machine: MachineModel, job: TrainingJob, space: Space) -> tuple[np.ndarray, np.ndarray]:
    """Per row of `space`: a step time it cannot beat (its unit's _unit_step_bound, plus its
    mesh's optimizer step and the least exposure of its data-parallel terms: each F, K and S
    term is paid at least once and exposes at least its floor and the share 1 - overlap.dp of
    its traffic, under any algorithm), and a bound its memory cannot go below (its mesh's model states, less the autocast copies, plus the machine's reserve: the
    activations, gradients and fragmentation only add to it). Cheap: no row-level work beyond
    two gathers, no tensor-parallel traffic."""
    machine = framework_machine(machine, job.framework)
    tiers, algos = link_tiers(machine), offered_algorithms(machine)
    M = mesh_costs(model, machine, job, space.meshes, tiers, algos, ddp_buckets(model, job, None))
    hidden = 1.0 - machine.overlap.dp  # _interfered exposes at least this share of any traffic

    def exposed(total, floor):
        return np.maximum(total * hidden, floor)

    dp = np.minimum.reduce([exposed(M.F_total[r], M.F_floor[r]) + exposed(M.K_total[r], M.K_floor[r]) for r in M.F_floor])
    s = np.minimum.reduce([exposed(t, f) for a in M.S_total for t, f in zip(M.S_total[a], M.S_floor[a])])
    mesh_step = M.optimizer_s + dp + s
    mesh_memory = (M.parameters - M.autocast_copies + M.optimizer + M.buffers + M.reference
                   + machine.memory_reserve_gib * GIB)
    return (_unit_step_bound(model, machine, job, space.units)[space.unit] + mesh_step[space.mesh],
            mesh_memory[space.mesh])
