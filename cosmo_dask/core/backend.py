"""Array backend: NumPy/CuPy dispatch, device detection and precision policy.

Dispatch is always on the chunk type of the data (``x._meta`` for dask
arrays), never on a global flag: a function given CuPy-backed chunks returns
CuPy-backed results. CuPy is imported only when it is installed *and* asked
for, so CPU-only machines never pay for (or fail on) the import.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np

from .checks import PRECISIONS
from .errors import DeviceError, ParameterError

Device = Literal["cpu", "gpu"]

_PRECISIONS = {name: np.dtype(name) for name in PRECISIONS}


# --------------------------------------------------------------------------- config
def default_chunk_size() -> int:
    """Particles per chunk, from dask config key ``cosmo_dask.chunk_size`` (default 2**20)."""
    value = dask.config.get("cosmo_dask.chunk_size", 2**20)
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 1:
        raise ParameterError(
            f"dask config 'cosmo_dask.chunk_size' must be a positive integer, got {value!r}"
        )
    return n


#: dask chunks at most, when a store is opened (or particles are generated) without
#: ``chunks``: every all-to-all step
#: (the domain split, the way back to chunk order, the slab exchange) has a task per
#: (chunk, domain or slab) pair, so a 2048^3 store in its 2^20-row chunks (8,192 chunks)
#: gives graphs of millions of tasks; 512 chunks of 2^24 rows (pos 192 MiB float32)
#: keep them under DESIGN.md's ~100k (benchmarks/RESULTS.md, "Graphs at 2048^3")
MAX_READ_CHUNKS = 512


def large_store_rows(store_rows: int, n_particles: int) -> int:
    """Rows per chunk for a store opened without ``chunks``: whole store chunks, enough of
    them that there are at most :data:`MAX_READ_CHUNKS` chunks (the store's own chunks for
    stores below ``MAX_READ_CHUNKS * store_rows`` particles, 2^29 with 2^20-row chunks).
    The generators' default chunks follow the same rule with ``default_chunk_size()``
    rows (``models.blocks.chunk_lengths``)."""
    store_rows = max(1, int(store_rows))
    per_chunk = -(-int(n_particles) // MAX_READ_CHUNKS)
    return store_rows * max(1, -(-per_chunk // store_rows))


def resolve_precision(precision: str | np.dtype | type | None = None) -> np.dtype:
    """Return the floating dtype of the precision policy.

    Parameters
    ----------
    precision : {"float32", "float64"}, numpy dtype or None
        ``None`` takes dask config key ``cosmo_dask.precision`` (default
        ``"float64"``). Every kernel computes in the dtype returned here.

    Raises
    ------
    ParameterError
        For anything other than float32 or float64.
    """
    if precision is None:
        precision = dask.config.get("cosmo_dask.precision", "float64")
    try:
        dt = np.dtype(precision)
    except TypeError:
        dt = None
    if dt is None or dt.name not in _PRECISIONS:
        raise ParameterError(f"precision must be 'float32' or 'float64', got {precision!r}")
    return _PRECISIONS[dt.name]


# --------------------------------------------------------------------------- devices
def cupy_installed() -> bool:
    """True when the ``cupy`` package can be found (does not import it)."""
    return importlib.util.find_spec("cupy") is not None


@functools.lru_cache(maxsize=1)
def gpu_count() -> int:
    """Number of CUDA devices usable through CuPy; 0 when CuPy or a GPU is absent."""
    if not cupy_installed():
        return 0
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver, no device, broken install: all mean "no GPU"
        return 0


def gpu_available() -> bool:
    """True when at least one CUDA GPU is usable through CuPy."""
    return gpu_count() > 0


def require_gpu(what: str = "this operation") -> Any:
    """Import and return cupy, or raise DeviceError saying why it cannot be used."""
    if not cupy_installed():
        raise DeviceError(
            f"{what} needs a GPU but CuPy is not installed; install the 'gpu' extra "
            "(pip install 'cosmo_dask[gpu]') or use device='cpu'"
        )
    if gpu_count() == 0:
        raise DeviceError(f"{what} needs a GPU but no CUDA device is visible; use device='cpu'")
    import cupy

    return cupy


# --------------------------------------------------------------------------- dispatch
def _is_cupy_type(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "cupy"


def array_module(x: Any):
    """Return ``numpy`` or ``cupy`` for an array or a dask array (from its ``_meta``)."""
    chunk = x._meta if isinstance(x, da.Array) else x
    if _is_cupy_type(chunk):
        import cupy

        return cupy
    return np


def device_of(x: Any) -> Device:
    """``"gpu"`` for CuPy arrays or CuPy-backed dask arrays, else ``"cpu"``."""
    return "gpu" if array_module(x) is not np else "cpu"


def check_device(device: str) -> Device:
    if device not in ("cpu", "gpu"):
        raise ParameterError(f"device must be 'cpu' or 'gpu', got {device!r}")
    return device  # type: ignore[return-value]


def host(x):
    """A NumPy array of ``x`` (copied from the GPU when it is a CuPy array)."""
    return x.get() if _is_cupy_type(x) else np.asarray(x)


def _to_cupy_chunk(block):
    import cupy

    return cupy.asarray(block)


def to_device(arr: Any, device: Device) -> Any:
    """Move an array to ``device``.

    Dask arrays stay lazy: each chunk is converted when computed and ``meta``
    is set to the target chunk type. NumPy/CuPy arrays are converted eagerly.
    Arrays already on ``device`` are returned unchanged.
    """
    device = check_device(device)
    if device_of(arr) == device:
        return arr
    if device == "gpu":
        cupy = require_gpu("to_device(..., 'gpu')")
        if isinstance(arr, da.Array):
            meta = cupy.empty((0,) * arr.ndim, dtype=arr.dtype)
            return arr.map_blocks(_to_cupy_chunk, dtype=arr.dtype, meta=meta)
        return cupy.asarray(arr)
    if isinstance(arr, da.Array):
        meta = np.empty((0,) * arr.ndim, dtype=arr.dtype)
        return arr.map_blocks(host, dtype=arr.dtype, meta=meta)
    return host(arr)


#: 64-bit odd constants of the content hash (the golden ratio and splitmix64's multipliers)
_HASH_STEP, _HASH_MUL1, _HASH_MUL2 = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                      0x94D049BB133111EB)
#: two independent 64-bit lanes (seeds) of the content hash
_HASH_SEEDS = (0x243F6A8885A308D3, 0x13198A2E03707344)
#: words hashed per step (bounds the temporaries to a few times 64 MiB)
_HASH_BLOCK = 1 << 23


def _content_hash(xp, x) -> np.ndarray:
    """Two 64-bit hashes of the bytes of ``x`` (C order), computed where ``x`` lives.

    Each 8-byte little-endian word ``w_i`` (the last one zero-padded) is mixed with its
    index by the splitmix64 finaliser, ``h = sum_i mix(w_i XOR (seed + i * step))``
    mod 2^64, once per seed. For a CuPy array the words never leave the device: a few
    elementwise kernels and one sum per block of :data:`_HASH_BLOCK` words, then one copy
    of the two sums (16 bytes) to the host. NumPy arrays give the same values.
    """
    flat = xp.ascontiguousarray(x).reshape(-1)
    if _is_cupy_type(flat) and flat.data.ptr % 8:  # a view at an odd offset: 8-byte words
        flat = flat.copy()                         # must be aligned on the device
    raw = flat.view(xp.uint8)
    n_words = raw.size // 8
    u64 = xp.uint64
    parts = [raw[: n_words * 8].view(u64)] if n_words else []
    if raw.size % 8:
        tail = xp.zeros(8, dtype=xp.uint8)
        tail[: raw.size % 8] = raw[n_words * 8:]
        parts.append(tail.view(u64))
    sums = xp.zeros(len(_HASH_SEEDS), dtype=u64)
    start = 0
    for words in parts:
        for lo in range(0, words.size, _HASH_BLOCK):
            w = words[lo:lo + _HASH_BLOCK]
            idx = xp.arange(start + lo, start + lo + w.size, dtype=u64) * u64(_HASH_STEP)
            for k, seed in enumerate(_HASH_SEEDS):
                z = w ^ (idx + u64(seed))
                z = (z ^ (z >> u64(30))) * u64(_HASH_MUL1)
                z = (z ^ (z >> u64(27))) * u64(_HASH_MUL2)
                z ^= z >> u64(31)
                sums[k:k + 1] += z.sum(dtype=u64, keepdims=True)  # wraps mod 2^64
        start += words.size
    return host(sums)


def array_token(x: Any) -> str:
    """A token of an array's contents, shape and dtype for dask key names.

    NumPy and other arrays: dask's ``tokenize`` (a hash of the buffer). CuPy arrays:
    :func:`_content_hash` on the device, since dask would pickle the array (a copy to
    the host, and back, at least twice) to tokenise it. Equal contents, shape and dtype
    give equal tokens; a change of any byte changes the token (up to 128-bit hash
    collisions), so keys stay deterministic and unique per input.
    """
    from dask.base import tokenize

    if _is_cupy_type(x):
        xp = array_module(x)
        return tokenize("content-hash", x.shape, x.dtype.str,
                        [int(v) for v in _content_hash(xp, x)])
    return tokenize(x)


def as_dask_rows(x: Any, rows: int | None = None, name: str = "array") -> da.Array:
    """Any NumPy/CuPy/dask/array-like input -> dask array chunked along axis 0 only.

    Non-dask input is wrapped in chunks of ``rows`` (default
    :func:`default_chunk_size`) rows, keeping its array type, under a key named by
    :func:`array_token` of its contents (no copy of a CuPy array to the host); a dask
    array is returned as is unless ``rows`` is given or it is chunked along other axes.
    """
    from dask.base import tokenize

    if not isinstance(x, da.Array):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            x = np.asarray(x)
        chunk = rows or default_chunk_size()
        x = da.from_array(x, chunks=(chunk,) + tuple(x.shape[1:]), asarray=False,
                          name=f"from-array-{name}-{tokenize(array_token(x), chunk)}")
    elif rows is not None or any(len(c) > 1 for c in x.chunks[1:]):
        x = x.rechunk((rows or x.chunks[0][0],) + tuple(-1 for _ in x.shape[1:]))
    return x


def particle_rows(pos: Any, mass: Any, what: str):
    """Checked particle arrays from any input: ``(pos, mass, n)``.

    ``pos`` becomes a dask (N, 3) array with one column chunk (see
    :func:`as_dask_rows`); ``mass`` stays ``None`` or one float, or becomes a
    dask (N,) array chunked like ``pos``. Raises ``ParameterError`` (naming
    ``what``) for a wrong shape or no particles; values are not read.
    """
    pos = as_dask_rows(pos)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ParameterError(f"{what}: positions must have shape (N, 3), got {pos.shape}")
    n = int(pos.shape[0])
    if n == 0:
        raise ParameterError(f"{what}: no particles (empty input)")
    if len(pos.chunks[1]) > 1:
        pos = pos.rechunk({1: 3})
    if mass is None or np.ndim(mass) == 0:
        return pos, None if mass is None else float(mass), n
    m = as_dask_rows(mass)
    if m.shape != (n,):
        raise ParameterError(f"{what}: mass must have shape ({n},) or be one number, "
                             f"got shape {m.shape}")
    if m.chunks[0] != pos.chunks[0]:
        m = m.rechunk((pos.chunks[0],))
    return pos, m, n


def _block_ranges(*blocks):
    """``(1, 2k)`` float64 of k blocks' (smallest, largest) values, where the blocks live;
    ``(+inf, -inf)`` for an empty block. NaN propagates (as ``min``/``max`` do)."""
    xp = array_module(blocks[0])
    vals = []
    for b in blocks:
        vals += [b.min(), b.max()] if b.size else [np.inf, -np.inf]
    return xp.stack([xp.asarray(v, dtype=np.float64) for v in vals]).reshape(1, -1)


def chunk_ranges(*arrays: da.Array) -> da.Array:
    """The smallest and largest value of each of ``arrays`` (dask, chunked alike along
    axis 0) in every row chunk, lazily: ``(n_chunks, 2 k)`` float64, one task per chunk.

    One task layer where ``a.min()``, ``a.max()`` per array would build and run ``2 k``
    tree reductions; :func:`value_ranges` reduces the computed table on the host (one
    copy from the device for all the values). Finite smallest and largest values mean
    every value is finite (NaN and infinities propagate to them).
    """
    letters = iter("abcdefghjlmnopqrstuvwxyz")  # every index but i (rows) and k (out)
    args = []
    for a in arrays:
        args += [a, "i" + "".join(next(letters) for _ in range(a.ndim - 1))]
    return da.blockwise(_block_ranges, "ik", *args, new_axes={"k": 2 * len(arrays)},
                        adjust_chunks={"i": 1}, concatenate=True, dtype=np.float64,
                        meta=array_module(arrays[0]).empty((0, 0), dtype=np.float64))


def value_ranges(table) -> list[tuple[float, float]]:
    """``[(smallest, largest), ...]`` per array from a computed :func:`chunk_ranges`
    table (NumPy or CuPy)."""
    t = np.asarray(host(table), dtype=np.float64)
    t = t.reshape(-1, t.shape[-1])
    return [(float(t[:, 2 * k].min()), float(t[:, 2 * k + 1].max()))
            for k in range(t.shape[1] // 2)]


def empty_meta(like: Any, ndim: int, dtype) -> Any:
    """A zero-size array of the same module as ``like`` (for ``meta=`` arguments)."""
    xp = array_module(like)
    return xp.empty((0,) * ndim, dtype=dtype)
