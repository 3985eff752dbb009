"""What the cost model's sp_collective_copies charges, checked on the torch this project pins:
the runtime's sequence parallelism shards dim 1 of (batch, sequence, hidden) (runtime/parallel/
tensor.py), and torch's functional collectives, which gather and scatter dim 0, reorder around
them: a reduce-scatter cats its input's chunks (a copy), an all-gather's output is re-cut along
dim 1 by a copy unless it holds one sequence (then a view). planner/cost/step.py charges a read
and a write of the whole activation for each such copy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch._utils import _chunk_or_narrow_cat, _maybe_view_chunk_cat  # noqa: E402


def test_the_runtime_shards_the_sequence_on_dim_1():
    import inspect

    from runtime.parallel import tensor

    assert "Shard(1) if sp else Replicate()" in inspect.getsource(tensor)


@pytest.mark.parametrize("mbs, copied", [(1, False), (2, True), (12, True)])
def test_an_all_gather_along_dim_1_copies_unless_it_holds_one_sequence(mbs, copied):
    tp, local_seq, hidden = 4, 8, 16
    gathered = torch.arange(tp * mbs * local_seq * hidden, dtype=torch.float32).reshape(tp * mbs, local_seq, hidden)
    out = _maybe_view_chunk_cat(gathered, tp, 1)
    assert out.shape == (mbs, tp * local_seq, hidden)
    shares_storage = out.untyped_storage().data_ptr() == gathered.untyped_storage().data_ptr()
    assert shares_storage == (not copied)
    expected = torch.cat(torch.chunk(gathered, tp, dim=0), dim=1)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("mbs", [1, 2])
def test_a_reduce_scatter_along_dim_1_always_copies_its_input(mbs):
    tp, seq, hidden = 4, 32, 16
    full = torch.randn(mbs, seq, hidden)
    reordered = _chunk_or_narrow_cat(full, tp, narrow_dim=1, cat_dim=0)
    assert reordered.shape == (tp * mbs, seq // tp, hidden)
    assert reordered.untyped_storage().data_ptr() != full.untyped_storage().data_ptr()
