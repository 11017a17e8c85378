"""Creating Zarr v3 particle arrays for :meth:`Snapshot.to_zarr` and product stores."""

from __future__ import annotations

import os
from collections.abc import Sequence

import dask.array as da
import numpy as np

from .errors import ParameterError, SnapshotError

COMPRESSORS = (None, "zstd", "blosc")


def plain_attrs(value):
    """Store attributes as JSON-able Python objects (NumPy scalars and arrays converted)."""
    if isinstance(value, dict):
        return {str(k): plain_attrs(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain_attrs(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
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


class GuardedTarget:
    """A stored array that refuses writes once its store directory has been removed.

    An atomic write removes its temporary directory when any chunk fails; chunk
    writes still in flight must not recreate it (zarr creates missing parents).
    """

    def __init__(self, array, root: str):
        self.array, self.root = array, root
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim

    def __setitem__(self, key, value):
        if not os.path.isdir(self.root):
            raise SnapshotError(f"{self.root}: write aborted (temporary store was removed)")
        self.array[key] = value


def create_arrays(
    group, names: Sequence[str], sources: Sequence[da.Array], compressors, root: str | None = None
):
    """Create one stored array per dask array, chunked like its (regular) dask chunks.

    With ``root`` (the store directory) the targets are :class:`GuardedTarget`.
    """
    targets = []
    for name, arr in zip(names, sources, strict=True):
        rows = max(1, arr.chunks[0][0]) if arr.shape[0] else 1
        targets.append(
            group.create_array(
                name,
                shape=arr.shape,
                chunks=(rows,) + tuple(arr.shape[1:]),
                dtype=arr.dtype,
                compressors=compressors,
                dimension_names=dims_of(arr),
                fill_value=0,
            )
        )
    if root is not None:
        targets = [GuardedTarget(t, root) for t in targets]
    return targets
