"""Plain-torch DDP baseline: DistributedDataParallel (bucket_cap_mb=25, gradient_as_bucket_view),
AdamW, clip_grad_norm_; each of the 2 ranks a micro-batch of 2 (no accumulation).

    torchrun --nproc-per-node 2 benchmarks/torch_ddp.py --steps 30 --out ddp.json
"""

import time

T_START = time.time()  # the script's first line: start-up is measured from here

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402


def main(argv=None) -> int:
    args = common.parse_args(__doc__, argv)
    device, rank, world = common.setup()
    spec = common.model_spec()
    model = common.meta_model(spec)
    common.materialise(model, spec, device, args.seed)
    ddp = common.ddp(model, device)
    params = list(ddp.parameters())
    opt = common.adamw(params)
    inputs, targets = common.synthetic_batch(spec, common.GLOBAL_BATCH // world, args.seed + rank, device)
    step = common.plain_step(ddp, inputs, targets, params, opt)
    times, first_end, losses = common.run_steps(step, args.steps, device)
    common.report(args, "ddp", T_START, times, first_end, losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
