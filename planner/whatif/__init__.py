"""What-if capacity planning (`exaplan whatif`): sweep models x machines x node counts x any
varied field, the best layout at each point from the full search, with intervals, node-hours
and energy; the fewest nodes and the cheapest point for a deadline, the fastest machine, the
knee of each scaling curve, and a warning when the global batch passes a critical-batch
estimate. Pure Python + numpy (no plotting: report/ draws the plots and the HTML report)."""

from planner.whatif.engine import run_whatif
from planner.whatif.types import WhatifPoint, WhatifResult

__all__ = ["WhatifPoint", "WhatifResult", "run_whatif"]
