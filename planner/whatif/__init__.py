"""What-if capacity planning (`exaplan whatif`): sweep models x machines x node counts x any
varied field, the best layout at each point from the full search, with intervals, node-hours
and energy; the fewest nodes and the cheapest point for a deadline, the fastest machine, the
knee of each scaling curve, and a warning when the global batch passes a critical-batch
estimate. Pure Python + numpy (no plotting: report/ draws the plots and the HTML report)."""


__all__ = ["WhatifPoint", "WhatifResult", "run_whatif"]


def __getattr__(name: str):
    """The engine (the search, numpy, networkx) imported on first use, not by `exaplan --help`,
    which only needs planner.whatif.parse's limits."""
    if name == "run_whatif":
        from planner.whatif.engine import run_whatif

        return run_whatif
    if name in ("WhatifPoint", "WhatifResult"):
        from planner.whatif import types

        return getattr(types, name)
    raise AttributeError(f"module 'planner.whatif' has no attribute {name!r}")
