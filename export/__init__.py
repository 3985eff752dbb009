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

from export.targets import TARGETS

__all__ = ["TARGETS", "Derived", "Export", "export_plan", "target_profile", "write_export"]


def __getattr__(name: str):
    """The rest (the plan schema, pydantic) imported on first use, not by `exaplan --help`,
    which only names the targets."""
    if name in ("Derived", "Export", "write_export"):
        from export import base

        return getattr(base, name)
    if name in ("export_plan", "target_profile"):
        from export import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
