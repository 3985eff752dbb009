"""Train the protein LM as a plan says. Runs as one rank; `exaplan run` starts the ranks.

Read top to bottom: the numbered steps are the order in which a plan is applied.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.schema.errors import PlanError
from runtime.build import build_model, join
from runtime.pretrain import PretrainTask


def lr_at(step: int, args) -> float:
    """Linear warm-up, then cosine decay to 10% over the run."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(args.steps - args.warmup, 1)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def main(argv: list[str] | None = None) -> int:
    """One rank of `exaplan run` (what torchrun starts: `python -m runtime.trainer PLAN ...`)."""
    from runtime.options import check_run_args, parse_run_args
    from runtime.walltime import StopSignal

    stop = StopSignal().install()  # first: a signal during start-up is kept, not fatal
    try:
        args = parse_run_args(argv)
        check_run_args(args)
        return run_rank(args, stop)
    except PlanError as e:
        print(f"exaplan run: error: {e}", file=sys.stderr)
        return 2


def run_rank(args, stop=None) -> int:
    """This process as one rank of a launched job (torchrun, srun, mpiexec): the stop signals
    handled, the open-files limit raised, stdout and stderr also to OUT/logs/rank-N.log; then
    `train`. Returns 0, or EXIT_REQUEUE (85) when a signal stopped the run after a checkpoint."""
    import os

    from runtime import launch
    from runtime.options import check_out_of_a_new_segment
    from runtime.runlock import OWNER_ENV, RunLock
    from runtime.startup import raise_nofile_limit, tee_rank_log
    from runtime.walltime import ParentWatchdog, StopSignal

    renv = launch.detect()
    stop = stop or StopSignal().install()
    stop.rank = renv.rank if renv is not None else None
    raise_nofile_limit()
    ParentWatchdog().start()  # the launcher gone: save, stop (never an orphan)
    lock = None
    if renv is not None and renv.rank == 0 and not os.environ.get(OWNER_ENV):
        lock = RunLock(args.out).acquire()  # under srun / mpiexec: rank 0 owns --out
    try:
        if lock is not None:
            check_out_of_a_new_segment(args)  # before this rank writes anything
        if renv is not None:
            tee_rank_log(Path(args.out), renv.rank)
        return train(args, stop)
    finally:
        if lock is not None:
            lock.release()


def train(args, stop=None) -> int:
    """Apply the plan in its numbered steps; the helpers below, runtime/build.py (the rank and
    its model) and the task (runtime/pretrain.py, runtime/dpo.py) do one step (or a few) each.
    `stop` (runtime/walltime.StopSignal): a recorded SIGUSR1/SIGTERM stops the run after the
    step in progress, all ranks together, with a checkpoint (returns EXIT_REQUEUE)."""
    import torch.distributed as dist

    from runtime.mesh import build_mesh
    from runtime.steplog import StepLog, StopAgreement

    # 1. The plan, and this rank's place in it.
    plan, device, rank, owns_group = join(args)
    out = Path(args.out)

    # 2. The mesh: pp, dp_replicate, dp_shard, cp, tp (+ flattened dp, dp_shard_cp, dp_cp).
    mesh = build_mesh(plan, device.type)

    # 3-6. The model, parallelised and initialised (build_model, below); --init: its weights.
    parts, handles = build_model(plan, mesh, device, args.seed, compile_blocks=args.compile)
    if args.init and not args.resume:
        from runtime import checkpoint
        from runtime.dpo import resolve_checkpoint

        checkpoint.load(resolve_checkpoint(args.init), parts, None, restore_rng=False)
    # One AdamW per model part (interleaved pipelines hold several), stepped together.
    optimizers = [h.build_optimizer(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1) for h in handles]

    # 7. The task: its data (this data-parallel rank's slice of every global batch), the
    #    forward and backward of a step, validation. DPO: runtime/dpo.py.
    if plan.job.workload.value == "dpo":
        from runtime.dpo import DPOTask

        task = DPOTask(args, plan, mesh, device, parts, handles, out, build_model)
    else:
        task = PretrainTask(args, plan, mesh, device, parts, handles, out, rank)
    run = _Run(args, plan, mesh, device, rank, parts, handles, optimizers, task, out / "checkpoints", stop=stop)

    # 8. Resume: model, optimizer, data position, RNG (reshards to this layout).
    start_step = _resume(run) if args.resume else 0
    run.writer = _open_run_folder(run, out)
    run.steplog = StepLog(run.writer, device, task.tokens_per_step, task.reduce_metric_rows)
    run.agreement = StopAgreement(stop)
    if args.io_mode == "io-only":
        from runtime.loader import measure_io

        result = measure_io(task.loader, args.steps * plan.grad_accumulation_steps)
        if rank == 0:
            print(f"io-only: {result}")
    else:
        # 9. Train: micro-batches accumulate without synchronising until the last one.
        for step in range(start_step, args.steps):
            if _train_step(run, step):  # the ranks agreed to stop (a signal): save, exit 85
                return _stop_for_requeue(run, step, owns_group)
        run.agreement.close()

        # 10. The end: the last checkpoint first (nothing after it can lose the training), then
        # validation, measured against predicted.
        if not args.no_final_checkpoint:
            run.save(args.steps)
        val = task.validate()
        if isinstance(val, dict):  # DPO: the final metrics get their own record (pretraining: summary only)
            run.writer.log_dpo_validation(args.steps - 1, val)
        run.writer.finish({**_final_summary(val), "compiled_blocks": _compiled_blocks(parts)})
    if owns_group:
        dist.barrier()  # no rank tears its group down while another still uses it (gloo aborts:
        dist.destroy_process_group()  # seen without the final checkpoint's collectives)
    return 0


@dataclass
class _Run:
    """What the steps of a run share, once built (steps 1-7)."""

    args: argparse.Namespace
    plan: Any
    mesh: Any
    device: Any
    rank: int
    parts: list
    handles: list
    optimizers: list
    task: Any
    ckpt_dir: Path
    writer: Any = None
    stop: Any = None  # runtime/walltime.StopSignal, or None
    resumed: dict | None = None  # checkpoint, step, sample: when resumed
    steplog: Any = None  # runtime/steplog.StepLog
    agreement: Any = None  # runtime/steplog.StopAgreement

    @property
    def optimizer(self):
        """What checkpoints save: the optimizer, or the list of them (one per model part)."""
        return self.optimizers[0] if len(self.optimizers) == 1 else self.optimizers

    def save(self, step: int) -> None:
        from runtime import checkpoint

        checkpoint.save(self.ckpt_dir, step, self.parts, self.optimizer,
                        {"data": self.task.state_dict(), "step": step, "seed": self.args.seed})


def _resume(run: _Run) -> int:
    """Step 8: load the latest checkpoint of --out; the step to continue from."""
    from runtime import checkpoint

    latest = checkpoint.latest(run.ckpt_dir)
    if latest is None:
        raise PlanError(f"--resume: no complete checkpoint in {run.ckpt_dir}", field="resume")
    extra = checkpoint.load(latest, run.parts, run.optimizer, seed=run.args.seed)
    run.task.load_state_dict(extra["data"])
    step = int(extra["step"])
    run.resumed = {"checkpoint": str(latest), "step": step, "sample": extra["data"].get("sample")}
    if run.rank == 0:
        print(f"resumed from {latest}: step {step}, sample {run.resumed['sample']} of the training stream", flush=True)
    return step


def _open_run_folder(run: _Run, out: Path):
    """The run folder (rank 0: a fresh metrics.jsonl unless resuming, a copy of the plan, so
    that `exaplan calibrate --from-runs` can refit from it) and the metrics writer."""
    from runtime import metrics

    if not run.args.resume and run.rank == 0:
        (out / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run starts a fresh log
    if run.resumed and run.rank == 0:  # the steps after the checkpoint are logged again: drop their records
        metrics.truncate_after(out / "metrics.jsonl", run.resumed["step"])
    if run.rank == 0:
        import shutil

        out.mkdir(parents=True, exist_ok=True)
        if Path(run.args.plan).resolve() != (out / "plan.yaml").resolve():
            shutil.copyfile(run.args.plan, out / "plan.yaml")
    writer = metrics.MetricsWriter(out, run.plan, enabled=run.rank == 0, device=run.device,
                                   purge_step=run.resumed["step"] if run.resumed else None)
    if run.resumed:
        writer.log_event("resume", **run.resumed)
    return writer


def _train_step(run: _Run, step: int) -> bool:
    """Step 9, once: the learning rate, forward and backward, clipping, the optimizer step;
    then the step's figures kept (reduced and written on logging steps: runtime/steplog.py),
    validation and checkpoint when due. Returns whether the ranks agreed to stop (a signal
    on any rank, agreed one step later without a blocking collective)."""
    from runtime import metrics
    from runtime.parallel import clip_grad_norm_
    from runtime.steplog import StepTimer

    args, task = run.args, run.task
    lr = lr_at(step, args)
    for opt in run.optimizers:
        for group in opt.param_groups:
            group["lr"] = lr
    timer = StepTimer(run.device)
    task.step()
    t1 = time.perf_counter()  # on GPUs the phases are launch times; the step time is the device's
    grad_norm = clip_grad_norm_(run.handles, 1.0)
    t2 = time.perf_counter()
    for opt in run.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    step_time = timer.stop()
    phases = {"forward_backward_s": t1 - timer.t0, "clip_s": t2 - t1, "optimizer_s": time.perf_counter() - t2}
    run.steplog.keep(step, task.metric_row(), grad_norm, step_time, phases, metrics.peak_memory_bytes(run.device), lr)
    if args.log_samples:
        _log_samples(run.writer, step, task.seen, run.mesh)
    _fault_injection(step, run.rank)
    stopping = run.agreement.after_step()
    due_val = bool(args.val_every) and (step + 1) % args.val_every == 0 and step + 1 < args.steps
    due_ckpt = bool(args.ckpt_every) and (step + 1) % args.ckpt_every == 0
    printed = step % args.log_every == 0 or step == args.steps - 1
    if stopping or due_val or due_ckpt or printed:
        for rec in run.steplog.flush():
            if run.rank == 0 and (rec["step"] % args.log_every == 0 or rec["step"] == args.steps - 1):
                stats = rec.get("stats")
                more = f"  reward acc {stats['reward_accuracy']:.3f}  margin {stats['reward_margin']:+.4f}" if stats else ""
                print(f"step {rec['step']:5d}  loss {rec['loss']:.4f}{more}  {rec['step_time_s'] * 1e3:8.1f} ms/step",
                      flush=True)
    if stopping:
        return True
    if due_val:
        _log_validation(run.writer, step, task.validate())
    if due_ckpt:
        run.save(step + 1)
    return False


def _stop_for_requeue(run: _Run, step: int, owns_group: bool) -> int:
    """A signal stopped the run after `step`: every rank saves the checkpoint of step + 1;
    rank 0 records why (metrics.jsonl, summary.json, OUT/stopped.json). EXIT_REQUEUE."""
    import torch.distributed as dist

    import os

    from runtime.options import EXIT_REQUEUE
    from runtime.walltime import LOCAL_LAUNCHER_ENV, write_stopped

    reason = (run.stop.requested if run.stop else None) or "a signal on another rank"
    run.save(step + 1)
    ckpt = run.ckpt_dir / f"step-{step + 1:08d}"
    if run.rank == 0:
        info = {"reason": reason, "resume_step": step + 1, "checkpoint": str(ckpt), "exit_code": EXIT_REQUEUE}
        run.writer.log_event("stop", step, **info)
        run.writer.finish({"stopped": info})
        write_stopped(run.ckpt_dir.parent, reason, step, ckpt, EXIT_REQUEUE)
        print(f"stopped by {reason} after step {step}: checkpoint {ckpt} is complete; exit {EXIT_REQUEUE} "
              f"(requeue with --resume)", flush=True)
    dist.barrier()  # no rank exits before rank 0 has recorded the stop (a launcher ends the others then)
    if owns_group:
        dist.destroy_process_group()
    # Under `exaplan run`'s own torchrun the parent turns the recorded stop into 85 itself; a rank's
    # 0 keeps torchrun from printing its ChildFailedError traceback after the clean message.
    return 0 if os.environ.get(LOCAL_LAUNCHER_ENV) == "1" else EXIT_REQUEUE


def _log_validation(writer, step: int, val) -> None:
    if val is None:  # DPO without validation pairs
        return
    if isinstance(val, dict):
        writer.log_dpo_validation(step, val)
    else:
        writer.log_validation(step, val)


def _compiled_blocks(parts) -> int:
    """How many of this rank's transformer blocks run through torch.compile."""
    return sum(type(b).__name__ == "OptimizedModule" for p in parts for b in getattr(p, "layers", {}).values())


def _final_summary(val) -> dict:
    if isinstance(val, dict):  # DPO: the validation pairs' metrics
        return {"val_loss": val["loss"], **{f"val_{k}": v for k, v in val.items() if k != "loss"}}
    return {"val_loss": val}


def _log_samples(writer, step: int, seen: list[int], mesh) -> None:
    """Append the sorted global sample numbers of the step (all data-parallel ranks) to
    metrics.jsonl; ranks of one data-parallel replica share samples, so the union is taken."""
    import torch.distributed as dist

    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, seen)
    if writer.enabled:
        writer._emit({"kind": "samples", "step": step, "samples": sorted({i for part in everyone for i in part})})


def _fault_injection(step: int, rank: int) -> None:
    """Test hook: EXAPLAN_FAULT_KILL=RANK:STEP makes that rank SIGKILL itself after that step,
    as a crashed node would (tests/runtime/test_runtime_e2e.py)."""
    import os
    import signal

    spec = os.environ.get("EXAPLAN_FAULT_KILL")
    if spec:
        kill_rank, kill_step = (int(x) for x in spec.split(":"))
        if rank == kill_rank and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    from runtime.startup import exit_rank

    exit_rank(main())  # an exception still ends the rank with its traceback, as before
