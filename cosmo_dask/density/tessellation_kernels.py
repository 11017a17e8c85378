"""Kernels of the phase-space-element tessellation: Lagrangian cells split into tetrahedra.

The geometry (Kuhn split, unwrapping, block and column layout) is described in
:mod:`.tessellation`, which builds the dask graphs and holds the public functions.
This module holds the per-chunk kernels on a computed block column (NumPy; the
array code also runs on CuPy arrays): the CPU implementations of the kernel
contracts ``column_tets_kernel``, ``rows_tets_kernel`` and ``column_bboxes_kernel``
of :mod:`.dispatch`, whose GPU twins are in :mod:`.tessellation_kernels_gpu`. It imports
neither its GPU twin nor any graph or API module.

A computed column is ``(corners (a+1, b+1, nz', 3), cell_mass (a, b, ncz) or None)``
(:class:`.tessellation.BlockColumns`); request rows are int64 ``(slot, bk, sx, sy,
sz)``: block ``bk`` of column ``columns[slot]`` translated by ``(sx, sy, sz)`` whole
boxes.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..core.backend import array_module

# corner c of a cell has offset ((c >> 2) & 1, (c >> 1) & 1, c & 1)
CORNER_OFFSETS = np.array([[(c >> 2) & 1, (c >> 1) & 1, c & 1] for c in range(8)], np.int64)


def _kuhn() -> np.ndarray:
    tets = []
    for p in itertools.permutations(range(3)):
        path = [0]
        off = np.zeros(3, np.int64)
        for ax in p:
            off[ax] = 1
            path.append(int(off[0] * 4 + off[1] * 2 + off[2]))
        v = CORNER_OFFSETS[path].astype(float)
        if np.linalg.det(v[1:] - v[0]) < 0:
            path[2], path[3] = path[3], path[2]
        tets.append(path)
    return np.array(tets, np.int64)


#: (6, 4) corner indices of the Kuhn tetrahedra of a cell, positively oriented.
KUHN_TETS = _kuhn()


def _minimage(d, box):
    return d - box * np.floor(d / box + 0.5)


def unwrap_cells(corners, box_size=None, ref=None):
    """Unwrapped corner positions of every cell of a corner array.

    Parameters
    ----------
    corners : ndarray (a+1, b+1, c+1, 3)
        Particle positions on a window of the Lagrangian grid (already wrapped
        in index space), any float dtype, NumPy or CuPy.
    box_size : float, optional
        Periodic box side; None: positions are used as they are.
    ref : (3,) array, optional
        With ``box_size``: each cell's corner 000 is moved by whole boxes to its
        minimum image relative to ``ref`` (compact block bounding boxes).

    Returns
    -------
    ndarray (a*b*c, 8, 3) float64 (same array module as ``corners``)
        Corner ``c`` of cell ``(i, j, k)`` (row ``(i*b + j)*c + k``) at offset
        ``CORNER_OFFSETS[c]``, each within half a box of the cell's corner 000.
    """
    xp = array_module(corners)
    p = xp.asarray(corners, dtype=xp.float64)
    a, b, c = (s - 1 for s in p.shape[:3])
    out = xp.empty((a, b, c, 8, 3))
    for n, (di, dj, dk) in enumerate(CORNER_OFFSETS):
        out[:, :, :, n] = p[di:di + a, dj:dj + b, dk:dk + c]
    out = out.reshape(a * b * c, 8, 3)
    if box_size is not None:
        box = float(box_size)
        anchor = out[:, :1, :]
        rel = _minimage(out - anchor, box)
        if ref is not None:
            r = xp.asarray(ref, dtype=xp.float64)
            anchor = r + _minimage(anchor - r, box)
        out = anchor + rel
    return out


def block_tets_from_corners(corners, cell_mass, box_size=None, ref=None):
    """Tetrahedra of the cells of one corner window (the per-block kernel).

    Parameters
    ----------
    corners : ndarray (a+1, b+1, c+1, 3)
        Positions of the block's particles plus the +1 layer (NumPy or CuPy).
    cell_mass : float or ndarray (a, b, c)
        Mass of each cell (the mass of its corner-000 particle).
    box_size, ref
        As for :func:`unwrap_cells`.

    Returns
    -------
    tets : ndarray (6*a*b*c, 4, 3) float64
        Tetrahedra in cell order, 6 per cell (``KUHN_TETS`` order), on the
        array module of ``corners``.
    mass : ndarray (6*a*b*c,) float64
        ``cell_mass / 6`` per tetrahedron.

    Cost: O(a*b*c), ~300 bytes of output per cell.
    """
    xp = array_module(corners)
    cells = unwrap_cells(corners, box_size, ref)
    tets = cells[:, xp.asarray(KUHN_TETS), :].reshape(-1, 4, 3)
    if np.ndim(cell_mass):
        m = xp.asarray(cell_mass, dtype=xp.float64).reshape(-1)
    else:
        m = xp.full(cells.shape[0], float(cell_mass))
    return tets, xp.repeat(m / 6.0, 6)


def block_window(column, bk, block, ncz):
    """Corners and cell masses of block ``bk`` of a computed column."""
    pos, mass = column
    k0 = bk * block
    k1 = min(k0 + block, ncz)
    return pos[:, :, k0:k1 + 1], None if mass is None else mass[:, :, k0:k1]


def column_block_tets(column, bks, block, ncz, box_size, particle_mass, shifts=None):
    """Tetrahedra and masses of blocks ``bks`` of one computed column, concatenated.

    ``shifts`` (len(bks), 3), optional: a translation added to each block's
    tetrahedra (whole periodic boxes, to bring an image next to a leaf).
    The CPU kernel of the contract ``column_tets_kernel`` (:mod:`.dispatch`); its GPU
    twin is :func:`.tessellation_kernels_gpu.column_block_tets_gpu` (one launch, same
    arithmetic, same result). Array maths run on the column's array module (NumPy
    here; the GPU tests also run it on CuPy columns as the reference of the kernel).
    """
    xp = array_module(column[0])
    tets, masses = [], []
    for n, bk in enumerate(bks):
        corners, cm = block_window(column, int(bk), block, ncz)
        ref = corners[0, 0, 0] if box_size is not None else None
        t, m = block_tets_from_corners(corners, 1.0 if cm is None else cm, box_size, ref)
        if shifts is not None and np.any(shifts[n]):
            t = t + xp.asarray(shifts[n], dtype=xp.float64)
        if particle_mass is not None:
            m = m * particle_mass
        tets.append(t)
        masses.append(m)
    if not tets:
        return xp.empty((0, 4, 3)), xp.empty(0)
    return xp.concatenate(tets), xp.concatenate(masses)

def _unpack_rows(rows):
    """Rows (slot, bk, sx, sy, sz), grouped by slot -> [(slot, bks, image shifts)]."""
    if not len(rows):
        return []
    cut = np.flatnonzero(np.diff(rows[:, 0])) + 1
    return [(int(r[0, 0]), r[:, 1], r[:, 2:].astype(np.float64))
            for r in np.split(rows, cut)]


def rows_tets(columns, rows, block, ncz, box_size, particle_mass):
    """Tetrahedra and masses of many columns' blocks, in row order (CPU).

    ``rows`` (R, 5) int64 ``(slot, bk, sx, sy, sz)``, grouped by slot: block ``bk``
    of the column ``columns[slot]`` translated by ``(sx, sy, sz) * box_size``.
    The concatenation of :func:`column_block_tets` per slot; the CPU kernel of
    ``rows_tets_kernel`` (GPU twin: :func:`.tessellation_kernels_gpu.rows_tets_gpu`, one
    launch for all rows).

    Returns
    -------
    tets : ndarray (T, 4, 3) float64
    mass : ndarray (T,) float64
    """
    parts = [column_block_tets(columns[slot], bks, block, ncz, box_size, particle_mass,
                               None if box_size is None else shifts * box_size)
             for slot, bks, shifts in _unpack_rows(np.asarray(rows, np.int64).reshape(-1, 5))]
    if not parts:
        return np.empty((0, 4, 3)), np.empty(0)
    return np.concatenate([t for t, _ in parts]), np.concatenate([m for _, m in parts])


def column_bboxes(column, block, ncz, box_size):
    """``(lo (nbk, 3), hi (nbk, 3))``: bounding boxes of the tetrahedra of every block
    of one column (the unwrapped cell corners), float64.

    The CPU kernel of ``column_bboxes_kernel`` (GPU twin:
    :func:`.tessellation_kernels_gpu.column_bboxes_gpu`, which makes no tetrahedra).
    """
    nbk = -(-ncz // block)
    a, b = column[0].shape[0] - 1, column[0].shape[1] - 1
    k0 = np.arange(nbk) * block
    counts = 6 * a * b * (np.minimum(k0 + block, ncz) - k0)
    tets, _ = column_block_tets(column, np.arange(nbk), block, ncz, box_size, None)
    full = int(np.sum(counts == counts[0]))  # all blocks but a shorter last one
    head = tets[:full * counts[0]].reshape(full, -1, 3)
    lo, hi = [head.min(axis=1)], [head.max(axis=1)]
    if full < nbk:
        tail = tets[full * counts[0]:]
        lo.append(tail.min(axis=(0, 1))[None])
        hi.append(tail.max(axis=(0, 1))[None])
    return np.concatenate(lo), np.concatenate(hi)


def tet_vertex_ids(lagrangian_shape, periodic: bool = True) -> np.ndarray:
    """(T, 4) particle ids of the vertices of :func:`snapshot_tetrahedra`'s tetrahedra."""
    shape = tuple(int(s) for s in lagrangian_shape)
    ids = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if periodic:
        ids = np.pad(ids, ((0, 1), (0, 1), (0, 1)), mode="wrap")
    a, b, c = (s - 1 for s in ids.shape)
    corner = np.empty((a, b, c, 8), np.int64)
    for n, (di, dj, dk) in enumerate(CORNER_OFFSETS):
        corner[..., n] = ids[di:di + a, dj:dj + b, dk:dk + c]
    return corner.reshape(-1, 8)[:, KUHN_TETS].reshape(-1, 4)
