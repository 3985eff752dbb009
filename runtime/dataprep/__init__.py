"""Data preparation for the runtime: input files -> the directories `exaplan run` trains on.

    fasta.py        streaming FASTA reader and protein tokeniser (`encode`, `decode`)
    shards.py       the prepared token-shard format: names, dtypes, the manifest reader
    prepare.py      FASTA -> memory-mapped token shards (`prepare`), the shipped UniProt sample
    cache.py        a prepared directory for every rank of a job (`ensure_prepared`), `describe`
    pairs.py        DPO preference pairs from a scored table (`build_pairs`, `read_pairs`)
    pairs_table.py  reading the CSV/TSV input tables of `build_pairs`
    pairs_report.py the report of `build_pairs` (and of a pairs directory) as a table
    atomic.py       writing an output directory atomically (temporary folder, then rename)
    samples/        the shipped samples (UniProt FASTA, GB1 fitness table) and their attribution

No torch at import (cache.py imports torch.distributed only when a job runs under it), and
nothing from the rest of runtime/: the trainer's side (runtime/loader.py, runtime/dpo.py)
imports from here, never the other way round. From the planner only planner.schema. The command
line (`exaplan data prepare|info|sample|pairs`) is cli/data.py.
"""
