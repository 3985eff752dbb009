"""Plans for the JAX backend's tests: the tiny model on one CPU 'node' of `world` ranks
(machine and prediction fields from an example plan; only the layout fields matter)."""

from __future__ import annotations

from pathlib import Path

from planner.presets import MODEL_PRESETS
from planner.schema.plan import Plan, ddp_impl_for, load_plan
from planner.schema.specs import ModelSpec, Precision, Sharding

ROOT = Path(__file__).resolve().parents[2]
GLOBAL_BATCH = 8
# "tiny": protein-tiny's blocks at 2 of its 6 layers. The JAX model traces its blocks one by one
# (a Python loop), so each layout's compile grows with the layers (the layout tests took 1.4x as
# long at 6), and what they check (a layout gives one device's losses and weights) does not
# depend on the count.
SPECS = {
    "tiny": MODEL_PRESETS["protein-tiny"].model_copy(update={"seq_len": 32, "layers": 2}),
    "gpt": ModelSpec(name="gpt-like", layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab_size=32,
                     seq_len=32, activation="gelu", norm="layernorm", position="learned", tied_embeddings=True),
}


def make_plan(world: int = 1, kind: str = "none", *, dp_replicate: int | None = None, dp_shard: int = 1, tp: int = 1,
              gas: int = 1, sp: bool = False, recompute: str = "none", spec: str = "tiny", precision: str = "fp32",
              pp: int = 1, cp: int = 1, global_batch: int = GLOBAL_BATCH, workload: str = "pretrain") -> Plan:
    model = SPECS[spec]
    base = load_plan(ROOT / "plans" / "protein-7b_dgx-h100_16n.yaml").model_dump(mode="json")
    if dp_replicate is None:
        dp_replicate = world // (dp_shard * tp * pp * cp)
    dp = dp_replicate * dp_shard
    d = dict(base)
    d["model"] = model.model_dump(mode="json")
    d["machine"] = {**base["machine"], "devices_per_node": world}
    d["job"] = {**base["job"], "global_batch": global_batch, "seq_len": model.seq_len, "precision": precision,
                "workload": workload}
    d["nodes"], d["ranks_per_node"] = 1, world
    d["mesh"] = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
    d["micro_batch_size"], d["grad_accumulation_steps"] = global_batch // (dp * gas), gas
    d["sequence_parallel"] = sp
    d["recompute"] = recompute
    d["sharding"] = {**base["sharding"], "kind": kind, "shard_group_size": dp_shard,
                     "ddp_impl": ddp_impl_for(Sharding(kind), tp, pp, Precision(precision))}
    d["pipeline"] = {"schedule": None, "virtual_stages": 1, "stages": []}
    return Plan.model_validate(d)
