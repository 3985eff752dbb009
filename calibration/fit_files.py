"""Writing a fit of the published runs (calibration/fit_published.py) into the files the
machine models are read from, and reading the framework figures back:

- machine_models/device_kinds.yaml: each fitted device kind's figures, the shipped
  framework's (exaplan's runtime: the torch FSDP rows) overlap.dp and step_overhead_s in
  every block, "# fit:" notes; a header line records the shipped framework's figures;
- machine_models/frameworks.yaml: the fitted overlap_dp and step_overhead_s of every other
  framework, in its profile;
- machine_models/uncertainty.yaml (with --loo): the leave-one-out errors per device kind and
  per framework, which bound the intervals of predictions.
Every line the refit does not own stays as it is.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

import numpy as np
import yaml

from calibration.fit_published import (FIT_COMMAND, FIT_MARK, FRAMEWORK_FIGURES, SHARES_FIGURES_WITH,
                                       SHIPPED_FRAMEWORK, Fit)
from calibration.published import PROFILE_OF
from machine_models.frameworks import FRAMEWORKS_FILE
from machine_models.loader import DEVICE_KINDS_FILE
from machine_models.uncertainty import UNCERTAINTY_FILE, conformal_bound

_FRAMEWORK_LINE = re.compile(r"^# fit: framework (\w+): (\{.*\})")


def framework_figures(kinds: Path = DEVICE_KINDS_FILE, frameworks: Path = FRAMEWORKS_FILE) -> dict[str, dict[str, float]]:
    """The fitted figures of every framework of the published rows (framework ->
    {overlap_dp, step_overhead_s}): the shipped one from the header of device_kinds.yaml,
    the others from their profiles in frameworks.yaml (where the profile has figures)."""
    out = {}
    for line in Path(kinds).read_text().splitlines():
        match = _FRAMEWORK_LINE.match(line)
        if match:
            figs = yaml.safe_load(match.group(2))
            out[match.group(1)] = {n: float(figs[n]) for n in FRAMEWORK_FIGURES}
    profiles = yaml.safe_load(Path(frameworks).read_text()) or {}
    for fw, profile in PROFILE_OF.items():
        figs = profiles.get(profile, {})
        if fw != SHIPPED_FRAMEWORK and all(figs.get(n) is not None for n in FRAMEWORK_FIGURES):
            out[fw] = {n: float(figs[n]) for n in FRAMEWORK_FIGURES}
    return out


def write_fit(fit: Fit, notes: dict[str, list[str]], path: Path = DEVICE_KINDS_FILE, date: str | None = None,
              frameworks: Path = FRAMEWORKS_FILE) -> None:
    """Write `fit` into `path` (device_kinds.yaml) and `frameworks`, keeping every line the
    refit does not own.

    device_kinds.yaml: the header gets the shipped framework's line ("# fit: framework NAME:
    {...}") and notes[""] (the summary of the fit); each fitted device kind's block (and the
    blocks of the kinds that share its figures) gets its figures and notes[device]; every
    block gets the shipped framework's overlap.dp and step_overhead_s. frameworks.yaml: every
    other fitted framework's profile gets its overlap_dp and step_overhead_s and a dated
    "# fit:" line. Notes become "# fit:" comment lines, the first one dated.
    """
    date = date or _dt.date.today().isoformat()
    text = Path(path).read_text()
    shipped = fit.framework[SHIPPED_FRAMEWORK]
    header = [f"framework {SHIPPED_FRAMEWORK}: {{overlap_dp: {shipped['overlap_dp']:.3f}, step_overhead_s: "
              f"{shipped['step_overhead_s']:.3f}}}  (shipped: in every block below; the other frameworks' in "
              "frameworks.yaml)"]
    text = _rewrite_header(text, header + [f"`{FIT_COMMAND}`, {date}:"] + list(notes.get("", [])))
    for device in _kinds_in(text):
        source = SHARES_FIGURES_WITH.get(device, device)
        if source in fit.device:
            note = [] if source == device else [f"copied from {source} (same GPU, no published rows of its own)."]
            note += [f"`{FIT_COMMAND}`, {date}:"] + list(notes.get(source, []))
            text = _rewrite_block(text, device, {**fit.device[source], **shipped}, note)
        else:
            note = [f"`{FIT_COMMAND}`, {date}: overlap.dp and step_overhead_s are the {SHIPPED_FRAMEWORK}",
                    "framework's (see the header); the other figures are first guesses (no published rows)."]
            text = _rewrite_block(text, device, shipped, note)
    Path(path).write_text(text)
    profiles = Path(frameworks).read_text()
    for fw, figs in sorted(fit.framework.items()):
        if fw != SHIPPED_FRAMEWORK:
            held = [n for g, n in fit.held if g == fw]
            note = f"`{FIT_COMMAND}`, {date}" + (
                f"; held at the first guess, which its rows cannot see (IDENTIFIABLE): {', '.join(held)}" if held else "")
            profiles = _rewrite_profile(profiles, PROFILE_OF[fw], figs, note)
    Path(frameworks).write_text(profiles)


def _rewrite_profile(text: str, profile: str, figs: dict[str, float], note: str) -> str:
    """Set overlap_dp and step_overhead_s (and the "# fit:" line) of one profile's block."""
    lines = text.splitlines()
    try:
        start = lines.index(f"{profile}:")
    except ValueError:
        return text
    end = start + 1
    while end < len(lines) and (not lines[end] or lines[end].startswith((" ", "#"))):
        end += 1
    block = [ln for ln in lines[start + 1:end] if not ln.strip().startswith(FIT_MARK)]
    out = [f"  {FIT_MARK} {note}"]
    for ln in block:
        key = ln.strip().split(":", 1)[0]
        if key in FRAMEWORK_FIGURES:
            ln = f"  {key}: {figs[key]:.3f}"
        out.append(ln)
    lines[start + 1:end] = out
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def _kinds_in(text: str) -> list[str]:
    return [ln[:-1] for ln in text.splitlines() if ln.endswith(":") and not ln.startswith((" ", "#"))]


def _rewrite_header(text: str, note: list[str]) -> str:
    """Replace the "# fit:" lines of the header (the comments before the first block) by
    `note`, placed at the end of the header."""
    lines = text.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    header = [ln for ln in lines[:first] if not ln.startswith(FIT_MARK)]
    while header and not header[-1].strip():
        header.pop()
    out = header + [""] + [f"{FIT_MARK} {line}" for line in note] + [""] + lines[first:]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _rewrite_block(text: str, device: str, figs: dict[str, float], note: list[str]) -> str:
    """Replace the fitted lines of one device kind's block (those of `figs`) and its
    "# fit:" comment lines; a step_overhead_s line is added after `overlap` if missing."""
    lines = text.splitlines()
    try:
        start = lines.index(f"{device}:")
    except ValueError:
        return text  # the kind is not in the file: nothing to update
    end = start + 1
    while end < len(lines) and (not lines[end] or lines[end].startswith((" ", "#"))):
        end += 1
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1  # comments after the block belong to the next one
    block = [ln for ln in lines[start + 1:end] if not ln.strip().startswith(FIT_MARK)]
    values = {}
    if "peak_fraction" in figs:
        values["matmul_efficiency"] = f"{{peak_fraction: {figs['peak_fraction']:.3f}, half_dim: {figs['half_dim']:.1f}}}"
    if "attention_efficiency_factor" in figs:
        values["attention_efficiency_factor"] = f"{figs['attention_efficiency_factor']:.3f}"
    if "elementwise_efficiency" in figs:
        values["elementwise_efficiency"] = f"{figs['elementwise_efficiency']:.3f}"
    if "step_overhead_s" in figs:
        values["step_overhead_s"] = f"{figs['step_overhead_s']:.3f}"
    out, has_overhead = [], False
    for ln in block:
        # Only the block's own keys (two spaces in): a nested block (runtime_kernels) may
        # reuse a figure's name for its own measured value.
        key = ln.strip().split(":", 1)[0] if not ln.startswith("   ") else None
        if ln.strip().startswith("#"):
            out.append(ln)
            continue
        if key in values:
            ln = f"  {key}: {values[key]}"
            has_overhead |= key == "step_overhead_s"
        elif key == "overlap" and "overlap_dp" in figs:
            ln = re.sub(r"dp: [0-9.]+", f"dp: {figs['overlap_dp']:.3f}", ln)
        out.append(ln)
    if "step_overhead_s" in values and not has_overhead:
        at = next((i + 1 for i, ln in enumerate(out) if ln.strip().startswith("overlap:")), len(out))
        out.insert(at, f"  step_overhead_s: {values['step_overhead_s']}")
    out[:0] = [f"  {FIT_MARK} {line}" for line in note]
    return "\n".join(lines[:start + 1] + out + lines[end:]) + ("\n" if text.endswith("\n") else "")


def write_uncertainty(errors: list[tuple[str, str, float]], path: Path = UNCERTAINTY_FILE,
                      date: str | None = None, held: dict[str, list[str]] | None = None,
                      held_out: list[tuple[str, str, float]] = ()) -> None:
    """machine_models/uncertainty.yaml from the leave-one-out errors of a refit: per device
    kind and per framework profile, the rows, the median, the 80% conformal bound (p80:
    machine_models.uncertainty.conformal_bound) and the max of
    |error|. `errors`: (device kind, framework profile, signed leave-one-out error) per row;
    `held`: profile -> the figures its rows could not fit (Fit.held), listed under it;
    `held_out`: (device kind, profile, signed error) of held-out rows (never fitted: out of
    sample as the leave-one-out errors are), pooled with them: into their profile, and into
    their device kind where that kind has leave-one-out rows (a kind that copies another's
    figures keeps its stated default); counted as held_out_rows. They may widen a p80, never
    narrow it (stats)."""
    date = date or _dt.date.today().isoformat()

    def stats(values: list[float], extra: int) -> dict:
        """The pooled rows' figures; the p80 never below the leave-one-out rows' own (the first
        len - extra): the held-out runs are single-GPU steps with no communication, which can
        show the model worse than the fitted rows say, not better for the multi-node layouts
        most plans are."""
        a = np.abs(np.asarray(values, dtype=float))
        p80 = conformal_bound(a)
        if extra and len(a) > extra:
            p80 = max(p80, conformal_bound(a[:len(a) - extra]))
        return {"rows": int(len(a)), **({"held_out_rows": extra} if extra else {}), "median": round(float(np.median(a)), 4),
                "p80": round(p80, 4), "max": round(float(a.max()), 4)}

    by_device: dict[str, list[float]] = {}
    by_framework: dict[str, list[float]] = {}
    for device, profile, err in errors:
        by_device.setdefault(device, []).append(err)
        by_framework.setdefault(profile, []).append(err)
    extra_device: dict[str, int] = {}
    extra_framework: dict[str, int] = {}
    for device, profile, err in held_out:
        if device in by_device:
            by_device[device].append(err)
            extra_device[device] = extra_device.get(device, 0) + 1
        by_framework.setdefault(profile, []).append(err)
        extra_framework[profile] = extra_framework.get(profile, 0) + 1
    body = {"device_kinds": {k: stats(v, extra_device.get(k, 0)) for k, v in sorted(by_device.items())},
            "frameworks": {k: {**stats(v, extra_framework.get(k, 0)), **({"held": list(held[k])} if (held or {}).get(k) else {})}
                           for k, v in sorted(by_framework.items())}}
    header = (f"# Leave-one-out |error| of the published-run fit, written by `{FIT_COMMAND} --loo`, {date},\n"
              "# with the held-out errors of exaplan's own runs on GPUs (section M, held_out_rows) pooled in.\n"
              "# p80: the 80% conformal bound of |error| (machine_models/uncertainty.py conformal_bound).\n"
              "# Read by machine_models/uncertainty.py: the p80 of a device kind and of a framework bound\n"
              "# the intervals of every prediction on that kind with that framework.\n")
    Path(path).write_text(header + yaml.safe_dump(body, sort_keys=False))
