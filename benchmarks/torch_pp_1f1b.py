"""Plain-torch pipeline baseline: 2 stages with torch.distributed.pipelining (PipelineStage with
static shapes, Schedule1F1B), the model split by hand (stage 0: the token embedding and the
first half of the blocks; stage 1: the other half, the final norm and the head), 4
micro-batches of 1 sequence per step; AdamW; the gradients clipped by the global norm (each
stage's squared norm allreduced over the 2 ranks). Both ranks hold the global batch of 4.

    torchrun --nproc-per-node 2 benchmarks/torch_pp_1f1b.py --steps 30 --out pp_1f1b.json
"""

import time

T_START = time.time()  # the script's first line: start-up is measured from here

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

MICROBATCHES = 4


def split(model, stage: int, stages: int) -> None:
    """Keep, in place, what pipeline stage `stage` of `stages` runs (blocks keep their global
    keys, so init_weights draws the same weights as in the whole model)."""
    n = len(model.layers)
    first, last = n * stage // stages, n * (stage + 1) // stages
    for key in [k for k in model.layers.keys() if not first <= int(k) < last]:
        del model.layers[key]
    if stage != 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if stage != stages - 1:
        model.norm = None
        model.output = None


def main(argv=None) -> int:
    args = common.parse_args(__doc__, argv)
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from runtime.model import loss_fn

    device, rank, world = common.setup()
    spec = common.model_spec()
    model = common.meta_model(spec)
    split(model, rank, world)
    common.materialise(model, spec, device, args.seed)
    mbs = common.GLOBAL_BATCH // MICROBATCHES
    hidden = torch.empty((mbs, common.SEQ_LEN, spec.hidden), device=device, requires_grad=True)
    x = torch.empty((mbs, common.SEQ_LEN), dtype=torch.long, device=device) if rank == 0 else hidden
    y = torch.empty((mbs, common.SEQ_LEN, spec.vocab_size), device=device, requires_grad=True) \
        if rank == world - 1 else hidden
    stage = PipelineStage(model, rank, world, device, input_args=(x,), output_args=(y,))
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)  # scale_grads: mean over them
    params = list(model.parameters())
    opt = common.adamw(params)
    inputs, targets = common.synthetic_batch(spec, common.GLOBAL_BATCH, args.seed, device)  # the same on both ranks

    def step():
        losses: list = []
        if rank == 0:
            schedule.step(inputs)
        else:
            schedule.step(target=targets, losses=losses)
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
        squared = norm.pow(2)
        dist.all_reduce(squared)  # the stages' squared norms: the whole model's
        torch.nn.utils.clip_grads_with_norm_(params, common.MAX_NORM, squared.sqrt())
        opt.step()
        opt.zero_grad(set_to_none=True)
        return torch.stack(losses).mean().detach() if losses else None

    times, first_end, losses = common.run_steps(step, args.steps, device)
    shared = [[float(x) for x in losses if x is not None]]
    dist.broadcast_object_list(shared, src=world - 1)  # the losses live on the last stage (after the timing)
    losses = shared[0]
    common.report(args, "pp_1f1b", T_START, times, first_end, losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
