"""`exaplan run PLAN --backend jax`: set JAX up for the plan, then train (jaxrt/trainer.py).

Processes. On a workstation `exaplan run` is the one process and holds all of the plan's
devices (on a CPU, `--xla_force_host_platform_device_count` = the plan's ranks: XLA's CPU
devices). Under a launcher (torchrun-style variables, Slurm, PALS/mpiexec, Open MPI: the
same environments the torch runtime reads, runtime/launch.py) every process joins one JAX
job through `jax.distributed.initialize` at the launcher's first host and MASTER_PORT and
holds world / processes devices; `exaplan launch` scripts start one process per rank, so
each holds one device (its local rank's GPU), or one process per node holding them all.
On CPUs the processes' collectives run over gloo.

Nothing here imports JAX at module level: XLA reads its flags when JAX starts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from jaxrt.preflight import check_before_start, missing_module, require_jax
from planner.schema.errors import PlanError
from planner.schema.plan import Plan


# XLA:CPU's default scheduler (concurrency-optimized) places jax.checkpoint's recomputation
# beside the forward pass, so recompute saved no memory on CPUs: a 4-layer step at 2,048
# tokens held 3.9 GiB of temporaries at every level. The memory-optimized scheduler keeps the
# recomputation in the backward (none 2.3, selective 1.6, full 1.3 GiB) and ran as fast or
# faster here (1 and 2 devices on 2 cores). CPU-only: GPU compilations ignore it. Kept where
# XLA_FLAGS already chooses a CPU scheduler.
CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
GPU_MEMORY_FRACTION = "0.95"
_CPU_SCHEDULER_FLAGS = ("xla_cpu_enable_concurrency_optimized_scheduler", "xla_cpu_scheduler_type")


def xla_flags(existing: str, devices: int) -> str:
    """XLA_FLAGS for a process holding `devices` CPU devices: the given flags, the memory-
    optimized CPU scheduler unless they choose one, and the device count (replacing any)."""
    flags = [f for f in existing.split() if "xla_force_host_platform_device_count" not in f]
    if not any(name in f for f in flags for name in _CPU_SCHEDULER_FLAGS):
        flags.append(CPU_SCHEDULER_FLAG)
    return " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])


def configure(plan: Plan, processes: int) -> int:
    """XLA's flags for this process, before JAX starts; returns its devices."""
    if plan.world_size % processes:
        raise PlanError(f"the plan's {plan.world_size} ranks do not split over the {processes} processes started",
                        field="world size")
    local = plan.world_size // processes
    os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""), local)
    for key, value in plan.collectives.env.items():
        os.environ.setdefault(key, value)  # NCCL_* etc.: XLA's GPU collectives read them too
    # JAX's GPU allocator takes 75% of the card unless told: a plan the planner fits into the
    # card (its reserve ~5% of it) needs the card less that reserve. CPUs ignore it.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_MEMORY_FRACTION)
    # XLA's persistent compilation cache: a requeued, resumed or repeated run of the same
    # plan loads the compiled step instead of compiling it again (EXAPLAN_JAX_CACHE=off: none).
    cache = os.environ.get("EXAPLAN_JAX_CACHE", str(Path.home() / ".cache" / "exaplan" / "jax"))
    if cache != "off":
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", cache)
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    return local


def start(args, plan: Plan) -> int:
    """Run the plan with the JAX backend in this process (under a launcher: as one process of
    the job). Returns the exit code."""
    from runtime import launch
    from runtime.runlock import RunLock
    from runtime.walltime import StopSignal

    require_jax()
    stop = StopSignal().install()
    renv = launch.detect()
    processes = renv.world_size if renv is not None else 1
    local = configure(plan, processes)
    first = renv is None or renv.rank == 0
    out = Path(args.out)
    created = not out.exists()
    lock = RunLock(out, getattr(args, "argv", None)) if first else None
    try:
        if lock is not None:
            lock.acquire()
        check_before_start(args, plan)
        if renv is None:
            from runtime.preflight import check_fits_this_machine

            check_fits_this_machine(plan)
        prepared = _prepare(args, first)
    except BaseException:
        if lock is not None:
            lock.release()
            if created:
                shutil.rmtree(out, ignore_errors=True)
        raise
    try:
        _join(renv, local)
        if first:
            out.mkdir(parents=True, exist_ok=True)
            if Path(args.plan).resolve() != (out / "plan.yaml").resolve():
                shutil.copyfile(args.plan, out / "plan.yaml")
        from jaxrt.trainer import train

        return train(args, plan, prepared, stop)
    finally:
        if lock is not None:
            lock.release()


def _prepare(args, first: bool):
    """The prepared data directory (process 0 prepares FASTA input once; None: synthetic)."""
    if args.io_mode == "synthetic":
        return None
    from runtime.dataprep.cache import ensure_prepared

    return ensure_prepared(args.data, Path(args.out) / "data", rank=0 if first else 1)


def _join(renv, local: int) -> None:
    """jax.distributed.initialize for a launched job of several processes."""
    if renv is None or renv.world_size == 1:
        return
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    one_each = visible is not None and "," not in visible  # the scheduler gave each process one GPU
    gpus = not (missing_module("jax_cuda12_plugin") and missing_module("jax_cuda13_plugin"))
    if local == 1 and (renv.local_world_size or 1) > 1 and not one_each and gpus:
        kwargs["local_device_ids"] = [renv.local_rank]  # one process per GPU, all GPUs visible: its local rank's
    jax.distributed.initialize(f"{renv.master_addr}:{renv.master_port}", renv.world_size, renv.rank, **kwargs)
