"""Halo finding: distributed friends-of-friends, catalogs, centres and mass functions,
bound subhalos inside the FOF halos, and HOD galaxy mocks on the catalogs.

The public names load on first use (:func:`cosmo_dask.core.lazy.lazy_exports`), so that
importing the light ``halos.parameters`` (as the CLI's parser does) loads no kernels.
"""

from ..core.lazy import lazy_exports

#: public name -> the module defining it
_PUBLIC = {"fof": "api", "fof_labels": "fof_graph", "FOFLabels": "fof_graph",
           "HaloResult": "result", "open_catalog": "result", "mass_function": "mass_functions",
           "plot_mass_function": "mass_functions", "sigma_of_mass": "mass_functions",
           "theory_mass_function": "mass_functions", "spherical_overdensity": "overdensity",
           "populate_hod": "hod", "merger_tree": "merger_trees", "MergerTree": "merger_trees",
           "open_merger_tree": "merger_trees", "correa2015_mah": "merger_trees",
           "open_members": "members", "subhalos": "subhalo_finder",
           "subhalo_mass_function": "subhalo_finder",
           "plot_subhalo_mass_function": "subhalo_finder",
           "SubhaloResult": "subhalo_result", "open_subhalos": "subhalo_result"}

__all__ = list(_PUBLIC)

lazy_exports(__name__, _PUBLIC)
