"""Creating Zarr v3 particle arrays for :meth:`Snapshot.to_zarr` and product stores."""

from __future__ import annotations

from collections.abc import Sequence

import dask.array as da

from .errors import ParameterError

COMPRESSORS = (None, "zstd", "blosc")


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


def create_arrays(group, names: Sequence[str], sources: Sequence[da.Array], compressors):
    """Create one stored array per dask array, chunked like its (regular) dask chunks."""
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
    return targets
