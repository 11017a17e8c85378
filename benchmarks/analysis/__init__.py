"""Benchmarks of cosmo_dask.analysis (pair counts and correlation functions)."""
