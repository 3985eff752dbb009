"""Train the protein LM with the JAX backend: one process per host (or per device), all the
devices of the job in one mesh. Started by jaxrt/launch.py, which has set up JAX first.

The run writes what the torch runtime writes, in the same forms (runtime/metrics.py):
metrics.jsonl, TensorBoard events (when torch's writer is installed), summary.json
(measured against predicted, with `backend: jax`), checkpoints (jaxrt/checkpoint.py), and it
answers SIGUSR1 / SIGTERM the same way: finish the step, agree, save, exit 85.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxrt import checkpoint as ckpt
from jaxrt.data import GlobalBatches, SyntheticCounter
from jaxrt.model import attention_implementation, attention_in_use
from jaxrt.sharding import build_mesh
from jaxrt.step import Trainer, compute_dtype
from planner.schema.plan import Plan
from runtime.loader import Loader, TokenDataset
from runtime.metrics import MetricsWriter, truncate_after

VAL_SEED = 1234  # the torch runtime's validation stream


def peak_memory_bytes() -> int:
    """Peak memory per device: on GPUs the largest of this process's devices' peaks (XLA's
    allocator high-water mark, tensors only); on the CPU the process's resident-set high-water
    mark (runtime/metrics.py) divided by its devices, since one process holds them all."""
    devices = jax.local_devices()
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in devices]
    if any(peaks):
        return int(max(peaks))
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int((rss if sys.platform == "darwin" else rss * 1024) / len(devices))


class Run:
    """One JAX run: the mesh, the compiled steps, the data, the writer, the state."""

    def __init__(self, args, plan: Plan, prepared: Path | None):
        self.args, self.plan, self.out = args, plan, Path(args.out)
        self.main = jax.process_index() == 0
        self.mesh = build_mesh(plan)
        self.trainer = Trainer(plan, self.mesh, lr=args.lr, warmup=args.warmup, steps=args.steps)
        mbs, gas, seq, dp = plan.micro_batch_size, plan.grad_accumulation_steps, plan.job.seq_len, plan.mesh.dp
        if args.io_mode == "synthetic":
            loader = SyntheticCounter(seq, mbs, dp, args.seed, grad_accumulation=gas)
        else:
            loader = Loader(TokenDataset(prepared, "train"), seq_len=seq, micro_batch=mbs, dp_rank=0, dp_size=dp,
                            seed=args.seed, grad_accumulation=gas)
        self.batches = GlobalBatches(loader, self.trainer.shardings.batch, synthetic=args.io_mode == "synthetic")
        self.val_set = TokenDataset(prepared, "validation") if prepared is not None else None
        self.mgr = ckpt.manager(self.out / "checkpoints")
        self.state = None
        self.start_step = 0

    def init_or_resume(self) -> None:
        self.state = self.trainer.init_state(self.args.seed)
        if self.args.init and not self.args.resume:
            params = ckpt.load_torch_weights(self.args.init, self.trainer.param_shapes)
            self.state = self.trainer.state_from_params(params)
        if self.args.resume:
            self.state, meta = ckpt.restore(self.mgr, self.state)
            self.start_step = int(meta["step"])
            self.batches.loader.load_state_dict(meta["loader"])

    def save(self, step: int) -> None:
        if self.mgr.latest_step() == step:  # saved already (--ckpt-every at the last step, a resume at the end)
            return
        meta = {"step": step, "loader": self.batches.loader.state_dict(), "backend": "jax",
                "plan_hash": self.plan.provenance.content_hash, "mesh": self.plan.mesh.model_dump()}
        ckpt.save(self.mgr, step, self.state, meta)

    def validate(self) -> float | None:
        if self.val_set is None:
            return None
        plan = self.plan
        loader = Loader(self.val_set, seq_len=plan.job.seq_len, micro_batch=plan.micro_batch_size, dp_rank=0,
                        dp_size=plan.mesh.dp, seed=VAL_SEED, grad_accumulation=plan.grad_accumulation_steps)
        batches = GlobalBatches(loader, self.trainer.shardings.batch)
        losses = [float(self.trainer.eval_step(self.state["params"], batches.next()))
                  for _ in range(self.args.val_batches)]
        return sum(losses) / len(losses)


def stop_agreed(stop) -> bool:
    """Whether any process saw a stop signal (one tiny all-gather across processes)."""
    mine = bool(stop is not None and stop.requested)
    if jax.process_count() == 1:
        return mine
    return bool(np.max(multihost_utils.process_allgather(np.array([int(mine)], np.int32))))


def train(args, plan: Plan, prepared: Path | None, stop=None) -> int:
    """The run's loop (the torch runtime's order: step, log, validate, checkpoint; at the end
    validation, the last checkpoint, the summary). Returns 0 or EXIT_REQUEUE."""
    from runtime.options import EXIT_REQUEUE
    from runtime.walltime import write_stopped

    run = Run(args, plan, prepared)
    run.init_or_resume()
    if run.main:
        if args.resume:  # the steps a resume repeats are logged again: drop their records
            truncate_after(run.out / "metrics.jsonl", run.start_step)
        else:  # a fresh run starts a fresh log
            (run.out / "metrics.jsonl").unlink(missing_ok=True)
    writer = MetricsWriter(run.out, plan, enabled=run.main, device=jax.devices()[0].platform,
                           purge_step=run.start_step if args.resume else None)
    if run.main:
        dev = jax.devices()[0]
        print(f"jax {jax.__version__}: {jax.device_count()} x {dev.device_kind} ({dev.platform}), attention "
              f"{attention_implementation(compute_dtype(plan))}", flush=True)
    if args.resume:
        writer.log_event("resume", run.start_step, sample=run.batches.loader.samples_consumed, backend="jax")
    tokens = plan.job.global_batch * plan.job.seq_len
    for step in range(run.start_step, args.steps):
        t0 = time.perf_counter()
        run.state, m = run.trainer.train_step(run.state, run.batches.next())
        loss, grad_norm = (float(v) for v in jax.device_get((m["loss"], m["grad_norm"])))  # waits for the step
        step_time = time.perf_counter() - t0
        lr = run.trainer.lr_at(step)
        writer.log_step(step, loss, tokens, step_time, peak_memory_bytes(), lr=lr, grad_norm=grad_norm)
        if step == run.start_step:  # the step is traced: say so where cuDNN's attention refused it
            _report_attention(run, writer, step)
        if run.main and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:5d}  loss {loss:.4f}  {step_time * 1e3:8.1f} ms/step", flush=True)
        _fault_injection(step)
        if stop_agreed(stop):
            run.save(step + 1)
            reason = (stop.requested if stop else None) or "a signal on another process"
            info = {"reason": reason, "resume_step": step + 1, "checkpoint": str(run.mgr.directory),
                    "exit_code": EXIT_REQUEUE}
            writer.log_event("stop", step, **info)
            writer.finish({"stopped": info, "backend": "jax"})
            if run.main:
                write_stopped(run.out, reason, step, Path(run.mgr.directory), EXIT_REQUEUE)
                print(f"stopped by {reason} after step {step}: checkpoint saved; exit {EXIT_REQUEUE} "
                      f"(requeue with --resume)", flush=True)
            return EXIT_REQUEUE
        if args.val_every and (step + 1) % args.val_every == 0 and step + 1 < args.steps:
            writer.log_validation(step, run.validate())
        if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            run.save(step + 1)
    val = run.validate()
    if not getattr(args, "no_final_checkpoint", False):
        run.save(args.steps)
    writer.finish({"val_loss": val, "backend": "jax"})
    return 0


def _report_attention(run, writer, step: int) -> None:
    """The start-up line names the kernel asked for; where cuDNN's refused the traced shapes
    and XLA's einsums ran instead, a line and a metrics event say so."""
    used = attention_in_use(compute_dtype(run.plan))
    if used != attention_implementation(compute_dtype(run.plan)):
        writer.log_event("attention", step, kernel=used)
        if run.main:
            print(f"attention: {used}", flush=True)


def _fault_injection(step: int) -> None:
    """Test hook, as the torch runtime's: EXAPLAN_FAULT_KILL=PROCESS:STEP makes that process
    SIGKILL itself after that step, as a crashed node would (tests/jaxrt/test_jax_run.py)."""
    import os
    import signal

    spec = os.environ.get("EXAPLAN_FAULT_KILL")
    if spec:
        who, when = (int(x) for x in spec.split(":"))
        if jax.process_index() == who and step == when:
            os.kill(os.getpid(), signal.SIGKILL)
