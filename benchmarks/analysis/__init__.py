"""Benchmarks of analysis (run them with `python -m benchmarks WORKLOAD`)."""
