"""Plain-torch tensor + sequence parallelism baseline: parallelize_module over a 2-rank mesh with
the Megatron plan exaplan applies (runtime/parallel/tensor.py, written out here): per block
wq/wk/wv and w1/w3 ColwiseParallel, wo and w2 RowwiseParallel onto the sequence, the two norms
SequenceParallel; the token embedding RowwiseParallel onto the sequence, the final norm
SequenceParallel, the head ColwiseParallel with the logits gathered. AdamW, clip_grad_norm_ on
the DTensor gradients. Both ranks take the whole global batch of 4 (no accumulation).

    torchrun --nproc-per-node 2 benchmarks/torch_tp_sp.py --steps 30 --out tp_sp.json
"""

import time

T_START = time.time()  # the script's first line: start-up is measured from here

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402


def tensor_parallel(model, mesh) -> None:
    """Shard the meta-device ProteinLM (rope, SwiGLU, untied head) over `mesh`, sequence
    parallel: between blocks each rank holds its half of the sequence as a plain tensor."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    spec = model.spec
    assert spec.position == "rope" and spec.activation == "swiglu" and not spec.tied_embeddings, spec
    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True),
    })
    for block in model.layers.values():
        # The block's input arrives as this rank's sequence slice, a plain tensor.
        parallelize_module(block, mesh, PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Shard(1), None), use_local_output=True))
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })


def main(argv=None) -> int:
    args = common.parse_args(__doc__, argv)
    from torch.distributed.device_mesh import init_device_mesh

    device, rank, world = common.setup()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    spec = common.model_spec()
    model = common.meta_model(spec)
    tensor_parallel(model, mesh)
    common.materialise(model, spec, device, args.seed)
    params = list(model.parameters())
    opt = common.adamw(params)
    inputs, targets = common.synthetic_batch(spec, common.GLOBAL_BATCH, args.seed, device)  # the same on both ranks
    step = common.plain_step(model, inputs, targets, params, opt)
    times, first_end, losses = common.run_steps(step, args.steps, device)
    common.report(args, "tp_sp", T_START, times, first_end, losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
