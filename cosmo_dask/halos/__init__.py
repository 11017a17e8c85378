"""Halo finding: distributed friends-of-friends, catalogs, centres and mass functions.

The public names load on first use (:func:`cosmo_dask.lazy.lazy_exports`), so that
importing the light ``halos.parameters`` (as the CLI's parser does) loads no kernels.
"""

from ..lazy import lazy_exports

#: public name -> the module defining it
_PUBLIC = {"fof": "api", "fof_labels": "fof", "FOFLabels": "fof", "HaloResult": "result",
           "open_catalog": "result", "mass_function": "mass_function",
           "plot_mass_function": "mass_function", "sigma_of_mass": "mass_function",
           "theory_mass_function": "mass_function",
           "spherical_overdensity": "spherical_overdensity"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
