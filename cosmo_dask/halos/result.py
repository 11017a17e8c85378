"""HaloResult: labels + catalog, and their store (written atomically).

Store layout (Zarr v3 group)::

    halos.zarr/
      zarr.json      attrs: format="cosmo_dask.halos", format_version=1, parameters,
                     snapshot (source path), box_size, units
      labels  (N,)   int64, chunks like the snapshot
      catalog/       the catalog Dataset (xarray's Zarr layout, dims halo and axis)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from ..atomic import atomic_directory, local_path
from ..zarr_read import open_product_group
from ..zarr_write import plain_attrs, store_arrays

FORMAT = "cosmo_dask.halos"
FORMAT_VERSION = 1


@dataclass
class HaloResult:
    """Friends-of-friends halos of a snapshot.

    Attributes
    ----------
    labels : dask.array.Array
        (N,) int64, aligned with the snapshot's particle order; halo id h is
        row h of the catalog; -1 for particles in no kept halo.
    catalog : xarray.Dataset
        Over dim ``halo`` (and ``axis``): ``n_members``, ``mass``,
        ``center_of_mass``, ``velocity``, ``r_max``, ``first_member_id`` and,
        when asked for, ``mbp_index``/``mbp_position``/``mbp_potential`` and
        ``mcp_index``/``mcp_position``/``mcp_friends``.
    parameters : dict
        Everything the result depends on.
    """

    labels: da.Array
    catalog: xr.Dataset
    parameters: dict = field(default_factory=dict)

    @property
    def n_halos(self) -> int:
        return int(self.catalog.sizes.get("halo", 0))

    def __repr__(self) -> str:
        largest = int(self.catalog["n_members"][0]) if self.n_halos else 0
        return (f"<HaloResult {self.n_halos} halos (largest {largest} members), "
                f"linking length {self.parameters.get('linking_length')}>")

    def to_zarr(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write labels, catalog and parameters to a Zarr v3 store, atomically."""
        with atomic_directory(path, overwrite=overwrite, what="halo store") as tmp:
            attrs = {"format": FORMAT, "format_version": FORMAT_VERSION,
                     "parameters": plain_attrs(self.parameters)}
            group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=attrs)
            store_arrays(group, {"labels": self.labels.astype(np.int64)}, root=tmp,
                         fill_value=-1, label=f"writing {path}")
            ds = self.catalog.drop_vars("axis", errors="ignore")  # strings: no stable v3 dtype
            ds.attrs = {k: plain_attrs(v) for k, v in ds.attrs.items()}
            ds.to_zarr(str(tmp / "catalog"), mode="w", zarr_format=3, consolidated=False)
        return str(local_path(path))


def open_catalog(path: str | os.PathLike) -> HaloResult:
    """Open a halo store written by :meth:`HaloResult.to_zarr` (labels lazily)."""
    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION, what="halo store")
    labels = da.from_zarr(group["labels"])
    catalog = xr.open_zarr(str(p / "catalog"), consolidated=False).load()
    if "axis" in catalog.dims:
        catalog = catalog.assign_coords(axis=["x", "y", "z"])
    return HaloResult(labels, catalog, dict(attrs.get("parameters", {})))
