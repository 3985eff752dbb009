"""Benchmarks that start processes: `python -m benchmarks.runtime_vs_torch` compares `exaplan run`
with hand-written torch training loops of the same layouts (benchmarks/torch_*.py)."""
