"""Benchmarks of expansion (run them with `python -m benchmarks WORKLOAD`)."""
