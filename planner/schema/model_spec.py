"""The model (the application): a dense decoder-only transformer."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.schema.bounds import MAX_SEQ_LEN, Count, Name, Spec, Width
from planner.schema.vocab import VOCAB_SIZE


class ModelSpec(Spec):
    """A dense decoder-only transformer (Llama-style protein LM by default)."""

    name: Name = Field("custom", description="Preset or user name of the model.")
    layers: Count = Field(description="Number of transformer blocks.")
    hidden: Width = Field(description="Model width d (residual stream size).")
    heads: Count = Field(description="Attention (query) heads.")
    kv_heads: Count = Field(description="Key/value heads (grouped-query attention); = heads for MHA.")
    ffn_hidden: Width = Field(description="Inner width of the MLP.")
    vocab_size: Width = Field(VOCAB_SIZE, description="Vocabulary size (protein: 31 tokens).")
    seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] = Field(description="Default training sequence length in tokens.")
    activation: Literal["gelu", "swiglu"] = Field("swiglu", description="MLP activation.")
    norm: Literal["layernorm", "rmsnorm"] = Field("rmsnorm", description="Normalisation layer.")
    position: Literal["rope", "learned"] = Field("rope", description="Position encoding.")
    tied_embeddings: bool = Field(False, description="Share the input embedding and output head.")

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads
