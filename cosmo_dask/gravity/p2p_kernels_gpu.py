"""All-pairs (P2P) gravity on the GPU: a tiled, register-blocked CUDA kernel (``cuda/p2p.cu``).

:func:`p2p_block_gpu` is the GPU twin of
:func:`cosmo_dask.gravity.p2p_kernels.p2p_block` (same definitions, kernels,
self-pair rules and parameters; CuPy arrays in and out).

Layout
------
Positions are taken relative to the targets' bounding-box centre in float64
(minimum image when periodic), then packed as ``(x, y, z, m)`` quadruples
(``float4`` / ``double4``) in the arithmetic dtype. A CUDA block of
``threads`` threads owns ``threads * per_thread`` targets (each thread keeps
``per_thread`` targets and their sums in registers: register blocking); the
block walks its source range in tiles of ``threads`` quadruples staged in
shared memory, each thread reading every tile entry once (a broadcast load)
and applying it to its ``per_thread`` targets (inner loop unrolled). The
source range can be split over ``blockIdx.y`` (``splits``) so that small N
still fills the GPU and the number of blocks is close to a whole number of
waves; the partial sums of the splits are added afterwards in a fixed order
(deterministic). Source counts are padded with zero-mass particles far away,
target counts with dummy targets whose results are dropped.

Plummer pair: 3 sub, 3 fma, ``rsqrtf``, 3 mul, 3 fma (+1 add for the
potential). Self pairs (``exclude="index"``) are tested only in the tiles
that overlap the block's own targets. Float32 sums are accumulated in float32
per thread in two levels (a sum per shared-memory tile, added to the running
total), so rounding grows with tile size plus tile count rather than with N;
float64 runs all in float64. Defaults (float32: 256 threads x 4 targets,
float64: 128 x 2): the fastest of a launch sweep (``benchmarks/RESULTS.md``, Gravity).

Units: as in :mod:`cosmo_dask.gravity.p2p_kernels`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import cuda
from ..core.backend import resolve_precision
from ..core.errors import ParameterError
from .p2p_kernels import _EXCLUDE, SPLINE_SUPPORT, check_kernel_params, check_p2p_inputs
from .truncated import get_table

__all__ = ["p2p_block_gpu", "DEFAULT_THREADS", "DEFAULT_PER_THREAD"]

DEFAULT_THREADS = {"float32": 256, "float64": 128}
DEFAULT_PER_THREAD = {"float32": 4, "float64": 2}
DEFAULT_UNROLL = 8
_PAD_POSITION = 1.0e18   # where padding sources (mass 0) sit, relative units

_MODULES: dict = {}


def kernel_defines(dtype, *, threads: int, per_thread: int, unroll: int, kernel: int,
                   trunc: int, level: int, periodic: bool, potential: bool, check: bool,
                   excl: int) -> dict:
    """The defines of ``p2p.cu`` for one specialisation of the tile kernel (entry point
    ``p2p_tile``)."""
    f32 = np.dtype(dtype) == np.float32
    return {"P2P_REAL": "float" if f32 else "double", "P2P_REAL4": "float4" if f32 else "double4",
            "P2P_SQRT": "sqrtf" if f32 else "sqrt", "P2P_FMA": "fmaf" if f32 else "fma",
            "P2P_NT": int(threads), "P2P_NR": int(per_thread), "P2P_UNROLL": int(unroll),
            "P2P_KERNEL": kernel, "P2P_TRUNC": trunc, "P2P_LEVEL": level,
            "P2P_PERIODIC": int(periodic), "P2P_POT": int(potential), "P2P_CHECK": int(check),
            "P2P_EXCL": excl}


def _compile(cupy, dtype: np.dtype, **spec):
    key = (dtype.name, tuple(sorted(spec.items())), cupy.cuda.runtime.getDevice())
    fn = _MODULES.get(key)
    if fn is None:
        options = ("-ftz=true",) if dtype == np.float32 else ()
        module = cuda.module("p2p", kernel_defines(dtype, **spec), options)
        fn = module.get_function("p2p_tile")
        _MODULES[key] = fn
    return fn


def _capacity(cupy, fn, threads: int) -> int:
    """Blocks resident on the whole GPU at once (occupancy from registers and threads)."""
    dev = cupy.cuda.Device()
    attrs = dev.attributes
    sms = int(attrs.get("MultiProcessorCount", 132))
    regs_sm = int(attrs.get("MaxRegistersPerMultiprocessor", 65536))
    threads_sm = int(attrs.get("MaxThreadsPerMultiProcessor", 2048))
    regs = max(int(getattr(fn, "num_regs", 64)), 1)
    regs_block = ((regs * 32 + 255) // 256 * 256) * (threads // 32)   # per-warp granularity
    per_sm = max(1, min(regs_sm // max(regs_block, 1), threads_sm // threads, 32))
    return sms * per_sm


def _choose_splits(n_blocks: int, n_tiles: int, capacity: int, min_tiles: int = 16) -> int:
    """Source splits so the block count is near a whole number of waves (>= 1 wave)."""
    best, best_eff = 1, -1.0
    max_s = max(1, min(64, n_tiles // min_tiles))
    for s in range(1, max_s + 1):
        per = -(-n_tiles // s)
        s_eff = -(-n_tiles // per)
        waves = n_blocks * s_eff / capacity
        eff = waves / math.ceil(waves) if waves > 0 else 0.0
        if eff > best_eff + 0.01:
            best, best_eff = s_eff, eff
    return best


def _pack(cupy, pos, mass, centre, box, dtype, n_pad: int):
    n = pos.shape[0]
    rel = cupy.asarray(pos, dtype=cupy.float64) - centre
    if box is not None:
        rel -= box * cupy.floor(rel / box + 0.5)
    packed = cupy.empty((n_pad, 4), dtype=dtype)
    packed[:n, :3] = rel
    packed[:n, 3] = mass
    packed[n:, :3] = _PAD_POSITION
    packed[n:, 3] = 0
    return packed


def p2p_block_gpu(tpos, spos, smass, *, G: float = 1.0, softening: float = 0.0,
                  softening_kernel: str = "plummer", precision="float64", potential: bool = True,
                  box_size: float | None = None, rs: float | None = None,
                  r_cut: float | None = None, table_level: int | None = None,
                  exclude: str = "none", centre=None, threads: int | None = None,
                  per_thread: int | None = None, splits: int | None = None,
                  unroll: int = DEFAULT_UNROLL):
    """Accelerations (and potentials) of targets due to sources, on the GPU.

    Same definitions and parameters as
    :func:`cosmo_dask.gravity.p2p_kernels.p2p_block` (CuPy arrays); the
    extra keywords tune the launch.

    Parameters
    ----------
    tpos, spos : cupy.ndarray
        Target ``(nt, 3)`` and source ``(ns, 3)`` positions (length units).
    smass : cupy.ndarray or float
        Source masses ``(ns,)`` or one mass (mass units).
    G, softening, softening_kernel, precision, potential, box_size, rs, r_cut, table_level,
    exclude, centre
        As in :func:`~cosmo_dask.gravity.p2p_kernels.p2p_block`.
    threads : int, optional
        Threads per block = sources per shared-memory tile (32..1024, a
        multiple of 32).
    per_thread : int, optional
        Targets per thread (register blocking), 1..16.
    splits : int, optional
        Source-range splits over ``blockIdx.y`` (default: chosen from the
        GPU's occupancy so the block count is close to whole waves).
    unroll : int
        Unroll factor of the inner source loop.

    Returns
    -------
    acc : cupy.ndarray
        ``(nt, 3)`` accelerations (length / time^2), dtype ``precision``.
    pot : cupy.ndarray or None
        ``(nt,)`` potentials (length^2 / time^2), or None.
    """
    import cupy

    kp = check_kernel_params(G=G, softening=softening, softening_kernel=softening_kernel,
                             box_size=box_size, rs=rs, r_cut=r_cut, table_level=table_level)
    dtype = resolve_precision(precision)
    tpos, spos, mass, centre = check_p2p_inputs(cupy, tpos, spos, smass, exclude, centre)
    threads = DEFAULT_THREADS[dtype.name] if threads is None else int(threads)
    per_thread = DEFAULT_PER_THREAD[dtype.name] if per_thread is None else int(per_thread)
    if threads < 32 or threads > 1024 or threads % 32:
        raise ParameterError(f"threads must be a multiple of 32 in 32..1024, got {threads}")
    if not 1 <= per_thread <= 16:
        raise ParameterError(f"per_thread must be in 1..16, got {per_thread}")
    nt, ns = int(tpos.shape[0]), int(spos.shape[0])
    acc = cupy.zeros((nt, 3), dtype=dtype)
    pot = cupy.zeros(nt, dtype=dtype) if potential else None
    if nt == 0 or ns == 0:
        return acc, pot
    box = kp["box_size"]
    centre = cupy.asarray(centre, dtype=cupy.float64)

    bt = threads * per_thread
    nt_pad = -(-nt // bt) * bt
    ns_pad = -(-ns // threads) * threads
    if exclude == "index":
        ns_pad = nt_pad = max(nt_pad, ns_pad)
    src = _pack(cupy, spos, mass, centre, box, dtype, ns_pad)
    tgt = src if exclude == "index" else _pack(cupy, tpos, 0.0, centre, box, dtype, nt_pad)

    eps = kp["softening"]
    kernel = int(softening_kernel == "spline")
    trunc = 0 if kp["rs"] is None else 1
    level = -1 if kp["table_level"] is None else kp["table_level"]
    check = kernel == 0 and eps == 0.0
    fn = _compile(cupy, dtype, threads=threads, per_thread=per_thread, unroll=int(unroll),
                  kernel=kernel, trunc=trunc, level=level, periodic=box is not None,
                  potential=bool(potential), check=check, excl=_EXCLUDE[exclude])
    n_blocks = nt_pad // bt
    n_tiles = ns_pad // threads
    if splits is None:
        splits = _choose_splits(n_blocks, n_tiles, _capacity(cupy, fn, threads))
    splits = max(1, min(int(splits), n_tiles))
    per = -(-n_tiles // splits)
    splits = -(-n_tiles // per)
    split_len = per * threads

    h = SPLINE_SUPPORT * eps
    rs_ = kp["rs"]
    scal = dtype.type
    tab = get_table(dtype, cupy)
    out = cupy.empty((splits, nt_pad, 4), dtype=dtype)
    fn((n_blocks, splits), (threads,),
       (tgt, src, np.int64(ns_pad), np.int64(split_len), np.int64(nt_pad),
        scal(eps * eps), scal(h * h), scal(1.0 / h if h > 0 else 0.0),
        scal(box or 0.0), scal(1.0 / box if box else 0.0),
        scal(0.5 / rs_ if rs_ else 0.0), scal(kp["r_cut"] ** 2 if rs_ else 0.0), tab, out))
    tot = out[0] if splits == 1 else out.sum(axis=0)
    g = scal(kp["G"])
    acc[...] = g * tot[:nt, :3]
    if potential:
        pot[...] = -g * tot[:nt, 3]
    return acc, pot
