"""Benchmarks of halos (run them with `python -m benchmarks WORKLOAD`)."""
