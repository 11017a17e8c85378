"""Periodic pair counts of one domain on the GPU (CuPy + CUDA C ``cuda/pair_count.cu``).

:func:`pair_count_gpu` is the GPU twin of
:func:`cosmo_dask.analysis.pair_count_kernels.pair_count`: same arguments, same
conventions (ordered pairs with an owned first member for an auto count, owned rows of
``pos`` with every row of ``pos2`` for a cross count; ``r_b^2 <= d^2 < r_{b+1}^2`` in
float64 with the CPU kernel's rounding) and the same counts, element for element.

Method: the cell list of :func:`~cosmo_dask.analysis.pair_count_kernels.cell_geometry`;
the particles' float64 coordinates (an open axis: the image nearest the domain, as on the
CPU) and cell ids are computed with CuPy array operations, sorted by cell (owned rows
first in each cell) with ``cupy.argsort``, and the cell starts found with
``searchsorted``. The kernel (one thread per particle of the first set) walks the
neighbour cells in the CPU kernel's order and adds each pair to a per-block histogram in
shared memory, added to the global int64 histogram with one atomic per bin at the end
(module docstring of ``pair_count.cu``). Compiled with ``--fmad=false`` so that squared
separations round as in the numba kernel.

:func:`pair_count_prepared` is the whole computation with the array module and the kernel
launcher given: :func:`pair_count_gpu` runs it with CuPy and the NVRTC-compiled kernel;
the tests run it with NumPy and the same source compiled on the host.

Memory: besides the input, 8 (key) + 8 (order) bytes per particle for the sort, then
25 bytes per particle (three float64 coordinates and the owned flag) and 8 per cell.
"""

from __future__ import annotations

import math

import numpy as np

from .. import cuda
from .pair_count_kernels import CELL_REFINE, count_bins

__all__ = ["pair_count_gpu", "pair_count_prepared", "sorted_cells", "BLOCK"]

#: threads per block
BLOCK = 128
#: shared memory a block may use for its histogram and edges (bytes)
SHARED_LIMIT = 48 * 1024


def sorted_cells(xp, pos, geo: np.ndarray, box: float, owned_rows: int):
    """The particles sorted by cell, owned rows (``< owned_rows``) first in each cell:
    ``(xs, ys, zs, own (uint8), cell (int64) of each sorted particle, start (ncell + 1))``
    with the coordinates and cells of :func:`~.pair_count_kernels._sort_cells`."""
    m = pos.shape[0]
    ns = [int(geo[4, a]) for a in range(3)]
    cid = xp.zeros(m, dtype=np.int64)
    coords = []
    for a in range(3):
        x = pos[:, a].astype(np.float64)
        out = (x < 0) | (x >= box)
        if bool(out.any()):
            w = x - box * xp.floor(x / box)
            w = xp.where(w >= box, 0.0, w)
            x = xp.where(out, w, x)
        if geo[5, a] == 0.0:  # open axis: the image nearest the domain
            x = xp.where(x - geo[0, a] > geo[1, a], x - box,
                         xp.where(x - geo[0, a] <= geo[1, a] - box, x + box, x))
            u = x - geo[0, a]
        else:
            u = x
        t = xp.clip(xp.floor((u - geo[2, a]) / geo[3, a]), -1, ns[a]).astype(np.int64)
        t = xp.clip(t, 0, ns[a] - 1)
        cid = cid * ns[a] + t
        coords.append(x)
    ghost = (xp.arange(m) >= owned_rows).astype(np.int64)
    order = xp.argsort(cid * 2 + ghost, kind="stable") if xp is np else \
        xp.argsort(cid * 2 + ghost)
    cell = xp.ascontiguousarray(cid[order])
    ncell = ns[0] * ns[1] * ns[2]
    start = xp.searchsorted(cell, xp.arange(ncell + 1, dtype=np.int64)).astype(np.int64)
    xs, ys, zs = (xp.ascontiguousarray(c[order]) for c in coords)
    own = xp.ascontiguousarray((1 - ghost[order]).astype(np.uint8))
    return xs, ys, zs, own, cell, start


def _launch(n: int) -> tuple[tuple[int], tuple[int]]:
    return (max(1, min(math.ceil(n / BLOCK), 65535)),), (BLOCK,)


def pair_count_prepared(xp, kernel, pos, n_owned: int, geometry, r_edges, mu_edges, los,
                        box_size: float, pos2=None, shared: bool = True) -> np.ndarray:
    """:func:`pair_count_gpu` with the array module ``xp`` and ``kernel(grid, block,
    args, shared_bytes)`` (the launcher of ``pair_count.cu``'s kernel) given."""
    e2, nr, nmu, mu2e, lv = count_bins(r_edges, mu_edges, los)
    e2 = xp.asarray(e2)
    geo = np.ascontiguousarray(geometry, dtype=np.float64)
    box = float(box_size)
    n_owned = int(n_owned)
    auto = pos2 is None
    hist = xp.zeros(nr * nmu, dtype=np.uint64)
    if n_owned == 0 or (not auto and pos2.shape[0] == 0):
        return np.zeros((nr, nmu), np.int64)
    pos = xp.asarray(pos)
    if auto:
        xs, ys, zs, own, cell, start = sorted_cells(xp, pos, geo, box, n_owned)
        first = (xs, ys, zs, own, cell)
        second = (xs, ys, zs, own, start)
        n1 = pos.shape[0]
    else:
        xs, ys, zs, own, cell, _ = sorted_cells(xp, pos[:n_owned], geo, box, n_owned)
        xs2, ys2, zs2, own2, _, start2 = sorted_cells(xp, xp.asarray(pos2), geo, box, 0)
        first = (xs, ys, zs, own, cell)
        second = (xs2, ys2, zs2, own2, start2)
        n1 = n_owned
    shared_bytes = 8 * (nr * nmu + (nr + 1) + (nmu + 1))
    args = (*first, np.int64(n1), *second, xp.asarray(geo.ravel()),
            np.int32(CELL_REFINE), np.float64(box),
            np.int32(1 if auto else 0), e2, np.int32(nr + 1), xp.asarray(mu2e),
            np.int32(nmu), np.float64(lv[0]), np.float64(lv[1]), np.float64(lv[2]), hist)
    grid, block = _launch(n1)
    kernel(grid, block, args, shared_bytes if shared else 0)
    out = hist.get() if hasattr(hist, "get") else np.asarray(hist)
    return out.astype(np.int64).reshape(nr, nmu)


def _cupy_kernel(shared: bool):
    module = cuda.module("pair_count", {"PC_SHARED": int(shared)}, cuda.NO_FMAD)
    return module.get_function("pair_count")


def pair_count_gpu(pos, n_owned: int, geometry: np.ndarray, r_edges: np.ndarray,
                   mu_edges: np.ndarray | None, los: np.ndarray | None, box_size: float,
                   pos2=None) -> np.ndarray:
    """Pair counts of one domain on the current GPU: the twin of
    :func:`cosmo_dask.analysis.pair_count_kernels.pair_count` (same parameters and
    results; CuPy or NumPy positions, a host int64 ``(nr, nmu)`` histogram back)."""
    import cupy

    nr = len(r_edges) - 1
    nmu = 1 if mu_edges is None else len(mu_edges) - 1
    shared = 8 * (nr * nmu + nr + nmu + 2) <= SHARED_LIMIT
    kern = _cupy_kernel(shared)

    def launch(grid, block, args, shared_bytes):
        kern(grid, block, args, shared_mem=shared_bytes)

    return pair_count_prepared(cupy, launch, pos, n_owned, geometry, r_edges, mu_edges, los,
                               box_size, pos2, shared=shared)
