"""Benchmarks of io (run them with `python -m benchmarks WORKLOAD`)."""
