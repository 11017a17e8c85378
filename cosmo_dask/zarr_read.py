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

On the GPU (``device="gpu"``) a task reads its rows in pieces of 8 MiB with a small
thread pool, each thread into its own pinned host buffer, and copies each piece to
the GPU on its own CUDA stream, so that file reads and host-to-device copies overlap;
the values are checked on the GPU afterwards.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from .backend import to_device
from .chunk_manifest import MANIFEST, check_chunks, local_root
from .errors import SnapshotError
from .validation import CHECKED_ARRAYS, check_block, checked_array, range_is_valid

_NUMCODECS = {"zstd": "zstd", "blosc": "blosc", "gzip": "gzip"}
#: bytes read per ``readinto`` call; each piece is range-checked while it is in cache
_PIECE_BYTES = 1 << 20


def _chunk_rows(n: int, rows: int) -> tuple[int, ...]:
    if n == 0:
        return (0,)
    full, rest = divmod(n, rows)
    return (rows,) * full + ((rest,) if rest else ())


def _direct_plan(zarray) -> dict[str, Any] | None:
    """What a task needs to read chunks of ``zarray`` itself, or None if it cannot."""
    try:
        from zarr.codecs import BytesCodec
    except ImportError:  # pragma: no cover - zarr layout changed
        return None
    meta = zarray.metadata
    root = local_root(zarray)
    if getattr(meta, "zarr_format", None) != 3 or root is None:
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


def _read_into(path: str, dest: np.ndarray, skip_rows: int, width: int, what: str,
               scan: bool = True) -> tuple:
    """``readinto`` ``dest`` from ``path`` piece by piece; returns the (min, max) seen
    (of floating values, when ``scan``)."""
    lo, hi = np.inf, -np.inf
    view = memoryview(dest).cast("B")
    step = max(width, _PIECE_BYTES // width * width)
    check = scan and dest.dtype.kind == "f"
    with open(path, "rb", buffering=0) as f:
        if skip_rows:
            f.seek(skip_rows * width)
        done = 0
        while done < len(view):
            got = f.readinto(view[done : done + step])
            if not got:
                raise SnapshotError(
                    f"{what}: chunk file {path} is truncated ({done} of {len(view)} bytes)"
                )
            if check and got % width == 0:
                piece = dest[done // width : (done + got) // width]
                lo, hi = min(lo, piece.min()), max(hi, piece.max())
            elif check:  # a short read that split a row: fall back to a full range
                lo, hi = -np.inf, np.inf
            done += got
    return lo, hi


def _store_chunks(lo: int, hi: int, rows: int):
    """``(c, a, b)``: store chunk ``c`` holds rows ``[a, b)`` of the range ``[lo, hi)``."""
    for c in range(lo // rows, (hi - 1) // rows + 1 if hi > lo else lo // rows):
        yield c, max(lo, c * rows), min(hi, (c + 1) * rows)


def _read_rows(
    plan: dict[str, Any], lo: int, hi: int, name: str, check: dict | None = None
) -> np.ndarray:
    """Rows [lo, hi) of the stored array, read chunk file by chunk file.

    With ``check`` (``{"box_size": ..., "source": ...}``) the values are checked
    as they are read (see :func:`cosmo_dask.validation.check_block`).
    """
    rows = plan["rows"]
    dtype = np.dtype(plan["dtype"])
    out = np.empty((hi - lo,) + tuple(plan["trailing"]), dtype=dtype)
    flat = out.reshape(hi - lo, -1)
    width = flat.shape[1] * dtype.itemsize
    vmin, vmax = np.inf, -np.inf
    what = f"{plan['root']}: array '{name}'"
    for c, a, b in _store_chunks(lo, hi, rows):
        c_lo = c * rows
        dest = flat[a - lo : b - lo]
        path = os.path.join(plan["root"], plan["keys"][c])
        try:
            if plan["compressor"] is None:
                c_min, c_max = _read_into(path, dest, a - c_lo, width, what)
            else:
                with open(path, "rb") as f:
                    raw = _decode(f.read(), plan["compressor"])
                block = np.frombuffer(raw, dtype=dtype).reshape(-1, flat.shape[1])
                dest[:] = block[a - c_lo : b - c_lo]
                c_min, c_max = (dest.min(), dest.max()) if dest.size else (np.inf, -np.inf)
        except FileNotFoundError:
            dest[:] = plan["fill"]  # zarr does not write chunks that hold only the fill value
            c_min = c_max = plan["fill"]
        vmin, vmax = min(vmin, c_min), max(vmax, c_max)
    if dtype.byteorder not in ("=", "|") and dtype.byteorder != np.dtype(dtype.name).byteorder:
        out = out.astype(dtype.newbyteorder("="))
    if (
        check is not None
        and out.size
        and not range_is_valid(float(vmin), float(vmax), name, check["box_size"])
    ):
        check_block(out, name, check["box_size"], check["source"], lo)
    return out


#: bytes per host-to-device piece of a GPU read: each reading thread owns one pinned
#: staging buffer of this size (allocated once per thread, reused by every read)
_STAGE_BYTES = 8 << 20
#: threads of the GPU read pool: page-cache reads and host-to-device copies in flight
_GPU_READ_THREADS = 8
_gpu_pool = None
_gpu_local = threading.local()


def _gpu_read_pool():
    global _gpu_pool
    if _gpu_pool is None:
        from concurrent.futures import ThreadPoolExecutor

        n = max(1, min(_GPU_READ_THREADS, os.cpu_count() or 1))
        _gpu_pool = ThreadPoolExecutor(n, thread_name_prefix="cosmo-dask-gpu-read")
    return _gpu_pool


def _staging(cupy):
    """This thread's pinned host buffer (a uint8 NumPy view) and its CUDA stream."""
    buffer = getattr(_gpu_local, "buffer", None)
    if buffer is None or buffer.size < _STAGE_BYTES:
        mem = cupy.cuda.alloc_pinned_memory(_STAGE_BYTES)
        _gpu_local.buffer = np.frombuffer(mem, np.uint8, _STAGE_BYTES)
        _gpu_local.stream = cupy.cuda.Stream(non_blocking=True)
    return _gpu_local.buffer, _gpu_local.stream


def _read_rows_gpu(
    plan: dict[str, Any], lo: int, hi: int, name: str, check: dict | None = None
):
    """Rows [lo, hi) of the stored array as a CuPy array, read the way
    :func:`_read_rows` reads them but in pieces of at most :data:`_STAGE_BYTES`, each read
    by a thread of a small pool into its pinned buffer and copied to the GPU on its own
    stream, so that reads and copies overlap; the values are checked on the GPU."""
    import cupy

    rows = plan["rows"]
    dtype = np.dtype(plan["dtype"])
    if dtype.byteorder not in ("=", "|") and dtype.byteorder != np.dtype(dtype.name).byteorder:
        return cupy.asarray(_read_rows(plan, lo, hi, name, check))  # a byte-swapped store
    out = cupy.empty((hi - lo,) + tuple(plan["trailing"]), dtype=dtype)
    flat = out.reshape(hi - lo, -1)
    width = flat.shape[1] * dtype.itemsize
    step = max(1, _STAGE_BYTES // width)  # rows per piece
    what = f"{plan['root']}: array '{name}'"
    device = cupy.cuda.Device().id
    cupy.cuda.get_current_stream().synchronize()  # ``out`` is free for other streams

    def copy(dest, host_rows, stream):
        cupy.cuda.runtime.memcpyAsync(dest.data.ptr, host_rows.ctypes.data, host_rows.nbytes,
                                      cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        stream.synchronize()  # the staging buffer is free again

    def read_piece(c, a, b):  # rows [a, b) of store chunk c, b - a <= step
        with cupy.cuda.Device(device):
            buffer, stream = _staging(cupy)
            dest = flat[a - lo : b - lo]
            path = os.path.join(plan["root"], plan["keys"][c])
            host_rows = buffer[: (b - a) * width].view(dtype).reshape(b - a, flat.shape[1])
            try:
                if plan["compressor"] is None:
                    _read_into(path, host_rows, a - c * rows, width, what, scan=False)
                    copy(dest, host_rows, stream)
                    return
                with open(path, "rb") as f:
                    raw = _decode(f.read(), plan["compressor"])
            except FileNotFoundError:
                dest[...] = plan["fill"]  # zarr writes no chunk that holds only the fill value
                return
            block = np.frombuffer(raw, dtype=dtype).reshape(-1, flat.shape[1])
            for p in range(a, b, step):
                q = min(b, p + step)
                host_rows[: q - p] = block[p - c * rows : q - c * rows]
                copy(flat[p - lo : q - lo], host_rows[: q - p], stream)

    pieces = []
    for c, a, b in _store_chunks(lo, hi, rows):
        if plan["compressor"] is not None:
            pieces.append((c, a, b))  # one decode per store chunk, copied piece by piece
        else:
            pieces.extend((c, p, min(b, p + step)) for p in range(a, b, step))
    for f in [_gpu_read_pool().submit(read_piece, *piece) for piece in pieces]:
        f.result()
    if check is not None and out.size:
        check_block(out, name, check["box_size"], check["source"], lo)
    return out


def _store_identity(zarray):
    """What tells this array's contents from a later write to the same path, for task
    keys: the chunk manifest (sizes and CRC-32s) when cosmo_dask wrote it, and the
    modification time of its metadata (a rewrite replaces the whole store directory)."""
    root = local_root(zarray)
    stamp = None
    if root is not None:
        try:
            stamp = os.stat(os.path.join(root, "zarr.json")).st_mtime_ns
        except OSError:
            pass
    return zarray.attrs.get(MANIFEST), stamp


def read_array(
    zarray,
    name: str,
    source: str,
    rows: int | None = None,
    *,
    check: bool = False,
    box_size: float | None = None,
    device: str = "cpu",
) -> da.Array:
    """A lazy dask array over a stored particle array (chunks of ``rows`` particles).

    ``rows`` defaults to the store's own chunk length. With ``check`` each chunk's
    values are checked as it is read (finite; masses > 0; positions inside
    ``[0, box_size)`` when ``box_size`` is given), raising SnapshotError. Task
    keys are named ``read-<name>-<token>`` so the dashboard shows what is read.
    With ``device="gpu"`` the chunks are CuPy arrays, read through pinned buffers
    straight to the GPU and checked there (:func:`_read_rows_gpu`).
    """
    n = zarray.shape[0]
    store_rows = zarray.chunks[0]
    rows = rows or store_rows
    check = check and name in CHECKED_ARRAYS
    token = tokenize(source, name, _store_identity(zarray), zarray.shape, str(zarray.dtype),
                     rows, check, box_size, device)
    key = f"read-{name}-{token}"
    plan = _direct_plan(zarray)
    if plan is None:
        arr = da.from_zarr(zarray, chunks=(rows,) + tuple(zarray.shape[1:]), name=key)
        return to_device(checked_array(arr, name, box_size, source) if check else arr, device)
    spec = {"box_size": box_size, "source": source} if check else None
    chunks = (_chunk_rows(n, rows),) + tuple((s,) for s in zarray.shape[1:])
    bounds = np.cumsum((0,) + chunks[0])
    dsk = {}
    for i in range(len(chunks[0])):
        dsk[(key, i) + (0,) * (zarray.ndim - 1)] = (
            _read_rows_gpu if device == "gpu" else _read_rows,
            plan,
            int(bounds[i]),
            int(bounds[i + 1]),
            name,
            spec,
        )
    dtype = np.dtype(plan["dtype"]).newbyteorder("=")
    meta = to_device(np.empty((0,) * zarray.ndim, dtype), device)
    return da.Array(dsk, key, chunks, dtype=dtype, meta=meta)


def open_product_group(path: str | os.PathLike, *, fmt: str, what: str,
                       version: int | None = None):
    """``(group, attrs)`` of a product store cosmo_dask wrote (halos, meshes, octrees, ...).

    SnapshotError naming ``what`` when ``path`` is no Zarr v3 directory, cannot be
    opened, has another ``format`` attribute or, with ``version``, another
    ``format_version``.
    """
    import zarr

    from .atomic import local_path, recover

    p = local_path(path)
    if not p.exists():
        recover(p)  # a replace of the store interrupted between its two renames
    if not p.is_dir() or not (p / "zarr.json").exists():
        raise SnapshotError(f"{p}: no {what} here (expected a Zarr v3 directory)")
    try:
        group = zarr.open_group(str(p), mode="r")
    except (FileNotFoundError, OSError, ValueError) as exc:
        raise SnapshotError(f"{p}: cannot open a {what} ({exc})") from exc
    attrs = dict(group.attrs)
    if attrs.get("format") != fmt:
        raise SnapshotError(f"{p}: not a cosmo_dask {what} (format is "
                            f"{attrs.get('format')!r}, expected {fmt!r})")
    if version is not None and attrs.get("format_version") != version:
        raise SnapshotError(f"{p}: {what} format_version {attrs.get('format_version')!r} "
                            f"is not supported (this cosmo_dask reads {version})")
    for name, arr in group.arrays():  # the product's own arrays (written with a manifest)
        check_chunks(arr, name, str(p), required=False)
    for sub_name, sub in group.groups():
        for name, arr in sub.arrays():
            check_chunks(arr, f"{sub_name}/{name}", str(p), required=False)
    return group, attrs
