"""exaplan planner: the schema (schema/), the analytical cost model (cost/), the layout search
(search/), plan emission (emit.py), reports (report.py), inputs and presets, capacity sweeps.

Pure Python + numpy/pydantic/networkx/OR-Tools: never imports torch, the runtime, the
calibration loop or the command line.
"""

__version__ = "0.1.0"
COST_MODEL_VERSION = "1"
