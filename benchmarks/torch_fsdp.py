"""Plain-torch FSDP2 baseline: fully_shard on every block, then on the root
(reshard_after_forward=True, ZeRO-3), AdamW, clip_grad_norm_ (on the DTensor gradients); each
of the 2 ranks a micro-batch of 2 (no accumulation).

    torchrun --nproc-per-node 2 benchmarks/torch_fsdp.py --steps 30 --out fsdp.json
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
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device, rank, world = common.setup()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    spec = common.model_spec()
    model = common.meta_model(spec)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    common.materialise(model, spec, device, args.seed)
    params = list(model.parameters())
    opt = common.adamw(params)
    inputs, targets = common.synthetic_batch(spec, common.GLOBAL_BATCH // world, args.seed + rank, device)
    step = common.plain_step(model, inputs, targets, params, opt)
    times, first_end, losses = common.run_steps(step, args.steps, device)
    common.report(args, "fsdp", T_START, times, first_end, losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
