"""`exaplan list`: the model presets, the machine presets (with their shape and network
figures) and the framework profiles; `--devices`: the device kinds."""

from __future__ import annotations

import argparse

from cli.common import add_json_option, console, print_json


def add_parser(sub) -> None:
    ls = sub.add_parser("list", help="list model and machine presets and framework profiles (--devices: device kinds)",
                        description="The model presets (with their size and shape), the machine presets and the "
                                    "framework profiles of machine_models/frameworks.yaml (--framework NAME). "
                                    "--devices lists the device kinds of machine_models/device_kinds.yaml instead: "
                                    "whether each kind's efficiency figures are fitted to published runs, copied "
                                    "from another kind, or unfitted first guesses, and the machine presets that use "
                                    "it.")
    ls.add_argument("--devices", action="store_true",
                    help="list the device kinds, their status (fitted / copied from KIND / unfitted) and presets")
    add_json_option(ls, "print the names as JSON")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "devices", False):
        return _run_devices(args)
    from machine_models import list_frameworks, list_machines, load_framework, load_machine
    from planner.cost.flops import total_params
    from planner.presets import MODEL_PRESETS

    if args.json:
        print_json(dict(models=list(MODEL_PRESETS), machines=list_machines(), frameworks=list_frameworks()))
        return 0
    out = console()
    for name, m in MODEL_PRESETS.items():
        out.print(f"model   {name:15s} {total_params(m) / 1e6:9.1f} M parameters, {m.layers} x {m.hidden}, "
                  f"heads {m.heads}/{m.kv_heads}, seq {m.seq_len}")
    for name in list_machines():
        out.print(f"machine {name:15s} {machine_summary(load_machine(name))}", markup=False, highlight=False)
    for name in list_frameworks():  # the description up to its first colon: what the profile stands for
        out.print(f"framework {name:11s} {load_framework(name).description.split(': ')[0]}", markup=False, highlight=False)
    return 0


def machine_summary(m) -> str:
    """One line of a machine's shape and figures: nodes x devices, the device kind, its memory and
    fastest peak, the intra-node fabric, the NICs and the efficiency collectives reach on them."""
    measured = " (measured)" if m.inter_node_efficiency is not None else ""
    prec, peak = max(m.peak_tflops.items(), key=lambda kv: kv[1])  # the fastest precision (bf16 on GPUs)
    return (f"{m.nodes:,} x {m.devices_per_node} {m.device_name}, {m.device_memory_gib:g} GiB, {peak:.4g} TFLOP/s "
            f"{getattr(prec, 'value', prec)}; "
            f"intra-node {m.intra_node_bandwidth_gbyte_s:g} GB/s; {m.nics_per_node} x {m.nic_gbit_s:g} Gb/s NICs at "
            f"{m.nic_efficiency:.2f}{measured}; {m.collective_library.value}")


def _run_devices(args: argparse.Namespace) -> int:
    """Every device kind: its status and the machine presets that name it. A kind that a preset
    names but device_kinds.yaml does not know is listed as "unknown"."""
    from machine_models.loader import device_kind_status, measured_kernels_source, presets_by_device_kind

    status, kernels = device_kind_status(), measured_kernels_source()
    rows = [dict(name=kind, status=status.get(kind, "unknown"), presets=presets, runtime_kernels=kernels.get(kind))
            for kind, presets in presets_by_device_kind().items()]
    if args.json:
        print_json(dict(devices=rows))
        return 0
    out = console()
    width = max(len(r["name"]) for r in rows) if rows else 0
    swidth = max(len(r["status"]) for r in rows) if rows else 0
    for r in rows:
        src = r["runtime_kernels"] or ""
        kernels = "kernels copied" if src.startswith("copied") else "kernels measured" if src else "-"
        out.print(f"device {r['name']:{width}s}  {r['status']:{swidth}s}  {kernels:16s}  "
                  f"{', '.join(r['presets']) or '-'}", markup=False, highlight=False)
    out.print("fitted: fitted to published runs (exaplan validate --published); unfitted: first guesses. kernels "
              "measured: exaplan's runtime's attention and elementwise rates measured on that device (torch and JAX "
              "plans are predicted at them; --json names the file); copied: another kind's.", markup=False, highlight=False)
    return 0
