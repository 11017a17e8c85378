"""The package version (``cosmo_dask.__version__``), here so that any layer can record it
(``created_by`` of the stores) without importing the package root."""

__version__ = "0.1.0"
