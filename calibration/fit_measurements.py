"""Fit a machine model to the raw measurements of `exaplan calibrate` (calibration/measure.py).

    machine = fit(meas, base)                      # a calibrated copy of base; meas["fit"] = the fits
    write_calibration(machine, meas, path)         # path (YAML) + <stem>.measurements.json
    alpha_s, beta_Bps = fit_alpha_beta(sizes, times, n, "allreduce")

The figures, each from its own measurements:
  - matmul: the saturating curve of planner.schema.specs.MatmulEfficiency, achieved(d) = P * f * d /
    (d + half_dim), fitted to the (d, FLOP/s) points of the precision with the most shapes by
    least squares on the log (so that small and large GEMMs count alike). Throughput alone
    fixes P * f (the asymptote) and half_dim, not P and f apart: where the device has a
    nominal peak (a GPU whose base model carries its datasheet peak, or meas
    "nominal_peak_tflops") f = asymptote / nominal peak; on a CPU, whose "peak" is no spec
    sheet figure, f stays the base's and P = asymptote / f. Either way P * eff(d) reproduces
    the measured points, and the other precisions' peaks follow from the same curve.
  - memory_bandwidth_gbyte_s: the copy bandwidth per device (a CPU node's divided by its ranks).
  - alpha (latency) and beta (bandwidth) per collective: the ring formulas of
    planner/cost/comm.py fitted to the measured times in log space (relative errors, so 4 B
    and 256 MiB messages weigh alike), robustly (soft-L1) against the odd slow repeat. gloo
    has one algorithm, a ring, so the allreduce fit gives the machine's figures: from a
    single-node run the intra-node latency and bandwidth, from a multi-node run the inter-node
    latency and the node's injection bandwidth (beta x ranks per node). The bandwidth
    figures are divided by the model's network_efficiency (the NICs' by inter_node_efficiency
    where the machine sets one), since the cost model multiplies it back and the fit is
    already an achieved figure.

numpy and scipy only: no torch here.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from planner.schema.errors import PlanError
from planner.schema.specs import MachineModel, MatmulEfficiency, Precision, TopologyKind

KINDS = ("allreduce", "reduce_scatter", "all_gather", "p2p")
CALIBRATE_COMMAND = "exaplan calibrate"


# --------------------------------------------------------------------------------------------
# Alpha-beta fits
# --------------------------------------------------------------------------------------------


def ring_coefficients(n: int, kind: str) -> tuple[float, float]:
    """(messages, fraction of M on the wire) of planner/cost/comm.py's ring formulas:
    t = a * alpha + b * M / beta."""
    if kind == "p2p":
        return 1.0, 1.0
    if n < 2:
        raise PlanError(f"a {kind} needs at least 2 ranks, got {n}", field="n")
    if kind == "allreduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather"):
        return float(n - 1), (n - 1) / n
    raise PlanError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}", field="kind")


@dataclass
class AlphaBetaFit:
    kind: str
    n: int
    alpha_s: float
    beta_Bps: float
    rms_log_residual: float  # root mean square of log(model / measured)
    residuals: list[float] = field(default_factory=list)  # log(model / measured) per size

    @property
    def alpha_us(self) -> float:
        return self.alpha_s * 1e6

    @property
    def beta_gbyte_s(self) -> float:
        return self.beta_Bps / 1e9


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float], n: int, kind: str) -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) of the ring formula for `kind` fitted to times(sizes)."""
    f = fit_alpha_beta_detail(sizes, times, n, kind)
    return f.alpha_s, f.beta_Bps


def fit_alpha_beta_detail(sizes: Sequence[float], times: Sequence[float], n: int, kind: str) -> AlphaBetaFit:
    """The fit with its residuals. Two steps: a non-negative least squares on relative errors
    for a start, then least squares of log(model) - log(measured) in log-parameters (alpha and
    beta stay positive), with a soft-L1 loss so that one slow repeat does not drag the line."""
    from scipy.optimize import least_squares, nnls

    M = _series(sizes, f"{kind}.bytes")
    t = _series(times, f"{kind}.times_s")
    _same_length(M, t, f"{kind}.bytes", f"{kind}.times_s")
    if len(M) < 2:
        raise PlanError("need at least 2 message sizes to fit latency and bandwidth", field=kind)
    if len(set(M.tolist())) < 2:
        raise PlanError("need at least 2 different message sizes to fit latency and bandwidth", field=kind)
    a, b = ring_coefficients(n, kind)

    # Start: min sum ((a*alpha + b*M*g) / t - 1)^2 with alpha, g >= 0 (g = 1 / beta).
    A = np.stack([a / t, b * M / t], axis=1)
    (alpha0, g0), _ = nnls(A, np.ones_like(t))
    alpha0 = alpha0 if alpha0 > 0 else 0.5 * t.min() / a
    g0 = g0 if g0 > 0 else 0.5 * t.max() / (b * M.max())

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(a * np.exp(x[0]) + b * M * np.exp(x[1])) - np.log(t)

    sol = least_squares(resid, x0=np.log([alpha0, g0]), loss="soft_l1", f_scale=0.3, x_scale=1.0)
    r = resid(sol.x)
    return AlphaBetaFit(kind=kind, n=int(n), alpha_s=float(np.exp(sol.x[0])), beta_Bps=float(np.exp(-sol.x[1])),
                        rms_log_residual=float(np.sqrt(np.mean(r**2))), residuals=[float(v) for v in r])


# --------------------------------------------------------------------------------------------
# Matmul efficiency curve
# --------------------------------------------------------------------------------------------


@dataclass
class MatmulFit:
    precision: str
    peak_flops: float  # P: the model's peak for this precision
    peak_fraction: float  # f
    half_dim: float
    asymptote_flops: float  # P * f: what the largest GEMMs approach
    max_measured_flops: float
    rms_log_residual: float
    residuals: list[float] = field(default_factory=list)


def fit_matmul_curve(d: Sequence[float], flops: Sequence[float], *, peak_flops: float | None = None,
                     peak_fraction: float = 0.8, precision: str = "fp32") -> MatmulFit:
    """Fit achieved(d) = A * d / (d + half_dim) (A = P * f) by least squares on the log.

    With `peak_flops` (a nominal peak) f = A / peak_flops (at most 1); without it f is
    `peak_fraction` and P = A / f.
    """
    from scipy.optimize import least_squares

    d = _series(d, f"matmul.{precision}.d")
    y = _series(flops, f"matmul.{precision}.flops")
    _same_length(d, y, f"matmul.{precision}.d", f"matmul.{precision}.flops")
    if len(d) < 2 or len(set(d.tolist())) < 2:
        raise PlanError("need at least 2 GEMM sizes to fit the efficiency curve", field=f"matmul.{precision}")

    def resid(x: np.ndarray) -> np.ndarray:
        return x[0] + np.log(d / (d + x[1])) - np.log(y)

    best = None
    for h0 in (0.01 * np.median(d), np.median(d), 4 * np.median(d)):  # a few starts: cheap, and safe
        x0 = [math.log(y.max()) + math.log((d.max() + h0) / d.max()), h0]
        sol = least_squares(resid, x0=x0, bounds=([-np.inf, 0.0], [np.inf, 1e6]))
        if best is None or sol.cost < best.cost:
            best = sol
    asymptote = float(np.exp(best.x[0]))
    half_dim = float(best.x[1])
    if peak_flops is not None and peak_flops > 0:
        f = min(1.0, asymptote / peak_flops)
        peak = asymptote / f
    else:
        f = float(peak_fraction)
        peak = asymptote / f
    r = resid(best.x)
    return MatmulFit(precision=precision, peak_flops=peak, peak_fraction=f, half_dim=half_dim,
                     asymptote_flops=asymptote, max_measured_flops=float(y.max()),
                     rms_log_residual=float(np.sqrt(np.mean(r**2))), residuals=[float(v) for v in r])


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _series(values: Any, name: str) -> np.ndarray:
    """A 1-D array of finite, positive numbers, or PlanError naming the series."""
    if values is None:
        raise PlanError("missing series", field=f"measurements.{name}")
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise PlanError("not a list of numbers", field=f"measurements.{name}") from None
    if arr.ndim != 1:
        raise PlanError("expected a flat list of numbers", field=f"measurements.{name}")
    if arr.size == 0:
        raise PlanError("empty series", field=f"measurements.{name}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise PlanError(f"{bad.size} value(s) not finite (NaN or inf), first at index {bad[0]}",
                        field=f"measurements.{name}")
    bad = np.flatnonzero(arr <= 0)
    if bad.size:
        raise PlanError(f"{bad.size} value(s) zero or negative, first at index {bad[0]}: {arr[bad[0]]!r}",
                        field=f"measurements.{name}")
    return arr


def _same_length(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise PlanError(f"mismatched lengths: {name_a} has {len(a)} values, {name_b} has {len(b)}",
                        field=f"measurements.{name_b}")


def validate_measurements(meas: dict[str, Any]) -> None:
    """Every series present is well formed; at least something was measured. PlanError otherwise."""
    if not isinstance(meas, dict):
        raise PlanError("expected a mapping of measurements", field="measurements")
    if not any(k in meas for k in ("matmul", "memory", "collectives")):
        raise PlanError("nothing measured (no matmul, memory or collectives)", field="measurements")
    if "matmul" in meas:
        rows = meas["matmul"]
        if not isinstance(rows, list) or not rows:
            raise PlanError("empty series", field="measurements.matmul")
        for prec in sorted({str(r.get("precision")) for r in rows}):
            pr = [r for r in rows if str(r.get("precision")) == prec]
            _series([r.get("d") for r in pr], f"matmul.{prec}.d")
            _series([r.get("tflops") for r in pr], f"matmul.{prec}.tflops")
            try:
                Precision(prec)
            except ValueError:
                raise PlanError(f"unknown precision {prec!r}", field="measurements.matmul") from None
    if "memory" in meas:
        mem = meas["memory"]
        _series([mem.get("gbyte_s_per_device") if isinstance(mem, dict) else None], "memory.gbyte_s_per_device")
    if "optimizer" in meas:
        o = meas["optimizer"]
        _series([o.get("seconds") if isinstance(o, dict) else None], "optimizer.seconds")
        _series([o.get("params") if isinstance(o, dict) else None], "optimizer.params")
    if "collectives" in meas:
        coll = meas["collectives"]
        if not isinstance(coll, dict) or not coll:
            raise PlanError("empty series", field="measurements.collectives")
        for kind, s in coll.items():
            if kind not in KINDS:
                raise PlanError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}", field="measurements.collectives")
            if not isinstance(s, dict):
                raise PlanError("expected {n, bytes, times_s}", field=f"measurements.collectives.{kind}")
            b = _series(s.get("bytes"), f"collectives.{kind}.bytes")
            t = _series(s.get("times_s"), f"collectives.{kind}.times_s")
            _same_length(b, t, f"collectives.{kind}.bytes", f"collectives.{kind}.times_s")


# --------------------------------------------------------------------------------------------
# The fit of a whole machine
# --------------------------------------------------------------------------------------------


@dataclass
class CalibrationFit:
    machine: MachineModel
    matmul: MatmulFit | None
    other_peaks_tflops: dict[str, float]
    memory_gbyte_s: float | None
    collectives: dict[str, AlphaBetaFit]
    machine_collective: str | None  # the fit the machine's network figures come from
    scope: str  # "intra-node" or "inter-node"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scope": self.scope,
            "machine_figures_from": self.machine_collective,
            "matmul": asdict(self.matmul) if self.matmul else None,
            "other_peaks_tflops": self.other_peaks_tflops,
            "memory_gbyte_s_per_device": self.memory_gbyte_s,
            "collectives": {},
        }
        for k, f in self.collectives.items():
            out["collectives"][k] = {"n": f.n, "alpha_us": f.alpha_us, "beta_gbyte_s": f.beta_gbyte_s,
                                     "rms_log_residual": f.rms_log_residual, "residuals": f.residuals}
        return out


def _fit_matmul(meas: dict[str, Any], base: MachineModel, device_type: str) -> tuple[MatmulFit | None, dict[str, float], dict[str, Any]]:
    """(the curve's fit, the other precisions' peaks, the machine fields they set): the curve
    from the precision with the most GEMM sizes, each other precision's peak from the same
    curve."""
    rows = meas["matmul"]
    mfit, others = None, {}
    by_prec: dict[str, list[dict]] = {}
    for r in rows:
        by_prec.setdefault(str(r["precision"]), []).append(r)
    curve_prec = max(by_prec, key=lambda p: (len({r["d"] for r in by_prec[p]}), p == "bf16"))
    pts = by_prec[curve_prec]
    if len({r["d"] for r in pts}) >= 2:
        nominal = (meas.get("nominal_peak_tflops") or {}).get(curve_prec)
        if nominal is None and device_type != "cpu" and not base.calibrated:
            nominal = base.peak_tflops.get(Precision(curve_prec))  # a datasheet peak
        mfit = fit_matmul_curve([r["d"] for r in pts], [r["tflops"] * 1e12 for r in pts],
                                peak_flops=nominal * 1e12 if nominal else None,
                                peak_fraction=base.matmul_efficiency.peak_fraction, precision=curve_prec)
        eff = MatmulEfficiency(peak_fraction=mfit.peak_fraction, half_dim=mfit.half_dim)
    else:
        eff = base.matmul_efficiency
    peaks = dict(base.peak_tflops)
    if mfit:
        peaks[Precision(curve_prec)] = mfit.peak_flops / 1e12
    for prec, pr in by_prec.items():
        if mfit and prec == curve_prec:
            continue
        # Same curve, this precision's own peak: the median of achieved / eff(d).
        ratios = [r["tflops"] / (eff.peak_fraction * r["d"] / (r["d"] + eff.half_dim)) for r in pr]
        others[prec] = float(np.median(ratios))
        peaks[Precision(prec)] = others[prec]
    return mfit, others, {"peak_tflops": peaks, "matmul_efficiency": eff}


def _network_figures(meas: dict[str, Any], base: MachineModel, fits: dict[str, AlphaBetaFit],
                     source: str | None, nodes: int) -> dict[str, Any]:
    """The machine's latency and bandwidth fields from the `source` fit (intra- or inter-node
    by the number of nodes measured), and the efficiency of reduce-scatter and all-gather
    against the allreduce the link figures came from."""
    update: dict[str, Any] = {}
    if source:
        f = fits[source]
        eff_net = base.network_efficiency or 1.0
        if nodes > 1:
            ranks_per_node = int(meas.get("ranks", 1))
            update["inter_node_latency_us"] = f.alpha_us
            update["nic_gbit_s"] = f.beta_gbyte_s * ranks_per_node * 8 / base.nics_per_node / base.nic_efficiency
        else:
            update["intra_node_latency_us"] = f.alpha_us
            update["intra_node_bandwidth_gbyte_s"] = f.beta_gbyte_s / eff_net
            if base.nodes == 1 and base.topology == TopologyKind.single_node:
                # One node: never used, kept equal to the intra-node figures (as the loader does).
                update["inter_node_latency_us"] = f.alpha_us
                update["nic_gbit_s"] = f.beta_gbyte_s * 8 / base.nics_per_node

    # Reduce-scatter and all-gather against the allreduce the link figures came from (times
    # what the base says allreduce itself reaches in training: 1 on GPUs, ~0.3 with gloo).
    if source == "allreduce" and nodes == 1:
        ar = base.collective_efficiency.allreduce
        ceff = {k: min(1.0, max(0.01, ar * fits[k].beta_gbyte_s / fits[source].beta_gbyte_s))
                for k in ("reduce_scatter", "all_gather") if k in fits}
        if ceff:
            update["collective_efficiency"] = {**base.collective_efficiency.model_dump(), **ceff}
    return update


def fit_details(meas: dict[str, Any], base: MachineModel) -> CalibrationFit:
    """All fits, and the calibrated copy of `base` (see the module docstring)."""
    validate_measurements(meas)
    update: dict[str, Any] = {}
    device_type = meas.get("device_type", "cpu")

    mfit, others = None, {}
    if "matmul" in meas:
        mfit, others, matmul_update = _fit_matmul(meas, base, device_type)
        update.update(matmul_update)

    # --- memory ---
    mem = None
    if "memory" in meas:
        mem = float(meas["memory"]["gbyte_s_per_device"])
        update["memory_bandwidth_gbyte_s"] = mem

    # --- optimizer: one AdamW step, as bytes of memory traffic per parameter ---
    if "optimizer" in meas:
        o = meas["optimizer"]
        bandwidth = mem if mem is not None else base.memory_bandwidth_gbyte_s
        per_param = float(o["seconds"]) / float(o["params"])
        if per_param > 0:
            update["optimizer_bytes_per_param"] = per_param * bandwidth * 1e9

    # --- collectives ---
    fits: dict[str, AlphaBetaFit] = {}
    for kind, s in (meas.get("collectives") or {}).items():
        fits[kind] = fit_alpha_beta_detail(s["bytes"], s["times_s"], int(s.get("n", meas.get("ranks", 2))), kind)
    nodes = int(meas.get("nodes", 1))
    scope = "inter-node" if nodes > 1 else "intra-node"
    source = next((k for k in ("allreduce", "reduce_scatter", "all_gather", "p2p") if k in fits), None)
    update.update(_network_figures(meas, base, fits, source, nodes))

    # --- a CPU run for another rank count re-splits the node ---
    ranks = int(meas.get("ranks", base.devices_per_node))
    if device_type == "cpu" and nodes == 1 and ranks != base.devices_per_node:
        update["devices_per_node"] = ranks
        update["device_memory_gib"] = base.device_memory_gib * base.devices_per_node / ranks

    update["calibrated"] = True
    update["description"] = _description(meas, mfit, mem, fits, source, scope)
    data = base.model_dump()
    data.update(update)
    machine = MachineModel.model_validate(data)
    return CalibrationFit(machine=machine, matmul=mfit, other_peaks_tflops=others, memory_gbyte_s=mem,
                          collectives=fits, machine_collective=source, scope=scope)


def fit(meas: dict[str, Any], base: MachineModel) -> MachineModel:
    """A calibrated copy of `base`. The fits and their residuals are attached to the
    measurements as meas["fit"] (so write_calibration keeps them beside the YAML)."""
    details = fit_details(meas, base)
    meas["fit"] = details.as_dict()
    return details.machine


def _command(meas: dict[str, Any]) -> str:
    cmd = f"{CALIBRATE_COMMAND} --ranks {meas.get('ranks', '?')}"
    return cmd + (" --quick" if meas.get("quick") else "")


def _description(meas, mfit, mem, fits, source, scope) -> str:
    parts = [f"Calibrated {meas.get('when', '?')} on {meas.get('host', '?')} ({meas.get('device_name', '?')}, "
             f"{meas.get('device_type', '?')}, torch {meas.get('torch', '?')}, {meas.get('backend', '?')}) by "
             f"`{_command(meas)}`: {meas.get('nodes', 1)} node(s) x {meas.get('ranks', '?')} ranks"]
    if meas.get("threads_per_rank"):
        parts[-1] += f", {meas['threads_per_rank']} thread(s) per rank"
    parts[-1] += "."
    if mfit:
        parts.append(f"Matmul {mfit.precision}: up to {mfit.max_measured_flops / 1e9:.1f} GFLOP/s measured, curve "
                     f"{mfit.asymptote_flops / 1e9:.1f} GFLOP/s x d/(d+{mfit.half_dim:.0f}) "
                     f"(rms log residual {mfit.rms_log_residual:.3f}).")
    if mem:
        parts.append(f"Memory copy {mem:.2f} GB/s per device.")
    for k, f in fits.items():
        parts.append(f"{k}: alpha {f.alpha_us:.1f} us, beta {f.beta_gbyte_s:.3f} GB/s (rms log residual "
                     f"{f.rms_log_residual:.2f}).")
    if source:
        parts.append(f"{scope} latency/bandwidth from the {source} fit. Other figures from the base model.")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def measurements_path(path: Path) -> Path:
    path = Path(path)
    return path.with_name(f"{path.stem}.measurements.json")


def write_calibration(machine: MachineModel, meas: dict[str, Any], path: Path, force: bool = True) -> None:
    """Write `path` (a machine YAML that load_machine / `exaplan plan --machine` reads) and the
    raw measurements beside it as <stem>.measurements.json, each atomically (tmp + rename;
    existing files replaced only with `force`, never a symlink or a device: files.write_new).
    Bad measurements raise PlanError before anything is written."""
    import datetime as _dt

    path = Path(path)
    validate_measurements(meas)
    data = machine.model_dump(mode="json")
    MachineModel.model_validate(data)  # what the loader will do
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    header = [
        f"# Machine model written by `{_command(meas)}` on {now}",
        f"# (measured {meas.get('when', '?')} on {meas.get('host', '?')}: {meas.get('device_name', '?')}).",
        f"# Raw measurements and fit residuals: {measurements_path(path).name}",
        "# Load with: exaplan plan --machine " + (str(path) if path.name != "local.yaml" else "local"),
    ]
    for k, f in ((meas.get("fit") or {}).get("collectives") or {}).items():
        header.append(f"#   {k} fit (n={f['n']}): alpha {f['alpha_us']:.1f} us, beta {f['beta_gbyte_s']:.3f} GB/s, "
                      f"rms log residual {f['rms_log_residual']:.2f}")
    text = "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    meas_text = json.dumps(meas, indent=1, default=_json_default) + "\n"
    from planner.schema.files import check_target, write_new

    check_target(path, "the fitted machine file", force)  # both refused before either is written
    check_target(measurements_path(path), "the measurements file", force)
    write_new(measurements_path(path), meas_text, "the measurements file", force)
    write_new(path, text, "the fitted machine file", force)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    raise TypeError(f"not JSON-able: {type(obj).__name__}")


def atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
