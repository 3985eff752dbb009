"""The runtime's model and the planner's counts are one: parameters and FLOPs per token."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from planner.cost.flops import model_flops_per_token, total_params
from planner.presets import MODEL_PRESETS
from planner.schema.specs import ModelSpec
from runtime.model import ProteinLM, full_init, init_weights, loss_fn

VARIANTS = [
    MODEL_PRESETS["protein-tiny"],
    ModelSpec(name="gpt-like", layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab_size=32, seq_len=64,
              activation="gelu", norm="layernorm", position="learned", tied_embeddings=True),
    ModelSpec(name="gqa", layers=3, hidden=96, heads=6, kv_heads=2, ffn_hidden=200, vocab_size=40, seq_len=64),
]


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_parameter_count_equals_planner(name):
    spec = MODEL_PRESETS[name]
    with torch.device("meta"):
        model = ProteinLM(spec)
    assert sum(p.numel() for p in model.parameters()) == total_params(spec)


@pytest.mark.parametrize("spec", VARIANTS, ids=lambda s: s.name)
def test_variants_count_and_flops_equal_planner(spec):
    """Training FLOPs (forward + backward) counted by torch on the math attention path, which
    runs the attention core as visible matmuls, equal the planner's count exactly."""
    model = ProteinLM(spec)
    init_weights(model, spec, seed=0)
    model.setup_rope()
    assert sum(p.numel() for p in model.parameters()) == total_params(spec)
    seq = spec.seq_len
    x = torch.randint(5, 31, (2, seq + 1))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss_fn(model(x[:, :-1]), x[:, 1:]).backward()
    assert counter.get_total_flops() == pytest.approx(model_flops_per_token(spec, seq) * 2 * seq, rel=1e-12)


def test_initial_loss_is_uniform_and_init_is_deterministic():
    spec = MODEL_PRESETS["protein-tiny"]
    a, b = ProteinLM(spec), ProteinLM(spec)
    init_weights(a, spec, seed=7)
    init_weights(b, spec, seed=7)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    c = ProteinLM(spec)
    init_weights(c, spec, seed=8)
    assert not torch.equal(a.layers["0"].attention.wq.weight, c.layers["0"].attention.wq.weight)
    a.setup_rope()
    x = torch.randint(5, 31, (4, 65))
    loss = loss_fn(a(x[:, :-1]), x[:, 1:]).item()
    assert abs(loss - torch.log(torch.tensor(32.0)).item()) < 0.1  # near-uniform predictions at init


def test_init_depends_on_the_name_not_on_wrappers():
    spec = MODEL_PRESETS["protein-tiny"]
    plain = full_init("layers.3.attention.wq.weight", (128, 128), spec, seed=1)
    wrapped = full_init("module.layers.3._checkpoint_wrapped_module.attention.wq.weight", (128, 128), spec, seed=1)
    assert torch.equal(plain, wrapped)
    assert not torch.equal(plain, full_init("layers.2.attention.wq.weight", (128, 128), spec, seed=1))


def test_a_job_longer_than_the_models_context_gets_rotary_tables_for_it():
    """`exaplan plan --seq-len 2048` on a 512-token preset: the job's sequences, not the model's,
    size the rotary tables (a 2048-token plan on an H100 failed at its first forward before)."""
    short = MODEL_PRESETS["protein-tiny"]
    long = short.model_copy(update={"seq_len": 2 * short.seq_len})
    a, b = ProteinLM(short), ProteinLM(long)
    init_weights(a, short, seed=3)
    init_weights(b, long, seed=3)
    a.setup_rope(seq_len=long.seq_len)
    b.setup_rope()
    x = torch.randint(5, 31, (2, long.seq_len))
    assert torch.equal(a(x), b(x))  # the same model at the longer context
    a.setup_rope()
    with pytest.raises(RuntimeError):
        a(x)  # tables for the model's context alone are too short
