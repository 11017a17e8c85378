"""Analysis of snapshots and meshes: power spectrum and multipoles, bispectrum, linear
theory, pair counts and correlation functions.

The public names load on first use (:func:`cosmo_dask.core.lazy.lazy_exports`), so that
importing the light ``analysis.parameters`` (as the CLI's parser does) loads no kernels.
"""

from ..core.lazy import lazy_exports

#: public name -> the module defining it
_PUBLIC = {"bispectrum": "bispectrum", "correlation_function": "correlation",
           "linear_power": "power", "open_correlation": "correlation",
           "plot_correlation_function": "correlation", "plot_power_spectrum": "power",
           "plot_reduced_bispectrum": "bispectrum", "power_spectrum": "power",
           "tree_level_bispectrum": "bispectrum"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
