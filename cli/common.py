"""What several subcommands share: the model/machine/job options, reading them into specs,
the console, and JSON output."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from planner.schema.errors import PlanError
from planner.schema.choices import Recompute
from planner.schema.limits import MAX_NODES

RECOMPUTES = [r.value for r in Recompute]
RECOMPUTE_HELP = ("activation recompute: none; selective (the attention core, Korthikanti et al. 2022); full (each "
                  "block from its input); selective-op (torchtitan's per-op policy: keeps the attention output and "
                  "every other GEMM's, recomputes k, o, up and the elementwise ops; exaplan's torch and JAX runtimes, not "
                  "--framework megatron or deepspeed)")

MODEL_HELP = "preset (protein-3.5b, protein-7b, protein-70b, protein-small, protein-tiny) or a ModelSpec YAML file"
MACHINE_HELP = ("preset (aurora, alps, frontier, leonardo, lumi, pdx, dgx-a100-80gb, dgx-a100-40gb, dgx-h100, "
                "dgx-h200, grand-teton-h100, ibm-a100-400g, local) or a MachineModel YAML file")
SET_HELP = ("override a spec field by dotted path, repeatable: model.layers=96, model.vocab_size=51200, "
            "machine.nics_per_node=4, machine.nic_gbit_s=400 (per NIC per direction, Gbit/s), "
            "machine.overlap.dp=0.5 ... ")
WORKLOAD_HELP = ("pretrain (next-token loss), or dpo: preference tuning on (chosen, rejected) pairs; the global batch "
                 "counts pairs, both sequences run through the policy, plus a frozen reference model")
FRAMEWORK_HELP = ("the training software the job runs with, as a profile of machine_models/frameworks.yaml: exaplan "
                  "(default: torch FSDP2/DDP/pipelining, exaplan's runtime), megatron (Megatron-LM), deepspeed "
                  "(Megatron-DeepSpeed), jax (exaplan's JAX backend, jaxrt/); it sets the fitted overlap and per-step "
                  "figures, the shardings searched, sequence, pipeline and context parallelism, the precisions, the "
                  "gradient-reduction precision and the DDP buckets")
COMPILE_HELP = ("plan for the runtime's blocks compiled (torch.compile: the plan says `compile: true`, which `exaplan "
                "run` honours): fused elementwise kernels, which the cost model counts; without it a GPU plan is "
                "predicted as it runs by default, eager, with the unfused norms, rotary embeddings and activations "
                "moving about 5x those bytes (exaplan profile only)")
REFERENCE_HELP = ("dpo: the reference model runs its forward passes in every step and is held in memory (in-step, "
                  "default), or its log-probabilities were precomputed once (exaplan run --precompute-reference)")


def add_job_options(p: argparse.ArgumentParser, nodes_required: bool = False) -> None:
    """--model, --machine, --nodes and the job: what `plan` and `estimate` take."""
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--machine", required=True, help=MACHINE_HELP)
    p.add_argument("--nodes", type=int, default=None if nodes_required else 1, required=nodes_required,
                   help="nodes to use (default 1)")
    p.add_argument("--global-batch", type=int,
                   help="sequences per optimizer step, held fixed (default: 8 per rank, as in the seed runs)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"],
                   help="compute precision (default: bf16 on GPUs, fp32 on CPUs); accumulation and reduction are fp32")
    p.add_argument("--token-budget", type=float, help="tokens to train on, for time-to-train (default 1e9)")
    add_workload_options(p)
    add_set_option(p)
    add_json_option(p)


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """--workload, --reference and --framework: what runs and with which software."""
    p.add_argument("--workload", choices=["pretrain", "dpo"], default="pretrain", help=WORKLOAD_HELP)
    p.add_argument("--reference", choices=["in-step", "precomputed"], default="in-step", help=REFERENCE_HELP)
    p.add_argument("--framework", default="exaplan", metavar="NAME", help=FRAMEWORK_HELP)
    p.add_argument("--compile", action="store_true", help=COMPILE_HELP)


def add_set_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP)


def add_force_option(p: argparse.ArgumentParser, what: str = "the output file") -> None:
    """--force: the one flag, on every command that writes, that lets it replace what exists."""
    p.add_argument("--force", action="store_true",
                   help=f"replace {what} when it exists (never a symlink, a device or a directory; without "
                        "--force an existing file is refused and left as it was)")


def add_json_option(p: argparse.ArgumentParser, what: str = "print JSON instead of tables") -> None:
    p.add_argument("--json", action="store_true", help=what)


def load_specs(args):
    """(model, machine) from --model/--machine with every --set override applied; the machine
    as --framework uses it (its fitted figures and settings: FrameworkProfile.applied_to)."""
    from machine_models import load_framework, load_machine
    from planner.inputs import apply_overrides, check_overrides, load_model, parse_override

    overrides = [parse_override(o) for o in args.overrides]
    check_overrides(overrides, ("model", "machine"))
    model = apply_overrides(load_model(args.model), "model", overrides)
    machine = apply_overrides(load_machine(args.machine), "machine", overrides)
    return model, load_framework(args.framework, compiled=getattr(args, "compile", False)).applied_to(machine)


def job_for(args, model, machine, world: int, token_budget: float | None = None):
    """The job of the options for a world of `world` ranks, with --framework's profile."""
    from machine_models import load_framework
    from planner.inputs import make_job

    return make_job(model, machine, world, args.global_batch, args.seq_len, args.precision,
                    token_budget if token_budget is not None else getattr(args, "token_budget", None),
                    args.workload, args.reference, load_framework(args.framework, compiled=getattr(args, "compile", False)))


def load_inputs(args):
    """(model, machine, job) for `--nodes` nodes."""
    model, machine = load_specs(args)
    if args.nodes is not None and args.nodes <= 0:
        raise PlanError("must be a positive number of nodes", field="nodes")
    if args.nodes is not None and args.nodes > MAX_NODES:
        raise PlanError(f"{args.nodes} nodes: at most {MAX_NODES:,} (the largest system a machine file may describe)",
                        field="nodes")
    if args.nodes is not None and args.nodes > machine.nodes:
        raise PlanError(f"{args.nodes:,} nodes asked for; {machine.name} has {machine.nodes:,} (machine.nodes: "
                        f"--set machine.nodes={args.nodes} to plan for a larger system)", field="nodes")
    return model, machine, job_for(args, model, machine, args.nodes * machine.devices_per_node)


def console():
    """A rich console at least 100 columns wide: the terminal's width, or COLUMNS when it is set
    (a pipe, a CI log), else 140 when not a terminal."""
    import os
    import shutil

    from rich.console import Console

    columns = os.environ.get("COLUMNS", "")
    if columns.strip().isdigit() and int(columns) > 0:
        width = int(columns)
    else:
        width = shutil.get_terminal_size((140, 40)).columns if sys.stdout.isatty() else 140
    return Console(stderr=False, highlight=False, width=max(min(width, 1000), 100))


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2))


def machine_file_of(args) -> str | None:
    """The absolute path of --machine when it names a file rather than a preset (a plan records
    it, so that `exaplan launch` finds the launch: section again)."""
    from pathlib import Path

    from machine_models.loader import _looks_like_path

    ref = getattr(args, "machine", None)
    if not isinstance(ref, str) or not _looks_like_path(ref) or not Path(ref).is_file():
        return None
    return str(Path(ref).resolve())


def command_line() -> str:
    """The command that is running, for a plan's provenance."""
    return shlex.join(["exaplan", *sys.argv[1:]])


def evaluation_json(ev, i: int, u=None) -> dict:
    """One row of an Evaluation as plain JSON (times in s, memory in GiB); with an uncertainty
    `u` (machine_models.uncertainty.Uncertainty), the interval of every figure."""
    gib = 2.0**30
    out = _evaluation_values(ev, i, gib)
    if u is not None:
        out["intervals"] = {
            "step_time_s": u.time_interval(out["step_time_s"]), "time_to_train_days": u.time_interval(out["time_to_train_days"]),
            **{k: u.rate_interval(out[k]) for k in ("tokens_per_s", "model_tflops_per_device", "hardware_tflops_per_device", "mfu")},
            "memory_gib_per_device": u.memory_interval(out["memory_gib_per_device"]),
        }
        out["uncertainty"] = u.as_json()
    return out


def _evaluation_values(ev, i: int, gib: float) -> dict:
    return dict(
        step_time_s=float(ev.step_time_s[i]), tokens_per_s=float(ev.tokens_per_s[i]),
        model_tflops_per_device=float(ev.model_tflops_per_device[i]),
        hardware_tflops_per_device=float(ev.hardware_tflops_per_device[i]), mfu=float(ev.mfu[i]),
        memory_gib_per_device=float(ev.memory.total[i] / gib), fits=bool(ev.memory.fits[i]),
        time_to_train_days=float(ev.time_to_train_days[i]),
        breakdown=dict(
            compute_s=float(ev.compute_s[i]), bubble_s=float(ev.bubble_s[i]), optimizer_s=float(ev.optimizer_s[i]),
            exposed_dp_s=float(ev.dp_s[i]), exposed_tp_s=float(ev.tp_s[i]), exposed_pp_s=float(ev.pp_s[i]),
            exposed_cp_s=float(ev.cp_s[i]),
            parameters_gib=float(ev.memory.parameters[i] / gib), gradients_gib=float(ev.memory.gradients[i] / gib),
            optimizer_gib=float(ev.memory.optimizer[i] / gib), activations_gib=float(ev.memory.activations[i] / gib),
            buffers_gib=float(ev.memory.buffers[i] / gib), reserve_gib=float(ev.memory.reserve[i] / gib),
        ),
    )


def repredicted_memory_gib(plan) -> float:
    """The plan's layout predicted again by this cost model (GiB a device, reserve included); a
    PlanError naming prediction.fits when the plan says it fits and its own layout does not: a
    file edited by hand with its hash recomputed (a larger sequence or micro-batch), or made by
    an earlier cost model. What `exaplan run` and `exaplan launch` check before starting."""
    from planner.cost.layout import Layouts
    from planner.cost.step import evaluate

    mem = evaluate(plan.model, plan.machine, plan.job, Layouts.from_plan(plan),
                   ddp_buckets_mb=(plan.sharding.ddp_bucket_mb,)).memory
    gib = float(mem.total[0]) / 2.0**30
    if plan.prediction.fits and not bool(mem.fits[0]):
        raise PlanError(f"the plan says it fits ({plan.prediction.memory_gib_per_device:,.1f} GiB a device), but its "
                        f"layout is predicted at {gib:,.1f} GiB of {plan.machine.device_memory_gib:,.0f}: the file was "
                        "edited (sequence, micro-batch) or made by an earlier cost model; make the plan again",
                        field="prediction.fits")
    return gib
