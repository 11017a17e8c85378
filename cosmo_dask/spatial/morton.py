"""Morton (Z-order) keys of particle positions, 21 bits per axis.

A position inside the root cube ``[root_lo, root_lo + root_size)^3`` gets the
integer cell coordinates ``(i, j, k) = floor((x - root_lo) / root_size * 2**21)``
(clipped to ``[0, 2**21 - 1]``) and the key ``interleave(i, j, k)`` with the x
bit the most significant of each triple (see
:mod:`cosmo_dask.spatial.octree_layout`). The key is a ``uint64`` that uses 63
bits. With ``box_size`` given the positions are first wrapped periodically into
``[root_lo, root_lo + box_size)`` (periodic-aware keys: a particle and its
periodic image get the same key).

Two kernels with one result, behind the contract
:data:`cosmo_dask.spatial.dispatch.morton_keys`: :func:`morton_keys` here (numba, NumPy
arrays) and the GPU octree's elementwise kernel for CuPy arrays
(:func:`cosmo_dask.spatial.octree_gpu.morton_keys_gpu`), which shares this module's
checks and periodic wrap.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ..core.backend import array_module
from ..core.errors import ParameterError
from .octree_layout import MORTON_BITS

__all__ = ["MORTON_BITS", "check_pos", "check_root", "morton_keys", "sort_by_key",
           "wrap_positions", "key_cell", "cell_keys"]

_NCELL = 1 << MORTON_BITS


# --------------------------------------------------------------------------- bit spreading
@numba.njit(cache=True, inline="always")
def _spread(v):
    """Spread the low 21 bits of ``v`` (uint64) to every third bit."""
    x = v & np.uint64(0x1FFFFF)
    x = (x | (x << np.uint64(32))) & np.uint64(0x1F00000000FFFF)
    x = (x | (x << np.uint64(16))) & np.uint64(0x1F0000FF0000FF)
    x = (x | (x << np.uint64(8))) & np.uint64(0x100F00F00F00F00F)
    x = (x | (x << np.uint64(4))) & np.uint64(0x10C30C30C30C30C3)
    x = (x | (x << np.uint64(2))) & np.uint64(0x1249249249249249)
    return x


@numba.njit(nogil=True, cache=True, parallel=True)
def _keys_kernel(pos, lo0, lo1, lo2, size, box, periodic):
    n = pos.shape[0]
    out = np.empty(n, dtype=np.uint64)
    scale = _NCELL / size
    top = _NCELL - 1
    lo = (lo0, lo1, lo2)
    for p in numba.prange(n):
        key = np.uint64(0)
        for a in range(3):
            u = np.float64(pos[p, a]) - lo[a]
            if periodic:
                u = u - box * np.floor(u / box)
                if u >= box:  # rounding of u just below 0
                    u = 0.0
            c = np.int64(np.floor(u * scale)) if u * scale < 4.0 * _NCELL else top
            if c < 0:
                c = 0
            elif c > top:
                c = top
            key |= _spread(np.uint64(c)) << np.uint64(2 - a)
        out[p] = key
    return out


@numba.njit(nogil=True, cache=True)
def _cell_keys_kernel(cells):
    out = np.empty(cells.shape[0], dtype=np.uint64)
    for p in range(cells.shape[0]):
        key = np.uint64(0)
        for a in range(3):
            key |= _spread(np.uint64(cells[p, a])) << np.uint64(2 - a)
        out[p] = key
    return out


def check_root(root_lo: Any, root_size: float, box_size: float | None):
    """The checked root cube ``(root_lo (3,) float64, root_size)`` of a Morton key call.

    Raises
    ------
    ParameterError
        ``root_lo`` not 3 finite numbers, ``root_size`` not positive and finite, a bad
        ``box_size``, or ``root_size < box_size``.
    """
    lo = np.asarray(root_lo, dtype=np.float64).reshape(-1)
    if lo.shape != (3,) or not np.all(np.isfinite(lo)):
        raise ParameterError(f"root_lo must be 3 finite numbers, got {root_lo!r}")
    size = float(root_size)
    if not (np.isfinite(size) and size > 0):
        raise ParameterError(f"root_size must be a positive finite number, got {root_size!r}")
    if box_size is not None:
        box = float(box_size)
        if not (np.isfinite(box) and box > 0):
            raise ParameterError(f"box_size must be a positive finite number or None, "
                                 f"got {box_size!r}")
        if size < box * (1.0 - 1e-12):
            raise ParameterError(f"root_size ({size}) must be >= box_size ({box}) for "
                                 "periodic keys")
    return lo, size


def check_pos(pos: Any) -> None:
    """Raise :class:`~cosmo_dask.core.errors.ParameterError` unless ``pos`` has shape (N, 3)."""
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ParameterError(f"pos must have shape (N, 3), got {tuple(pos.shape)}")


def morton_keys(pos: np.ndarray, root_lo: Any, root_size: float, *,
                box_size: float | None = None) -> np.ndarray:
    """Morton keys of positions, on the CPU (numba): the CPU kernel of the contract
    :data:`cosmo_dask.spatial.dispatch.morton_keys`.

    Parameters
    ----------
    pos : (N, 3) numpy.ndarray
        Positions (length units of the snapshot).
    root_lo : (3,) float
        Lower corner of the root cube (length).
    root_size : float
        Side of the root cube (length); ``>= box_size`` when periodic.
    box_size : float, optional
        Periodic box side (length): positions are wrapped into
        ``[root_lo, root_lo + box_size)`` first.

    Returns
    -------
    (N,) uint64 array
        Keys ``interleave(i, j, k)`` at level 21; positions outside the root
        are clipped to the boundary cells.
    """
    check_pos(pos)
    lo, size = check_root(root_lo, root_size, box_size)
    periodic = box_size is not None
    box = float(box_size) if periodic else 1.0
    return _keys_kernel(np.ascontiguousarray(pos), lo[0], lo[1], lo[2], size, box, periodic)


def wrap_positions(pos: Any, root_lo: Any, box_size: float) -> Any:
    """Positions wrapped periodically into ``[root_lo, root_lo + box_size)`` (float64, xp)."""
    xp = array_module(pos)
    lo = xp.asarray(np.asarray(root_lo, dtype=np.float64))
    u = pos.astype(xp.float64) - lo
    u = u - box_size * xp.floor(u / box_size)
    u = xp.where(u >= box_size, 0.0, u)
    return u + lo


def cell_keys(cells: Any) -> np.ndarray:
    """Morton keys (uint64) of integer cell coordinates ``(N, 3)``, each in
    ``[0, 2**MORTON_BITS)``: the bit order of :func:`morton_keys` (the inverse of
    :func:`key_cell` at level ``MORTON_BITS``); the keys of one level's cells order them
    depth first (NumPy)."""
    cells = np.ascontiguousarray(cells, dtype=np.int64).reshape(-1, 3)
    return _cell_keys_kernel(cells)


def key_cell(keys: Any, level: int) -> Any:
    """Integer cell coordinates ``(N, 3)`` at ``level`` of level-21 keys (NumPy)."""
    keys = np.asarray(keys, dtype=np.uint64)
    out = np.zeros((keys.shape[0], 3), dtype=np.int64)
    k = keys >> np.uint64(3 * (MORTON_BITS - level))
    for b in range(level):
        for a in range(3):
            bit = (k >> np.uint64(3 * b + 2 - a)) & np.uint64(1)
            out[:, a] |= bit.astype(np.int64) << b
    return out


def sort_by_key(keys: Any) -> Any:
    """Stable argsort of keys (ties keep the input order), NumPy or CuPy, int64."""
    xp = array_module(keys)
    if xp is np:
        return np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    return xp.argsort(keys).astype(xp.int64)  # CuPy argsort is a stable radix sort
