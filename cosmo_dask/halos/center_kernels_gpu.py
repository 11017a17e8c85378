"""Halo-centre kernels on the GPU (CUDA kernel ``cuda/center.cu``).

:func:`segment_potentials_gpu` is the GPU twin of
:func:`cosmo_dask.halos.center_kernels.segment_potentials`: the exact
potential of every particle due to the other members of its segment
(particles sorted by halo, segment ``s`` = rows ``starts[s]:starts[s+1]``);
:func:`segment_mbp_gpu`, the twin of :func:`~cosmo_dask.halos.center_kernels.segment_mbp`,
takes each segment's argmin of those potentials.

Layout: the work is a precomputed list of ``(segment, i-tile)`` items, one
CUDA block of ``_BLOCK`` threads per item, so a big halo is spread over many
blocks and a small one takes one. Each thread owns one particle ``i`` of the
tile; the block walks the segment's particles ``j`` in chunks of ``_BLOCK``
staged through shared memory. Sums are accumulated in float64.

CuPy is imported inside the functions, so this module imports without it.

Units: as in :mod:`cosmo_dask.halos.center_kernels` (positions, box and
softening in one length unit, masses in one mass unit, ``G`` in
length**3 / (mass time**2)).
"""

from __future__ import annotations

import numpy as np

from .. import cuda
from ..core.backend import host
from ..core.errors import ParameterError
from .center_kernels import check_common, check_starts, segmented_argmin

__all__ = ["segment_max_gpu", "segment_mbp_gpu", "segment_potentials_gpu"]

# Threads per block = particles per i-tile = j particles per shared-memory chunk.
_BLOCK = 128


def _module(precision: str):
    """``center.cu`` compiled for ``precision`` ('float64' or 'float32') on the current
    device: its ``seg_pot_f64`` / ``seg_pot_f32`` kernel, and ``seg_max_nonneg``."""
    real, name = ("double", "f64") if precision == "float64" else ("float", "f32")
    return cuda.module("center", {"REAL": real, "SEG_POT": f"seg_pot_{name}", "BLOCK": _BLOCK})


def _kernel(precision: str):
    """The ``seg_pot_f64`` / ``seg_pot_f32`` kernel of ``center.cu`` for ``precision``."""
    return _module(precision).get_function(
        "seg_pot_f64" if precision == "float64" else "seg_pot_f32")


def segment_potentials_gpu(pos, mass, starts, *, box_size=None, softening=0.0, G=1.0,
                           precision="float64"):
    """Exact potential of every particle due to its own segment, on the GPU.

    Same definition and results as
    :func:`cosmo_dask.halos.center_kernels.segment_potentials`:
    ``phi_i = -G * sum_{j in seg(i), j != i} m_j / sqrt(|r_i - r_j|**2 + eps**2)``,
    a zero separation with ``softening = 0`` contributing 0.

    Parameters
    ----------
    pos : cupy.ndarray
        Positions, shape ``(n, 3)`` (length units); converted to float64.
    mass : cupy.ndarray or float
        Masses, shape ``(n,)`` or a scalar (mass units).
    starts : cupy.ndarray or numpy.ndarray
        int64 segment bounds, shape ``(h + 1,)``, non-decreasing within
        ``[0, n]``. Rows outside every segment get potential 0.
    box_size : float, optional
        Periodic box side (length units): separations use the minimum image.
    softening : float, optional
        Plummer softening length ``eps >= 0`` (length units).
    G : float, optional
        Gravitational constant (length**3 / (mass time**2)).
    precision : {"float64", "float32"}, optional
        Arithmetic of the pair separations. Positions are first taken
        relative to their segment's first particle (minimum image with
        ``box_size``) in float64, then cast; the sum over pairs is accumulated
        in float64 either way (float32 and float64 errors against the CPU
        reference: ``benchmarks/RESULTS.md``, "Halos").

    Returns
    -------
    cupy.ndarray
        float64 potentials, shape ``(n,)``, in length**2 / time**2.

    Raises
    ------
    ParameterError
        On wrong shapes, unsorted or out-of-range ``starts``, ``box_size <= 0``,
        ``softening < 0`` or an unknown ``precision``.

    Notes
    -----
    GPU timings: ``benchmarks/RESULTS.md``, "Halos".
    """
    import cupy

    if precision not in ("float64", "float32"):
        raise ParameterError(f"precision must be 'float64' or 'float32', got {precision!r}")
    pos = cupy.asarray(pos, dtype=cupy.float64)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ParameterError(f"pos must have shape (n, 3), got {pos.shape}")
    n = pos.shape[0]
    if np.ndim(mass) == 0:
        mass = cupy.full(n, float(mass), dtype=cupy.float64)
    mass = cupy.asarray(mass, dtype=cupy.float64)
    if mass.shape != (n,):
        raise ParameterError(f"mass must have shape ({n},) like pos, got {mass.shape}")
    mass = cupy.ascontiguousarray(mass)
    L, eps, G = check_common(box_size, softening, G)
    starts_h = check_starts(cupy.asnumpy(starts) if hasattr(starts, "get") else starts, n)

    out = cupy.zeros(n, dtype=cupy.float64)
    counts_h = np.diff(starts_h)
    if n == 0 or not np.any(counts_h > 0):
        return out

    # work items: (segment, i-tile) for every tile of every non-empty segment
    ntiles_h = (counts_h + _BLOCK - 1) // _BLOCK
    seg_h = np.repeat(np.arange(counts_h.shape[0], dtype=np.int64), ntiles_h)
    tile_h = np.arange(seg_h.shape[0], dtype=np.int64) - np.repeat(
        np.cumsum(ntiles_h) - ntiles_h, ntiles_h
    )
    item_lo = cupy.asarray(starts_h[seg_h])
    item_hi = cupy.asarray(starts_h[seg_h + 1])
    item_i0 = cupy.asarray(starts_h[seg_h] + tile_h * _BLOCK)

    # positions relative to each segment's first particle (rows outside: to themselves)
    ref_h = np.arange(n, dtype=np.int64)
    a, b = starts_h[0], starts_h[-1]
    ref_h[a:b] = np.repeat(starts_h[:-1], counts_h)
    rel = pos - pos[cupy.asarray(ref_h)]
    if L > 0.0:
        rel -= L * cupy.rint(rel / L)
    real = cupy.float64 if precision == "float64" else cupy.float32
    x = cupy.ascontiguousarray(rel[:, 0], dtype=real)
    y = cupy.ascontiguousarray(rel[:, 1], dtype=real)
    z = cupy.ascontiguousarray(rel[:, 2], dtype=real)
    rtype = np.float64 if precision == "float64" else np.float32

    kern = _kernel(precision)
    kern(
        (int(seg_h.shape[0]),),
        (_BLOCK,),
        (x, y, z, mass, item_lo, item_hi, item_i0,
         rtype(L if L > 0.0 else 1.0), np.int32(1 if L > 0.0 else 0), rtype(eps * eps),
         np.float64(G), out),
    )
    return out


def segment_mbp_gpu(pos, mass, starts, *, box_size=None, softening=0.0,
                    G=1.0) -> tuple[np.ndarray, np.ndarray]:
    """Most bound particle of every segment and its potential, from every member's exact
    potential on the GPU (:func:`segment_potentials_gpu`, float64).

    The GPU twin of :func:`cosmo_dask.halos.center_kernels.segment_mbp`: same arguments
    (``pos`` and ``mass`` CuPy arrays), same answer (the argmin of the exact potentials,
    ties to the first row), returned like it on the host: ``rows`` int64 ``(h,)`` (-1
    for an empty segment) and ``potentials`` float64 ``(h,)`` (NaN for an empty
    segment). The per-member potentials are copied to the host (8 bytes a member) for
    the segmented argmin.
    """
    pot = host(segment_potentials_gpu(pos, mass, starts, box_size=box_size,
                                      softening=softening, G=G))
    best = segmented_argmin(pot, host(starts))
    return best, np.where(best >= 0, pot[np.maximum(best, 0)], np.nan)


def segment_max_gpu(values, starts):
    """:func:`cosmo_dask.halos.center_kernels.segment_max` on the GPU (the contract
    :data:`cosmo_dask.halos.dispatch.segment_max`): ``center.cu``'s ``seg_max_nonneg``, an
    atomic max of each value's bits into its segment (exact, in any thread order, for
    non-negative values). Returns a CuPy float64 ``(h,)``."""
    import cupy

    values = cupy.ascontiguousarray(cupy.asarray(values, dtype=np.float64))
    starts = cupy.asarray(starts, dtype=np.int64)
    h = int(starts.size) - 1
    if h < 1:
        return cupy.empty(0)
    n = int(values.size)
    seg = cupy.searchsorted(starts, cupy.arange(n, dtype=np.int64), side="right") - 1
    out = cupy.zeros(h, dtype=np.uint64)
    if n:
        kern = _module("float64").get_function("seg_max_nonneg")
        kern(((n + 255) // 256,), (256,), (values, seg.astype(np.int64), np.int64(n), out))
    return out.view(np.float64)
