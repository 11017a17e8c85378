"""Creating Zarr v3 particle arrays for :meth:`Snapshot.to_zarr` and product stores."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import dask.array as da
import numpy as np

from ..core.backend import host
from ..core.errors import ParameterError, SnapshotError
from .chunk_manifest import write_manifests

COMPRESSORS = (None, "zstd", "blosc")


def plain_attrs(value, *, nonfinite_as_text: bool = False):
    """Store attributes as JSON-able Python objects: mappings as dicts with string keys,
    tuples and NumPy arrays as lists, NumPy scalars as Python numbers, bytes as text;
    with ``nonfinite_as_text`` non-finite floats (not JSON) as strings ("nan", "inf")."""
    if isinstance(value, Mapping):
        return {str(k): plain_attrs(v, nonfinite_as_text=nonfinite_as_text)
                for k, v in value.items()}
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain_attrs(v, nonfinite_as_text=nonfinite_as_text) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if nonfinite_as_text and isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def codecs_for(compressor: str | None):
    """The zarr ``compressors=`` argument for a compressor name."""
    if compressor is None:
        return None
    from zarr.codecs import BloscCodec, ZstdCodec

    if compressor == "zstd":
        return (ZstdCodec(level=3),)
    if compressor == "blosc":
        return (BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"),)
    raise ParameterError(f"compressor must be one of {COMPRESSORS}, got {compressor!r}")


def dims_of(arr: da.Array) -> tuple[str, ...]:
    return ("particle", "axis") if arr.ndim == 2 else ("particle",)


def regular_rows(arr: da.Array) -> int:
    """Rows per store chunk for ``arr``: its first row chunk when that grid fits it
    (all chunks equal, the last no longer), else its largest row chunk."""
    rows = arr.chunks[0]
    if not rows or not rows[0]:
        return 1
    if len(set(rows[:-1])) > 1 or rows[-1] > rows[0]:
        return max(rows)
    return rows[0]


class GuardedTarget:
    """The write end of one stored array, for ``da.store``.

    Takes chunks of any array type (CuPy chunks are copied to the host here, so
    no writer has to remember it), and refuses writes once its store directory
    has been removed: an atomic write removes its temporary directory when any
    chunk fails, and chunk writes still in flight must not recreate it (zarr
    creates missing parents).
    """

    def __init__(self, array, root: str):
        self.array, self.root = array, root
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim

    def __setitem__(self, key, value):
        if not os.path.isdir(self.root):
            raise SnapshotError(f"{self.root}: write aborted (temporary store was removed)")
        self.array[key] = host(value)


def store_dataset(ds, where: str | os.PathLike, *, label: str) -> None:
    """Write a small in-memory ``xarray.Dataset`` (catalogs, coefficients) at ``where``
    inside a (temporary) store, every chunk written and recorded in the chunk manifest
    like :func:`store_arrays`' arrays, so a lost chunk is found on reading."""
    import zarr

    ds.to_zarr(str(where), mode="w", zarr_format=3, consolidated=False,
               write_empty_chunks=True)
    written = zarr.open_group(str(where), mode="r+")
    write_manifests([a for _, a in written.arrays()], label, show=False)


def write_dataset_store(ds, path: str | os.PathLike, *, group: str, fmt: str, version: int,
                        what: str, overwrite: bool = False, inputs=()) -> str:
    """A small in-memory ``xarray.Dataset`` (a product: correlation function, bispectrum)
    as a Zarr v3 store of its own, written atomically: a root group carrying ``format``
    and ``format_version``, the Dataset in ``group`` (:func:`store_dataset`, every chunk
    in the manifest, attributes made JSON values by :func:`plain_attrs`). Returns the
    path; :func:`cosmo_dask.store.zarr_read.open_dataset_store` reads it back."""
    import zarr

    from .atomic import atomic_directory, local_path

    with atomic_directory(path, overwrite=overwrite, what=what, fmt=fmt,
                          inputs=tuple(inputs)) as tmp:
        zarr.open_group(str(tmp), mode="w", zarr_format=3,
                        attributes={"format": fmt, "format_version": version})
        out = ds.copy()
        out.attrs = {k: plain_attrs(v) for k, v in ds.attrs.items()}
        store_dataset(out, tmp / group, label=f"writing {path}")
    return str(local_path(path))


def store_arrays(group, arrays: Mapping[str, da.Array], *, root: str | os.PathLike,
                 label: str, chunks: Mapping[str, tuple] | None = None,
                 dims: Mapping[str, tuple] | None = None, compressors=None,
                 fill_value=0, show: bool | None = None) -> None:
    """Create one stored array per dask array under ``group`` and write them all.

    The one way every cosmo_dask store writes its arrays. Each source is
    rechunked onto its store's chunk grid first, so no two tasks ever write the
    same stored chunk (at any alignment of the compute chunks), and chunks may
    be NumPy or CuPy (see :class:`GuardedTarget`).

    Parameters
    ----------
    group : zarr.Group
        Where to create the arrays; a name ``"sub/name"`` goes into the existing
        subgroup ``sub``.
    arrays : mapping of str to dask.array.Array
    root : path
        The (temporary) store directory; writes stop once it is removed.
    label : str
        Progress label, e.g. ``"writing out.zarr"``.
    chunks : mapping, optional
        Store chunk shape per name; default: :func:`regular_rows` rows, whole
        other axes.
    dims : mapping, optional
        Dimension names per name; default :func:`dims_of`.
    compressors, fill_value :
        Passed to ``create_array``.
    show : bool, optional
        Progress display (default: dask config ``cosmo_dask.progress``).
    """
    from ..core.progress import compute

    sources, targets = [], []
    for name, arr in arrays.items():
        shape = (chunks or {}).get(name) or (regular_rows(arr),) + tuple(arr.shape[1:])
        parent, _, leaf = name.rpartition("/")
        where = group[parent] if parent else group
        # every chunk is written, even one holding only the fill value, so a missing
        # chunk file is always an error when the store is read (chunk_manifest.check_chunks)
        stored = where.create_array(leaf, shape=arr.shape, chunks=shape, dtype=arr.dtype,
                                    compressors=compressors, fill_value=fill_value,
                                    dimension_names=(dims or {}).get(name) or dims_of(arr),
                                    config={"write_empty_chunks": True})
        grid = tuple(min(c, n) or 1 for c, n in zip(shape, arr.shape, strict=True))
        sources.append(arr.rechunk(grid))
        targets.append(GuardedTarget(stored, str(root)))
    if not sources:
        return
    stored = da.store(sources, targets, lock=False, compute=False)
    stored = stored if isinstance(stored, (tuple, list)) else (stored,)
    compute(*stored, label=label, show=show)
    write_manifests([target.array for target in targets], f"{label}: checksums", show)
