"""Training-framework profiles (frameworks.yaml): `load_framework("megatron")`."""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from pydantic import ValidationError

from planner.schema.errors import PlanError, format_validation_error
from planner.schema.files import load_yaml, read_text
from planner.schema.figures import FIGURES
from planner.schema.specs import FrameworkProfile

FRAMEWORKS_FILE = Path(__file__).resolve().parent / "frameworks.yaml"
DEFAULT_FRAMEWORK = "exaplan"


def _profiles(path: Path = FRAMEWORKS_FILE) -> dict[str, dict]:
    """The file's profiles as parsed, shared: not to be changed. The file is read every time,
    parsed once per content: the published-run fit asks for a profile thousands of times, and
    parsing the YAML each time was 88% of its time (deep-copying every profile, 15%)."""
    text = read_text(path, "the framework profiles")  # a device, a FIFO, binary or huge: refused
    data = _parse(text, str(path))
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise PlanError("expected a mapping of framework name -> fields", field=str(path))
    return data


@functools.lru_cache(maxsize=8)
def _parse(text: str, field: str):
    return load_yaml(text, field)  # nesting bounded; errors name the file


def _fields(name: str, profiles: dict[str, dict]) -> dict:
    """A profile's fields: those of the profile it names as `base` (and so on), its own replacing them."""
    chain = [name]
    while "base" in profiles[chain[-1]]:
        base = profiles[chain[-1]]["base"]
        if base not in profiles or base in chain:
            why = "not a profile" if base not in profiles else "a cycle"
            raise PlanError(f"{chain[-1]}.base: {base!r} is {why}; known: {', '.join(profiles)}", field=str(FRAMEWORKS_FILE))
        chain.append(base)
    fields: dict = {}
    for link in reversed(chain):
        fields.update(profiles[link])
    fields.pop("base", None)
    return fields


def list_frameworks(path: Path = FRAMEWORKS_FILE) -> list[str]:
    """The profiles `load_framework` knows, in file order."""
    return list(_profiles(path))


def load_framework(name: str | None = None, path: Path = FRAMEWORKS_FILE, compiled: bool = False) -> FrameworkProfile:
    """A framework profile by name (default: exaplan's own runtime). An unknown name raises
    PlanError with the known ones and the closest match. `compiled` (--compile): the runtime's
    blocks through torch.compile, for a profile whose blocks otherwise run eager."""
    name = name or DEFAULT_FRAMEWORK
    profiles = _profiles(path)  # validation copies what it keeps
    if name not in profiles:
        near = difflib.get_close_matches(name, list(profiles), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise PlanError(f"unknown framework {name!r}{hint}; known: {', '.join(profiles)}", field="framework")
    try:
        profile = FrameworkProfile.model_validate({"name": name, **_fields(name, profiles)})
    except ValidationError as e:
        raise PlanError(format_validation_error(e, prefix=name), field=str(path)) from None
    unknown = sorted(set(profile.cpu_figures) - set(FIGURES))
    if unknown:
        raise PlanError(f"{name}.cpu_figures: unknown figure(s) {', '.join(unknown)}; known: {', '.join(FIGURES)}",
                        field=str(path))
    if compiled:
        if profile.eager_bytes_per_element is None:
            raise PlanError(f"applies to exaplan's torch runtime, whose blocks otherwise run eager; the {name} profile's "
                            f"kernels are fused already (use --framework exaplan, or drop --compile)", field="compile")
        profile = profile.model_copy(update={"compiled": True})
    return profile


def as_exaplan_runtime(plan):
    """The plan with exaplan's own framework profile in its job: what the planner predicts for
    the same layout run by exaplan's torch runtime (`exaplan check` steps a plan for another
    framework, or for the JAX backend, in that runtime)."""
    return plan.model_copy(update={"job": plan.job.model_copy(update={"framework": load_framework(
        "exaplan", compiled=plan.compile)})})
