"""Check an exported ds_config.json with DeepSpeed's own code (0.19.8): the file is parsed as
DeepSpeed parses a config path (hjson, duplicate keys refused), then built into
`deepspeed.runtime.config.DeepSpeedConfig` with an mpu whose data-parallel group has the plan's
size, after a one-rank gloo `deepspeed.init_distributed` (without it DeepSpeed's rank lookup
fails silently and the world becomes 1). DeepSpeedConfig asserts train_batch_size =
micro-batch x accumulation x data-parallel ranks, refuses unknown keys inside its pydantic
sections, both 16-bit modes at once, ZeRO stage 4; the batch split is also re-derived by
DeepSpeed from the file with one of the three left out. DeepSpeed ignores a top-level key it
never reads, and the keys of activation_checkpointing: both refused here, from what
DeepSpeedConfig itself looked up and its own list of checkpointing keys.

Importing this module imports nothing of DeepSpeed's; check() starts the process group once.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import socket
from dataclasses import dataclass

from export.base import Derived, Export, environment
from planner.schema.errors import PlanError
from planner.schema.plan import Plan

PINNED = "0.19.8"


def missing() -> str | None:
    """What is not installed (None when deepspeed 0.19.8 is)."""
    if importlib.util.find_spec("deepspeed") is None:
        return f"deepspeed=={PINNED}"
    version = importlib.metadata.version("deepspeed")
    return None if version == PINNED else f"deepspeed=={PINNED} (found {version})"


@dataclass(frozen=True)
class DeepSpeedDerived:
    """What DeepSpeed's config code makes of a ds_config for a data-parallel group of `dp`."""

    dp: int  # the data-parallel world DeepSpeedConfig divided the batch by
    train_batch_size: int
    micro_batch: int
    accumulation: int
    zero_stage: int
    bf16: bool
    fp16: bool
    communication_dtype: str  # what the engine communicates gradients in (fp32, bf16, fp16)
    derived_accumulation: int  # accumulation DeepSpeed computes from the batch, micro-batch and dp
    derived_micro_batch: int  # micro-batch it computes from the batch, accumulation and dp
    zero: dict  # the zero_optimization section as DeepSpeed resolved it (its field names)
    checkpointing: dict  # activation_checkpointing as DeepSpeed resolved it


class _Mpu:
    """The model-parallel unit DeepSpeedConfig asks for the data-parallel world size."""

    def __init__(self, dp: int, mp: int):
        self.dp, self.mp = dp, mp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return self.mp

    def get_model_parallel_rank(self) -> int:
        return 0


class _Read(dict):
    """A config dict that records which top-level keys DeepSpeed's code looked up."""

    def __init__(self, data, seen: set | None = None):
        super().__init__(data)
        self.seen = set() if seen is None else seen

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)

    def keys(self):
        return _ReadKeys(self)

    def __copy__(self):
        return _Read(self, self.seen)


class _ReadKeys:
    def __init__(self, owner: _Read):
        self.owner = owner

    def __contains__(self, key):
        return key in self.owner

    def __iter__(self):
        return iter(dict.keys(self.owner))

    def __len__(self):
        return len(self.owner)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start() -> None:
    """deepspeed.init_distributed over gloo with a one-rank world, where no process group is up
    (once per process, or again after someone destroyed it: DeepSpeed asks torch.distributed);
    the launch variables are set only while it starts."""
    import deepspeed
    import deepspeed.comm as dist

    if not dist.is_initialized():
        rendezvous = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        with environment(rendezvous):
            deepspeed.init_distributed("gloo", auto_mpi_discovery=False, verbose=False)


def parse(text: str) -> dict:
    """ds_config.json as DeepSpeedConfig reads a config file (hjson, duplicate keys refused)."""
    import hjson
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys

    try:
        return hjson.loads(text, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    except ValueError as e:
        raise PlanError(f"DeepSpeed cannot read ds_config.json: {e}", field="ds_config.json") from None


def _config(config: dict, dp: int, mp: int):
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError

    read = _Read(config)
    try:
        cfg = DeepSpeedConfig(read, mpu=_Mpu(dp, mp))
    except (AssertionError, ValueError, DeepSpeedConfigError, NotImplementedError, TypeError) as e:
        raise PlanError(f"DeepSpeed {PINNED} refuses the config: {' '.join(str(e).split())}",
                        field="ds_config.json") from None
    return cfg, read.seen


def check_config(config: dict, dp: int, mp: int = 1) -> DeepSpeedDerived:
    """What DeepSpeed's own config code derives from `config` for `dp` data-parallel ranks (mp:
    the model-parallel size its mpu reports). PlanError where it refuses the config, and for a
    top-level key it never reads or a checkpointing key it does not know."""
    start()
    import torch
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT, ACT_CHKPT_DEFAULT
    from deepspeed.runtime.engine import DeepSpeedEngine

    cfg, seen = _config(config, dp, mp)
    unread = sorted(set(config) - seen)
    if unread:
        raise PlanError(f"DeepSpeed {PINNED} never reads the top-level key(s) {', '.join(unread)} (it ignores them "
                        f"silently)", field="ds_config.json")
    unknown = sorted(set(config.get(ACT_CHKPT, {})) - set(ACT_CHKPT_DEFAULT))
    if unknown:
        raise PlanError(f"DeepSpeed's activation checkpointing has no {', '.join(unknown)} (it ignores them silently)",
                        field="ds_config.json")
    # The engine's own rule for the gradients' communication dtype (engine.py), on the config.
    engine = object.__new__(DeepSpeedEngine)
    object.__setattr__(engine, "_config", cfg)
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[engine.communication_data_type]
    # DeepSpeed's derivation of the split, each of accumulation and micro-batch left out in turn.
    rest = {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}
    derived_accumulation = _config(rest, dp, mp)[0].gradient_accumulation_steps
    rest = {k: v for k, v in config.items() if k != "train_micro_batch_size_per_gpu"}
    derived_micro = _config(rest, dp, mp)[0].train_micro_batch_size_per_gpu
    ac = cfg.activation_checkpointing_config
    return DeepSpeedDerived(
        dp=int(cfg.world_size), train_batch_size=cfg.train_batch_size, micro_batch=cfg.train_micro_batch_size_per_gpu,
        accumulation=cfg.gradient_accumulation_steps, zero_stage=int(cfg.zero_optimization_stage),
        bf16=bool(cfg.bfloat16_config.enabled), fp16=bool(cfg.float16_config.enabled), communication_dtype=dtype,
        derived_accumulation=derived_accumulation, derived_micro_batch=derived_micro,
        zero=cfg.zero_config.model_dump(), checkpointing={k: getattr(ac, k) for k in ACT_CHKPT_DEFAULT})


def check(exported: Export, plan: Plan) -> Derived:
    """The degrees and batch split DeepSpeed derives from the deepspeed target's ds_config.json:
    every rank data-parallel (no model parallelism without model code: the engine's data-parallel
    group is the world), the split as DeepSpeedConfig computes it for the plan's world."""
    config = parse(exported.files["ds_config.json"])
    d = check_config(config, dp=plan.world_size)
    if (d.derived_accumulation, d.derived_micro_batch) != (d.accumulation, d.micro_batch):
        raise PlanError(f"DeepSpeed derives accumulation {d.derived_accumulation} and micro-batch "
                        f"{d.derived_micro_batch} from the batch, the file says {d.accumulation} and {d.micro_batch}",
                        field="ds_config.json")
    return Derived(tp=1, pp=1, vpp=1, cp=1, dp=d.dp, micro_batch=d.micro_batch, accumulation=d.accumulation,
                   global_batch=d.train_batch_size)
