"""Distributed 3-d real FFT of a mesh held in slabs (``docs/fft.md``).

Every mesh FFT elsewhere in cosmo_dask (PM gravity, P(k), paint's interlacing,
the IC generators) transforms the whole mesh in one task on one worker. The two
functions here split that work over the cluster, the classic slab
decomposition:

forward, :func:`rfftn`
    1. ``fft-r2c`` (one task per real slab along axis 0, chunks ``(c0, n1, n2)``):
       ``rfft`` along axis 2, then ``fft`` along axis 1; both axes are whole
       inside a slab.
    2. the transpose: ``rechunk`` to *k-space slabs along axis 1*, chunks
       ``(n0, c1, n2 // 2 + 1)``. This is Dask's all-to-all (``rechunk-split`` /
       ``rechunk-merge`` tasks, or Dask's P2P rechunk when a distributed client
       is the default one and the graph is large): every real slab sends a piece
       to every k-slab.
    3. ``fft-c2c`` (one task per k-slab): ``fft`` along axis 0.

inverse, :func:`irfftn`
    the same steps backwards: ``fft-ic2c`` (inverse ``fft`` along axis 0 per
    k-slab), the transpose back to real slabs along axis 0, ``fft-c2r``
    (inverse ``fft`` along axis 1, ``irfft`` along axis 2, per slab).

Conventions are NumPy's (unnormalised forward, ``1 / (n0 n1 n2)`` on the
inverse): ``rfftn(x)`` holds the values of ``numpy.fft.rfftn(x)`` and
``irfftn(k, shape)`` those of ``numpy.fft.irfftn(k, s=shape)``; even and odd
sizes on every axis behave as in NumPy (the last axis of the k-space mesh has
``n2 // 2 + 1`` entries, so :func:`irfftn` needs ``shape`` to tell an even
``n2`` from an odd one). float32 meshes give complex64 k-space meshes and back,
float64 meshes complex128.

Chunks may be NumPy or CuPy arrays: each block function picks its module from
the block it is given (:func:`cosmo_dask.core.backend.array_module`), ``scipy.fft``
with ``workers=1`` on the CPU (one task is one thread; Dask runs the slabs in
parallel, unlike the single-task paths, which give ``scipy.fft`` every core) and
``cupy.fft`` on the GPU; the ``meta`` of every result keeps the input's array
type, so a CuPy-backed mesh gives a CuPy-backed k-space mesh.

Memory
------
Write ``M`` for the bytes of the complex k-space mesh (``n0 n1 (n2 // 2 + 1)``
complex values, about the real mesh's bytes) and ``S`` for the number of slabs.
One ``fft-r2c`` task holds one real slab in and one complex slab out (the
second FFT runs in place on the output): about ``2 M / S``. One ``fft-c2c``
task holds one k-slab in and one out: ``2 M / S``. A ``rechunk-merge`` task
holds the ``S`` pieces of one k-slab and their concatenation: ``2 M / S``. So
the peak per task is about **2/S of the mesh** (2/S of ``M``; with the default
one slab per 64 MiB of ``M``, about 128 MiB). Summed over the cluster, the
transpose is the transient: until the pieces are released both the slab and
the k-slab copies of the mesh may be alive, up to ``2 M`` in all (P2P
rechunking holds its shards on the workers' disks instead).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, empty_meta
from ..core.errors import ParameterError
from ..core.progress import worker_threads

__all__ = ["DEFAULT_SLAB_BYTES", "LARGE_SLAB_BYTES", "MAX_DEFAULT_SLABS", "MAX_N_MESH",
           "MAX_PRIME_FACTOR", "SINGLE_SLAB_BYTES",
           "check_mesh_size", "default_slab_count", "irfftn", "kslab_wavenumbers",
           "map_kslabs", "reduce_kslabs", "rfftn", "slab_chunks", "smooth_size_below",
           "fft_sizes_around", "is_fft_size", "prime_factors"]

#: Target bytes of one complex k-space slab for the default slab count.
DEFAULT_SLAB_BYTES = 64 * 2**20
#: Most slabs of the default count while slabs of up to :data:`LARGE_SLAB_BYTES` suffice:
#: every exchange (painting, transposes, interpolation) has tasks per slab, so a big mesh
#: takes fewer, larger slabs (2048^3 in float32: 103 slabs, not 513).
MAX_DEFAULT_SLABS = 96
#: Largest target bytes of one complex slab of the default count (see MAX_DEFAULT_SLABS):
#: a PM interpolation task reads 4 real slabs of about this size in float32 (1.25 GiB),
#: the 2LPT source 6 in float64 (1.9 GiB)
LARGE_SLAB_BYTES = 320 * 2**20
#: A mesh whose complex k-space mesh is at most this big is one slab by default (the
#: fast path: no transpose, the FFT tasks use every core).
SINGLE_SLAB_BYTES = 256 * 2**20
#: The largest mesh side of the mesh path (painting, P(k), PM, TreePM, ICs).
MAX_N_MESH = 4096
#: Mesh sides must be products of primes up to this one (2, 3, 5, 7).
MAX_PRIME_FACTOR = 7

_COMPLEX_OF = {np.dtype(np.float32): np.dtype(np.complex64),
               np.dtype(np.float64): np.dtype(np.complex128)}
_REAL_OF = {c: r for r, c in _COMPLEX_OF.items()}


# --------------------------------------------------------------------------- slab sizes
def slab_chunks(n: int, n_slabs: int) -> tuple[int, ...]:
    """Chunk sizes splitting an axis of ``n`` cells into ``n_slabs`` slabs.

    Sizes differ by at most one, the larger ones first (as
    ``numpy.array_split``). ``n_slabs`` above ``n`` is lowered to ``n``: a slab
    holds at least one plane.

    Raises
    ------
    ParameterError
        For ``n < 1`` or ``n_slabs < 1``.
    """
    n, n_slabs = int(n), int(n_slabs)
    if n < 1:
        raise ParameterError(f"slab_chunks: the axis must have at least one cell, got n={n}")
    if n_slabs < 1:
        raise ParameterError(f"slab_chunks: n_slabs must be at least 1, got {n_slabs}")
    n_slabs = min(n_slabs, n)
    q, r = divmod(n, n_slabs)
    return (q + 1,) * r + (q,) * (n_slabs - r)


def prime_factors(n: int) -> list[int]:
    """The prime factors of ``n >= 1`` in increasing order, with multiplicity."""
    out, p, n = [], 2, int(n)
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def is_fft_size(n: int) -> bool:
    """True when ``n``'s prime factors are all at most :data:`MAX_PRIME_FACTOR`."""
    return max(prime_factors(n), default=1) <= MAX_PRIME_FACTOR


def fft_sizes_around(n: int) -> tuple[int, int]:
    """The nearest valid FFT sizes below and above ``n`` (:func:`is_fft_size`)."""
    below = next((m for m in range(int(n) - 1, 0, -1) if is_fft_size(m)), 1)
    above = next(m for m in range(int(n) + 1, 2 * int(n) + 8) if is_fft_size(m))
    return below, above


def smooth_size_below(n: float) -> int:
    """The largest valid mesh side (:func:`check_mesh_size`) not above ``n`` (at least 1)."""
    m = max(1, min(int(n * (1 + 1e-9)), MAX_N_MESH))  # a cube root of 256^3 is 255.99...
    while not is_fft_size(m):
        m -= 1
    return m


def check_mesh_size(n_mesh, what: str, name: str = "n_mesh") -> int:
    """``n_mesh`` as an int, checked for the mesh path; the one check of every mesh side.

    Valid: an integer from 1 to :data:`MAX_N_MESH` (4096) whose prime factors are
    all at most :data:`MAX_PRIME_FACTOR` (7), e.g. 64, 96, 100, 128, 160, 192,
    224, 256, 384, 448, 512, 640, 768, 1000, 1024, 1536, 2048, 3072, 4096.

    Raises
    ------
    ParameterError
        Naming ``name`` and ``what``: not a positive integer; above 4096 (a slab
        holds at least one plane, so a transpose has up to ``n^2`` pieces, 16.8
        million at 4096; larger meshes need a pencil decomposition, not built);
        a prime factor above 7 (``scipy.fft`` and cuFFT
        fall back to Bluestein's algorithm there, several times slower), with the
        nearest valid sizes.
    """
    if isinstance(n_mesh, bool) or not isinstance(n_mesh, (int, np.integer)) or n_mesh < 1:
        raise ParameterError(f"{what}: {name} must be a positive integer, got {n_mesh!r}")
    n = int(n_mesh)
    if n > MAX_N_MESH:
        raise ParameterError(
            f"{what}: {name}={n} is larger than {MAX_N_MESH}, the largest mesh side of the "
            f"slab decomposition (a slab holds at least one plane, so a transpose has up to "
            f"{name}^2 pieces, 16.8 million at {MAX_N_MESH}; larger meshes need a pencil "
            "decomposition, which is not built)")
    p = max(prime_factors(n), default=1)
    if p > MAX_PRIME_FACTOR:
        below, above = fft_sizes_around(n)
        raise ParameterError(
            f"{what}: {name}={n} has the prime factor {p}: mesh sides must be products of "
            f"2, 3, 5 and 7 (the FFTs of other sizes are several times slower); the nearest "
            f"valid sizes are {below} and {above}")
    return n


def default_slab_count(shape: tuple[int, int, int], dtype: Any, *,
                       single_slab: bool = True) -> int:
    """The default number of slabs of a mesh of ``shape`` and real ``dtype``.

    The dask config key ``cosmo_dask.mesh_slabs`` (a positive integer) wins when
    set. Otherwise one slab (the fast path) when the complex k-space mesh holds
    at most :data:`SINGLE_SLAB_BYTES` (256 MiB: up to 400^3 in float32, 320^3 in
    float64): such a mesh is transformed in one task per step with every core
    (``scipy.fft`` ``workers=-1``), which on one machine beats splitting it.
    Above that, the larger of: one slab per :data:`DEFAULT_SLAB_BYTES` (64 MiB)
    of the complex mesh, and one slab per worker thread (of the default
    distributed client, else per core of this machine), so that every thread
    has a slab; but at most :data:`MAX_DEFAULT_SLABS` (96) slabs unless slabs
    of :data:`LARGE_SLAB_BYTES` (320 MiB) need more (2048^3 in float32: 103 slabs
    of 19-20 planes instead of 513; in float64, 205 instead of 1,025; a complex
    mesh of at most 6 GiB, up to 1171^3 in float32 and 929^3 in float64, keeps
    its 64 MiB slabs unless more than 96 threads ask for more). Never more than
    the mesh's planes along the split axes (``min(n0, n1)``). ``single_slab=False``
    skips the one-slab fast path (for a mesh whose whole pipeline would not fit
    one worker).

    Raises
    ------
    ParameterError
        For a ``cosmo_dask.mesh_slabs`` that is not a positive integer.
    """
    n0, n1, n2 = (int(s) for s in shape)
    configured = dask.config.get("cosmo_dask.mesh_slabs", None)
    if configured is not None:
        count = _count(configured, "dask config 'cosmo_dask.mesh_slabs'")
        return max(1, min(count, n0, n1))
    itemsize = _COMPLEX_OF.get(np.dtype(dtype), np.dtype(np.complex128)).itemsize
    kbytes = n0 * n1 * (n2 // 2 + 1) * itemsize
    if single_slab and kbytes <= SINGLE_SLAB_BYTES:
        return 1
    count = max(math.ceil(kbytes / DEFAULT_SLAB_BYTES), worker_threads())
    most = max(MAX_DEFAULT_SLABS, math.ceil(kbytes / LARGE_SLAB_BYTES))
    return max(1, min(count, most, n0, n1))


def _count(slabs: int | None, what: str) -> int | None:
    if slabs is None:
        return None
    if isinstance(slabs, bool) or not isinstance(slabs, (int, np.integer)) or slabs < 1:
        raise ParameterError(f"{what}: slabs must be a positive integer or None, got {slabs!r}")
    return int(slabs)


# --------------------------------------------------------------------------- block functions
def _scipy_fft():
    import scipy.fft

    return scipy.fft


#: Every cupy.fft call of the slab tasks runs on this one thread of the process, on a
#: block whose data starts on a 256-byte boundary, after a device synchronisation on
#: that thread: without these cuFFT failed with CUFFT_EXEC_FAILED (observed failures:
#: docs/fft.md, Devices; benchmarks/RESULTS.md, GPU tests).
_GPU_FFT_THREAD: list = []
_GPU_FFT_START = threading.Lock()


def _on_fft_thread(func, block, **kwargs):
    """``func(block, **kwargs)`` for a CuPy ``block`` on the process's one cuFFT thread,
    with the caller's current device."""
    import concurrent.futures

    import cupy

    with _GPU_FFT_START:
        if not _GPU_FFT_THREAD:
            _GPU_FFT_THREAD.append(concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="cosmo-dask-cufft"))
    device = cupy.cuda.Device().id
    if block.data.ptr % 256:  # a view into a larger array (e.g. da.from_array's slices):
        block = block.copy()  # cuFFT failed (CUFFT_EXEC_FAILED) on such a (3, 12, 10) slab

    def call():
        with cupy.cuda.Device(device):
            cupy.cuda.Device(device).synchronize()
            return func(block, **kwargs)

    return _GPU_FFT_THREAD[0].submit(call).result()


def _threads(n_slabs: int) -> int:
    """scipy.fft ``workers`` of a block task: every core for a one-slab mesh (the
    transform is the only task of its stage), one thread per task otherwise."""
    return -1 if n_slabs == 1 else 1


def _r2c_block(block, workers: int = 1):
    """Real slab (c0, n1, n2) -> complex slab (c0, n1, n2 // 2 + 1): rfft axis 2, fft axis 1."""
    xp = array_module(block)
    if xp is np:
        return _scipy_fft().rfftn(block, axes=(1, 2), workers=workers)
    return _on_fft_thread(xp.fft.rfftn, block, axes=(1, 2))


def _c2c_block(block, inverse: bool, workers: int = 1):
    """fft (or inverse fft) along axis 0 of a k-slab (n0, c1, nk)."""
    xp = array_module(block)
    mod = _scipy_fft() if xp is np else xp.fft
    func = mod.ifft if inverse else mod.fft
    if xp is np:
        return func(block, axis=0, workers=workers)
    return _on_fft_thread(func, block, axis=0)


def _r2c_whole(block):
    """A one-slab CuPy mesh's whole 3-d real FFT as one cuFFT plan (``fft-r2c3``)."""
    return _on_fft_thread(array_module(block).fft.rfftn, block)


def _c2r_whole(block, n2: int, overwrite: bool = False):
    """A one-slab CuPy k-space mesh's whole inverse 3-d real FFT as one cuFFT plan
    (``fft-c2r3``); ``overwrite``: cuFFT may use the block as its work space (no copy of
    it first: cuFFT's complex-to-real transforms overwrite their input)."""
    import cupyx.scipy.fft

    return _on_fft_thread(cupyx.scipy.fft.irfftn, block,
                          s=(block.shape[0], block.shape[1], n2), overwrite_x=overwrite)


def _one_gpu_plan(x: da.Array, slab_axis: int, slabs: int | None) -> bool:
    """A CuPy-backed mesh in one slab that stays one slab: transformed by one 3-d cuFFT
    plan (one pass over the mesh per direction instead of a plan per axis group and a
    strided axis-0 pass: 8 instead of 23 ms forward, 16 instead of 52 ms inverse at
    1024^3 float32 on a current GPU, ``pm-profile-gpu``). The values agree with the
    slab path's to float rounding; CPU meshes keep the slab path, whose bits do not
    depend on the slab count."""
    return (array_module(x._meta) is not np and len(x.chunks[slab_axis]) == 1
            and (slabs or 1) == 1)


def _c2r_block(block, n1: int, n2: int, workers: int = 1):
    """Complex slab (c0, n1, n2 // 2 + 1) -> real slab (c0, n1, n2): ifft axis 1, irfft axis 2."""
    xp = array_module(block)
    if xp is np:
        return _scipy_fft().irfftn(block, s=(n1, n2), axes=(1, 2), workers=workers)
    return _on_fft_thread(xp.fft.irfftn, block, s=(n1, n2), axes=(1, 2))


# --------------------------------------------------------------------------- checks
def _as_dask(x, chunks) -> da.Array:
    """A NumPy/CuPy (or array-like) mesh as a dask array of ``chunks``, keeping its type."""
    if isinstance(x, da.Array):
        return x
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = np.asarray(x)
    return da.from_array(x, chunks=chunks, asarray=False)


def _check_3d(shape, what: str) -> None:
    if len(shape) != 3:
        raise ParameterError(f"{what}: the mesh must be 3-d, got shape {tuple(shape)}")
    if any(math.isnan(s) for s in shape):
        raise ParameterError(f"{what}: the mesh shape must be known, got {tuple(shape)} "
                             "(call compute_chunk_sizes() first)")
    if min(shape) < 1:
        raise ParameterError(f"{what}: every axis needs at least one cell, got shape "
                             f"{tuple(shape)}")


# --------------------------------------------------------------------------- transforms
def rfftn(mesh, slabs: int | None = None) -> da.Array:
    """3-d real forward FFT of a mesh in slabs along axis 0: ``numpy.fft.rfftn(mesh)``.

    Parameters
    ----------
    mesh : dask array (or NumPy/CuPy array), shape (n0, n1, n2), real
        Best chunked in slabs along axis 0, ``chunks=((c0, ...), n1, n2)``
        (see :func:`slab_chunks`). A dask mesh chunked along axis 1 or 2 as
        well is first rechunked to slabs keeping its axis-0 chunks (one more
        all-to-all: chunk meshes in slabs where they are made to avoid it). A
        NumPy or CuPy array is wrapped in ``slabs`` slabs. float32 and float64
        are kept; integer and bool meshes are transformed in float64 (NumPy's
        rule); complex and other dtypes raise.
    slabs : int, optional
        Number of k-space slabs of the result (along axis 1), at most ``n1``;
        default: as many as the input's slabs, or :func:`default_slab_count`
        for a NumPy/CuPy input.

    Returns
    -------
    dask array, shape (n0, n1, n2 // 2 + 1), complex64 (float32 input) or complex128
        Laid out as **k-space slabs along axis 1**: chunks
        ``(n0, (c1, ...), n2 // 2 + 1)``, each chunk whole along axes 0 and 2.
        Same array type as the input chunks (NumPy or CuPy). Values as
        ``numpy.fft.rfftn`` (no normalisation). Peak memory per task is about
        2/S of the complex mesh for S slabs (module docstring).

    Raises
    ------
    ParameterError
        For a mesh that is not 3-d, has an empty axis or an unknown shape, is
        complex or of an unsupported dtype, or for a bad ``slabs``.
    """
    slabs = _count(slabs, "rfftn")
    shape = tuple(mesh.shape) if hasattr(mesh, "shape") else np.shape(mesh)
    _check_3d(shape, "rfftn")
    n0, n1, n2 = (int(s) for s in shape)
    dtype = np.dtype(mesh.dtype) if hasattr(mesh, "dtype") else np.asarray(mesh).dtype
    if dtype.kind in "biu":
        dtype_in = np.dtype(np.float64)
    elif dtype in _COMPLEX_OF:
        dtype_in = dtype
    elif dtype.kind == "c":
        raise ParameterError(f"rfftn: the mesh must be real, got dtype {dtype}; "
                             "use dask.array.fft.fftn for complex data")
    else:
        raise ParameterError(f"rfftn: the mesh must be float32 or float64 (or integer), "
                             f"got dtype {dtype}")
    if not isinstance(mesh, da.Array):
        count = slabs or default_slab_count(shape, dtype_in)
        mesh = _as_dask(mesh, (slab_chunks(n0, count), n1, n2))
    if dtype_in != dtype:
        mesh = mesh.astype(dtype_in)
    if len(mesh.chunks[1]) > 1 or len(mesh.chunks[2]) > 1:
        # each slab must hold whole planes for the first two 1-d FFTs
        mesh = mesh.rechunk((mesh.chunks[0], -1, -1))
    ctype = _COMPLEX_OF[dtype_in]
    nk = n2 // 2 + 1
    meta = empty_meta(mesh, 3, ctype)
    if _one_gpu_plan(mesh, 0, slabs):
        return da.map_blocks(_r2c_whole, mesh, chunks=((n0,), (n1,), (nk,)), dtype=ctype,
                             meta=meta, name=f"fft-r2c3-{tokenize(mesh)}")

    kslab = da.map_blocks(_r2c_block, mesh, _threads(len(mesh.chunks[0])),
                          chunks=(mesh.chunks[0], (n1,), (nk,)), dtype=ctype, meta=meta,
                          name=f"fft-r2c-{tokenize(mesh)}")
    kchunks = slab_chunks(n1, slabs or len(mesh.chunks[0]))
    pencils = kslab.rechunk(((n0,), kchunks, (nk,)))  # the all-to-all transpose
    return da.map_blocks(_c2c_block, pencils, False, _threads(len(kchunks)), dtype=ctype,
                         meta=meta, name=f"fft-c2c-{tokenize(pencils)}")


def irfftn(kmesh, shape, slabs: int | None = None, *, overwrite_input: bool = False
           ) -> da.Array:
    """3-d inverse real FFT, k-space slabs -> real slabs: ``numpy.fft.irfftn(kmesh, s=shape)``.

    Parameters
    ----------
    kmesh : dask array (or NumPy/CuPy array), shape (n0, n1, n2 // 2 + 1), complex
        Best laid out as :func:`rfftn` returns it, k-space slabs along axis 1
        (chunks ``(n0, (c1, ...), n2 // 2 + 1)``); a dask array chunked along
        axis 0 or 2 is first rechunked to that layout keeping its axis-1
        chunks. A NumPy or CuPy array is wrapped in ``slabs`` k-slabs.
        complex64 gives float32, complex128 float64.
    shape : (n0, n1, n2)
        The real mesh's shape. Must match ``kmesh``: ``(n0, n1)`` its first two
        axes and ``n2 // 2 + 1`` its last (``n2`` tells even from odd; unlike
        NumPy, no cropping or zero padding).
    slabs : int, optional
        Number of real slabs of the result (along axis 0), at most ``n0``;
        default: as many as the input's k-slabs, or :func:`default_slab_count`.
    overwrite_input : bool
        The caller's promise that ``kmesh``'s blocks are temporaries whose only consumer
        is this transform (e.g. a Green's function's output): a one-slab CuPy mesh is
        then transformed in its own memory (cuFFT's inverse real transforms overwrite
        their input; without the promise the block is copied first, a pass over the
        mesh). Ignored elsewhere.

    Returns
    -------
    dask array, shape ``shape``, float32 or float64
        Real slabs along axis 0 (chunks ``((c0, ...), n1, n2)``), chunks of the
        input's array type. Values as ``numpy.fft.irfftn(kmesh, s=shape)``
        (the ``1 / (n0 n1 n2)`` normalisation included; the imaginary parts
        that a real mesh cannot have, at k2 = 0 and the Nyquist plane, are
        dropped as NumPy does). Peak memory per task as for :func:`rfftn`.

    Raises
    ------
    ParameterError
        For a k-space mesh that is not 3-d or not complex, a ``shape`` that
        does not match it, or a bad ``slabs``.
    """
    slabs = _count(slabs, "irfftn")
    kshape = tuple(kmesh.shape) if hasattr(kmesh, "shape") else np.shape(kmesh)
    _check_3d(kshape, "irfftn")
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ParameterError(f"irfftn: shape must be three integers, got {shape!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise ParameterError(f"irfftn: shape must be three positive integers, got {shape}")
    n0, n1, n2 = shape
    nk = n2 // 2 + 1
    if tuple(int(s) for s in kshape) != (n0, n1, nk):
        raise ParameterError(f"irfftn: a real mesh of shape {shape} has a k-space mesh of "
                             f"shape {(n0, n1, nk)}, got {kshape}")
    dtype = np.dtype(kmesh.dtype) if hasattr(kmesh, "dtype") else np.asarray(kmesh).dtype
    if dtype not in _REAL_OF:
        raise ParameterError(f"irfftn: the k-space mesh must be complex64 or complex128, "
                             f"got dtype {dtype}")
    if not isinstance(kmesh, da.Array):
        count = slabs or default_slab_count(shape, _REAL_OF[dtype])
        kmesh = _as_dask(kmesh, (n0, slab_chunks(n1, count), nk))
    if len(kmesh.chunks[0]) > 1 or len(kmesh.chunks[2]) > 1:
        # each k-slab must hold whole lines along axis 0 for the first 1-d FFT
        kmesh = kmesh.rechunk((-1, kmesh.chunks[1], -1))
    rtype = _REAL_OF[dtype]
    if _one_gpu_plan(kmesh, 1, slabs):
        return da.map_blocks(_c2r_whole, kmesh, n2, bool(overwrite_input),
                             chunks=((n0,), (n1,), (n2,)), dtype=rtype,
                             meta=empty_meta(kmesh, 3, rtype),
                             name=f"fft-c2r3-{tokenize(kmesh, n2, bool(overwrite_input))}")

    lines = da.map_blocks(_c2c_block, kmesh, True, _threads(len(kmesh.chunks[1])), dtype=dtype,
                          meta=empty_meta(kmesh, 3, dtype), name=f"fft-ic2c-{tokenize(kmesh)}")
    chunks0 = slab_chunks(n0, slabs or len(kmesh.chunks[1]))
    slab = lines.rechunk((chunks0, (n1,), (nk,)))  # the all-to-all transpose back
    return da.map_blocks(_c2r_block, slab, n1, n2, _threads(len(chunks0)),
                         chunks=(chunks0, (n1,), (n2,)), dtype=rtype,
                         meta=empty_meta(kmesh, 3, rtype), name=f"fft-c2r-{tokenize(slab, n2)}")


# --------------------------------------------------------------------------- k-space slabs
def kslab_wavenumbers(shape, box_size: float, rows: slice, xp: Any = np, dtype: Any = np.float64):
    """Wavenumbers of one k-space slab, broadcastable against it.

    The k-space mesh of a real mesh of ``shape = (n0, n1, n2)`` is
    ``(n0, n1, n2 // 2 + 1)`` (:func:`rfftn`), held in slabs along axis 1; the
    slab ``rows`` is ``kmesh[:, rows, :]``. The wavenumbers follow
    ``numpy.fft.fftfreq`` / ``rfftfreq`` times ``2 pi n / box_size``.

    Parameters
    ----------
    shape : (n0, n1, n2)
        The real mesh's shape.
    box_size : float
        Side of the periodic box (length); ``2 pi / box_size`` is the
        fundamental wavenumber (1 / length).
    rows : slice
        The slab's rows along axis 1 (``slice(start, stop)``).
    xp : module
        ``numpy`` or ``cupy``: the arrays' module.
    dtype : dtype
        Real dtype of the returned arrays.

    Returns
    -------
    kx : (n0, 1, 1) array
    ky : (1, stop - start, 1) array
    kz : (1, 1, n2 // 2 + 1) array
        Wavenumbers along the three axes (1 / length), so ``kx**2 + ky**2 +
        kz**2`` broadcasts to the slab's shape.
    """
    n0, n1, n2 = (int(s) for s in shape)
    scale = 2.0 * math.pi / float(box_size)
    fx = np.fft.fftfreq(n0, d=1.0 / n0)
    fy = np.fft.fftfreq(n1, d=1.0 / n1)[rows]
    fz = np.fft.rfftfreq(n2, d=1.0 / n2)
    kx = xp.asarray((scale * fx).astype(dtype)).reshape(n0, 1, 1)
    ky = xp.asarray((scale * fy).astype(dtype)).reshape(1, fy.size, 1)
    kz = xp.asarray((scale * fz).astype(dtype)).reshape(1, 1, fz.size)
    return kx, ky, kz


def _kslab_block(block, *args, kfunc, shape, box_size, kdtype=None, block_info=None, **kwargs):
    lo, hi = block_info[0]["array-location"][1]
    xp = array_module(block)
    real = kdtype or _REAL_OF.get(np.dtype(block.dtype), np.dtype(np.float64))
    k = kslab_wavenumbers(shape, box_size, slice(lo, hi), xp, real)
    return kfunc(block, *k, *args, **kwargs)


def map_kslabs(func, kmesh: da.Array, *args, shape, box_size: float, name: str,
               dtype: Any = None, kdtype: Any = None, **kwargs) -> da.Array:
    """Apply ``func(block, kx, ky, kz, *args, **kwargs)`` to every k-space slab.

    The one way to act on a k-space mesh slab by slab (Green's functions,
    filters, transfer functions, IC fields): each task gets its slab and the
    slab's wavenumbers from :func:`kslab_wavenumbers` in the block's module
    (NumPy or CuPy) and real dtype, and returns a block of the same shape.

    Parameters
    ----------
    func : callable
        ``func(block, kx, ky, kz, *args, **kwargs) -> array`` of the block's shape.
    kmesh : dask array, (n0, n1, n2 // 2 + 1)
        A k-space mesh in slabs along axis 1, as :func:`rfftn` returns it.
    shape : (n0, n1, n2)
        The real mesh's shape.
    box_size : float
        Periodic box side (length).
    name : str
        Task-name prefix (dashboard kind), e.g. ``"pm-green"``.
    dtype : dtype, optional
        Result dtype; default the input's.
    kdtype : dtype, optional
        Real dtype of the wavenumbers handed to ``func``; default the block's
        real dtype (float32 for complex64). float64 keeps functions of ``k``
        (windows, Green's functions) exact before they touch a float32 slab.

    Other dask arrays among ``args`` chunked like ``kmesh`` are handed to ``func``
    block by block (e.g. the second mesh of an interlaced pair).

    Returns
    -------
    dask array, the k-space slabs ``func`` returned (same chunks and array type).
    """
    _check_kslabs(kmesh, name)
    dtype = np.dtype(kmesh.dtype if dtype is None else dtype)
    shape = tuple(int(s) for s in shape)
    kdtype = None if kdtype is None else np.dtype(kdtype)
    token = tokenize(kmesh, func, args, kwargs, shape, box_size, kdtype)
    return da.map_blocks(_kslab_block, kmesh, *args, kfunc=func, shape=shape,
                         box_size=float(box_size), kdtype=kdtype, dtype=dtype,
                         meta=empty_meta(kmesh, 3, dtype), name=f"{name}-{token}", **kwargs)


def _check_kslabs(kmesh, name: str) -> None:
    if len(kmesh.chunks[0]) > 1 or len(kmesh.chunks[2]) > 1:
        raise ParameterError(f"{name}: the k-space mesh must be in slabs along axis 1 "
                             f"(chunks (n0, (c1, ...), nk)), got chunks {kmesh.chunks}")


def _reduce_block(block, *args, kfunc, shape, box_size, kdtype, out_shape, block_info=None,
                  **kwargs):
    lo, hi = block_info[0]["array-location"][1]
    xp = array_module(block)
    k = kslab_wavenumbers(shape, box_size, slice(lo, hi), xp, kdtype)
    out = np.asarray(kfunc(block, *k, *args, **kwargs), dtype=np.float64)
    if out.shape != out_shape:
        raise ValueError(f"reduce_kslabs: {kfunc!r} returned shape {out.shape}, not {out_shape}")
    return out.reshape((1, 1, 1) + out_shape)


def reduce_kslabs(func, kmesh: da.Array, *args, shape, box_size: float, name: str,
                  out_shape: tuple[int, ...], kdtype: Any = np.float64, **kwargs) -> da.Array:
    """Sum over the k-space slabs of ``func(block, kx, ky, kz, *args, **kwargs)``.

    The reduction twin of :func:`map_kslabs` (binned power spectra, norms):
    each task gets one k-space slab and its wavenumbers (:func:`kslab_wavenumbers`,
    in ``kdtype``, float64 by default, in the block's module) and returns a small
    NumPy float64 array of ``out_shape`` (host memory: copy CuPy results back);
    the per-slab arrays are summed by a tree reduction.

    Parameters
    ----------
    func : callable
        ``func(block, kx, ky, kz, *args, **kwargs) -> numpy array`` of ``out_shape``.
    kmesh : dask array, (n0, n1, n2 // 2 + 1)
        A k-space mesh in slabs along axis 1, as :func:`rfftn` returns it. Dask
        arrays among ``args`` chunked like it are handed over block by block.
    shape : (n0, n1, n2)
        The real mesh's shape.
    box_size : float
        Periodic box side (length).
    name : str
        Task-name prefix (dashboard kind), e.g. ``"power-bin"``.
    out_shape : tuple of int
        Shape of ``func``'s result.
    kdtype : dtype
        Real dtype of the wavenumbers (default float64).

    Returns
    -------
    dask array of ``out_shape``, float64, NumPy-backed: the sum over slabs.
    """
    _check_kslabs(kmesh, name)
    shape = tuple(int(s) for s in shape)
    out_shape = tuple(int(d) for d in out_shape)
    n_slabs = len(kmesh.chunks[1])
    token = tokenize(kmesh, func, args, kwargs, shape, box_size, kdtype, out_shape)
    parts = da.map_blocks(
        _reduce_block, kmesh, *args, kfunc=func, shape=shape, box_size=float(box_size),
        kdtype=np.dtype(kdtype), out_shape=out_shape, dtype=np.float64,
        chunks=((1,), (1,) * n_slabs, (1,)) + tuple((d,) for d in out_shape),
        new_axis=list(range(3, 3 + len(out_shape))),
        meta=np.empty((0,) * (3 + len(out_shape)), dtype=np.float64),
        name=f"{name}-{token}", **kwargs)
    return parts.sum(axis=(0, 1, 2))
