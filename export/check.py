"""Validate exported files with the framework's own config code (`exaplan export --check`, the
tests of tests/export/): each target's check_* module loads what it wrote through the
framework's own parser and config classes and returns the degrees and batch split the
framework derives, which must equal the plan's (export.base.Derived). The frameworks are the
`frameworks` extra of pyproject.toml, at the pinned versions of docs/frameworks/."""

from __future__ import annotations

import importlib

from planner.schema.errors import PlanError

CHECKS = {
    "megatron": "export.check_megatron",
    "megatron-deepspeed": "export.check_megatron",
    "deepspeed": "export.check_deepspeed",
    "torchtitan": "export.check_torchtitan",
    "maxtext": "export.check_maxtext",
}


def check_export(exported, plan):
    """The Derived the framework computes from `exported`'s files (PlanError where the framework
    refuses them, or is not installed)."""
    module = importlib.import_module(CHECKS[exported.target])
    missing = module.missing()
    if missing:
        raise PlanError(f"{exported.target}'s own code is not installed here ({missing}); install the frameworks "
                        f"extra: pip install -e '.[frameworks]' (docs/frameworks/)", field="check")
    return module.check(exported, plan)
