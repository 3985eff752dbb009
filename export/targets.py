"""The export targets (`exaplan export --to`) as a plain table: no schema imported, so that the
command line names them in its help (export/registry.py dispatches on it)."""

# --to name -> (module under export/, the framework profile of machine_models/frameworks.yaml
# whose constraints it keeps).
TARGETS: dict[str, tuple[str, str]] = {
    "megatron": ("export.megatron", "megatron"),
    "megatron-deepspeed": ("export.megatron", "deepspeed"),
    "deepspeed": ("export.deepspeed", "deepspeed-zero"),
    "torchtitan": ("export.torchtitan", "torchtitan"),
    "maxtext": ("export.maxtext", "maxtext"),
}
