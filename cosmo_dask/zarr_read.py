"""Reading Zarr v3 particle arrays into dask arrays.

For arrays on a local filesystem with a regular chunk grid and the plain
``bytes`` codec (optionally followed by a zstd/blosc/gzip compressor), each
dask task reads its store chunks itself: ``readinto`` straight into the
task's output buffer for uncompressed chunks, or one read plus a numcodecs
decode (which releases the GIL) for compressed ones. This skips zarr's
synchronous API, which funnels every chunk through a single event-loop thread
and copies it twice; it roughly halves read time (benchmarks/bench_io.py).
Anything else (remote stores, sharding, filters) is read through
``dask.array.from_zarr``.
"""

from __future__ import annotations

import os
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from .errors import SnapshotError

_NUMCODECS = {"zstd": "zstd", "blosc": "blosc", "gzip": "gzip"}


def _chunk_rows(n: int, rows: int) -> tuple[int, ...]:
    if n == 0:
        return (0,)
    full, rest = divmod(n, rows)
    return (rows,) * full + ((rest,) if rest else ())


def _direct_plan(zarray) -> dict[str, Any] | None:
    """What a task needs to read chunks of ``zarray`` itself, or None if it cannot."""
    try:
        from zarr.codecs import BytesCodec
        from zarr.storage import LocalStore
    except ImportError:  # pragma: no cover - zarr layout changed
        return None
    meta = zarray.metadata
    if getattr(meta, "zarr_format", None) != 3 or not isinstance(zarray.store, LocalStore):
        return None
    codecs = list(meta.codecs)
    if not codecs or not isinstance(codecs[0], BytesCodec) or len(codecs) > 2:
        return None
    compressor = None
    if len(codecs) == 2:
        spec = codecs[1].to_dict()
        if spec.get("name") not in _NUMCODECS:
            return None
        compressor = spec["name"]
    chunk_shape = tuple(meta.chunk_grid.chunk_shape)
    if chunk_shape[1:] != tuple(zarray.shape[1:]):
        return None
    dtype = np.dtype(meta.dtype.to_native_dtype())
    endian = getattr(codecs[0], "endian", None)
    if dtype.itemsize > 1 and endian is not None:
        dtype = dtype.newbyteorder(
            "<" if str(getattr(endian, "value", endian)) == "little" else ">"
        )
    root = os.path.join(str(zarray.store.root), zarray.path)
    n_store = -(-zarray.shape[0] // chunk_shape[0]) if zarray.shape[0] else 0
    keys = [meta.encode_chunk_key((i,) + (0,) * (len(chunk_shape) - 1)) for i in range(n_store)]
    return {
        "root": root,
        "keys": keys,
        "rows": chunk_shape[0],
        "trailing": chunk_shape[1:],
        "dtype": dtype.str,
        "compressor": compressor,
        "fill": meta.fill_value,
    }


def _decode(raw: bytes, compressor: str | None) -> bytes:
    if compressor is None:
        return raw
    import numcodecs

    return numcodecs.get_codec({"id": _NUMCODECS[compressor]}).decode(raw)


def _read_rows(plan: dict[str, Any], lo: int, hi: int, name: str) -> np.ndarray:
    """Rows [lo, hi) of the stored array, read chunk file by chunk file."""
    rows = plan["rows"]
    dtype = np.dtype(plan["dtype"])
    out = np.empty((hi - lo,) + tuple(plan["trailing"]), dtype=dtype)
    flat = out.reshape(hi - lo, -1)
    width = flat.shape[1] * dtype.itemsize
    for c in range(lo // rows, (hi - 1) // rows + 1 if hi > lo else lo // rows):
        c_lo, c_hi = c * rows, (c + 1) * rows
        a, b = max(lo, c_lo), min(hi, c_hi)
        dest = flat[a - lo : b - lo]
        path = os.path.join(plan["root"], plan["keys"][c])
        try:
            if plan["compressor"] is None:
                with open(path, "rb", buffering=0) as f:
                    if a > c_lo:
                        f.seek((a - c_lo) * width)
                    view = memoryview(dest).cast("B")
                    got = f.readinto(view)
                    while got < len(view):  # short reads happen on some filesystems
                        more = f.readinto(view[got:])
                        if not more:
                            raise SnapshotError(
                                f"{plan['root']}: chunk file {plan['keys'][c]} of '{name}' is "
                                f"truncated ({got} of {len(view)} bytes)"
                            )
                        got += more
            else:
                with open(path, "rb") as f:
                    raw = _decode(f.read(), plan["compressor"])
                block = np.frombuffer(raw, dtype=dtype).reshape(-1, flat.shape[1])
                dest[:] = block[a - c_lo : b - c_lo]
        except FileNotFoundError:
            dest[:] = plan["fill"]  # zarr does not write chunks that hold only the fill value
    if dtype.byteorder not in ("=", "|") and dtype.byteorder != np.dtype(dtype.name).byteorder:
        out = out.astype(dtype.newbyteorder("="))
    return out


def read_array(zarray, name: str, source: str, rows: int | None = None) -> da.Array:
    """A lazy dask array over a stored particle array (chunks of ``rows`` particles).

    ``rows`` defaults to the store's own chunk length. Task keys are named
    ``read-<name>-<token>`` so the dashboard shows what is being read.
    """
    n = zarray.shape[0]
    store_rows = zarray.chunks[0]
    rows = rows or store_rows
    key = f"read-{name}-{tokenize(source, name, zarray.shape, str(zarray.dtype), rows)}"
    plan = _direct_plan(zarray)
    if plan is None:
        return da.from_zarr(zarray, chunks=(rows,) + tuple(zarray.shape[1:]), name=key)
    chunks = (_chunk_rows(n, rows),) + tuple((s,) for s in zarray.shape[1:])
    bounds = np.cumsum((0,) + chunks[0])
    dsk = {}
    for i in range(len(chunks[0])):
        dsk[(key, i) + (0,) * (zarray.ndim - 1)] = (
            _read_rows,
            plan,
            int(bounds[i]),
            int(bounds[i + 1]),
            name,
        )
    dtype = np.dtype(plan["dtype"]).newbyteorder("=")
    return da.Array(dsk, key, chunks, dtype=dtype, meta=np.empty((0,) * zarray.ndim, dtype))
