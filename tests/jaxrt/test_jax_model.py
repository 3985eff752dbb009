"""The JAX model is the torch model: parameter counts and FLOPs equal the planner's, and
from the same weights the first step's loss and gradients equal the torch runtime's."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxrt.model import Dims, ProteinLM, blockwise_loss, from_torch_state, path_to_torch_name, torch_name_to_path
from planner.cost.flops import model_flops_per_token, total_params
from planner.presets import MODEL_PRESETS
from planner.schema.specs import ModelSpec
from runtime.model import ProteinLM as TorchLM
from runtime.model import init_weights, loss_fn

VARIANTS = [
    MODEL_PRESETS["protein-tiny"].model_copy(update={"seq_len": 32}),
    ModelSpec(name="gpt-like", layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab_size=32, seq_len=32,
              activation="gelu", norm="layernorm", position="learned", tied_embeddings=True),
    ModelSpec(name="gqa", layers=3, hidden=96, heads=6, kv_heads=2, ffn_hidden=200, vocab_size=40, seq_len=32),
]


def _params_shapes(spec: ModelSpec):
    model = ProteinLM(Dims.of(spec))
    tokens = jnp.zeros((1, spec.seq_len), jnp.int32)
    return model, jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_parameter_count_equals_planner(name):
    spec = MODEL_PRESETS[name]
    _, shapes = _params_shapes(spec)
    count = sum(int(np.prod(leaf.unbox().shape if hasattr(leaf, "unbox") else leaf.shape))
                for leaf in jax.tree.leaves(shapes, is_leaf=lambda x: hasattr(x, "unbox")))
    assert count == total_params(spec)


def _dot_flops(jaxpr) -> int:
    """2 x M x N x K of every dot_general in a jaxpr, nested jaxprs included."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            a = eqn.invars[0].aval.shape
            contract = int(np.prod([a[i] for i in lc]))
            total += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * contract
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += _dot_flops(sub)
    return total


@pytest.mark.parametrize("spec", VARIANTS, ids=lambda s: s.name)
def test_training_flops_equal_planner(spec):
    """Forward + backward matmul FLOPs of the traced step (XLA's attention runs as visible
    einsums on the CPU) equal the planner's count exactly."""
    model, _ = _params_shapes(spec)
    seq = spec.seq_len
    tokens = jnp.zeros((2, seq + 1), jnp.int32)
    params = model.init(jax.random.key(0), tokens[:, :-1])["params"]

    def loss(p):
        return blockwise_loss(model.apply({"params": p}, tokens[:, :-1]), tokens[:, 1:], 1)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
    assert _dot_flops(jaxpr) == pytest.approx(model_flops_per_token(spec, seq) * 2 * seq, rel=1e-12)


def test_torch_names_round_trip():
    for name in ("tok_embeddings.weight", "pos_embeddings.weight", "layers.11.attention.wq.weight",
                 "layers.0.feed_forward.w3.weight", "norm.weight", "output.weight", "layers.2.ffn_norm.bias"):
        assert path_to_torch_name(torch_name_to_path(name)) == name


@pytest.mark.parametrize("spec", VARIANTS, ids=lambda s: s.name)
def test_first_step_equals_torch(spec):
    """The torch runtime's initial weights converted to JAX: the same loss and the same
    gradient of every parameter, within 1e-4, on a batch with padding."""
    _first_step_equals_torch(spec, spec.seq_len)


@pytest.mark.parametrize("spec", [v for v in VARIANTS if v.position == "rope"], ids=lambda s: s.name)
def test_sequences_longer_than_the_models_context(spec):
    """A job may train sequences longer than the model's seq_len (protein-3.5b, 512, at 2,048
    tokens): the rotary tables cover them, as the torch runtime's setup_rope does (the JAX
    model's were the model's length, and such a step failed to trace on an H100)."""
    _first_step_equals_torch(spec, 2 * spec.seq_len)


def _first_step_equals_torch(spec, seq_len: int):
    torch_model = TorchLM(spec)
    init_weights(torch_model, spec, seed=3)
    torch_model.setup_rope(seq_len=seq_len)
    g = torch.Generator().manual_seed(5)
    batch = torch.randint(5, 31, (4, seq_len + 1), generator=g)
    batch[1, -7:] = 0  # <pad>: ignored by both losses
    loss_t = loss_fn(torch_model(batch[:, :-1]), batch[:, 1:])
    loss_t.backward()
    state = {n: p.detach().numpy() for n, p in torch_model.named_parameters()}
    grads_t = {n: p.grad.numpy() for n, p in torch_model.named_parameters()}

    model, shapes = _params_shapes(spec)
    params = from_torch_state(state, jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, shapes,
                                                  is_leaf=lambda x: hasattr(x, "unbox")))
    tokens = jnp.asarray(batch.numpy(), jnp.int32)

    def loss(p):
        return blockwise_loss(model.apply({"params": p}, tokens[:, :-1]), tokens[:, 1:], 1)

    loss_j, grads_j = jax.value_and_grad(loss)(params)
    assert float(loss_j) == pytest.approx(float(loss_t.detach()), abs=1e-4)
    flat = {path_to_torch_name(tuple(k.key for k in path)): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(grads_j)[0]}
    assert set(flat) == set(grads_t)
    for name, gt in grads_t.items():
        np.testing.assert_allclose(flat[name], gt, atol=1e-4, rtol=1e-4, err_msg=name)


def test_the_learning_rate_schedule_is_the_torch_runtimes():
    """optax's schedule of the update count equals runtime/trainer.lr_at at every step."""
    from types import SimpleNamespace

    from jaxrt.step import lr_schedule
    from runtime.trainer import lr_at

    args = SimpleNamespace(lr=3e-4, warmup=10, steps=100)
    schedule = lr_schedule(args.lr, args.warmup, args.steps)
    for step in range(0, 120):
        assert float(schedule(step)) == pytest.approx(lr_at(step, args), rel=1e-6)


@pytest.mark.parametrize("spec", VARIANTS[:2], ids=lambda s: s.name)
def test_selective_op_saves_the_torch_policys_kept_outputs(spec):
    """selective-op under jax.checkpoint saves the block's input and the outputs the torch
    runtime's per-op policy keeps (q, v, the attention output, the first MLP projection),
    nothing else but the weights: jax saves only what backward needs, so not the down
    projection's output, which the torch policy caches for its replay."""
    import flax.linen as nn
    from jax._src.ad_checkpoint import saved_residuals

    from jaxrt.model import REMAT_POLICIES, Block

    dims = Dims.of(spec)
    block = nn.remat(Block, policy=REMAT_POLICIES["selective-op"], prevent_cse=True)(dims, jnp.float32)
    x = jnp.ones((2, spec.seq_len, spec.hidden))
    params = block.init(jax.random.key(0), x, None)
    saved = [desc for _, desc in saved_residuals(lambda p, x: block.apply(p, x, None).sum(), params, x)]
    names = sorted(d.split("'")[1] for d in saved if d.startswith("named"))
    assert names == ["op_attention", "op_gate", "op_q", "op_v"]
    others = [d for d in saved if not d.startswith("named") and "p['params']" not in d]
    assert others == ["from the argument x"]


@pytest.mark.parametrize("remat", ["none", "full", "selective", "selective-op"])
def test_what_a_bf16_block_saves_is_what_the_planner_counts_for_jax(remat):
    """A bf16 block (fp32 weights cast at use): jax saves the 16-bit casts of its weights for
    backward without recompute (as torch's autocast holds them), none under any recompute level
    (recomputed with the block), and its input in bf16, not fp32: the jax profile's
    compiled_step (planner/cost/memory.py: copies_never_held, kept_input_bytes)."""
    import flax.linen as nn
    from jax._src.ad_checkpoint import saved_residuals

    from jaxrt.model import REMAT_POLICIES, Block
    from machine_models import load_framework
    from planner.cost import memory
    from planner.cost.layout import RECOMPUTES, Layouts
    from planner.schema.specs import TrainingJob

    spec = VARIANTS[0]
    dims = Dims.of(spec)
    cls = Block if remat == "none" else nn.remat(Block, policy=REMAT_POLICIES[remat], prevent_cse=True)
    block = cls(dims, jnp.bfloat16)
    x = jnp.ones((2, spec.seq_len, spec.hidden), jnp.bfloat16)
    params = block.init(jax.random.key(0), x, None)
    weights = {tuple(w.shape) for w in jax.tree.leaves(params) if w.ndim == 2}
    saved = [aval for aval, _ in saved_residuals(lambda p, x: block.apply(p, x, None).astype(jnp.float32).sum(), params, x)]
    casts = [a for a in saved if a.dtype == jnp.bfloat16 and tuple(a.shape) in weights]
    job = TrainingJob(global_batch=2, seq_len=spec.seq_len, precision="bf16", framework=load_framework("jax"))
    never_held = bool(memory.copies_never_held(job, RECOMPUTES.index(remat)))
    assert (len(casts) == 0) == never_held == (remat != "none")
    if remat != "none":  # what it keeps of the stream's shape is bf16 (without recompute the norms' fp32
        # upcasts are saved too, part of the block's count)
        assert all(a.dtype == jnp.bfloat16 for a in saved if tuple(a.shape) == x.shape)
    lay = Layouts.one(dp=1, mbs=2)
    stream = 2 * spec.seq_len * spec.hidden
    assert float(memory.kept_input_bytes(spec, job, lay)[0]) == stream * 2  # bf16
    torch_job = job.model_copy(update={"framework": load_framework("exaplan")})
    assert float(memory.kept_input_bytes(spec, torch_job, lay)[0]) == stream * 4  # fp32 under torch's autocast


def _compiled_dots(fn, *args) -> int:
    """dot ops in XLA's compiled `fn`."""
    import re

    return len(re.findall(r"= \S+ dot\(", jax.jit(fn).lower(*args).compile().as_text()))


@pytest.mark.parametrize("spec", VARIANTS[:2], ids=["swiglu", "gelu"])
def test_xlas_full_recompute_stops_before_the_down_projection(spec):
    """Full recompute replays every matmul of a block's forward but its last, the down
    projection, whose output nothing in backward needs (XLA removes it as dead code): the jax
    profile's recompute_early_stop, as torch's non-reentrant checkpoint (planner/cost/flops.py).
    Measured on one H100: a whole replay predicted protein-3.5b's full-recompute step 10.4% slow
    (docs/gpu/2026-11-27-h100-jax-full.json)."""
    import flax.linen as nn

    from jaxrt.model import REMAT_POLICIES, Block
    from machine_models import load_framework

    dims = Dims.of(spec)
    x = jnp.ones((2, spec.seq_len, spec.hidden), jnp.bfloat16)
    plain = Block(dims, jnp.bfloat16)
    remat = nn.remat(Block, policy=REMAT_POLICIES["full"], prevent_cse=True)(dims, jnp.bfloat16)
    params = plain.init(jax.random.key(0), x, None)

    def step(block):  # the loss value and the gradients, as a training step asks for them
        return jax.value_and_grad(lambda p, x: block.apply(p, x, None).astype(jnp.float32).sum(), argnums=(0, 1))

    forward = _compiled_dots(lambda p, x: plain.apply(p, x, None), params, x)
    replayed = _compiled_dots(step(remat), params, x) - _compiled_dots(step(plain), params, x)
    assert replayed == forward - 1
    assert load_framework("jax").recompute_early_stop


def test_what_xlas_selective_recompute_keeps_is_what_the_planner_counts():
    """jax's dots_with_no_batch_dims_saveable (the backend's "selective") keeps a block's input
    and its matmuls' outputs but the down projection's; the planner counts the same bytes
    (memory.xla_selective_kept_bytes), not torch's selective (the whole block less the scores,
    which predicted a 1.2B block at 8,192 tokens 35% over XLA's peak on one H100)."""
    import flax.linen as nn
    from jax._src.ad_checkpoint import saved_residuals

    from jaxrt.model import REMAT_POLICIES, Block
    from machine_models import load_framework
    from planner.cost import memory
    from planner.cost.layout import Layouts
    from planner.schema.specs import TrainingJob

    for spec in VARIANTS:
        block = nn.remat(Block, policy=REMAT_POLICIES["selective"], prevent_cse=True)(Dims.of(spec), jnp.bfloat16)
        x = jnp.ones((2, spec.seq_len, spec.hidden), jnp.bfloat16)
        params = block.init(jax.random.key(0), x, None)
        saved = saved_residuals(lambda p, x: block.apply(p, x, None).astype(jnp.float32).sum(), params, x)
        kept = sum(a.size * a.dtype.itemsize for a, desc in saved if "p['params']" not in desc)
        job = TrainingJob(global_batch=2, seq_len=spec.seq_len, precision="bf16", framework=load_framework("jax"))
        lay = Layouts.one(dp=1, mbs=2, recompute="selective")
        assert float(memory.xla_selective_kept_bytes(spec, job, lay)[0]) == kept, spec.name
