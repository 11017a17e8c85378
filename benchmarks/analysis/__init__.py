"""Benchmarks of cosmo_dask.analysis: clustering statistics (pair counts and correlation
functions, redshift space, the bispectrum)."""
