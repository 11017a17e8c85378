"""cosmo_dask's benchmarks: ``python -m benchmarks --list`` names the workloads,
``python -m benchmarks WORKLOAD [--device cpu|gpu] [--out DIR] [options]`` runs one.
Shared options, timing and output: ``benchmarks/common.py``; figures: ``RESULTS.md``."""
