"""Machine models: YAML presets of real systems, and the local machine (detected or calibrated).

    from machine_models import load_machine, list_machines
    frontier = load_machine("frontier")
    mine = load_machine("my-cluster.yaml")
    here = load_machine("local", ranks=4)
"""

from machine_models.frameworks import FRAMEWORKS_FILE, list_frameworks, load_framework
from machine_models.loader import (
    DEVICE_KINDS_FILE,
    PRESET_DIR,
    detect_local_machine,
    list_machines,
    load_machine,
    load_machine_file,
)

__all__ = [
    "DEVICE_KINDS_FILE",
    "FRAMEWORKS_FILE",
    "PRESET_DIR",
    "detect_local_machine",
    "list_frameworks",
    "load_framework",
    "list_machines",
    "load_machine",
    "load_machine_file",
]
