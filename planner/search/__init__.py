"""Layout search: stage partitioning and (elsewhere) the parallel-layout search."""
