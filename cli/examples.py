"""`make plans`: regenerate the example plans committed in plans/ (each file's header names
the command that makes it; this runs those commands)."""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from pathlib import Path

from cli.main import main as cli_main

PLANS_DIR = Path(__file__).resolve().parent.parent / "plans"

EXAMPLES = {
    "protein-3.5b_aurora_3200n.yaml": "--model protein-3.5b --machine aurora --nodes 3200",
    "protein-3.5b_alps_2060n.yaml": "--model protein-3.5b --machine alps --nodes 2060",
    "protein-3.5b_frontier_2048n.yaml": "--model protein-3.5b --machine frontier --nodes 2048",
    "protein-3.5b_leonardo_1500n.yaml": "--model protein-3.5b --machine leonardo --nodes 1500",
    "protein-3.5b_pdx_400n.yaml": "--model protein-3.5b --machine pdx --nodes 400",
    "protein-7b_dgx-h100_16n.yaml": "--model protein-7b --machine dgx-h100 --nodes 16 --global-batch 1024",
    "protein-70b_frontier_64n.yaml": "--model protein-70b --machine frontier --nodes 64 --global-batch 512",
    # DPO (the seed paper's workload) on the five seed systems: 4 pairs (8 sequences) per rank.
    "protein-3.5b_aurora_3200n_dpo.yaml": "--model protein-3.5b --machine aurora --nodes 3200 --workload dpo",
    "protein-3.5b_alps_2060n_dpo.yaml": "--model protein-3.5b --machine alps --nodes 2060 --workload dpo",
    "protein-3.5b_frontier_2048n_dpo.yaml": "--model protein-3.5b --machine frontier --nodes 2048 --workload dpo",
    "protein-3.5b_leonardo_1500n_dpo.yaml": "--model protein-3.5b --machine leonardo --nodes 1500 --workload dpo",
    "protein-3.5b_pdx_400n_dpo.yaml": "--model protein-3.5b --machine pdx --nodes 400 --workload dpo",
    # Plans for the field's frameworks (docs/frameworks/; `exaplan export` writes their files): the
    # seed paper's own run (Megatron-DeepSpeed, DPO, 38,400 Aurora tiles: its authors' layout is
    # re-found), and one per other framework on the machines they are run on.
    "frameworks/protein-3.5b_aurora_3200n_deepspeed_dpo.yaml": "--model protein-3.5b --machine aurora --nodes 3200 "
                                                              "--framework deepspeed --workload dpo --global-batch 2457600",
    "frameworks/protein-7b_dgx-h100_16n_megatron.yaml": "--model protein-7b --machine dgx-h100 --nodes 16 "
                                                        "--global-batch 1024 --framework megatron",
    "frameworks/protein-70b_frontier_64n_torchtitan.yaml": "--model protein-70b --machine frontier --nodes 64 "
                                                           "--global-batch 512 --framework torchtitan",
    "frameworks/protein-3.5b_dgx-h100_8n_maxtext.yaml": "--model protein-3.5b --machine dgx-h100 --nodes 8 "
                                                        "--global-batch 512 --framework maxtext",
    # One GPU (benchmarks/gpu_check.py): the runtime benchmark's workload, and protein-3.5b in bf16.
    "gpu/demo_1gpu.yaml": "--model protein-small --machine dgx-h200 --set machine.devices_per_node=1 --global-batch 4 "
                          "--seq-len 128 --precision fp32 --mbs 4 --recompute none --draws 0",
    "gpu/protein-3.5b_1xh200.yaml": "--model protein-3.5b --machine dgx-h200 --set machine.devices_per_node=1 "
                                    "--global-batch 32 --draws 0",
    "gpu/protein-3.5b_1xh100.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                    "--global-batch 32 --draws 0",
    # The demo's workload at 4 micro-batches a step (1 and 4 sequences each): what a step costs
    # per micro-batch and per optimizer step where kernel launches, not the GPU, set the pace.
    "gpu/demo_1gpu_mbs1x4.yaml": "--model protein-small --machine dgx-h100 --set machine.devices_per_node=1 "
                                 "--global-batch 4 --seq-len 128 --precision fp32 --mbs 1 --recompute none --draws 0",
    "gpu/demo_1gpu_mbs4x4.yaml": "--model protein-small --machine dgx-h100 --set machine.devices_per_node=1 "
                                 "--global-batch 16 --seq-len 128 --precision fp32 --mbs 4 --recompute none --draws 0",
    # Held out from the eager count's first check: sequences 4x longer (attention 4x the share).
    "gpu/protein-3.5b_1xh100_s2048.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                          "--global-batch 16 --seq-len 2048 --draws 0",
    # Held out: a small hidden size at a long sequence (section A's 1.7B shape: hidden 2,048, 16
    # heads of 128, 24 blocks; here SwiGLU and the protein vocabulary), where attention is a sixth
    # of the FLOPs and the elementwise work a larger share than in protein-3.5b.
    "gpu/protein-1.2b-h2048_1xh100_s4096.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                                "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                "--set model.heads=16 --set model.kv_heads=16 --set model.ffn_hidden=5504 "
                                                "--set model.layers=24 --set model.seq_len=4096 "
                                                "--global-batch 16 --seq-len 4096 --draws 0",
    # Held out from the measured kernels (planner/schema/kernels.py), predicted before they ran:
    # the same block at 8,192 tokens (attention a quarter of the FLOPs, the kernel table's 8k
    # rate), and a narrow one (hidden 1,024, 16 heads of 64: the table's other head dimension,
    # small GEMMs, elementwise work and the weights' traffic a larger share).
    "gpu/protein-1.2b-h2048_1xh100_s8192.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                                "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                "--set model.heads=16 --set model.kv_heads=16 --set model.ffn_hidden=5504 "
                                                "--set model.layers=24 --set model.seq_len=8192 "
                                                "--global-batch 8 --seq-len 8192 --draws 0",
    "gpu/protein-0.3b-h1024_1xh100_s2048.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                                "--set model.name=protein-0.3b-h1024 --set model.hidden=1024 "
                                                "--set model.heads=16 --set model.kv_heads=16 --set model.ffn_hidden=2752 "
                                                "--set model.layers=24 --set model.seq_len=2048 "
                                                "--global-batch 64 --seq-len 2048 --mbs 8 --draws 0",
    # Held out on the H200, whose measured kernels are the H100's (copied: same chip and clocks),
    # predicted before it ran: the long-sequence block of the H100's blind case.
    "gpu/protein-1.2b-h2048_1xh200_s8192.yaml": "--model protein-3.5b --machine dgx-h200 --set machine.devices_per_node=1 "
                                                "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                "--set model.heads=16 --set model.kv_heads=16 --set model.ffn_hidden=5504 "
                                                "--set model.layers=24 --set model.seq_len=8192 "
                                                "--global-batch 8 --seq-len 8192 --draws 0",
    # Held out from the eager surplus's measured rate (set after the runs above), predicted before
    # it ran: a mid-sized block (hidden 1,536, 12 heads of 128) at 1,024 tokens.
    "gpu/protein-0.7b-h1536_1xh100_s1024.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                                "--set model.name=protein-0.7b-h1536 --set model.hidden=1536 "
                                                "--set model.heads=12 --set model.kv_heads=12 --set model.ffn_hidden=4096 "
                                                "--set model.layers=24 --set model.seq_len=1024 "
                                                "--global-batch 64 --seq-len 1024 --mbs 8 --draws 0",
    # Held out from the memory model's counts (set against the runs above, all without
    # recompute), predicted before they ran: recompute full and selective, the micro-batch the
    # planner picks under each.
    "gpu/protein-3.5b_1xh100_full.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                         "--global-batch 32 --recompute full --draws 0",
    "gpu/protein-1.2b-h2048_1xh100_s4096_full.yaml": "--model protein-3.5b --machine dgx-h100 "
                                                     "--set machine.devices_per_node=1 "
                                                     "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                     "--set model.heads=16 --set model.kv_heads=16 "
                                                     "--set model.ffn_hidden=5504 --set model.layers=24 "
                                                     "--set model.seq_len=4096 "
                                                     "--global-batch 16 --seq-len 4096 --recompute full --draws 0",
    "gpu/protein-1.2b-h2048_1xh100_s8192_sel.yaml": "--model protein-3.5b --machine dgx-h100 "
                                                    "--set machine.devices_per_node=1 "
                                                    "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                    "--set model.heads=16 --set model.kv_heads=16 "
                                                    "--set model.ffn_hidden=5504 --set model.layers=24 "
                                                    "--set model.seq_len=8192 "
                                                    "--global-batch 8 --seq-len 8192 --recompute selective --draws 0",
    # Held out from the fp32 kept inputs and the backward's end (set after the three above),
    # predicted before they ran: full recompute with accumulation (gradients held at the peak).
    "gpu/protein-3.5b_1xh100_s2048_full.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                               "--global-batch 16 --seq-len 2048 --recompute full --mbs 8 --draws 0",
    "gpu/protein-1.2b-h2048_1xh100_s4096_full4.yaml": "--model protein-3.5b --machine dgx-h100 "
                                                      "--set machine.devices_per_node=1 "
                                                      "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                      "--set model.heads=16 --set model.kv_heads=16 "
                                                      "--set model.ffn_hidden=5504 --set model.layers=24 "
                                                      "--set model.seq_len=4096 "
                                                      "--global-batch 16 --seq-len 4096 --recompute full --mbs 4 --draws 0",
    # Held out from selective-op recompute's counts (written from torchtitan's policy and the
    # CPU runtime's MemTracker), predicted before they ran: the micro-batch the planner picks.
    "gpu/protein-3.5b_1xh100_op.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                       "--global-batch 32 --recompute selective-op --draws 0",
    "gpu/protein-1.2b-h2048_1xh100_s4096_op.yaml": "--model protein-3.5b --machine dgx-h100 "
                                                   "--set machine.devices_per_node=1 "
                                                   "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                   "--set model.heads=16 --set model.kv_heads=16 "
                                                   "--set model.ffn_hidden=5504 --set model.layers=24 "
                                                   "--set model.seq_len=4096 "
                                                   "--global-batch 16 --seq-len 4096 --recompute selective-op --draws 0",
    "gpu/protein-1.2b-h2048_1xh100_s8192_op.yaml": "--model protein-3.5b --machine dgx-h100 "
                                                   "--set machine.devices_per_node=1 "
                                                   "--set model.name=protein-1.2b-h2048 --set model.hidden=2048 "
                                                   "--set model.heads=16 --set model.kv_heads=16 "
                                                   "--set model.ffn_hidden=5504 --set model.layers=24 "
                                                   "--set model.seq_len=8192 "
                                                   "--global-batch 8 --seq-len 8192 --recompute selective-op --draws 0",
    # Held out from the three memory terms the runs above led to (compiled blocks under
    # recompute hold no weight copies; a recomputed block's kept tensors counted once; the
    # backward's gradients), predicted before it ran: selective-op with accumulation.
    "gpu/protein-3.5b_1xh100_s2048_op.yaml": "--model protein-3.5b --machine dgx-h100 --set machine.devices_per_node=1 "
                                             "--global-batch 16 --seq-len 2048 --recompute selective-op --mbs 4 --draws 0",
}
# The JAX backend on one H100: the same jobs with `--backend jax` (docs/validation/gpu.md, "The JAX
# backend on a GPU"). Measured first (2026-11-27): protein-3.5b at its own pick (micro-batch 16) and at the
# torch plan's 8, and the hidden-2,048 block at 4,096 tokens; then, predicted before they ran,
# the same block at 8,192 tokens and the narrow one; protein-3.5b at 2,048 tokens under full
# recompute, the third, failed to trace (the rotary tables, since fixed) and is not measured.
JAX_TWINS = {
    "gpu/protein-3.5b_1xh100_jax.yaml": ("gpu/protein-3.5b_1xh100.yaml", " --mbs 16 --recompute none"),
    "gpu/protein-3.5b_1xh100_jax_search.yaml": ("gpu/protein-3.5b_1xh100.yaml", ""),
    "gpu/protein-3.5b_1xh100_jax_mbs8.yaml": ("gpu/protein-3.5b_1xh100.yaml", " --mbs 8"),
    "gpu/protein-1.2b-h2048_1xh100_s4096_jax.yaml": ("gpu/protein-1.2b-h2048_1xh100_s4096.yaml", ""),
    "gpu/protein-1.2b-h2048_1xh100_s8192_jax.yaml": ("gpu/protein-1.2b-h2048_1xh100_s8192.yaml", ""),
    "gpu/protein-0.3b-h1024_1xh100_s2048_jax.yaml": ("gpu/protein-0.3b-h1024_1xh100_s2048.yaml", ""),
    "gpu/protein-3.5b_1xh100_s2048_jax_full.yaml": ("gpu/protein-3.5b_1xh100_s2048_full.yaml", ""),
    "gpu/protein-3.5b_1xh100_s2048_jax_op.yaml": ("gpu/protein-3.5b_1xh100_s2048_op.yaml", ""),
    "gpu/protein-1.2b-h2048_1xh100_s8192_jax_sel.yaml": ("gpu/protein-1.2b-h2048_1xh100_s8192_sel.yaml", " --mbs 2"),
}
EXAMPLES.update({name: f"{EXAMPLES[torch_twin]}{extra} --backend jax" for name, (torch_twin, extra) in JAX_TWINS.items()})


def command_for(name: str) -> list[str]:
    """The exaplan arguments that make plans/<name> (relative to the repository root)."""
    return ["plan", *shlex.split(EXAMPLES[name]), "-o", f"plans/{name}"]


def regenerate(name: str, out_dir: Path = PLANS_DIR) -> Path:
    """Run the plan command of one example, writing into out_dir; the plan's header keeps
    the repository-relative command."""
    argv = command_for(name)
    target = out_dir / name
    target.parent.mkdir(parents=True, exist_ok=True)
    saved = sys.argv
    sys.argv = ["exaplan", *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli_main([*argv[:-1], str(target), "--force"])  # the recorded command stays as argv
    finally:
        sys.argv = saved
    if code:
        raise SystemExit(f"exaplan {' '.join(argv)} failed with exit code {code}")
    return target


def main() -> int:
    for name in EXAMPLES:
        print(f"wrote {regenerate(name).relative_to(PLANS_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
