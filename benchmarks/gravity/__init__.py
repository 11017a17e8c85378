"""Benchmarks of gravity (run them with `python -m benchmarks WORKLOAD`)."""
