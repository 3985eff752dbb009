"""What one lent GPU shows that a CPU cannot (issue 14, item 5), in one call of a few minutes:

    python3 -m benchmarks.gpu_check --out DIR [--plans A.yaml,B.yaml] [--rounds 2] [--steps 12]
        [--warmup 4] [--quick]

1. The device and its two ceilings, measured: a bf16 8192^3 matrix product on random data and
   a 2 GiB device-to-device copy (bytes read + written), CUDA events, median of 10 after 3
   warm-ups.
2. Flash attention: one forward + backward of one protein-3.5b block under bf16 autocast in
   torch.profiler; the attention kernels it ran (a flash kernel must be among them).
3. Each plan (default: plans/gpu/demo_1gpu.yaml, the runtime benchmark's workload on one GPU,
   and the planner's one-GPU protein-3.5b plan for this card, plans/gpu/protein-3.5b_1xh200.yaml
   or _1xh100.yaml by the card's memory) run R interleaved rounds by `exaplan run PLAN
   --io-mode synthetic --no-final-checkpoint` (A) and by benchmarks/torch_one_gpu.py, the
   plain-torch loop of the same workload (B). Reported: median and fastest step (the first
   --warmup steps of each run dropped), start-up to the end of the first step (from the
   launch), and MFU measured (the plan's model FLOPs per step over the median step, over the
   plan's peak) against the plan's predicted step time and MFU.

A plan made with `--backend jax` runs on the JAX backend (`exaplan run` reads the plan's
backend; run it with --exaplan-only: the plain loop is torch's): `make bench-gpu-jax`.

Writes DIR/gpu_check.json and DIR/gpu_check.md and prints the table last. Without a GPU it
needs --plans: it runs them on the CPU and skips 1 and 2 (the test does that with a tiny plan);
without either, exit 2. Exit 0, or 1 when a run failed (the others still reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.runtime_vs_torch import ROOT, RunFailed, launch, read_step_records  # noqa: E402

PLANS = ROOT / "plans" / "gpu"


def log(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--plans", help="comma-separated plan files (default: the demo's and this card's 3.5b plan)")
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per plan (default 2)")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per run (default 12)")
    ap.add_argument("--warmup", type=int, default=4, help="first steps of every run left out (default 4)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take (default 300)")
    ap.add_argument("--quick", action="store_true", help="1 round of 4 steps, 1 warm-up step")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block on both sides "
                    "(exaplan run --compile; the plain loop the same way)")
    ap.add_argument("--skip-device", action="store_true", help="skip the ceilings and the attention probe")
    ap.add_argument("--exaplan-only", action="store_true", help="run exaplan alone, not the plain-torch loop "
                    "(measured against predicted only)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 4, 1
    if args.rounds < 1 or not 0 <= args.warmup < args.steps:
        ap.error("need --rounds >= 1 and 0 <= --warmup < --steps")
    return args


def median_event_ms(fn, reps: int = 10, warm: int = 3) -> float:
    import torch

    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _nccl_version() -> str:
    import torch

    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 (a build without NCCL)
        return "none"
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def device_and_ceilings() -> dict:
    """The card, torch's versions, and the measured bf16 GEMM rate and copy bandwidth."""
    import torch

    p = torch.cuda.get_device_properties(0)
    info = {"device": p.name, "memory_gib": p.total_memory / 2**30, "sms": p.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "nccl": _nccl_version()}
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    info["gemm_bf16_8192_tflops"] = 2 * n**3 / (median_event_ms(lambda: a @ b) * 1e-3) / 1e12
    src = torch.randn(2**29, device="cuda")  # 2 GiB of fp32
    dst = torch.empty_like(src)
    info["copy_tbyte_s"] = 2 * src.numel() * 4 / (median_event_ms(lambda: dst.copy_(src)) * 1e-3) / 1e12
    del a, b, src, dst
    torch.cuda.empty_cache()
    return info


def attention_kernels() -> dict:
    """One protein-3.5b block, forward + backward under bf16 autocast, profiled: the kernels
    whose names say attention, and the top kernels by CUDA time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from planner.presets import get_model
    from runtime.model import ProteinLM, init_weights

    spec = get_model("protein-3.5b").model_copy(update={"layers": 1})
    with torch.device("meta"):
        model = ProteinLM(spec)
    model.to_empty(device="cuda")
    init_weights(model, spec, 0)
    model.setup_rope(torch.device("cuda"))
    x = torch.randint(1, spec.vocab_size, (8, spec.seq_len), device="cuda")

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        logits.float().sum().backward()

    fwd_bwd()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd_bwd()
        torch.cuda.synchronize()
    events = [(e.key, e.device_time_total) for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda kv: -kv[1])
    names = [k for k, _ in events]
    attn = [k for k in names if any(s in k.lower() for s in ("flash", "fmha", "attention", "sdpa"))]
    del model
    torch.cuda.empty_cache()
    return {"attention_kernels": attn, "flash": any("flash" in k.lower() for k in attn),
            "top_kernels_us": [[k[:90], round(t, 1)] for k, t in events[:10]]}


def default_plans() -> list[Path]:
    import torch

    big = torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory > 100 * 2**30
    return [PLANS / "demo_1gpu.yaml", PLANS / f"protein-3.5b_1x{'h200' if big else 'h100'}.yaml"]


def _steps(rec_times: list[float], warmup: int) -> dict:
    t = rec_times[warmup:] or rec_times
    return {"median_s": statistics.median(t), "min_s": min(t)}


def run_pair(plan_path: Path, out: Path, args, env: dict) -> dict:
    """R interleaved rounds of exaplan run (A) and the plain-torch loop (B) on one plan."""
    import yaml

    plan = yaml.safe_load(plan_path.read_text())
    job, name = plan["job"], plan_path.stem + ("+compile" if args.compile else "")
    torch_args = [*(["--compile"] if args.compile else []), "--model", plan["model"]["name"], "--global-batch", str(job["global_batch"]),
                  "--seq-len", str(job["seq_len"]), "--mbs", str(plan["micro_batch_size"]),
                  "--precision", job["precision"], "--steps", str(args.steps)]
    runs: dict[str, list] = {"exaplan": []} if args.exaplan_only else {"exaplan": [], "torch": []}
    for r in range(args.rounds):
        for side in (("exaplan", "torch") if r % 2 == 0 else ("torch", "exaplan")):
            if side not in runs:
                continue
            tag = f"{name}-r{r + 1}-{side}"
            lg = out / "logs" / f"{tag}.log"
            log(f"{name} round {r + 1}/{args.rounds}: {side}")
            if side == "exaplan":
                run_dir = out / "runs" / tag
                cmd = [sys.executable, "-m", "cli", "run", str(plan_path), "--steps", str(args.steps), "--io-mode",
                       "synthetic", "--out", str(run_dir), "--val-every", "0", "--val-batches", "1",
                       "--log-every", str(args.steps), "--no-final-checkpoint", *(["--compile"] if args.compile else [])]
                t_launch, wall = launch(cmd, lg, env, args.timeout)
                steps = read_step_records(run_dir / "metrics.jsonl")
                if not steps:
                    raise RunFailed(f"{run_dir}/metrics.jsonl: no step records (log {lg})")
                summary = json.loads((run_dir / "summary.json").read_text())
                rec = {"step_times_s": [s["step_time_s"] for s in steps],
                       "startup_s": steps[0]["time"] - t_launch, "wall_s": wall,
                       "peak_memory_gib": summary.get("peak_memory_gib")}
            else:
                result = out / "runs" / f"{tag}.json"
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                       "--nproc-per-node", "1", "--max-restarts", "0", "-m", "benchmarks.torch_one_gpu",
                       *torch_args, "--out", str(result)]
                t_launch, wall = launch(cmd, lg, env, args.timeout)
                r_ = json.loads(result.read_text())
                rec = {"step_times_s": r_["step_times_s"], "startup_s": r_["first_step_end_time"] - t_launch,
                       "wall_s": wall}
            rec.update(_steps(rec["step_times_s"], args.warmup))
            log(f"  median {rec['median_s'] * 1e3:.1f} ms, min {rec['min_s'] * 1e3:.1f} ms, "
                f"start-up {rec['startup_s']:.1f} s")
            runs[side].append(rec)
    return {"plan": str(plan_path), "runs": runs, **compare(plan, runs, predicted_step_s(plan_path, args.compile, env))}


def predicted_step_s(plan_path: Path, compiled: bool, env: dict | None = None) -> float:
    """The plan's predicted step, or with --compile on a plan predicted for eager blocks the
    compiled prediction of the same plan: its own command (provenance.command) rerun by the
    CLI with --compile into a temporary file (the planner is not imported here)."""
    import shlex
    import subprocess
    import tempfile

    import yaml

    plan = yaml.safe_load(plan_path.read_text())
    framework = plan["job"]["framework"]
    if not compiled or plan.get("compile") or framework.get("eager_bytes_per_element") is None:
        return plan["prediction"]["step_time_s"]
    argv = shlex.split(plan["provenance"]["command"])[1:]  # drop "exaplan"
    if "-o" in argv:
        i = argv.index("-o")
        del argv[i:i + 2]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compiled.yaml"
        subprocess.run([sys.executable, "-m", "cli", *argv, "--compile", "-o", str(out)], cwd=ROOT, env=env,
                       check=True, capture_output=True, timeout=300)
        return yaml.safe_load(out.read_text())["prediction"]["step_time_s"]


def compare(plan: dict, runs: dict, step_s: float | None = None) -> dict:
    """Ratios (exaplan over torch, best of the rounds) and MFU measured against predicted
    (`step_s`: the predicted step, default the plan's)."""
    pred = dict(plan["prediction"])
    if step_s is not None:
        pred["mfu"] *= pred["step_time_s"] / step_s
        pred["step_time_s"] = step_s
    peak = plan["machine"]["peak_tflops"][plan["job"]["precision"]] * 1e12
    best = {side: {k: min(r[k] for r in rs) for k in ("median_s", "min_s", "startup_s")} for side, rs in runs.items()}
    out = {"best": best, "predicted_step_s": pred["step_time_s"], "predicted_mfu": pred["mfu"]}
    if "torch" in best:
        out.update(ratio_median=best["exaplan"]["median_s"] / best["torch"]["median_s"],
                   ratio_min=best["exaplan"]["min_s"] / best["torch"]["min_s"])
    for side in runs:
        out[f"mfu_{side}"] = pred["model_flops_per_step"] / best[side]["median_s"] / peak
    out["step_error"] = best["exaplan"]["median_s"] / pred["step_time_s"] - 1
    return out


def table(results: dict) -> str:
    lines = []
    dev = results.get("device") or {}
    if dev:
        lines.append(f"{dev['device']} ({dev['memory_gib']:.0f} GiB), torch {dev['torch']}, CUDA {dev['cuda']}, "
                     f"NCCL {dev['nccl']}: bf16 GEMM 8192^3 {dev['gemm_bf16_8192_tflops']:.0f} TFLOP/s, "
                     f"copy {dev['copy_tbyte_s']:.2f} TB/s")
    att = results.get("attention")
    if att:
        lines.append(f"flash attention: {'yes' if att['flash'] else 'NO'} ({', '.join(a[:60] for a in att['attention_kernels'][:3])})")
    lines += ["", "| plan | exaplan median / min (ms) | torch median / min (ms) | ratio median / min | "
              "start-up exaplan / torch (s) | MFU exaplan / torch | predicted step (ms), MFU | step error |",
              "|---|---|---|---|---|---|---|---|"]
    for name, c in results["plans"].items():
        e = c["best"]["exaplan"]
        t = c["best"].get("torch")
        if t is None:  # --exaplan-only
            lines.append(f"| {name} | {e['median_s'] * 1e3:.1f} / {e['min_s'] * 1e3:.1f} | - | - | {e['startup_s']:.1f} / - "
                         f"| {c['mfu_exaplan']:.1%} / - | {c['predicted_step_s'] * 1e3:.1f}, {c['predicted_mfu']:.1%} | "
                         f"{c['step_error']:+.1%} |")
            continue
        lines.append(f"| {name} | {e['median_s'] * 1e3:.1f} / {e['min_s'] * 1e3:.1f} | {t['median_s'] * 1e3:.1f} / "
                     f"{t['min_s'] * 1e3:.1f} | {c['ratio_median']:.3f} / {c['ratio_min']:.3f} | {e['startup_s']:.1f} / "
                     f"{t['startup_s']:.1f} | {c['mfu_exaplan']:.1%} / {c['mfu_torch']:.1%} | "
                     f"{c['predicted_step_s'] * 1e3:.1f}, {c['predicted_mfu']:.1%} | {c['step_error']:+.1%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import os

    args = parse_args(argv)
    import torch

    if not args.plans and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; its default plans are for one H100 / H200 "
              "(on a CPU, --plans PLAN[,PLAN] --skip-device compares given plans)", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"config": vars(args), "plans": {}, "failures": []}
    if torch.cuda.is_available() and not args.skip_device:
        for key, fn in (("device", device_and_ceilings), ("attention", attention_kernels)):
            try:
                results[key] = fn()
                log(f"{key}: {json.dumps(results[key])[:400]}")
            except Exception as e:  # noqa: BLE001 (report it and go on to the runs)
                results["failures"].append({"plan": key, "error": repr(e)})
                log(f"FAILED {key}: {e!r}")
    plans = [Path(p) for p in args.plans.split(",")] if args.plans else default_plans()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for plan in plans:
        try:
            results["plans"][plan.stem + ("+compile" if args.compile else "")] = run_pair(plan, out, args, env)
        except (RunFailed, OSError, KeyError, ValueError) as e:
            results["failures"].append({"plan": plan.stem, "error": str(e)})
            log(f"FAILED {plan.stem}: {e}")
        (out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    text = table(results)
    (out / "gpu_check.md").write_text(text + "\n")
    print(text)
    for f in results["failures"]:
        print(f"FAILED {f['plan']}: {f['error'][-1500:]}")
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
