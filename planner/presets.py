"""Model presets: the seed paper's protein LMs (MProt-DPO, SC24) and two small ones for CPU runs."""

from __future__ import annotations

from planner.schema.errors import PlanError
from planner.schema.specs import ModelSpec
from planner.schema.vocab import VOCAB_SIZE

# The protein vocabulary has 31 tokens; presets pad it to 32 (a multiple of 8 for kernels).
PROTEIN_VOCAB_PADDED = 32
assert PROTEIN_VOCAB_PADDED >= VOCAB_SIZE

_LLAMA = dict(activation="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False, vocab_size=PROTEIN_VOCAB_PADDED)

MODEL_PRESETS: dict[str, ModelSpec] = {
    # MProt-DPO launch scripts: 16 x 4096, 32 heads, FFN 11008, seq 512 (3.24e9 parameters).
    "protein-3.5b": ModelSpec(name="protein-3.5b", layers=16, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, seq_len=512, **_LLAMA),
    "protein-7b": ModelSpec(name="protein-7b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, seq_len=512, **_LLAMA),
    "protein-70b": ModelSpec(name="protein-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, seq_len=128, **_LLAMA),
    # CPU-sized models for the runtime: about 25M and 1M parameters.
    "protein-small": ModelSpec(name="protein-small", layers=8, hidden=512, heads=8, kv_heads=8, ffn_hidden=1376, seq_len=256, **_LLAMA),
    "protein-tiny": ModelSpec(name="protein-tiny", layers=6, hidden=128, heads=4, kv_heads=2, ffn_hidden=352, seq_len=128, **_LLAMA),
}


def get_model(name: str) -> ModelSpec:
    """A preset by name (a copy, safe to modify)."""
    try:
        return MODEL_PRESETS[name].model_copy(deep=True)
    except KeyError:
        raise PlanError(f"unknown model {name!r}; presets: {', '.join(MODEL_PRESETS)} (or a YAML path)", field="model") from None
