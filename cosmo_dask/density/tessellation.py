"""Phase-space-element tessellation: Lagrangian cells split into tetrahedra.

The particles of a snapshot with ``lagrangian_shape = (nx, ny, nz)`` and ids
``id = (i*ny + j)*nz + k`` sit on the vertices of a logical Lagrangian grid.
Each Lagrangian cell ``(i, j, k)`` has the 8 particles ``(i+di, j+dj, k+dk)``,
``di, dj, dk in {0, 1}``, at its corners and is split into 6 tetrahedra by the
Freudenthal / Kuhn decomposition along its main diagonal (corner 000 to 111):
one tetrahedron per permutation ``p`` of the axes, ``000 -> e_p0 -> e_p0 + e_p1
-> 111``. Every cell uses the same split, so the two triangles on a face shared
by neighbouring cells coincide (face-matching, conforming tessellation), and
the vertex order of each tetrahedron is chosen so that it has positive volume
on the unperturbed lattice (negative volume then flags a cell turned inside
out, i.e. shell crossing).

Periodic boxes (``box_size`` set): the grid wraps, there are ``nx*ny*nz`` cells
(particle ``i = nx`` is particle 0) and every cell's corners are unwrapped by
minimum image relative to its corner 000, so a tetrahedron straddling the box
edge comes out whole (coordinates may leave ``[0, box_size)`` by less than
half a box). Within a Lagrangian block the cells are additionally shifted by
whole boxes to lie next to the block's first particle, so a block's bounding
box is compact. Isolated snapshots have ``(nx-1)*(ny-1)*(nz-1)`` cells and no
unwrapping.

Mass: each tetrahedron carries ``m / 6`` where ``m`` is the mass of the
particle at the cell's corner 000 (``particle_mass``, or the ``mass`` array);
in a periodic box cells and particles correspond one to one, so the
tetrahedra carry the snapshot's total mass exactly.

Blocks and data movement
------------------------
The Lagrangian grid of cells is cut into blocks of ``block^3`` cells (8^3 by
default, ADECO's sub-blocks): block ``(bi, bj, bk)`` holds cells
``bi*block <= i < min((bi+1)*block, ncx)`` etc. and needs the particles of
those cells plus one more layer (the +1 corners), wrapped periodically.
In id order the particles of one Lagrangian x-plane ``i`` are the contiguous
rows ``[i*ny*nz, (i+1)*ny*nz)`` of the position array, so the particles of a
block row ``bi`` are ``block + 1`` contiguous planes (two row ranges when the
row wraps). A dask graph feeds :func:`block_tets_from_corners` by slicing
those rows from the id-ordered position array (:func:`id_ordered_positions`,
lazily; one slab task per ``bi``, shared by all ``(bj, bk)`` blocks of that
row), selecting the ``(j, k)`` window with wrap, and calling it per block;
:func:`lagrangian_blocks` does exactly that to compute every block's bounding
box, and :func:`block_tetrahedra` for one block. Per block, the kernel input is
``(block+1)^3 * 3`` floats (17.5 kB for 8^3 cells in float64) against
``6 * block^3 * 12`` floats (295 kB) of tetrahedra, so blocks of particles,
not tetrahedra, are what should move between workers.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import dask
import dask.array as da
import numpy as np

from ..errors import ParameterError, SnapshotError

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


class LagrangianBlocks(NamedTuple):
    """Lagrangian blocks of a snapshot and the bounding boxes of their tetrahedra.

    ``index`` (B, 3) block indices ``(bi, bj, bk)``; ``lo``, ``hi`` (B, 3) the
    bounding box of the block's (unwrapped) tetrahedra; ``n_tets`` (B,);
    ``block`` cells per block side; ``cells_shape`` the Lagrangian cells per axis.
    """

    index: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n_tets: np.ndarray
    block: int
    cells_shape: tuple[int, int, int]


# --------------------------------------------------------------------------- checks
def _lagrangian(snap) -> tuple[tuple[int, int, int], float | None]:
    shape = snap.lagrangian_shape
    src = snap.source or "snapshot"
    if shape is None:
        raise SnapshotError(
            f"{src}: has no 'lagrangian_shape'; the phase-space tessellation needs the "
            "Lagrangian grid the ids index")
    if snap.ids is None:
        raise SnapshotError(f"{src}: has no 'ids'; the phase-space tessellation needs "
                            "particle ids on the Lagrangian grid")
    shape = tuple(int(s) for s in shape)
    box = snap.box_size
    if box is None and min(shape) < 2:
        raise SnapshotError(f"{src}: an isolated Lagrangian grid {shape} has no cells")
    return shape, box


def cells_shape(lagrangian_shape, periodic: bool) -> tuple[int, int, int]:
    """Cells per axis: the particle grid in a periodic box, one fewer per axis otherwise."""
    d = 0 if periodic else 1
    return tuple(int(s) - d for s in lagrangian_shape)


def _check_block(block) -> int:
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ParameterError(f"block must be a positive integer, got {block!r}")
    return int(block)


def id_ordered_positions(snap):
    """(N, 3) dask array of positions in id order (row ``id`` = particle ``id``).

    Computes the ids (8 bytes per particle) to check that they are a
    permutation of ``0 .. N-1`` (SnapshotError for duplicate, missing or
    out-of-range ids). Ids already equal to ``arange(N)`` (the generators'
    layout) return ``snap.pos`` unchanged and lazy; otherwise the rows are
    permuted with a dask fancy index (a shuffle).
    """
    shape, _ = _lagrangian(snap)
    n = snap.n_particles
    if int(np.prod(shape)) != n:
        raise SnapshotError(f"lagrangian_shape {shape} does not match {n} particles")
    ids = np.asarray(snap.ids.compute())
    if hasattr(ids, "get"):
        ids = ids.get()
    ids = ids.astype(np.int64, copy=False)
    if np.array_equal(ids, np.arange(n)):
        return snap.pos
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise SnapshotError(f"ids must lie in [0, {n}) for lagrangian_shape {shape}")
    counts = np.bincount(ids, minlength=n)
    if np.any(counts != 1):
        raise SnapshotError(
            f"ids are not a permutation of 0..{n - 1}: {int(np.sum(counts > 1))} duplicated, "
            f"{int(np.sum(counts == 0))} missing")
    return snap.pos[np.argsort(ids, kind="stable")]


def _id_ordered_masses(snap):
    if snap.mass is None:
        return None
    ids = np.asarray(snap.ids.compute()).astype(np.int64)
    m = np.empty(snap.n_particles)
    m[ids] = np.asarray(snap.mass.compute())
    return m


# --------------------------------------------------------------------------- kernels
def _minimage(d, box):
    return d - box * np.floor(d / box + 0.5)


def unwrap_cells(corners, box_size=None, ref=None) -> np.ndarray:
    """Unwrapped corner positions of every cell of a corner array.

    Parameters
    ----------
    corners : ndarray (a+1, b+1, c+1, 3)
        Particle positions on a window of the Lagrangian grid (already wrapped
        in index space), any float dtype.
    box_size : float, optional
        Periodic box side; None: positions are used as they are.
    ref : (3,) array, optional
        With ``box_size``: each cell's corner 000 is moved by whole boxes to its
        minimum image relative to ``ref`` (compact block bounding boxes).

    Returns
    -------
    ndarray (a*b*c, 8, 3) float64
        Corner ``c`` of cell ``(i, j, k)`` (row ``(i*b + j)*c + k``) at offset
        ``CORNER_OFFSETS[c]``, each within half a box of the cell's corner 000.
    """
    p = np.asarray(corners, dtype=np.float64)
    a, b, c = (s - 1 for s in p.shape[:3])
    out = np.empty((a, b, c, 8, 3))
    for n, (di, dj, dk) in enumerate(CORNER_OFFSETS):
        out[:, :, :, n] = p[di:di + a, dj:dj + b, dk:dk + c]
    out = out.reshape(a * b * c, 8, 3)
    if box_size is not None:
        box = float(box_size)
        anchor = out[:, :1, :]
        rel = _minimage(out - anchor, box)
        if ref is not None:
            anchor = np.asarray(ref, np.float64) + _minimage(anchor - np.asarray(ref), box)
        out = anchor + rel
    return out


def block_tets_from_corners(corners, cell_mass, box_size=None, ref=None):
    """Tetrahedra of the cells of one corner window (the per-block kernel).

    Parameters
    ----------
    corners : ndarray (a+1, b+1, c+1, 3)
        Positions of the block's particles plus the +1 layer.
    cell_mass : float or ndarray (a, b, c)
        Mass of each cell (the mass of its corner-000 particle).
    box_size, ref
        As for :func:`unwrap_cells`.

    Returns
    -------
    tets : ndarray (6*a*b*c, 4, 3) float64
        Tetrahedra in cell order, 6 per cell (``KUHN_TETS`` order).
    mass : ndarray (6*a*b*c,) float64
        ``cell_mass / 6`` per tetrahedron.

    Cost: O(a*b*c), ~300 bytes of output per cell.
    """
    cells = unwrap_cells(corners, box_size, ref)
    tets = cells[:, KUHN_TETS, :].reshape(-1, 4, 3)
    m = np.broadcast_to(np.asarray(cell_mass, np.float64).reshape(-1)
                        if np.ndim(cell_mass) else np.float64(cell_mass), (cells.shape[0],))
    mass = np.repeat(m / 6.0, 6)
    return tets, mass


def _plane_rows(i0: int, count: int, nx: int, plane: int):
    """Row slices of ``count`` consecutive x-planes from ``i0`` (wrapping at nx)."""
    idx = (i0 + np.arange(count)) % nx
    # split into contiguous runs
    runs = []
    start = idx[0]
    length = 1
    for a, b in zip(idx[:-1], idx[1:], strict=True):
        if b == a + 1:
            length += 1
        else:
            runs.append((start, length))
            start, length = b, 1
    runs.append((start, length))
    return [slice(int(s) * plane, int(s + ln) * plane) for s, ln in runs]


def _block_ranges(bidx, block, ncells):
    lo = [int(b) * block for b in bidx]
    hi = [min(lo[d] + block, ncells[d]) for d in range(3)]
    if any(lo[d] >= ncells[d] or lo[d] < 0 for d in range(3)):
        raise ParameterError(f"block index {tuple(bidx)} outside the block grid")
    return lo, hi


def _window(slab, shape, lo, hi, periodic):
    """Corner window (cells lo..hi plus one layer) from an x-slab (planes lo[0]..hi[0])."""
    ny, nz = shape[1], shape[2]
    jj = np.arange(lo[1], hi[1] + 1) % ny if periodic else np.arange(lo[1], hi[1] + 1)
    kk = np.arange(lo[2], hi[2] + 1) % nz if periodic else np.arange(lo[2], hi[2] + 1)
    return slab[:, jj][:, :, kk]


def _slab(pos_by_id, shape, i0, count, periodic):
    nx, ny, nz = shape
    plane = ny * nz
    if periodic:
        parts = [pos_by_id[s] for s in _plane_rows(i0, count, nx, plane)]
        rows = parts[0] if len(parts) == 1 else da.concatenate(parts)
    else:
        rows = pos_by_id[i0 * plane:(i0 + count) * plane]
    return rows


def _row_blocks(slab, mslab, shape, box, block, ncells, bi, bjk, want):
    """Kernel of one block row: tets or bounding boxes of blocks (bi, bj, bk) for bjk."""
    periodic = box is not None
    slab = np.asarray(slab)
    if hasattr(slab, "get"):
        slab = slab.get()
    slab = slab.reshape(-1, shape[1], shape[2], 3)
    out = []
    for bj, bk in bjk:
        lo, hi = _block_ranges((bi, bj, bk), block, ncells)
        local_lo = [0, lo[1], lo[2]]
        local_hi = [hi[0] - lo[0], hi[1], hi[2]]
        corners = _window(slab, shape, local_lo, local_hi, periodic)
        ref = corners[0, 0, 0] if periodic else None
        if mslab is None:
            cm = _ONE
        else:
            ms = np.asarray(mslab).reshape(-1, shape[1], shape[2])
            cm = _window(ms[..., None], shape, local_lo, local_hi, periodic)[:-1, :-1, :-1, 0]
        if want == "bbox":
            cells = unwrap_cells(corners, box, ref)
            out.append((cells.min(axis=(0, 1)), cells.max(axis=(0, 1)), 6 * cells.shape[0]))
        else:
            out.append(block_tets_from_corners(corners, cm, box, ref))
    return out


_ONE = 1.0


def _particle_mass(snap):
    if snap.mass is None:
        if snap.particle_mass is None:
            snap.particle_masses()  # raises the standard error
        return float(snap.particle_mass)
    return None


def lagrangian_blocks(snap, block: int = 8) -> LagrangianBlocks:
    """Blocks of ``block^3`` Lagrangian cells and their bounding boxes.

    One dask task per block row ``bi`` reads the ``block + 1`` x-planes of the
    id-ordered positions it needs and returns the bounding boxes of all its
    blocks (computed from the unwrapped cell corners, the same coordinates the
    tetrahedra get). Cost: one pass over the positions, ~(1 + 1/block) reads.

    Returns
    -------
    LagrangianBlocks
        ``index`` (B, 3) in C order of ``(bi, bj, bk)``, ``lo``/``hi`` (B, 3),
        ``n_tets`` (B,), ``block``, ``cells_shape``.
    """
    block = _check_block(block)
    shape, box = _lagrangian(snap)
    periodic = box is not None
    ncells = cells_shape(shape, periodic)
    pos = id_ordered_positions(snap)
    nb = [-(-c // block) for c in ncells]
    bjk = [(bj, bk) for bj in range(nb[1]) for bk in range(nb[2])]
    tasks = []
    for bi in range(nb[0]):
        i0 = bi * block
        count = min(i0 + block, ncells[0]) - i0 + 1
        slab = _slab(pos, shape, i0, count, periodic)
        tasks.append(dask.delayed(_row_blocks, pure=True)(
            slab, None, shape, box, block, ncells, bi, bjk, "bbox"))
    rows = dask.compute(*tasks)
    index = np.array([(bi, bj, bk) for bi in range(nb[0]) for bj, bk in bjk], np.int64)
    lo = np.array([r[0] for row in rows for r in row]).reshape(-1, 3)
    hi = np.array([r[1] for row in rows for r in row]).reshape(-1, 3)
    nt = np.array([r[2] for row in rows for r in row], np.int64)
    return LagrangianBlocks(index, lo, hi, nt, block, ncells)


def block_tetrahedra(snap, block_index, block: int = 8, *, positions=None):
    """Tetrahedra and masses of one Lagrangian block.

    Parameters
    ----------
    snap : Snapshot
        With ``ids`` and ``lagrangian_shape``.
    block_index : (int, int, int)
        ``(bi, bj, bk)`` as in :func:`lagrangian_blocks`.
    block : int
        Cells per block side.
    positions : dask or numpy array (N, 3), optional
        Id-ordered positions (from :func:`id_ordered_positions`), to avoid
        re-checking the ids for every block.

    Returns
    -------
    tets : ndarray (T, 4, 3) float64
        ``T = 6 * cells in the block``; cells in C order, 6 Kuhn tetrahedra each;
        periodic ones unwrapped next to the block's first particle.
    mass : ndarray (T,) float64
        Cell mass / 6.
    """
    block = _check_block(block)
    shape, box = _lagrangian(snap)
    periodic = box is not None
    ncells = cells_shape(shape, periodic)
    bi, bj, bk = (int(b) for b in block_index)
    lo, hi = _block_ranges((bi, bj, bk), block, ncells)
    pos = id_ordered_positions(snap) if positions is None else positions
    count = hi[0] - lo[0] + 1
    slab = _slab(pos, shape, lo[0], count, periodic)
    slab = slab.compute() if hasattr(slab, "compute") else slab
    pm = _particle_mass(snap)
    mslab = None
    if pm is None:
        m = _id_ordered_masses(snap)
        mslab = np.concatenate([m[s] for s in _plane_rows(lo[0], count, shape[0],
                                                          shape[1] * shape[2])]) \
            if periodic else m[lo[0] * shape[1] * shape[2]:(lo[0] + count) * shape[1] * shape[2]]
    (tets, mass), = _row_blocks(slab, mslab, shape, box, block, ncells, bi, [(bj, bk)], "tets")
    if pm is not None:
        mass = mass * pm
    return tets, mass


def snapshot_tetrahedra(snap):
    """All tetrahedra of a (small) snapshot in memory: ``(tets (T, 4, 3), mass (T,))``.

    Cells in C order of ``(i, j, k)``, 6 Kuhn tetrahedra each (``T = 6 * cells``),
    each cell unwrapped about its own corner 000 (no block shift). Memory ~300
    bytes per particle: for tests and small boxes; large snapshots go block by
    block (:func:`block_tetrahedra`).
    """
    shape, box = _lagrangian(snap)
    periodic = box is not None
    pos = np.asarray(id_ordered_positions(snap).compute())
    if hasattr(pos, "get"):
        pos = pos.get()
    grid = pos.reshape(*shape, 3)
    if periodic:
        grid = np.pad(grid, ((0, 1), (0, 1), (0, 1), (0, 0)), mode="wrap")
    pm = _particle_mass(snap)
    if pm is None:
        m = _id_ordered_masses(snap).reshape(shape)
        ncells = cells_shape(shape, periodic)
        cm = m[:ncells[0], :ncells[1], :ncells[2]]
    else:
        cm = pm
    return block_tets_from_corners(grid, cm, box)


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
