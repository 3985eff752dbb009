"""The cost model's kernel terms against kernels timed one by one on a GPU
(benchmarks/gpu_kernels.py; `exaplan validate --kernels FILE`).

The device kinds' figures are fitted to whole published steps (calibration.fit_published); a
kernel benchmark shows which of them are kernel rates and which stand for more than their
kernel. For each measured case the cost model's time for the same work on the machine preset
of the measured card, with its shipped figures:

    gemm       planner.cost.compute.gemm_time over the 12 GEMMs of one block of each section A
               model on one tensor-parallel rank (forward, input and weight gradients), and
               square GEMMs;
    attention  attention_core_time x (1 + the flash backward ratio 2.5) for the measured
               shape, against each fused backend (FlashAttention-2, cuDNN, memory-efficient);
    elementwise the counted bytes / (HBM bandwidth x elementwise_efficiency), against compiled
               (fused) residual + RMSNorm and SwiGLU, forward + backward;
    loss       48 bytes a logit at the same rate, against Megatron's op-by-op vocab-parallel
               cross-entropy and torch's F.cross_entropy;
    step       layer_times of exaplan's own block (exaplan profile, eager and compiled) by kind
               (GEMM, attention, the rest), against the kernel time by kind of the runtime's model.

ratio = model / measured time: above 1 the model charges more time than the kernel takes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from calibration.json_input import loads
from planner.cost import compute, flops
from planner.cost.layout import Layouts
from planner.schema.errors import PlanError
from planner.schema.files import read_text
from planner.schema.specs import MachineModel, TrainingJob

# The machine preset whose shipped figures describe a measured card (matched on the name
# torch reports; the first match wins).
CARD_PRESETS = (("GH200", "alps"), ("H100", "dgx-h100"), ("H200", "dgx-h200"), ("A100", "dgx-a100-80gb"))
FLASH_BACKWARD = compute.FLASH_BACKWARD_RATIO


class KernelFileError(PlanError):
    """A kernel benchmark file that cannot be read (the message names the field)."""


@dataclass
class KernelRow:
    part: str
    case: str
    measured_ms: float
    model_ms: float

    @property
    def ratio(self) -> float:
        return self.model_ms / self.measured_ms


def load(path: str | Path) -> dict:
    """A benchmarks/gpu_kernels.py JSON file; KernelFileError naming what is missing."""
    try:  # a device, a FIFO, a binary, huge or deeply nested file: refused naming it
        data = loads(read_text(path, "the kernels file"), str(path))
    except PlanError as exc:
        raise KernelFileError(f"--kernels: {exc}") from None
    except json.JSONDecodeError as exc:
        raise KernelFileError(f"--kernels: cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("device"), dict) or not isinstance(
            data["device"].get("device"), str):
        raise KernelFileError(f"--kernels: {path}: no device.device (not a benchmarks/gpu_kernels.py file)")
    return data


def preset_for(card: str) -> str | None:
    """The machine preset of a card as torch names it ("NVIDIA H100 80GB HBM3" -> dgx-h100)."""
    for key, preset in CARD_PRESETS:
        if key in card:
            return preset
    return None


def _job(seq: int, framework=None) -> TrainingJob:
    """A job at `seq` tokens: by default the device kind's fitted figures (the measured
    kernels, which the file itself may have set, left out); `framework` for exaplan's block."""
    from planner.schema.specs import FrameworkProfile

    framework = FrameworkProfile(measured_kernels=False, weight_bytes_per_param=0.0) if framework is None else framework
    return TrainingJob(global_batch=1, seq_len=seq, precision="bf16", framework=framework)


def _one(batch: int = 1) -> Layouts:
    return Layouts.one(dp=1, mbs=batch, gas=1, tp=1, pp=1, sharding="none", shard_group=None, recompute="none",
                       vpp=1, sp=1)


def _ms(x) -> float:
    return float(np.asarray(x, dtype=np.float64).ravel()[0]) * 1e3


def gemm_rows(data: dict, machine: MachineModel) -> list[KernelRow]:
    g = data.get("gemm")
    if not isinstance(g, dict) or "error" in g:
        return []
    job = _job(4096)
    rows = []
    for b in g.get("section_a_blocks", []):
        model = sum(_ms(compute.gemm_time(machine, job, s["m"], s["n"], s["k"])) for s in b["gemms"].values())
        rows.append(KernelRow("gemm", f"block h{b['hidden']} tp{b['tp']}", b["forward_backward_ms"], model))
    for s in g.get("squares", []):
        n = s["size"]
        rows.append(KernelRow("gemm", f"square {n}", s["ms"], _ms(compute.gemm_time(machine, job, n, n, n))))
    return rows


def attention_model_ms(machine: MachineModel, seq: int, head_dim: int, heads: int, batch: int) -> float:
    """Forward + backward of the fused attention core for one call of the measured shape."""
    from planner.presets import get_model

    spec = get_model("protein-3.5b").model_copy(update={"hidden": heads * head_dim, "heads": heads,
                                                        "kv_heads": heads, "seq_len": seq})
    return _ms(compute.attention_core_time(spec, machine, _job(seq), _one(batch))) * (1.0 + FLASH_BACKWARD)


def attention_rows(data: dict, machine: MachineModel) -> list[KernelRow]:
    att = data.get("attention")
    if not isinstance(att, list):
        return []
    return [KernelRow("attention", _attention_case(a), a["fwd_bwd_ms"],
                      attention_model_ms(machine, a["seq"], a["head_dim"], a["heads"], a["batch"]))
            for a in att if "fwd_bwd_ms" in a]


def _attention_case(a: dict) -> str:
    return f"{a['backend'].split('_')[0].lower()} hd{a['head_dim']} s{a['seq']}"


def _stream_ms(machine: MachineModel, nbytes: float) -> float:
    return _ms(compute.elementwise_time(machine, nbytes))


def elementwise_rows(data: dict, machine: MachineModel) -> list[KernelRow]:
    ew = data.get("elementwise")
    if not isinstance(ew, list):
        return []
    return [KernelRow("elementwise", f"compiled t{e['tokens']} h{e['hidden']}", e["norm_residual_ms"] + e["swiglu_ms"],
                      _stream_ms(machine, e["counted_bytes"])) for e in ew]


def loss_rows(data: dict, machine: MachineModel) -> list[KernelRow]:
    loss = data.get("loss")
    if not isinstance(loss, list):
        return []
    rows = []
    for r in loss:
        model = _stream_ms(machine, r["counted_bytes"])
        rows.append(KernelRow("loss", f"megatron ops v{r['vocab']}", r["megatron_ops_ms"], model))
        rows.append(KernelRow("loss", f"torch fp32 v{r['vocab']}", r["torch_cross_entropy_fp32_ms"], model))
    return rows


def step_model_ms(machine: MachineModel, layers: int, mbs: int, seq: int, compiled: bool) -> dict[str, float]:
    """exaplan's block as layer_times charges it, x layers, by kind: GEMM, attention and the
    rest (elementwise work, the eager surplus unless compiled, and the weights' casts and
    gradient accumulation per micro-batch), with the exaplan profile: at the device kind's
    measured kernels where it carries them (planner/schema/kernels.py)."""
    from machine_models import load_framework
    from planner.presets import get_model

    spec = get_model("protein-3.5b").model_copy(update={"seq_len": seq})
    job = _job(seq, load_framework("exaplan").model_copy(update={"compiled": compiled}))
    lay = _one(mbs)
    elem = compute.elementwise_time(machine, compute.elementwise_bytes(spec, machine, job, lay), job)
    weights = compute.weight_traffic_time(machine, job, flops.layer_params(spec), lay)
    other = 3.0 * (_ms(elem) + _ms(compute.eager_extra_time(spec, machine, job, lay))) + _ms(weights)
    return {"gemm": layers * 3.0 * _ms(compute.dense_time(spec, machine, job, lay)),
            "attention": layers * (1.0 + FLASH_BACKWARD) * _ms(compute.attention_core_time(spec, machine, job, lay)),
            "other": layers * other}


def step_rows(data: dict, machine: MachineModel) -> list[KernelRow]:
    steps = data.get("step")
    if not isinstance(steps, list):
        return []
    rows = []
    for s in steps:
        model = step_model_ms(machine, s["layers"], s["micro_batch"], s["seq"], s["mode"] == "compiled")
        for kind, ms in s["kernel_ms"].items():
            rows.append(KernelRow("step", f"{s['mode']} {kind}", ms, model[kind]))
        rows.append(KernelRow("step", f"{s['mode']} all kernels", s["kernel_total_ms"], sum(model.values())))
        rows.append(KernelRow("step", f"{s['mode']} wall", s["wall_ms"], sum(model.values())))
    return rows


def compare(data: dict, machine: MachineModel) -> list[KernelRow]:
    """Every measured case of a gpu_kernels.py file against the model on `machine`."""
    rows: list[KernelRow] = []
    for part in (gemm_rows, attention_rows, elementwise_rows, loss_rows, step_rows):
        try:
            rows += part(data, machine)
        except (KeyError, TypeError) as exc:
            raise KernelFileError(f"--kernels: {part.__name__[:-5]}: missing field {exc}") from exc
    return rows


def summary_key(r: KernelRow) -> str:
    """The group a row is summarised in: GEMMs as blocks or squares, attention by backend,
    the loss by implementation, exaplan's block by kind (eager and compiled together)."""
    if r.part == "step":
        return f"step {r.case.split(maxsplit=1)[1]}"
    return f"{r.part} {r.case.split()[0]}" if r.part in ("gemm", "attention", "loss") else r.part


def summary(rows: list[KernelRow]) -> dict[str, dict[str, float]]:
    """Per group (summary_key): the median and range of model / measured."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(summary_key(r), []).append(r.ratio)
    return {k: {"median": float(np.median(v)), "min": float(min(v)), "max": float(max(v)), "cases": len(v)}
            for k, v in groups.items()}


def to_json(data: dict, machine: MachineModel, rows: list[KernelRow]) -> dict:
    return {"device": data["device"], "machine": machine.name,
            "rows": [{**asdict(r), "ratio": r.ratio} for r in rows], "summary": summary(rows)}


def render(data: dict, machine: MachineModel, rows: list[KernelRow], console) -> None:
    from rich.table import Table

    dev = data["device"]
    console.print(f"{dev['device']} (torch {dev.get('torch')}, cuDNN {dev.get('cudnn')}) against the cost model on "
                  f"`{machine.name}` with its shipped figures: model / measured time")
    table = Table(show_lines=False)
    for col in ("part", "case", "measured ms", "model ms", "model / measured"):
        table.add_column(col, justify="left" if col in ("part", "case") else "right")
    for r in rows:
        table.add_row(r.part, r.case, f"{r.measured_ms:.3f}", f"{r.model_ms:.3f}", f"{r.ratio:.2f}")
    console.print(table)
    for key, s in summary(rows).items():
        console.print(f"  {key}: model / measured median {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}, "
                      f"{s['cases']} cases)")


def plot(data: dict, machine: MachineModel, rows: list[KernelRow], path: str | Path, force: bool = True) -> None:
    """Two panels: attention forward + backward TFLOP/s against the sequence for each measured
    backend and for the model (head dimension 128 solid, 64 dashed); model / measured time
    per case of the other parts (1 = the model charges what the kernel takes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    att = [a for a in data.get("attention") or [] if "fwd_bwd_ms" in a]
    model_ms = {r.case: r.model_ms for r in rows if r.part == "attention"}
    for hd, style in ((128, "-"), (64, "--")):
        cases = [a for a in att if a["head_dim"] == hd]
        for backend in sorted({a["backend"] for a in cases}):
            pts = sorted((a["seq"], a["fwd_bwd_tflops"]) for a in cases if a["backend"] == backend)
            ax.plot(*zip(*pts), style, marker="o", ms=3, label=f"{backend.split('_')[0].lower()} hd{hd}")
        # the model's rate on the measured work: the measured FLOPs over the model's time (compare's rows)
        model = sorted((a["seq"], a["fwd_bwd_tflops"] * a["fwd_bwd_ms"] / model_ms[_attention_case(a)])
                       for a in cases if a["backend"] == cases[0]["backend"]) if cases else []
        if model:
            ax.plot(*zip(*model), style, color="k", lw=2, label=f"model hd{hd}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence (tokens)")
    ax.set_ylabel("causal attention, forward + backward TFLOP/s")
    ax.set_title(f"attention on {data['device']['device']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    other = [r for r in rows if r.part != "attention"]
    bx.barh(range(len(other)), [r.ratio for r in other], color=[f"C{'gemm elementwise loss step'.split().index(r.part)}"
                                                                 for r in other])
    bx.set_yticks(range(len(other)), [f"{r.part}: {r.case}" for r in other], fontsize=6)
    bx.axvline(1.0, color="k", lw=1)
    bx.set_xscale("log")
    bx.set_xlabel("model / measured time")
    bx.set_title(f"the cost model on {machine.name} (shipped figures)")
    bx.invert_yaxis()
    fig.tight_layout()
    import io

    from planner.schema.files import write_new

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_new(path, png.getvalue(), "the plot (--plot)", force)
