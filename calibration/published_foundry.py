"""Section L: llm-foundry's whole benchmark tables, held out: the rows of
calibration/data/llm_foundry_mpt.csv made records as calibration/data/published/
llm-foundry-tables.yaml says (what the rows share, the tables' machines, the rows C and H fit).

    foundry_runs()        section L as PublishedRun (the rows of C and H left out)
    foundry_table(run)    which of the source's tables a row comes from
    read_table()          the CSV's rows
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

from pydantic import Field

from calibration.published_files import DATA_DIR, Citation, read_yaml, validated
from calibration.published_schema import PublishedLayout, PublishedRun
from planner.schema.plan import Recompute, Sharding
from planner.schema.specs import ModelSpec, PosInt, Spec

FILE = DATA_DIR / "llm-foundry-tables.yaml"


class Table(Spec):
    machine: str
    assumed: list[str]


class FoundryFile(Spec):
    citation: Citation
    csv: str = Field(description="The CSV, calibration/data/<csv>.")
    note: str = Field(min_length=1)
    shapes: dict[str, tuple[PosInt, PosInt, PosInt]] = Field(description="Model size -> (layers, d_model, heads).")
    tables: dict[str, Table]
    shardings: dict[str, Sharding]
    fitted: list[tuple[str, str, PosInt, PosInt]] = Field(description="(table, model, seq, gpus) of the rows C and H fit.")


SPEC = validated(FoundryFile, read_yaml(FILE), FILE.name)
DATA = DATA_DIR.parent / SPEC.csv
MPT_SHAPES = dict(SPEC.shapes)
TABLES = {name: (t.machine, list(t.assumed)) for name, t in SPEC.tables.items()}
FITTED = set(SPEC.fitted)
EARLY_STOP = "recompute_early_stop"


def read_table(path: Path = DATA) -> list[dict[str, str]]:
    """The CSV's rows (its '#' lines are the attribution)."""
    with path.open(newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _model(size: str, seq: int) -> ModelSpec:
    """MPT: 4d GELU MLP, LayerNorm, ALiBi (no position parameters: 'rope' is the closest
    parameter-free choice), tied embeddings, vocabulary 50368."""
    layers, d, heads = MPT_SHAPES[size]
    return ModelSpec(name=f"mpt-{size}", layers=layers, hidden=d, heads=heads, kv_heads=heads, ffn_hidden=4 * d,
                     vocab_size=50368, seq_len=seq, activation="gelu", norm="layernorm", position="rope",
                     tied_embeddings=True)


def _run(row: dict[str, str], index: int) -> PublishedRun:
    table, size = row["table"], row["model"]
    seq, gpus = int(row["seq"]), int(row["gpus"])
    machine, assumed = TABLES[table]
    pure = row["mp_mode"] == "PURE"
    recompute = row["activation_checkpointing"] == "True"
    return PublishedRun(
        id=f"L-{table}-{size}-s{seq}-g{gpus}" + (f"-{index}" if index else ""), section="L", source=SPEC.citation.text(),
        model=_model(size, seq), machine=machine, framework="fsdp", gpus=gpus,
        layout=PublishedLayout(dp=gpus, sharding=SPEC.shardings[row["sharding"]], micro_batch=int(row["micro_batch"]),
                               global_batch=int(row["global_batch"]),
                               recompute=Recompute.full if recompute else Recompute.none),
        figure=float(row["tokens_per_s_per_gpu"]), kind="tokens_per_s_per_gpu", grad_reduce_bf16=pure, fused_loss=True,
        flash_attention_v1=True, recompute_early_stop=False if pure else None,
        assumed=list(assumed) + ([EARLY_STOP] if recompute else []),
        note=SPEC.note.strip() + f" Table {table}; published MFU {row['mfu']}%, precision {row['precision']} ({row['mp_mode']}).",
    )


@lru_cache(maxsize=1)
def _all_runs() -> tuple[PublishedRun, ...]:
    runs, seen = [], {}
    for row in read_table():
        key = (row["table"], row["model"], int(row["seq"]), int(row["gpus"]))
        if key in FITTED:
            continue
        seen[key] = seen.get(key, -1) + 1  # a configuration the table prints twice keeps both rows
        runs.append(_run(row, seen[key]))
    return tuple(runs)


def foundry_runs() -> list[PublishedRun]:
    """Section L: every row of the source's bf16 tables that sections C and H do not fit."""
    return list(_all_runs())


def foundry_table(run: PublishedRun) -> str:
    """The source table a section-L row comes from (h100_bf16_large, h100_bf16, a100_80gb, a100_40gb)."""
    return next(t for t in TABLES if run.id.startswith(f"L-{t}-"))
