"""The gravity store: accelerations and potentials of a snapshot's particles.

Layout of ``OUT.zarr`` (Zarr v3 group, written atomically: a failed or
interrupted write leaves nothing at the path and an existing store untouched)::

    gravity.zarr/
      zarr.json   attrs: format="cosmo_dask.gravity", format_version=1, n_particles,
                  created_by, and the parameters of the computation: method, G,
                  box_size, theta, softening, softening_kernel, precision, n_mesh,
                  r_split, r_cut, max_leaf, max_group (those that apply), source;
                  units {length, velocity, mass}, length_units (box_size, softening,
                  r_split, r_cut), G_units
      acc  (N, 3) float32|float64   chunks (C, 3), dims (particle, axis);
                                    attr units: velocity^2 / length
      pot  (N,)   float32|float64   chunks (C,), dims (particle,); absent when not computed;
                                    attr units: velocity^2

Units come from :func:`~cosmo_dask.units.products.product_units` of the
snapshot's units (mass / length^2 and mass / length, marked "(G = 1)", for raw
arrays computed with the default G = 1).

Rows are in the snapshot's particle order and chunked like its arrays, so
``acc`` sits next to the snapshot's ``pos`` row for row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import dask.array as da
import numpy as np
import zarr

from ..core.errors import ParameterError, SnapshotError
from ..core.version import __version__
from ..store.atomic import atomic_directory, local_path
from ..store.zarr_read import open_product_group
from ..store.zarr_write import codecs_for, plain_attrs, store_arrays
from ..units import QUANTITIES
from ..units.products import FORCE_ARRAYS, product_units, store_units

FORMAT = "cosmo_dask.gravity"
FORMAT_VERSION = 1

__all__ = ["to_zarr", "open_gravity", "FORMAT", "FORMAT_VERSION"]


def _as_dask(x, rows: int | None = None) -> da.Array:
    if isinstance(x, da.Array):
        return x
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    chunk = rows or max(1, int(x.shape[0]))
    return da.from_array(x, chunks=(chunk,) + tuple(x.shape[1:]), asarray=False)


def to_zarr(
    acc,
    pot,
    path: str | os.PathLike,
    *,
    attrs: dict | None = None,
    overwrite: bool = False,
    compressor: str | None = None,
    progress: bool | None = None,
    units: Mapping[str, str] | None = None,
) -> str:
    """Write accelerations (and potentials) to a Zarr v3 gravity store, atomically.

    Parameters
    ----------
    acc : dask.array.Array or array_like
        (N, 3) accelerations (NumPy or CuPy chunks; CuPy chunks are copied to
        the host chunk by chunk).
    pot : dask.array.Array or array_like or None
        (N,) potentials, or None to store none.
    path : str or path-like
        The store directory (local or shared filesystem).
    attrs : dict, optional
        JSON-able attributes stored with the format header, typically the
        parameters of :func:`~cosmo_dask.gravity.accelerations` (``method``,
        ``G``, ``theta``, ...).
    overwrite : bool
        Replace an existing store at ``path`` (only once the new one is complete).
    compressor : {None, "zstd", "blosc"}
        Chunk compression (default none).
    progress : bool, optional
        Show progress (default: dask config ``cosmo_dask.progress``).
    units : mapping, optional
        The snapshot's ``units`` or their
        :func:`~cosmo_dask.units.products.product_units` (what
        :func:`~cosmo_dask.units.products.input_units` gives, with the "(G = 1)"
        variant): ``acc`` is stored in its ``acceleration``, ``pot`` in its
        ``potential`` unit. None: the "input ..." labels.

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ParameterError
        Wrong shapes, non-float dtypes or attributes that are not JSON-able.
    SnapshotError
        ``path`` exists (without ``overwrite``), is a file, or its parent is missing.
    """
    acc = _as_dask(acc)
    if acc.ndim != 2 or acc.shape[1] != 3:
        raise ParameterError(f"to_zarr: acc must have shape (N, 3), got {tuple(acc.shape)}")
    n = int(acc.shape[0])
    arrays = {"acc": acc}
    if pot is not None:
        pot = _as_dask(pot, acc.chunks[0][0] or None)
        if tuple(pot.shape) != (n,):
            raise ParameterError(f"to_zarr: pot must have shape ({n},) like acc's rows, "
                                 f"got {tuple(pot.shape)}")
        arrays["pot"] = pot
    for name, arr in arrays.items():
        if arr.dtype not in (np.float32, np.float64):
            raise ParameterError(f"to_zarr: {name} must be float32 or float64, got {arr.dtype}")
    pu = product_units(units)
    meta = plain_attrs(dict(attrs or {}))
    meta.update({"format": FORMAT, "format_version": FORMAT_VERSION, "n_particles": n,
                 "created_by": f"cosmo_dask {__version__}",
                 "units": {q: pu[q] for q in QUANTITIES}, "length_units": pu["length"],
                 "G_units": pu["gravitational_constant"]})
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"to_zarr: attrs must be JSON-serialisable ({exc})") from None
    compressors = codecs_for(compressor)
    with atomic_directory(path, overwrite=overwrite, what="gravity store", fmt=FORMAT,
                          inputs=(meta.get("source"),)) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3, attributes=meta)
        store_arrays(group, arrays, root=tmp, compressors=compressors,
                     label=f"writing {path}", show=progress)
        store_units(group, {name: pu[FORCE_ARRAYS[name]] for name in arrays})
    return str(local_path(path))


def open_gravity(path: str | os.PathLike):
    """Open a gravity store lazily as an ``xarray.Dataset``.

    Returns
    -------
    xarray.Dataset
        ``acc`` over dims (``particle``, ``axis``) and, when stored, ``pot``
        over ``particle``: dask arrays reading the store chunk by chunk, each
        with its stored ``units`` attribute; the store's attributes
        (parameters included) in ``attrs``.

    Raises
    ------
    SnapshotError
        No Zarr v3 group at ``path``, not a gravity store, an unsupported
        format version, or no ``acc`` array.
    """
    import xarray as xr

    p = local_path(path)
    group, attrs = open_product_group(p, fmt=FORMAT, version=FORMAT_VERSION,
                                      what="gravity store")
    keys = set(group.array_keys())
    if "acc" not in keys:
        raise SnapshotError(f"{p}: malformed gravity store (no 'acc' array)")
    data = {name: (dims, da.from_zarr(group[name]),
                   {k: v for k, v in group[name].attrs.items() if k == "units"})
            for name, dims in (("acc", ("particle", "axis")), ("pot", ("particle",)))
            if name in keys}
    return xr.Dataset(data, coords={"axis": ["x", "y", "z"]}, attrs=attrs)
