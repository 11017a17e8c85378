"""Gravity: direct, octree (Barnes-Hut with group interaction lists), PM and TreePM.

Public API::

    from cosmo_dask.gravity import accelerations, to_zarr, open_gravity

    acc, pot = accelerations(snap, method="tree", theta=0.5, softening=0.01)
    to_zarr(acc, pot, "gravity.zarr", attrs={"method": "tree"})
    ds = open_gravity("gravity.zarr")   # xarray Dataset of dask arrays

See ``docs/gravity.md`` for the conventions, methods and store layout. The
method modules (``direct``, ``tree.graph``, ``pm``, ``treepm``) are imported
only when a method is asked for.
"""

from ..core.lazy import lazy_exports

#: public name -> the module holding it; loaded on first use (:func:`cosmo_dask.core.lazy.
#: lazy_exports`), so that importing the light ``gravity.parameters`` (as the CLI's parser
#: does) does not load numba and the kernels
_PUBLIC = {"accelerations": "api", "check_parameters": "api", "default_n_mesh": "api",
           "METHODS": "api", "to_zarr": "output", "open_gravity": "output"}

__all__ = ["accelerations", "check_parameters", "default_n_mesh", "to_zarr", "open_gravity",
           "METHODS"]

lazy_exports(__name__, _PUBLIC)
