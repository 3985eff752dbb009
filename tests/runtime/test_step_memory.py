"""A whole training step of exaplan's runtime on the CPU, its memory counted exactly (torch's
MemTracker: every tensor, no allocator between), against the planner's prediction.

The step is the runtime's: ProteinLM with the plan's recompute level, bf16 under autocast on
fp32 weights (a dp size of 1, runtime/parallel/data_parallel.py), its cross-entropy, AdamW;
the second step is measured (the optimizer's moments exist). The planner counts the blocks as
an eager GPU block (dgx-h100: the eager count of memory.eager_saved_bytes applies, and the CPU's
SDPA keeps what the fused kernel keeps): peak = model states + every block's kept tensors +
the largest of the loss, the final norm's backward (memory.head_bytes) and the last block's
backward. Before the final norm was counted, a protein model's step (32-token vocabulary, whose
loss holds little) came out 3-8% under; a GELU/LayerNorm model 15% over, its eager norms
counted as RMSNorms.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker, _ModState

from machine_models import load_framework, load_machine
from planner.cost.layout import RC_FULL, RC_NONE, RC_OP, SC_NONE, SH_NONE, Layouts
from planner.cost.memory import head_bytes
from planner.cost.step import evaluate
from planner.schema.specs import ModelSpec, Precision, TrainingJob
from runtime.model import ProteinLM, loss_fn
from runtime.parallel.data_parallel import autocast_forward
from runtime.parallel.recompute import apply_recompute

MBS, SEQ = 2, 512
LEVELS = {"none": RC_NONE, "full": RC_FULL, "selective-op": RC_OP}


def _spec(activation: str, norm: str, layers: int = 2) -> ModelSpec:
    return ModelSpec(name="t", layers=layers, hidden=256, heads=4, kv_heads=4, ffn_hidden=688, vocab_size=32,
                     seq_len=SEQ, activation=activation, norm=norm)


def _measured_step(spec: ModelSpec, level: str, weights: str = "autocast") -> tuple[MemTracker, torch.nn.Module]:
    """The tracker of one step after a first (which creates AdamW's moments), and the model (its
    per-module statistics live only as long as the modules)."""
    torch.manual_seed(0)
    model = ProteinLM(spec)
    model.setup_rope()
    apply_recompute(model, level)
    if weights == "autocast":
        autocast_forward(model, torch.bfloat16)
    else:
        model.to(torch.bfloat16)  # what FSDP's bf16 MixedPrecisionPolicy computes with
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, spec.vocab_size, (MBS, SEQ))

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(tokens), tokens).backward()
        opt.step()

    step()
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    return tracker, model


def _total(snapshot) -> int:
    return sum(v["Total"] for v in snapshot.values())


def _job_and_layout(level: str) -> tuple[TrainingJob, Layouts]:
    """The measured step as the planner sees it: one rank, one micro-batch, bf16."""
    job = TrainingJob(global_batch=MBS, seq_len=SEQ, precision=Precision.bf16, framework=load_framework("exaplan"))
    lay = Layouts(pp=np.array([1]), dp_replicate=1, dp_shard=1, cp=1, tp=1, mbs=MBS, gas=1, vpp=1,
                  schedule=SC_NONE, sharding=SH_NONE, recompute=LEVELS[level], sp=0)
    return job, lay


def _predicted(spec: ModelSpec, level: str) -> float:
    """The planner's peak less its reserve and the DDP buckets a dp size of 1 has not."""
    job, lay = _job_and_layout(level)
    mem = evaluate(spec, load_machine("dgx-h100"), job, lay).memory
    return float(mem.total[0] - mem.reserve[0] - mem.buffers[0])


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("activation,norm", [("swiglu", "rmsnorm"), ("gelu", "layernorm")])
def test_a_steps_peak_is_predicted(activation, norm, level):
    """Measured (2026-11-27): SwiGLU/RMSNorm -0.3%, +0.2%, -1.1% (none, full, selective-op);
    GELU/LayerNorm -0.9%, -2.6%, -2.6%. At larger shapes (hidden 512-1024, 2-6 blocks) the same
    within 2.1%, selective-op the least exact (it keeps its block's kept tensors and autocast's
    weight copies through forward, where the count adds its backward's working set to them)."""
    spec = _spec(activation, norm)
    tracker, _ = _measured_step(spec, level)
    measured = _total(tracker.get_tracker_snapshot("peak"))
    assert _predicted(spec, level) / measured - 1 == pytest.approx(0.0, abs=0.03)


@pytest.mark.parametrize("weights", ["autocast", "bf16"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_the_final_norms_backward_holds_what_the_profile_says(norm, weights):
    """From the end of the last block's forward to the peak of the final norm's backward, plus
    the last block's output (which no block's count holds): the exaplan profile's
    head_bytes_per_element for the norm with an fp32 stream (RMSNorm 24 bytes a stream element,
    LayerNorm 12), within a quarter of a byte (the per-token rsqrt or mean and the head's
    weight gradient are not counted); with 16-bit weights less (22, 6), which the count
    takes as its upper bound."""
    spec = _spec("swiglu", norm)
    tracker, model = _measured_step(spec, "none", weights)
    stats = {s.mod_fqn: s.snapshots for s in tracker.memory_tracking.values()}
    del model
    last_block = _total(stats[f"ProteinLM.layers.{spec.layers - 1}"][_ModState.POST_FW][-1])
    norm_peak = _total(stats["ProteinLM.norm"][_ModState.PEAK_BW][-1])
    elements = MBS * SEQ * spec.hidden
    per_element = (norm_peak - last_block + elements * (4 if weights == "autocast" else 2)) / elements
    counted = float(head_bytes(spec, *_job_and_layout("none"))[0]) / elements
    assert counted == load_framework("exaplan").head_bytes_per_element[norm]
    if weights == "autocast":
        assert per_element == pytest.approx(counted, abs=0.25)
    else:
        assert counted - 6.5 <= per_element <= counted
