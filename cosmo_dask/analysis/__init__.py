"""Analysis of snapshots and meshes: power spectrum and multipoles, bispectrum, linear theory.

The public names load on first use (:func:`cosmo_dask.core.lazy.lazy_exports`), so that
importing the light ``analysis.parameters`` (as the CLI's parser does) loads no kernels.
"""

from ..core.lazy import lazy_exports

#: public name -> the module defining it
_PUBLIC = {"linear_power": "power", "plot_power_spectrum": "power",
           "power_spectrum": "power", "bispectrum": "bispectrum",
           "plot_reduced_bispectrum": "bispectrum",
           "tree_level_bispectrum": "bispectrum"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
