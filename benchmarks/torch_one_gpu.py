"""Plain-torch baseline on one device: the loop a user writes for one GPU. No wrapper; bf16
under torch.autocast on fp32 weights (flash attention through scaled_dot_product_attention),
gradient accumulation over micro-batches, torch's clip_grad_norm_, AdamW with torch's default
implementation (foreach on a GPU), zero_grad. One fixed random batch reused (as `exaplan run
--io-mode synthetic`). The workload is given on the command line (default: the demo's, fp32).

    torchrun --nproc-per-node 1 benchmarks/torch_one_gpu.py --model protein-3.5b --global-batch 32 \\
        --seq-len 512 --mbs 32 --precision bf16 --steps 15 --out one.json
"""

import time

T_START = time.time()  # the script's first line: start-up is measured from here

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    ap.add_argument("--out", help="JSON file for the result (default: print a line only)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the synthetic batch (default 0)")
    ap.add_argument("--model", default=common.MODEL, help=f"model preset (default {common.MODEL})")
    ap.add_argument("--global-batch", type=int, default=common.GLOBAL_BATCH, help="sequences per optimizer step")
    ap.add_argument("--seq-len", type=int, default=common.SEQ_LEN, help="tokens per sequence")
    ap.add_argument("--mbs", type=int, default=None, help="sequences per micro-batch (default: the global batch)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="compute precision (default fp32)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block (as `exaplan run --compile`)")
    args = ap.parse_args(argv)
    args.mbs = args.mbs or args.global_batch
    if args.steps < 1 or args.global_batch % args.mbs:
        ap.error("need --steps >= 1 and --mbs dividing --global-batch")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)  # before torch: --help answers at once
    import torch

    from planner.presets import get_model
    from runtime.model import loss_fn

    device, rank, world = common.setup()
    if world != 1:
        raise SystemExit("torch_one_gpu.py runs one rank (--nproc-per-node 1)")
    spec = get_model(args.model)
    spec.seq_len = max(spec.seq_len, args.seq_len)
    model = common.meta_model(spec)
    common.materialise(model, spec, device, args.seed)
    if args.compile:
        for key, block in list(model.layers.items()):
            model.layers[key] = torch.compile(block)
    params = list(model.parameters())
    opt = common.adamw(params)
    inputs, targets = common.synthetic_batch(spec, args.mbs, args.seed, device, args.seq_len)
    gas = args.global_batch // args.mbs
    dtype = torch.bfloat16 if args.precision == "bf16" else None

    def step():
        for _ in range(gas):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(inputs)
            loss = loss_fn(logits, targets) / gas
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, common.MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach() * gas

    times, first_end, losses = common.run_steps(step, args.steps, device)
    common.report(args, "one-gpu" + ("+compile" if args.compile else ""), T_START, times, first_end, losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
