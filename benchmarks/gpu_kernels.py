"""The kernels a training step is made of, timed one by one on one GPU (issue 10: the cost
model's per-kernel figures against measurements nobody fitted them to):

    python3 -m benchmarks.gpu_kernels --out DIR [--quick]

1. GEMMs (cuBLAS through torch.matmul, bf16 in and out, random data): square sizes 256-16,384,
   and the forward, input-gradient and weight-gradient GEMMs of the Megatron-LM README's
   weak-scaling models on one tensor-parallel rank (calibration section A: hidden 2,048-18,432,
   4,096 tokens a micro-batch, tensor parallelism 1-8, GPT MLP of 4 x hidden).
2. Causal attention forward and forward + backward through torch's scaled_dot_product_attention,
   each of its fused backends forced in turn: FLASH_ATTENTION (FlashAttention-2), CUDNN_ATTENTION
   (cuDNN's fused attention, the kernel Transformer Engine prefers on Hopper) and
   EFFICIENT_ATTENTION (memory-efficient, CUTLASS), head dimensions 64 and 128, sequences
   512-16,384 at 16,384 tokens a call (FlashAttention-2's benchmark shape: hidden 2,048).
   Rates count the causal half: forward 2 GEMMs, backward 2.5 x forward (Dao 2023).
3. Fused elementwise work (torch.compile): residual add + RMSNorm and SwiGLU, forward +
   backward, bf16, at the bytes the cost model counts for them (planner/cost/compute.py
   token_elements: 2 + 3 accesses of the residual stream forward, 1.5 x that backward).

4. The loss over one micro-batch's logits (4,096 tokens, vocabulary 131,072 over tp 1-8):
   Megatron's vocab-parallel cross-entropy op by op, and torch's F.cross_entropy on fp32
   logits, forward + backward, at the 48 bytes a logit the cost model counts.
5. exaplan's own model as its one-GPU protein-3.5b plan runs it (4 of its blocks), eager and
   compiled: GPU kernel time by kind (GEMM, attention, other) against the wall time.

Every figure is GPU kernel time per call (torch.profiler, summed over 10 calls after
warm-ups): what a call costs where the host runs ahead of the device, as in a training step. Writes DIR/gpu_kernels.json
and prints a summary. Needs a CUDA device (exit 2 without one); parts 1-4 import torch alone, part 5 the runtime.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_check import median_event_ms as median_ms  # noqa: E402

SQUARES = (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
# Section A's models (calibration/data/published/megatron-lm-readme.yaml): hidden size, tensor parallelism.
SECTION_A = ((2048, 1), (4096, 2), (6144, 4), (7168, 8), (8192, 8), (10240, 8), (12288, 8), (16384, 8),
             (18432, 8))
TOKENS = 4096
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
ATTN_TOKENS = 16384
ATTN_HIDDEN = 2048
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
ELEMENTWISE = ((4096, 2048), (4096, 4096), (8192, 4096), (16384, 8192))  # tokens, hidden


def log(msg: str) -> None:
    print(f"[gpu-kernels {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def kernel_ms(fn, reps: int = 10, warm: int = 3) -> float:
    """Milliseconds of GPU kernel time per call (torch.profiler: the sum of the kernels' own
    device time over `reps` calls, / reps): what the call costs where the host runs ahead of the
    device, as in a training step, free of the launch gaps a lone small call shows."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / reps


def device_info() -> dict:
    import torch

    p = torch.cuda.get_device_properties(0)
    info = {"device": p.name, "sms": p.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    try:
        q = "power.limit,clocks.max.sm,clocks.max.mem,driver_version"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        info["nvidia_smi"] = dict(zip(q.split(","), (s.strip() for s in out.split(","))))
    except (OSError, subprocess.SubprocessError) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    return info


def gemm_ms(m: int, n: int, k: int, reps: int) -> float:
    """(m x k) @ (k x n), bf16."""
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    return kernel_ms(lambda: a @ b, reps=reps)


def gemm_shapes(hidden: int, tp: int) -> dict[str, tuple[int, int, int]]:
    """One block's GEMMs on one tensor-parallel rank, (m, n, k): forward, then each one's input
    gradient (dgrad) and weight gradient (wgrad)."""
    fwd = {"qkv": (TOKENS, 3 * hidden // tp, hidden), "proj": (TOKENS, hidden, hidden // tp),
           "fc1": (TOKENS, 4 * hidden // tp, hidden), "fc2": (TOKENS, hidden, 4 * hidden // tp)}
    out = {}
    for name, (m, n, k) in fwd.items():
        out[f"{name}.fwd"] = (m, n, k)
        out[f"{name}.dgrad"] = (m, k, n)
        out[f"{name}.wgrad"] = (k, n, m)
    return out


def gemms(reps: int) -> dict:
    import torch

    squares = []
    for s in SQUARES:
        ms = gemm_ms(s, s, s, reps)
        squares.append({"size": s, "ms": ms, "tflops": 2 * s**3 / ms / 1e9})
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    wall = median_ms(lambda: a @ a, reps=reps)  # CUDA events around one call: the check of kernel_ms
    blocks = []
    for hidden, tp in SECTION_A:
        shapes = gemm_shapes(hidden, tp)
        rows = {}
        for name, (m, n, k) in shapes.items():
            ms = gemm_ms(m, n, k, reps)
            rows[name] = {"m": m, "n": n, "k": k, "ms": ms, "tflops": 2 * m * n * k / ms / 1e9}
        fwd = sum(r["ms"] for name, r in rows.items() if name.endswith(".fwd"))
        total = sum(r["ms"] for r in rows.values())
        blocks.append({"hidden": hidden, "tp": tp, "tokens": TOKENS, "gemms": rows, "forward_ms": fwd,
                       "forward_backward_ms": total})
    return {"squares": squares, "section_a_blocks": blocks, "square_8192_event_tflops": 2 * 8192**3 / wall / 1e9}


def attention(reps: int) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for hd in HEAD_DIMS:
        heads = ATTN_HIDDEN // hd
        for s in SEQS:
            batch = max(ATTN_TOKENS // s, 1)
            q, k, v = (torch.randn(batch, heads, s, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn(batch, heads, s, hd, device="cuda", dtype=torch.bfloat16)
            fwd_flops = 4.0 * batch * heads * s * s * hd / 2  # causal half
            for name in BACKENDS:
                backend = getattr(SDPBackend, name)
                row = {"backend": name, "head_dim": hd, "seq": s, "batch": batch, "heads": heads}
                try:
                    with sdpa_kernel(backend):
                        fwd = kernel_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps)

                        def fwd_bwd():
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                            torch.autograd.grad(o, (q, k, v), dout)

                        both = kernel_ms(fwd_bwd, reps)
                    row.update(fwd_ms=fwd, fwd_bwd_ms=both, fwd_tflops=fwd_flops / fwd / 1e9,
                               bwd_tflops=2.5 * fwd_flops / max(both - fwd, 1e-6) / 1e9,
                               fwd_bwd_tflops=3.5 * fwd_flops / both / 1e9)
                except RuntimeError as exc:  # a backend that does not take this shape
                    row["error"] = str(exc).splitlines()[0][:200]
                out.append(row)
                log(f"attention {name} hd{hd} s{s}: {row.get('fwd_bwd_tflops', float('nan')):.0f} TFLOP/s")
            del q, k, v, dout
            torch.cuda.empty_cache()
    return out


def elementwise(reps: int) -> list[dict]:
    """Residual add + RMSNorm and SwiGLU, compiled, forward + backward. Bytes as the cost
    model counts them: the norm + residual pair 2 + 3 accesses of the stream forward, SwiGLU
    3 of the ffn width (gate and up read, product written); backward 1.5 x forward."""
    import torch
    import torch.nn.functional as F

    def norm_residual(x, res, w):
        y = x + res
        yf = y.float()
        return (yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(y.dtype) * w, y

    def swiglu(g, u):
        return F.silu(g) * u

    cn, cs = torch.compile(norm_residual), torch.compile(swiglu)
    out = []
    for tokens, hidden in ELEMENTWISE:
        bf = dict(device="cuda", dtype=torch.bfloat16)
        x, res = (torch.randn(tokens, hidden, **bf, requires_grad=True) for _ in range(2))
        w = torch.randn(hidden, **bf, requires_grad=True)
        dy = torch.randn(tokens, hidden, **bf)

        def norm_step():
            y, s = cn(x, res, w)
            torch.autograd.grad((y, s), (x, res, w), (dy, dy))

        ffn = 4 * hidden
        g, u = (torch.randn(tokens, ffn, **bf, requires_grad=True) for _ in range(2))
        dz = torch.randn(tokens, ffn, **bf)

        def swiglu_step():
            torch.autograd.grad(cs(g, u), (g, u), dz)

        norm_ms, glu_ms = kernel_ms(norm_step, reps), kernel_ms(swiglu_step, reps)
        counted = 2 * (5 * tokens * hidden + 3 * tokens * ffn) * 2.5  # bytes fwd + 1.5 x bwd
        out.append({"tokens": tokens, "hidden": hidden, "norm_residual_ms": norm_ms, "swiglu_ms": glu_ms,
                    "counted_bytes": counted, "counted_tbyte_s": counted / (norm_ms + glu_ms) / 1e9})
        log(f"elementwise t{tokens} h{hidden}: {out[-1]['counted_tbyte_s']:.2f} TB/s on the counted bytes")
        del x, res, w, dy, g, u, dz
        torch.cuda.empty_cache()
    return out


def vocab_parallel_loss(logits, target):
    """Megatron's vocab-parallel cross-entropy on one rank, op by op (tensor_parallel/
    cross_entropy.py, the all-reduces left out): fp32 cast, max, subtract, exp, sum, log, the
    target's logit; backward softmax - one-hot, cast back."""
    import torch

    x = logits.float()
    x = x - x.max(dim=-1, keepdim=True).values
    e = x.exp()
    s = e.sum(dim=-1, keepdim=True)
    picked = x.gather(-1, target[:, None])
    return (s.log() - picked).mean()


def loss(reps: int) -> list[dict]:
    """The loss over a micro-batch's logits (4,096 tokens, vocabulary 131,072 split over tp
    1-8): Megatron's op-by-op fp32 cross-entropy and torch's F.cross_entropy on fp32 logits,
    forward + backward from bf16 logits; bytes as the cost model counts them, 48 a logit
    (planner/cost/compute.py LOSS_ACCESSES_PER_LOGIT: 12 fp32 passes)."""
    import torch
    import torch.nn.functional as F

    out = []
    for tp in (1, 2, 4, 8):
        vocab = 131072 // tp
        logits = torch.randn(TOKENS, vocab, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        target = torch.randint(0, vocab, (TOKENS,), device="cuda")
        row = {"tokens": TOKENS, "vocab": vocab, "counted_bytes": 48.0 * TOKENS * vocab}
        for name, fn in (("megatron_ops", vocab_parallel_loss),
                         ("torch_cross_entropy_fp32", lambda x, t: F.cross_entropy(x.float(), t))):
            ms = kernel_ms(lambda: torch.autograd.grad(fn(logits, target), logits), reps)
            row[f"{name}_ms"] = ms
            row[f"{name}_tbyte_s"] = row["counted_bytes"] / ms / 1e9
        out.append(row)
        log(f"loss vocab {vocab}: {row['megatron_ops_tbyte_s']:.2f} / {row['torch_cross_entropy_fp32_tbyte_s']:.2f} TB/s")
        del logits, target
        torch.cuda.empty_cache()
    return out


STEP_LAYERS = 4
GEMM_KERNELS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_")
ATTENTION_KERNELS = ("flash", "fmha", "sdpa", "attention")


def kernel_category(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ATTENTION_KERNELS):
        return "attention"
    if any(k in low for k in GEMM_KERNELS):
        return "gemm"
    return "other"


def step(reps: int) -> list[dict]:
    """exaplan's own model (runtime.model.ProteinLM) as protein-3.5b's one-GPU H100 plan runs
    it (micro-batch 8 x 512 tokens, bf16 autocast over fp32 weights), cut to STEP_LAYERS blocks:
    forward + backward, eager and with each block compiled; GPU kernel time by kind (GEMM,
    attention, other) against the events' wall time. Needs the repository's runtime (pydantic)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from planner.presets import get_model
    from runtime.model import ProteinLM, init_weights

    spec = get_model("protein-3.5b").model_copy(update={"layers": STEP_LAYERS})
    out = []
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        with torch.device("meta"):
            model = ProteinLM(spec)
        model.to_empty(device="cuda")
        init_weights(model, spec, 0)
        model.setup_rope(torch.device("cuda"))
        if mode == "compiled":
            for name, block in list(model.layers.items()):
                model.layers[name] = torch.compile(block)
        x = torch.randint(1, spec.vocab_size, (8, spec.seq_len), device="cuda")

        def fwd_bwd():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
            logits.float().sum().backward()

        wall = median_ms(fwd_bwd, reps)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fwd_bwd()
            torch.cuda.synchronize()
        kinds = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
        top = []
        for e in prof.key_averages():
            ms = e.self_device_time_total / 1e3 / reps
            kinds[kernel_category(e.key)] += ms
            if ms > 0:
                top.append([e.key[:100], round(ms, 4)])
        top.sort(key=lambda kv: -kv[1])
        out.append({"mode": mode, "layers": STEP_LAYERS, "micro_batch": 8, "seq": spec.seq_len, "wall_ms": wall,
                    "kernel_ms": kinds, "kernel_total_ms": sum(kinds.values()), "top_kernels_ms": top[:16]})
        log(f"step {mode}: wall {wall:.2f} ms, kernels {kinds}")
        del model
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (gpu_kernels.json)")
    ap.add_argument("--quick", action="store_true", help="3 timed repetitions instead of 10")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: gemm, attention, elementwise, loss, step")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_kernels: needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_kernels: needs a CUDA device (none visible)", file=sys.stderr)
        return 2
    reps, skip = (3 if args.quick else 10), set(filter(None, args.skip.split(",")))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": device_info()}
    log(f"{result['device']}")
    parts = {"gemm": gemms, "attention": attention, "elementwise": elementwise, "loss": loss, "step": step}
    for name, fn in parts.items():
        if name in skip:
            continue
        t0 = time.time()
        try:
            result[name] = fn(reps)
        except Exception as exc:  # noqa: BLE001 (report what ran; one part failing keeps the others)
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        log(f"{name}: {time.time() - t0:.0f} s")
        (out_dir / "gpu_kernels.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
