"""Benchmarks of simulation (run them with `python -m benchmarks WORKLOAD`)."""
