"""Input specs: the model (application), the machine (system) and the training job.

Three inputs kept apart, as in Calculon: cost is a pure function of (model, machine, job,
layout). Every figure carries its unit in its name; every model forbids unknown fields.

This module gathers them, so that one import line reaches every spec; each lives in a file
of its own:

- bounds.py: the physical bounds of every figure, the field types built on them, `Spec`;
- model_spec.py: the model (ModelSpec);
- machine.py: the machine (MachineModel), its precisions, collective library and algorithms,
  topology, efficiency and overlap figures, power;
- framework.py: the layout choices (Sharding, Recompute, Schedule) and the training framework
  (FrameworkProfile);
- job.py: the training job (TrainingJob), its workload and DPO reference;
- integers.py: powers of two and divisors.
"""

from __future__ import annotations

from planner.schema.bounds import (MAX_BATCH, MAX_COUNT, MAX_NAME, MAX_NODES, MAX_RATE, MAX_SEQ_LEN, MAX_SIZE_GIB, MAX_TEXT,
                                   MAX_TIME, MAX_TOKENS, MAX_WIDTH, Count, Efficiency, Fraction, Name, PosFloat, PosInt,
                                   PosTime, Rate, Spec, Text, Time, Width)
from planner.schema.framework import FrameworkProfile, Recompute, Schedule, Sharding
from planner.schema.integers import divisors, is_power_of_two
from planner.schema.job import Reference, TrainingJob, Workload, precision_message
from planner.schema.machine import (ALGORITHM_ORDER, RENAMED_MACHINE_FIELDS, Algorithm, CollectiveEfficiency,
                                    CollectiveLibrary, MachineModel, MachinePower, MatmulEfficiency, Overlap, Precision,
                                    TopologyKind, bytes_per_element)
from planner.schema.model_spec import ModelSpec

__all__ = [
    "ALGORITHM_ORDER", "MAX_BATCH", "MAX_COUNT", "MAX_NAME", "MAX_NODES", "MAX_RATE", "MAX_SEQ_LEN", "MAX_SIZE_GIB",
    "MAX_TEXT", "MAX_TIME", "MAX_TOKENS", "MAX_WIDTH", "RENAMED_MACHINE_FIELDS", "Algorithm", "CollectiveEfficiency",
    "CollectiveLibrary", "Count", "Efficiency", "Fraction", "FrameworkProfile", "MachineModel", "MachinePower",
    "MatmulEfficiency", "ModelSpec", "Name", "Overlap", "PosFloat", "PosInt", "PosTime", "Precision", "Rate", "Recompute",
    "Reference", "Schedule", "Sharding", "Spec", "Text", "Time", "TopologyKind", "TrainingJob", "Width", "Workload",
    "bytes_per_element", "divisors", "is_power_of_two", "precision_message",
]
