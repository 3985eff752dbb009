"""Reading what-if options: node ranges, --vary values, names and positive finite numbers.
Every bad value raises PlanError naming the option (the CLI prints it and exits 2)."""

from __future__ import annotations

import difflib
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.schema.errors import PlanError, check_name_or_path
from planner.schema.limits import MAX_NODES  # plain numbers: `exaplan --help` names these limits


def positive_finite(value: float | None, option: str) -> float | None:
    """`value` if None or a finite number > 0 (1e400 reads as inf, so it is refused too)."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PlanError(f"expected a number, got {value!r}", field=option) from None
    if not math.isfinite(v) or v <= 0:
        raise PlanError(f"must be a finite positive number, got {value!r}", field=option)
    return v


def positive_int(value: int | None, option: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlanError(f"must be a positive whole number, got {value!r}", field=option)
    return value


MAX_NODE_COUNTS = 256  # node counts in one sweep
MAX_VARY_VALUES = 32  # values of one --vary
# Points (models x machines x varied combinations x node counts) in one what-if: each is a full
# layout search of 0.05-0.5 s, so 256 take about a minute on 2 cores.
MAX_POINTS = 256


def parse_nodes(spec: str | list[int]) -> list[int]:
    """'LO:HI' -> LO, 2 LO, 4 LO, ... up to HI; '64,128,300' -> that list (sorted, unique);
    each at most MAX_NODES (the schema's bound on a system), at most MAX_NODE_COUNTS of them."""
    counts = _parse_nodes(spec)
    if counts[-1] > MAX_NODES:
        raise PlanError(f"{counts[-1]} nodes: at most {MAX_NODES:,} (the largest system a machine file may describe)",
                        field="nodes")
    if len(counts) > MAX_NODE_COUNTS:
        raise PlanError(f"{len(counts)} node counts: at most {MAX_NODE_COUNTS} in one sweep", field="nodes")
    return counts


def _parse_nodes(spec: str | list[int]) -> list[int]:
    if isinstance(spec, (list, tuple)):
        counts = [positive_int(n, "nodes") for n in spec]
        if not counts:
            raise PlanError("no node counts given", field="nodes")
        return sorted(set(counts))
    text = str(spec).strip()
    if ":" in text:
        lo_hi = text.split(":")
        if len(lo_hi) != 2:
            raise PlanError(f"expected LO:HI (powers of two from LO to HI) or a list, got {text!r}", field="nodes")
        lo, hi = (_int(x, text) for x in lo_hi)
        if lo <= 0:
            raise PlanError(f"LO must be at least 1, got {text!r}", field="nodes")
        if hi < lo:
            raise PlanError(f"empty range: HI is below LO in {text!r}", field="nodes")
        counts, n = [], lo
        while n <= hi:
            counts.append(n)
            n *= 2
        return counts
    counts = [_int(x, text) for x in text.split(",") if x.strip()]
    if not counts:
        raise PlanError(f"no node counts in {text!r}", field="nodes")
    if min(counts) <= 0:
        raise PlanError(f"node counts must be at least 1, got {text!r}", field="nodes")
    return sorted(set(counts))


def _int(text: str, whole: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise PlanError(f"expected whole numbers (LO:HI or a comma-separated list), got {whole!r}",
                        field="nodes") from None


@dataclass(frozen=True)
class Vary:
    """One --vary: a dotted field path and its values, each absolute or a multiplier."""

    field: str  # "machine.nic_gbit_s"
    labels: tuple[str, ...]  # as given: "x2", "400"
    values: tuple[Any, ...]  # absolute values; a multiplier as ("x", factor)

    def value_for(self, label: str, base: Any) -> Any:
        v = self.values[self.labels.index(label)]
        if isinstance(v, tuple):
            if isinstance(base, bool) or not isinstance(base, (int, float)):
                raise PlanError(f"a multiplier needs a numeric field; {self.field} is {base!r}", field="vary")
            out = base * v[1]
            return int(round(out)) if isinstance(base, int) else out
        return v


def parse_vary(text: str) -> Vary:
    """'machine.nic_gbit_s=x0.5,x2' or 'model.layers=16,32'."""
    if "=" not in text:
        raise PlanError(f"expected FIELD=v1,v2 or FIELD=x0.5,x2, got {text!r}", field="vary")
    key, raw = (s.strip() for s in text.split("=", 1))
    if key.partition(".")[0] not in ("model", "machine") or not key.partition(".")[2]:
        raise PlanError(f"the field is a dotted path starting model. or machine., got {key!r}{_prefixed(key)}",
                        field="vary")
    labels = [s.strip() for s in raw.split(",")]
    if not raw.strip() or any(not s for s in labels):
        raise PlanError(f"no values (or an empty one) in {text!r}", field="vary")
    if len(labels) > MAX_VARY_VALUES:
        raise PlanError(f"{len(labels):,} values of {key}: at most {MAX_VARY_VALUES} per --vary (each value is a whole "
                        f"scaling curve); give fewer, e.g. a few multipliers such as x0.5,x1,x2", field="vary")
    if len(set(labels)) != len(labels):
        raise PlanError(f"a value is repeated in {text!r}", field="vary")
    return Vary(key, tuple(labels), tuple(_vary_value(s, text) for s in labels))


def _prefixed(key: str) -> str:
    """' (did you mean 'machine.nic_gbit_s'?)' where `key` names a field of a spec without its prefix."""
    from planner.schema.specs import MachineModel, ModelSpec

    head = key.partition(".")[0]
    for prefix, spec in (("machine", MachineModel), ("model", ModelSpec)):
        if head in spec.model_fields:
            return f" (did you mean '{prefix}.{key}'?)"
    return ""


def _vary_value(label: str, whole: str):
    if label[0] in "x*" and len(label) > 1:
        try:
            factor = float(label[1:])
        except ValueError:
            raise PlanError(f"multiplier {label!r} is not a number (in {whole!r})", field="vary") from None
        if not math.isfinite(factor) or factor <= 0:
            raise PlanError(f"multiplier {label!r} must be finite and positive (in {whole!r})", field="vary")
        return ("x", factor)
    from planner.inputs import yaml_value  # the schema, imported once a sweep is parsed

    value = yaml_value(label, "vary")
    try:
        as_float = float(value) if isinstance(value, (str, float)) else 0.0
    except ValueError:
        as_float = 0.0
    if not math.isfinite(as_float):  # 'inf', 'nan', '.inf', 1e400
        raise PlanError(f"value {label!r} is not finite (in {whole!r})", field="vary")
    return value


def check_points(models: int, machines: int, varies: list[Vary], counts: int) -> int:
    """The points of a sweep (models x machines x varied combinations x node counts), before
    any is searched; PlanError saying the cap and how to narrow it past MAX_POINTS."""
    combos = math.prod(len(v.labels) for v in varies)
    points = models * machines * combos * counts
    if points > MAX_POINTS:
        parts = [f"{models} models"] if models > 1 else []
        parts += [f"{machines} machines"] if machines > 1 else []
        parts += [f"{len(v.labels)} values of {v.field}" for v in varies]
        parts += [f"{counts} node counts"]
        raise PlanError(f"{points:,} points ({' x '.join(parts)}): at most {MAX_POINTS} in one what-if (each point "
                        f"is a full layout search, about a minute for {MAX_POINTS}); narrow it: fewer --vary values, "
                        "fewer node counts (a shorter LO:HI or a list), fewer models or machines, or split it into "
                        "several runs", field="vary" if varies else "nodes")
    return points


def combinations(varies: list[Vary]) -> list[dict[str, str]]:
    """Every combination of the varied values ({} once without --vary)."""
    fields = [v.field for v in varies]
    if len(set(fields)) != len(fields):
        raise PlanError("the same field is varied twice", field="vary")
    return [dict(zip(fields, combo)) for combo in itertools.product(*(v.labels for v in varies))]


def check_name(name: str, known: list[str], what: str) -> str:
    """A preset name, or a path to an existing YAML file; else PlanError with a did-you-mean
    (a name too long for a file name, or with a control character, is refused as such)."""
    check_name_or_path(name, what)
    if name in known or _is_file(name):
        return name
    near = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise PlanError(f"unknown {what} {name!r}{hint}; presets: {', '.join(known)} (or a path to a YAML file)",
                    field=what)


def _is_file(name: str) -> bool:
    try:
        return Path(name).is_file()
    except (OSError, ValueError):  # a component longer than the file system allows (ENAMETOOLONG)
        return False


def split_names(value: str | list[str], what: str) -> list[str]:
    names = [s.strip() for s in value.split(",")] if isinstance(value, str) else [str(s).strip() for s in value]
    if not names or any(not n for n in names):
        raise PlanError(f"expected a name or a comma-separated list, got {value!r}", field=what)
    return list(dict.fromkeys(names))
