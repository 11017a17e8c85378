"""Benchmarks of runtime (run them with `python -m benchmarks WORKLOAD`)."""
