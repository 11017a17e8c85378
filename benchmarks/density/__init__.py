"""Benchmarks of density (run them with `python -m benchmarks WORKLOAD`)."""
