"""exaplan planner: specs, analytical cost model, layout search and plan files.

Pure Python + numpy/pydantic/networkx/OR-Tools. Never imports torch.
"""

__version__ = "0.1.0"
COST_MODEL_VERSION = "1"
