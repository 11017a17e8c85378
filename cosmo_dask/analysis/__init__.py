"""Analysis of snapshots and meshes: power spectrum and multipoles, linear theory, pair
counts and correlation functions.

The public names load on first use (:func:`cosmo_dask.core.lazy.lazy_exports`), so that
importing the light ``analysis.parameters`` (as the CLI's parser does) loads no kernels.
"""

from ..core.lazy import lazy_exports

#: public name -> the module defining it
_PUBLIC = {"correlation_function": "correlation", "linear_power": "power",
           "open_correlation": "correlation", "plot_correlation_function": "correlation",
           "plot_power_spectrum": "power", "power_spectrum": "power"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
