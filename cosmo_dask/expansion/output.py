"""The store ``cosmo-dask expand`` writes: an expansion's result, atomically.

Layout of ``OUT.zarr`` (Zarr v3 group; attrs ``format="cosmo_dask.expansion"``,
``format_version=1``, ``method`` ("scf" or "mex"), ``parameters``):

* ``scf/`` (SCF only): the coefficient store of :meth:`SCF.to_zarr`
  (coefficients and their variances), readable with :meth:`SCF.from_zarr`;
* ``acc`` (N, 3) and ``pot`` (N,): accelerations and potentials at the
  snapshot's particles, in its particle order (always for MEX, whose fitted
  state is per particle; for SCF with ``--accelerations``), each with a
  ``units`` attribute (velocity^2 / length and velocity^2 of the snapshot's
  units, :func:`~cosmo_dask.units.products.product_units`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import dask.array as da
import zarr

from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_product_group
from ..store.zarr_write import store_arrays
from ..units.products import FORCE_ARRAYS, product_units, store_units

FORMAT = "cosmo_dask.expansion"
FORMAT_VERSION = 1


def write_expansion(path: str | os.PathLike, *, method: str, parameters: dict, scf=None,
                    acc: da.Array | None = None, pot: da.Array | None = None,
                    overwrite: bool = False, units: Mapping[str, str] | None = None) -> str:
    """Write an expansion result (see the module docstring for the layout).

    ``units``: the unit strings of ``acc`` and ``pot`` as
    :func:`~cosmo_dask.units.products.product_units` gives them (``MEX.units_``,
    or the snapshot's ``units``). Default: those of ``scf``
    (``acceleration_units``, ``potential_units``), else the "input ..." labels.
    """
    pu = product_units(units)
    if units is None and scf is not None:
        a = scf.coefficients.attrs
        pu = dict(pu, acceleration=a.get("acceleration_units", pu["acceleration"]),
                  potential=a.get("potential_units", pu["potential"]))
    with atomic_directory(path, overwrite=overwrite, what="expansion store", fmt=FORMAT,
                          inputs=(parameters.get("source"),)) as tmp:
        attrs = {"format": FORMAT, "format_version": FORMAT_VERSION, "method": method,
                 "parameters": parameters}
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=attrs)
        if scf is not None:
            scf.to_zarr(tmp / "scf")
        arrays = {n: a for n, a in (("acc", acc), ("pot", pot)) if a is not None}
        store_arrays(group, arrays, root=tmp, label=f"writing {path}")
        store_units(group, {name: pu[FORCE_ARRAYS[name]] for name in arrays})
    return str(local_path(path))


def open_expansion(path: str | os.PathLike) -> dict:
    """Read a store written by :func:`write_expansion`: a dict with ``method``,
    ``parameters``, ``scf`` (an :class:`SCF` or None), lazy ``acc``/``pot``
    (dask arrays or None) and ``units`` (``{"acc": ..., "pot": ...}`` for those
    stored with a unit)."""
    from .scf import SCF

    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="expansion store")
    keys = set(group.array_keys())
    return {
        "method": attrs["method"],
        "parameters": attrs.get("parameters", {}),
        "scf": SCF.from_zarr(p / "scf") if (p / "scf").is_dir() else None,
        "acc": da.from_zarr(group["acc"]) if "acc" in keys else None,
        "pot": da.from_zarr(group["pot"]) if "pot" in keys else None,
        "units": {n: group[n].attrs["units"] for n in ("acc", "pot")
                  if n in keys and "units" in group[n].attrs},
    }
