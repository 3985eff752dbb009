"""A tiny model trained by DeepSpeed under an exported ds_config.json, on CPU ranks over gloo:
what tests/export/test_deepspeed.py launches to see DeepSpeed's engine take the file.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 \\
        -m export.deepspeed_smoke --config DIR/ds_config.json --steps 6 --out result.json

A residual MLP of a few blocks on a fixed regression task, each rank its own samples. Where the
config has an activation_checkpointing section the blocks run through
deepspeed.checkpointing.checkpoint (after deepspeed.checkpointing.configure from the same
file), as a user's model would. Rank 0 writes the held-out loss before training and after each optimizer step and what the engine
reports: micro-batch, accumulation, global batch, data-parallel ranks, ZeRO stage, 16-bit mode,
and its optimizer's class.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

IN, HIDDEN, BLOCKS = 16, 64, 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self, checkpoint=None):
        super().__init__()
        self.embed = nn.Linear(IN, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(HIDDEN, 1)
        self.checkpoint = checkpoint

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = self.checkpoint(block, h) if self.checkpoint else block(h)
        return self.head(h).squeeze(-1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import deepspeed

    deepspeed.init_distributed("gloo")
    with open(args.config) as f:
        config = json.load(f)
    checkpoint = None
    if "activation_checkpointing" in config:
        deepspeed.checkpointing.configure(None, deepspeed_config=args.config)
        checkpoint = deepspeed.checkpointing.checkpoint
    torch.manual_seed(0)
    model = Tiny(checkpoint)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=args.config)
    rank = engine.global_rank
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float16 if engine.fp16_enabled() else torch.float32
    truth = torch.Generator().manual_seed(1)
    w = torch.randn(IN, generator=truth) / IN**0.5
    held_x = torch.randn(256, IN, generator=truth)
    held_y = held_x @ w
    data = torch.Generator().manual_seed(100 + rank)
    micro, accumulation = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()

    def held_out() -> float:
        with torch.no_grad():
            return torch.nn.functional.mse_loss(engine(held_x.to(dtype)).float(), held_y).item()

    losses = [held_out()]  # before the first step, then after each
    for _ in range(args.steps):
        for _ in range(accumulation):
            x = torch.randn(micro, IN, generator=data)
            loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), x @ w)
            engine.backward(loss)
            engine.step()
        losses.append(held_out())
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "micro_batch": micro, "accumulation": accumulation,
                       "train_batch_size": engine.train_batch_size(), "dp": engine.dp_world_size,
                       "zero_stage": engine.zero_optimization_stage(), "bf16": engine.bfloat16_enabled(),
                       "fp16": engine.fp16_enabled(), "optimizer": type(engine.optimizer).__name__,
                       "global_steps": engine.global_steps, "checkpointing": checkpoint is not None}, f)
    deepspeed.comm.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
