"""Reading Zarr v3 particle arrays into dask arrays.

For arrays on a local filesystem with a regular chunk grid and the plain
``bytes`` codec (optionally followed by a zstd/blosc/gzip compressor), each
dask task reads its store chunks itself: ``readinto`` straight into the
task's output buffer for uncompressed chunks, or one read plus a numcodecs
decode (which releases the GIL) for compressed ones. This skips zarr's
synchronous API, which funnels every chunk through a single event-loop thread
and copies it twice; it roughly halves read time (``python -m benchmarks io``).
Anything else (remote stores, sharding, filters) is read through
``dask.array.from_zarr``.

On the GPU (``device="gpu"``) a task reads its rows in pieces of 8 MiB with a small
thread pool, each thread into its own pinned host buffer, and copies each piece to
the GPU on its own CUDA stream, so that file reads and host-to-device copies overlap;
the values are checked on the GPU afterwards.

Reads verify (``verify=True``, the default of :func:`cosmo_dask.open_snapshot`): the
CRC-32 of each chunk file's raw bytes is computed piece by piece as they are read (on
the host, before a piece is copied to the GPU) and compared with the one the chunk
manifest recorded when the store was written; a mismatch raises
:class:`~cosmo_dask.core.errors.ChecksumError` naming the store, array and chunk. A task
that reads only part of a chunk also reads (and checksums) the rest of that chunk file.
Reads through the zarr library go through :class:`~cosmo_dask.store.chunk_manifest.VerifiedStore`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import to_device
from ..core.errors import ChecksumError, SnapshotError
from .chunk_manifest import (
    MANIFEST,
    check_chunks,
    checksum_error,
    crc32,
    crc32_combine,
    expected_crcs,
    local_root,
    verified_store,
    verify_default,
)
from .validation import CHECKED_ARRAYS, check_block, checked_array, range_is_valid

_NUMCODECS = {"zstd": "zstd", "blosc": "blosc", "gzip": "gzip"}
#: bytes read per ``readinto`` call; each piece is range-checked while it is in cache
_PIECE_BYTES = 1 << 20


def _chunk_rows(n: int, rows: int) -> tuple[int, ...]:
    if n == 0:
        return (0,)
    full, rest = divmod(n, rows)
    return (rows,) * full + ((rest,) if rest else ())


def _direct_plan(zarray, verify: bool = False) -> dict[str, Any] | None:
    """What a task needs to read chunks of ``zarray`` itself, or None if it cannot; with
    ``verify`` it holds the manifest's CRC-32 of each chunk file (``"crc32"``)."""
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
        "store": str(zarray.store.root),
        "keys": keys,
        "rows": chunk_shape[0],
        "trailing": chunk_shape[1:],
        "dtype": dtype.str,
        "compressor": compressor,
        "fill": meta.fill_value,
        "crc32": expected_crcs(zarray) if verify else None,
    }


def _decode(raw: bytes, compressor: str | None) -> bytes:
    if compressor is None:
        return raw
    import numcodecs

    return numcodecs.get_codec({"id": _NUMCODECS[compressor]}).decode(raw)


def _crc_span(f, value: int, size: int | None = None) -> int:
    """``value`` carried over the next ``size`` bytes of open file ``f`` (to its end when
    None), read piece by piece into scratch memory."""
    while size is None or size > 0:
        piece = f.read(_PIECE_BYTES if size is None else min(size, _PIECE_BYTES))
        if not piece:
            break
        value = crc32(piece, value)
        if size is not None:
            size -= len(piece)
    return value


def _file_crc(path: str, start: int, stop: int | None = None) -> int:
    """CRC-32 of bytes ``[start, stop)`` of ``path`` (``stop`` None: to its end)."""
    with open(path, "rb") as f:
        f.seek(start)
        return _crc_span(f, 0, None if stop is None else stop - start)


def _missing(what: str, key: str) -> ChecksumError:
    return ChecksumError(f"{what}: chunk {key} is missing (the store was written complete); "
                         "restore it or re-create the store")


def _read_into(path: str, dest: np.ndarray, skip_rows: int, width: int, what: str,
               scan: bool = True, want: int | None = None, key: str = "") -> tuple:
    """``readinto`` ``dest`` from ``path`` piece by piece; returns the (min, max) seen
    (of floating values, when ``scan``). With ``want`` (the chunk file's recorded CRC-32)
    the CRC-32 of the whole file is computed as it is read (the rows before and after
    ``dest`` into scratch memory) and a mismatch raises ChecksumError naming ``key``."""
    lo, hi = np.inf, -np.inf
    view = memoryview(dest).cast("B")
    step = max(width, _PIECE_BYTES // width * width)
    check = scan and dest.dtype.kind == "f"
    value = 0
    with open(path, "rb", buffering=0) as f:
        if skip_rows and want is None:
            f.seek(skip_rows * width)
        elif skip_rows:
            value = _crc_span(f, value, skip_rows * width)
        done = 0
        while done < len(view):
            got = f.readinto(view[done : done + step])
            if not got:
                raise SnapshotError(
                    f"{what}: chunk file {path} is truncated ({done} of {len(view)} bytes)"
                )
            if want is not None:
                value = crc32(view[done : done + got], value)
            if check and got % width == 0:
                piece = dest[done // width : (done + got) // width]
                lo, hi = min(lo, piece.min()), max(hi, piece.max())
            elif check:  # a short read that split a row: fall back to a full range
                lo, hi = -np.inf, np.inf
            done += got
        if want is not None and _crc_span(f, value) != want:
            raise checksum_error(what, key)
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
    as they are read (see :func:`cosmo_dask.store.validation.check_block`).
    """
    rows = plan["rows"]
    dtype = np.dtype(plan["dtype"])
    out = np.empty((hi - lo,) + tuple(plan["trailing"]), dtype=dtype)
    flat = out.reshape(hi - lo, -1)
    width = flat.shape[1] * dtype.itemsize
    vmin, vmax = np.inf, -np.inf
    what = f"{plan['store']}: array '{name}'"
    crcs = plan.get("crc32")
    for c, a, b in _store_chunks(lo, hi, rows):
        c_lo = c * rows
        dest = flat[a - lo : b - lo]
        key = plan["keys"][c]
        path = os.path.join(plan["root"], key)
        want = None if crcs is None else crcs[c]
        try:
            if plan["compressor"] is None:
                c_min, c_max = _read_into(path, dest, a - c_lo, width, what, want=want,
                                          key=key)
            else:
                with open(path, "rb") as f:
                    raw = f.read()
                if want is not None and crc32(raw) != want:
                    raise checksum_error(what, key)
                block = np.frombuffer(_decode(raw, plan["compressor"]),
                                      dtype=dtype).reshape(-1, flat.shape[1])
                dest[:] = block[a - c_lo : b - c_lo]
                c_min, c_max = (dest.min(), dest.max()) if dest.size else (np.inf, -np.inf)
        except FileNotFoundError:
            if want is not None:  # the manifest records it written
                raise _missing(what, key) from None
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
    what = f"{plan['store']}: array '{name}'"
    crcs = plan.get("crc32")
    device = cupy.cuda.Device().id
    cupy.cuda.get_current_stream().synchronize()  # ``out`` is free for other streams

    def copy(dest, host_rows, stream):
        cupy.cuda.runtime.memcpyAsync(dest.data.ptr, host_rows.ctypes.data, host_rows.nbytes,
                                      cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        stream.synchronize()  # the staging buffer is free again

    def read_piece(c, a, b):  # rows [a, b) of store chunk c, b - a <= step
        """The CRC-32 of the piece's bytes on the host (None unless verifying)."""
        with cupy.cuda.Device(device):
            buffer, stream = _staging(cupy)
            dest = flat[a - lo : b - lo]
            key = plan["keys"][c]
            path = os.path.join(plan["root"], key)
            want = None if crcs is None else crcs[c]
            host_rows = buffer[: (b - a) * width].view(dtype).reshape(b - a, flat.shape[1])
            try:
                if plan["compressor"] is None:
                    _read_into(path, host_rows, a - c * rows, width, what, scan=False)
                    value = None if want is None else crc32(host_rows)  # before the copy
                    copy(dest, host_rows, stream)
                    return value
                with open(path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                if want is not None:  # the manifest records it written
                    raise _missing(what, key) from None
                dest[...] = plan["fill"]  # zarr writes no chunk that holds only the fill value
                return None
            if want is not None and crc32(raw) != want:
                raise checksum_error(what, key)
            block = np.frombuffer(_decode(raw, plan["compressor"]),
                                  dtype=dtype).reshape(-1, flat.shape[1])
            for p in range(a, b, step):
                q = min(b, p + step)
                host_rows[: q - p] = block[p - c * rows : q - c * rows]
                copy(flat[p - lo : q - lo], host_rows[: q - p], stream)
            return None

    pieces = []
    for c, a, b in _store_chunks(lo, hi, rows):
        if plan["compressor"] is not None:
            pieces.append((c, a, b))  # one decode per store chunk, copied piece by piece
        else:
            pieces.extend((c, p, min(b, p + step)) for p in range(a, b, step))
    futures = [_gpu_read_pool().submit(read_piece, *piece) for piece in pieces]
    values = [f.result() for f in futures]
    if crcs is not None and plan["compressor"] is None:
        _check_pieces(plan, pieces, values, width, what)
    if check is not None and out.size:
        check_block(out, name, check["box_size"], check["source"], lo)
    return out


def _check_pieces(plan: dict, pieces: list, values: list, width: int, what: str) -> None:
    """ChecksumError unless each store chunk's CRC-32, combined from the CRC-32s of the
    pieces (rows ``[a, b)`` of chunk ``c``, in order) that threads read of it and of the
    file's bytes before and after them, is the one its manifest records."""
    rows = plan["rows"]
    by_chunk: dict[int, list] = {}
    for (c, a, b), value in zip(pieces, values, strict=True):
        by_chunk.setdefault(c, []).append((a, b, value))
    for c, parts in by_chunk.items():
        if plan["crc32"][c] is None:  # recorded as not written
            continue
        key = plan["keys"][c]
        path = os.path.join(plan["root"], key)
        first, last = parts[0][0] - c * rows, parts[-1][1] - c * rows
        total = _file_crc(path, 0, first * width) if first else 0
        for a, b, value in parts:
            total = crc32_combine(total, value, (b - a) * width)
        total = _tail_crc(path, last * width, total)
        if total != plan["crc32"][c]:
            raise checksum_error(what, key)


def _tail_crc(path: str, start: int, value: int) -> int:
    """``value`` carried over the bytes of ``path`` from ``start`` to its end."""
    with open(path, "rb") as f:
        f.seek(start)
        return _crc_span(f, value)


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
    verify: bool | None = None,
) -> da.Array:
    """A lazy dask array over a stored particle array (chunks of ``rows`` particles).

    ``rows`` defaults to the store's own chunk length. With ``check`` each chunk's
    values are checked as it is read (finite; masses > 0; positions inside
    ``[0, box_size)`` when ``box_size`` is given), raising SnapshotError. With
    ``verify`` (default: dask config ``cosmo_dask.verify``, True) each chunk file's
    CRC-32 is compared with its manifest's as it is read (ChecksumError). Task
    keys are named ``read-<name>-<token>`` so the dashboard shows what is read.
    With ``device="gpu"`` the chunks are CuPy arrays, read through pinned buffers
    straight to the GPU and checked there (:func:`_read_rows_gpu`).
    """
    n = zarray.shape[0]
    store_rows = zarray.chunks[0]
    rows = rows or store_rows
    check = check and name in CHECKED_ARRAYS
    verify = verify_default(verify) and expected_crcs(zarray) is not None
    token = tokenize(source, name, _store_identity(zarray), zarray.shape, str(zarray.dtype),
                     rows, check, box_size, device, verify)
    key = f"read-{name}-{token}"
    plan = _direct_plan(zarray, verify)
    if plan is None:
        root = local_root(zarray)
        if verify and root is not None:  # the zarr library reads through a VerifiedStore
            import zarr

            zarray = zarr.open_array(verified_store(zarray.store.root), path=zarray.path,
                                     mode="r")
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


def product_store(path: str | os.PathLike, verify: bool | None = None):
    """What to open the local product store ``path`` with (``zarr.open_group``,
    ``xarray.open_zarr``): a :class:`~cosmo_dask.store.chunk_manifest.VerifiedStore` that checks
    every chunk it reads against the manifest's CRC-32 when ``verify`` (default: dask
    config ``cosmo_dask.verify``, True), else the path."""
    return verified_store(path) if verify_default(verify) else str(path)


def open_dataset_store(path: str | os.PathLike, *, group: str, fmt: str, version: int,
                       what: str):
    """The loaded ``xarray.Dataset`` of a store written by
    :func:`cosmo_dask.store.zarr_write.write_dataset_store` (format and version checked,
    chunks verified against their checksums)."""
    import xarray as xr

    from .atomic import local_path

    p = local_path(path)
    open_product_group(p, fmt=fmt, version=version, what=what)
    return xr.open_zarr(product_store(p / group), consolidated=False).load()


def open_product_group(path: str | os.PathLike, *, fmt: str, what: str,
                       version: int | None = None, verify: bool | None = None):
    """``(group, attrs)`` of a product store cosmo_dask wrote (halos, meshes, octrees, ...).

    SnapshotError naming ``what`` when ``path`` is no Zarr v3 directory, cannot be
    opened, has another ``format`` attribute or, with ``version``, another
    ``format_version``; when an array's shape implies another chunk count than its
    manifest records, or a chunk file is missing or resized. With ``verify`` (default:
    dask config ``cosmo_dask.verify``, True) the group reads through a
    :class:`~cosmo_dask.store.chunk_manifest.VerifiedStore`: every chunk read from it later
    is checked against its recorded CRC-32 (ChecksumError).
    """
    import zarr

    from .atomic import local_path, recover

    p = local_path(path)
    if not p.exists():
        recover(p)  # a replace of the store interrupted between its two renames
    if not p.is_dir() or not (p / "zarr.json").exists():
        raise SnapshotError(f"{p}: no {what} here (expected a Zarr v3 directory)")
    try:
        group = zarr.open_group(product_store(p, verify), mode="r")
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
