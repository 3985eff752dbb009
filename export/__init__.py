"""Plans in the field's frameworks' own terms: `exaplan export PLAN --to TARGET -o DIR`.

A plan file is the one contract between the planner and what executes it; this package turns
one into what each framework reads (arguments files, ds_config.json, command-line overrides,
YAML), at the pinned versions of docs/frameworks/. Like the runtimes it takes only the schema
from planner/ (and the framework profiles, as data, from machine_models/).

Each target module has `export(plan) -> Export`. What a framework cannot express (a schedule,
sharding or recompute it lacks) is refused with a PlanError naming the plan's field: never
dropped or approximated. `export.check` runs the framework's own config code on the files, where
that framework is installed (the `frameworks` extra).
"""

from __future__ import annotations

from export.base import Derived, Export, write_export
from export.registry import TARGETS, export_plan, target_profile

__all__ = ["TARGETS", "Derived", "Export", "export_plan", "target_profile", "write_export"]
