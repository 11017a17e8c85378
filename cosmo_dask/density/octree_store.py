"""The density octree's Zarr store: :func:`write_density_octree` (behind
:meth:`DensityOctree.to_zarr`) and :func:`read_density_octree` (behind
:func:`~.octree_model.open_density_octree`). This module does not import the model
(the model's methods import it), so the two form no import cycle.

Store layout
------------
``OUT.zarr`` (Zarr v3 group, written atomically; a "multiscale" layout, one
subgroup per level present)::

    OUT.zarr/
      zarr.json        attrs: format="cosmo_dask.density_octree", format_version=1,
                       root_lo [3], root_size, patch_size, box_size (null: isolated),
                       levels [present levels], n_leaves, attrs (provenance dict),
                       units {length, velocity, mass} (the snapshot's), root_lo_units,
                       root_size_units, box_size_units, density_units
      level_{l}/       attrs: level, n_leaves, leaf_size, cell_size, leaf_size_units,
                       cell_size_units
        origin   (n_l, 3)        int64, the integer node indices at level l (units "1")
        density  (n_l, p, p, p)  float64, chunks (1, p, p, p) (units: mass / length^3)

Units (attribute ``units`` of each array, ``*_units`` of each attribute) come
from :func:`~cosmo_dask.units.products.product_units` of the tree's ``units``.

Leaves are stored grouped by level (in their order within a level), so a tree
re-opened with :func:`open_density_octree` lists its leaves level by level.
"""

from __future__ import annotations

import json
import os

import dask.array as da
import numpy as np
import zarr

from ..core.errors import ParameterError, SnapshotError
from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_product_group
from ..store.zarr_write import plain_attrs, store_arrays
from ..units.products import store_units

FORMAT = "cosmo_dask.density_octree"
FORMAT_VERSION = 1


def write_density_octree(tree, path: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Write the tree atomically as a Zarr v3 store (layout in the module docstring).

    Returns the path written. Raises ``SnapshotError`` for an existing
    ``path`` without ``overwrite=True``; a failed write leaves nothing.
    """
    provenance = plain_attrs(tree.attrs)
    try:
        json.dumps(provenance)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"DensityOctree.to_zarr: attrs must be JSON-serialisable "
                             f"({exc})") from exc
    levels = sorted(tree.levels)
    p = tree.patch_size
    pu = tree.unit_strings
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION,
            "root_lo": tree.root_lo.tolist(), "root_size": tree.root_size,
            "patch_size": p, "box_size": tree.box_size, "levels": levels,
            "n_leaves": tree.n_leaves, "attrs": provenance, "units": tree.units,
            "root_lo_units": pu["length"], "root_size_units": pu["length"],
            "box_size_units": pu["length"], "density_units": pu["density"]}
    with atomic_directory(path, overwrite=overwrite, what="density octree store",
                          fmt=FORMAT, inputs=(provenance.get("source"),)) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=meta)
        sources, chunks, dims = {}, {}, {}
        for lev in levels:
            ids = np.flatnonzero(tree.level == lev)
            size = tree.root_size / 2.0**lev
            group.create_group(f"level_{lev}", attributes={
                "level": lev, "n_leaves": len(ids), "leaf_size": size,
                "cell_size": size / p, "leaf_size_units": pu["length"],
                "cell_size_units": pu["length"]})
            rows = min(len(ids), 2**20)
            sources[f"level_{lev}/origin"] = da.from_array(
                tree.origin[ids].astype(np.int64), chunks=(rows, 3))
            chunks[f"level_{lev}/origin"] = (rows, 3)
            dims[f"level_{lev}/origin"] = ("leaf", "axis")
            src = tree.patches if len(ids) == tree.n_leaves else tree.patches[ids]
            sources[f"level_{lev}/density"] = src.astype(np.float64)
            chunks[f"level_{lev}/density"] = (1, p, p, p)
            dims[f"level_{lev}/density"] = ("leaf", "x", "y", "z")
        store_arrays(group, sources, root=tmp, chunks=chunks, compressors="auto",
                     dims=dims, label=f"writing {path}")
        store_units(group, {name: pu["density"] if name.endswith("/density") else "1"
                            for name in sources})
    return str(local_path(path))


def read_density_octree(path: str | os.PathLike) -> dict:
    """The fields of a store written by :meth:`DensityOctree.to_zarr`: the keyword
    arguments of :class:`~.octree_model.DensityOctree` (patches as lazy dask arrays);
    raises the ``SnapshotError`` of :func:`~.octree_model.open_density_octree`."""
    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="density octree store")
    try:
        levels = [int(v) for v in attrs["levels"]]
        level, origin, patches = [], [], []
        for lev in levels:
            sub = group[f"level_{lev}"]
            org = np.asarray(sub["origin"][...], dtype=np.int64)
            origin.append(org)
            level.append(np.full(len(org), lev, dtype=np.int64))
            patches.append(da.from_zarr(sub["density"]))
        return dict(root_lo=attrs["root_lo"], root_size=attrs["root_size"],
                    patch_size=int(attrs["patch_size"]), level=np.concatenate(level),
                    origin=np.concatenate(origin), patches=da.concatenate(patches, axis=0),
                    box_size=attrs.get("box_size"), attrs=dict(attrs.get("attrs") or {}),
                    units=attrs.get("units"))
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(p, exc) from exc


def malformed(path, exc: Exception) -> SnapshotError:
    """The error for a store at ``path`` whose content does not make a tree."""
    return SnapshotError(f"{local_path(path)}: malformed density octree store ({exc})")
