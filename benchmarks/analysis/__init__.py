"""Benchmarks of the analyses (clustering statistics)."""
