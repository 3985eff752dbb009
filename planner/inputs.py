"""Reading the three inputs from the command line: presets or YAML files, and `--set` overrides."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner.schema.errors import PlanError, check_name_or_path, format_validation_error
from planner.schema.files import check_nesting, load_yaml_file
from planner.schema.framework import job_refusals
from planner.presets import MODEL_PRESETS, get_model
from planner.schema.specs import (
    RENAMED_MACHINE_FIELDS, FrameworkProfile, MachineModel, ModelSpec, Precision, TrainingJob, precision_message,
)


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name, or a ModelSpec YAML file."""
    check_name_or_path(name_or_path, "model")
    if name_or_path in MODEL_PRESETS:
        return get_model(name_or_path)
    path = Path(name_or_path)
    if not path.suffix and not _exists(path):
        return get_model(name_or_path)  # unknown preset: the error lists the presets
    return _load_yaml_spec(ModelSpec, path, "model")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name longer than the file system's limit for one component
        return False


def _load_yaml_spec(cls: type[BaseModel], path: Path, what: str):
    data = load_yaml_file(path, f"{what} file")  # a device, FIFO, binary, huge or deeply nested file: refused
    if not isinstance(data, dict):
        raise PlanError(f"expected a mapping of {what} fields", field=str(path))
    data.setdefault("name", path.stem)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise PlanError(format_validation_error(e), field=str(path)) from None


def parse_override(text: str) -> tuple[str, Any]:
    """'model.layers=96' -> ('model.layers', 96): the value is read as YAML (numbers, booleans,
    lists), so `--set machine.algorithms=[ring,tree]` works."""
    if "=" not in text:
        raise PlanError(f"--set takes FIELD=VALUE, got {text!r}", field="--set")
    key, raw = text.split("=", 1)
    key = key.strip()
    return key, yaml_value(raw, key) if raw.strip() else ""


def yaml_value(raw: str, field: str) -> Any:
    """A value given on the command line, read as YAML (the text itself where it is no YAML);
    PlanError naming `field` where it nests deeper than a file may (which would end in a
    RecursionError)."""
    try:
        check_nesting(raw, field)
    except PlanError as e:
        if "nested more than" in str(e):
            raise
        return raw  # malformed YAML: the text
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    except RecursionError:
        raise PlanError("nested too deeply", field=field) from None


def apply_overrides(spec: BaseModel, prefix: str, overrides: list[tuple[str, Any]]) -> BaseModel:
    """Return a copy of `spec` with every override under `prefix.` applied and re-validated."""
    data = spec.model_dump(mode="json")
    touched = False
    for key, value in overrides:
        head, _, rest = key.partition(".")
        if head != prefix:
            continue
        if not rest:
            raise PlanError(f"--set needs a field after '{prefix}.'", field=key)
        _set_path(data, rest.split("."), value, key, type(spec))
        touched = True
    if not touched:
        return spec
    try:
        return type(spec).model_validate(data)
    except ValidationError as e:
        raise PlanError(format_validation_error(e, prefix=prefix)) from None


def _set_path(data: dict, parts: list[str], value: Any, full_key: str, cls: type[BaseModel]) -> None:
    node = data
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            options = list(node) if isinstance(node, dict) else []
            if cls is MachineModel and i == 0 and part in RENAMED_MACHINE_FIELDS:
                raise PlanError(f"renamed to '{RENAMED_MACHINE_FIELDS[part]}'", field=full_key)
            near = difflib.get_close_matches(part, options, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else f"; fields: {', '.join(options)}" if options else ""
            raise PlanError(f"unknown field{hint}", field=full_key)
        if i == len(parts) - 1:
            node[part] = value
        else:
            node = node[part]


def check_overrides(overrides: list[tuple[str, Any]], allowed: tuple[str, ...]) -> None:
    for key, _ in overrides:
        if key.partition(".")[0] not in allowed:
            raise PlanError(f"--set fields start with one of {', '.join(p + '.' for p in allowed)}", field=key)


def default_precision(machine: MachineModel, framework: FrameworkProfile | None = None) -> Precision:
    """fp32 on CPU machines (gloo: the runtime trains CPU plans in fp32, as bf16 autocast is
    slow there even where bf16 matmuls are fast); elsewhere bf16 where the device runs it
    faster than fp32. Of the framework's precisions (its first when it trains in neither)."""
    if machine.collective_library.value == "gloo":
        best = Precision.fp32
    else:
        bf16 = machine.peak_tflops.get(Precision.bf16, 0.0)
        best = Precision.bf16 if bf16 > machine.peak_tflops[Precision.fp32] else Precision.fp32
    if framework is None or best in framework.precisions:
        return best
    return Precision.fp32 if Precision.fp32 in framework.precisions else framework.precisions[0]


def make_job(model: ModelSpec, machine: MachineModel, world: int, global_batch: int | None, seq_len: int | None,
             precision: str | None, token_budget: float | None, workload: str = "pretrain",
             reference: str = "in-step", framework: FrameworkProfile | None = None) -> TrainingJob:
    """The training job; defaults: 8 sequences per rank (the seed runs' micro-batch; dpo: 4
    pairs, the same 8 sequences), the model's sequence length, the machine's fastest
    precision, 1e9 tokens, exaplan's own runtime as the framework."""
    per_rank = 4 if workload == "dpo" else 8
    precision = precision or default_precision(machine, framework).value
    if framework is not None and precision in {p.value for p in Precision} and Precision(precision) not in framework.precisions:
        raise PlanError(precision_message(precision, framework), field="precision")
    problems = job_refusals(framework, workload, reference, machine.collective_library.value) if framework else []
    if problems:
        field, message = problems[0].split(": ", 1)
        raise PlanError(message, field=field.removeprefix("job."))
    data = {
        "global_batch": global_batch if global_batch is not None else per_rank * world,
        "reference": reference,
        "seq_len": seq_len if seq_len is not None else model.seq_len,
        "precision": precision,
        "workload": workload,
    }
    if token_budget is not None:
        data["token_budget"] = token_budget
    if framework is not None:
        data["framework"] = framework
    try:
        job = TrainingJob.model_validate(data)
    except ValidationError as e:
        raise PlanError(format_validation_error(e, prefix="job")) from None
    if model.position == "learned" and job.seq_len > model.seq_len:
        raise PlanError(f"{job.seq_len} exceeds the model's learned positions ({model.seq_len})", field="seq_len")
    return job
