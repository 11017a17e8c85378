"""The store ``cosmo-dask density --method ngp|cic|tsc|pcs`` writes: a painted mesh.

Layout of ``OUT.zarr`` (Zarr v3 group, written atomically; attrs
``format="cosmo_dask.mesh"``, ``format_version=1``, ``box_size``, ``n_mesh``,
``scheme``, ``cell_size``, ``convention``, and the units ``mass_units``,
``box_size_units``, ``cell_size_units``, ``density_units``): one array ``mass``
(n, n, n), the mass per cell in the snapshot's mass unit (its ``units``
attribute), chunked in slabs along axis 0 (about 128 MiB of float64 each; the
painted mesh's slabs are rechunked to them as they are written). Cell ``i``
covers ``[i H, (i + 1) H)`` with ``H = box_size / n``; divide by ``H**3`` for a
density (in ``density_units``). Units come from :func:`~cosmo_dask.units.products.product_units`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import dask.array as da
import numpy as np
import zarr

from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_product_group
from ..store.zarr_write import store_arrays
from ..units.products import product_units, store_units

FORMAT = "cosmo_dask.mesh"
FORMAT_VERSION = 1


def write_mesh(path: str | os.PathLike, mesh: da.Array, *, box_size: float, scheme: str,
               overwrite: bool = False, attrs: dict | None = None,
               units: Mapping[str, str] | None = None) -> str:
    """Write a painted mesh (mass per cell) atomically; returns the path.

    Parameters
    ----------
    path : str or path-like
    mesh : dask.array.Array
        ``(n, n, n)`` mass per cell, e.g. from :func:`~cosmo_dask.density.paint`.
    box_size : float
        Side of the painted cube, in length units.
    scheme : str
        The mass-assignment scheme it was painted with.
    overwrite : bool
        Replace an existing mesh store.
    attrs : dict, optional
        More attributes of the store (``source``, ...).
    units : mapping, optional
        The painted snapshot's ``units`` (or their
        :func:`~cosmo_dask.units.products.product_units`); None: the "input
        mass" / "input length" labels.
    """
    n = int(mesh.shape[0])
    pu = product_units(units)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "box_size": float(box_size),
            "n_mesh": n, "scheme": scheme, "cell_size": float(box_size) / n,
            "convention": "mass per cell; cell i covers [i H, (i+1) H), H = box_size / n_mesh",
            "mass_units": pu["mass"], "box_size_units": pu["length"],
            "cell_size_units": pu["length"], "density_units": pu["density"], **(attrs or {})}
    slab = max(1, min(n, 2**24 // max(1, n * n)))  # about 128 MiB of float64 per chunk
    with atomic_directory(path, overwrite=overwrite, what="mesh store", fmt=FORMAT,
                          inputs=(meta.get("source"),)) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=meta)
        store_arrays(group, {"mass": mesh.astype(np.float64)}, root=tmp,
                     chunks={"mass": (slab, n, n)}, dims={"mass": ("x", "y", "z")},
                     compressors="auto", label=f"writing {path}")
        store_units(group, {"mass": pu["mass"]})
    return str(local_path(path))


def open_mesh(path: str | os.PathLike):
    """``(mass, attrs)``: the mesh as a lazy dask array and the store's attributes
    (``mass_units``, ``cell_size_units``, ... among them)."""
    group, attrs = open_product_group(path, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="mesh store")
    return da.from_zarr(group["mass"]), attrs
