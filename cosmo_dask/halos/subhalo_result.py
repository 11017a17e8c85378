"""SubhaloResult: the subhalo catalog (and optional per-particle labels), and its store.

Store layout (Zarr v3 group, written atomically, every chunk in the manifest)::

    subhalos.zarr/
      zarr.json      attrs: format="cosmo_dask.subhalos", format_version=1, parameters
      catalog/       the catalog Dataset (xarray's Zarr layout, dims subhalo and axis;
                     every variable's ``units`` attribute kept)
      labels  (N,)   int64, only when the result has labels (-1: in no subhalo)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_product_group, product_store
from ..store.zarr_write import plain_attrs, store_arrays, store_dataset
from ..units.products import store_units

FORMAT = "cosmo_dask.subhalos"
FORMAT_VERSION = 1

__all__ = ["SubhaloResult", "open_subhalos"]


@dataclass
class SubhaloResult:
    """Bound subhalos of a snapshot's FOF halos (:func:`cosmo_dask.halos.subhalos`).

    Attributes
    ----------
    catalog : xarray.Dataset
        Over dim ``subhalo`` (and ``axis``): ``host``, ``n_bound``, ``mass``,
        ``position``, ``velocity``, ``v_max``, ``r_max``, ``mbp_id``, ``mbp_index``,
        ``is_central``, ``n_candidates``, each with a ``units`` attribute.
    labels : dask.array.Array or None
        (N,) int64 subhalo row of each particle (-1: bound to none), when asked for.
    parameters : dict
        Everything the result depends on.
    """

    catalog: xr.Dataset
    labels: da.Array | None = None
    parameters: dict = field(default_factory=dict)

    @property
    def n_subhalos(self) -> int:
        return int(self.catalog.sizes.get("subhalo", 0))

    @property
    def n_satellites(self) -> int:
        return int((~self.catalog["is_central"].values.astype(bool)).sum())

    def __repr__(self) -> str:
        from ..plot.html import with_unit

        big = ""
        sat = ~self.catalog["is_central"].values.astype(bool) if self.n_subhalos else []
        if np.any(sat):
            m = float(self.catalog["mass"].values[sat].max())
            big = f", largest satellite {with_unit(m, self.catalog.attrs.get('mass_unit'))}"
        return (f"<SubhaloResult {self.n_subhalos} subhalos ({self.n_satellites} satellites) "
                f"in {self.catalog.attrs.get('n_hosts', '?')} hosts{big}>")

    def to_zarr(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the catalog (and labels) to a Zarr v3 store, atomically; returns its path."""
        with atomic_directory(path, overwrite=overwrite, what="subhalo store", fmt=FORMAT,
                              inputs=(self.parameters.get("snapshot"),
                                      self.parameters.get("halos"))) as tmp:
            attrs = {"format": FORMAT, "format_version": FORMAT_VERSION,
                     "parameters": plain_attrs(self.parameters)}
            group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=attrs)
            if self.labels is not None:
                store_arrays(group, {"labels": self.labels.astype(np.int64)}, root=tmp,
                             fill_value=-1, label=f"writing {path}: labels")
                store_units(group, {"labels": "1"})
            ds = self.catalog.drop_vars("axis", errors="ignore")
            ds = ds.assign({k: ds[k].astype(np.int8) for k in ("is_central",) if k in ds})
            ds.attrs = {k: plain_attrs(v) for k, v in ds.attrs.items()}
            store_dataset(ds, tmp / "catalog", label=f"writing {path}: catalog")
        return str(local_path(path))


def open_subhalos(path: str | os.PathLike) -> SubhaloResult:
    """Open a store written by :meth:`SubhaloResult.to_zarr` (every chunk checked
    against its checksum; labels lazily)."""
    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="subhalo store")
    catalog = xr.open_zarr(product_store(p / "catalog"), consolidated=False).load()
    if "axis" in catalog.dims:
        catalog = catalog.assign_coords(axis=["x", "y", "z"])
    if "is_central" in catalog:
        catalog["is_central"] = catalog["is_central"].astype(bool)
    labels = da.from_zarr(group["labels"]) if "labels" in group else None
    return SubhaloResult(catalog, labels, dict(attrs.get("parameters", {})))
