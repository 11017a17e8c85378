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
row wraps). :func:`block_columns` slices those rows lazily from the
id-ordered positions (:func:`id_ordered`; one x-slab per ``bi``), cuts
them into *columns* (all blocks ``bk`` of one ``(bi, bj)``, with the ``j``
and ``k`` windows wrapped), persists the columns (one dask key each; worker
memory under a distributed client) and computes every block's bounding box
from its unwrapped cells. Tasks then build a block's tetrahedra from its
column (:func:`~.tessellation_kernels.column_block_tets`); :func:`lagrangian_blocks`
and :func:`block_tetrahedra` use the same path. Per block, the kernel input is
``(block+1)^3 * 3`` floats (17.5 kB for 8^3 cells in float64) against
``6 * block^3 * 12`` floats (295 kB) of tetrahedra, so blocks of particles,
not tetrahedra, are what should move between workers.

This module builds the graphs and holds the public functions; the per-column
kernels are in :mod:`.tessellation_kernels` (CPU) and :mod:`.tessellation_kernels_gpu`
(GPU), reached through the contracts of :mod:`.dispatch`.
"""

from __future__ import annotations

from typing import NamedTuple

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import array_module, host
from ..core.errors import ParameterError, SnapshotError
from ..core.task_graph import TaskGraph
from .dispatch import column_bboxes_kernel, column_tets_kernel
from .parameters import check_block
from .tessellation_kernels import block_tets_from_corners


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


def id_ordered(snap):
    """``(positions, masses)`` in id order (row ``id`` = particle ``id``), as dask arrays.

    ``masses`` is None when the snapshot has one ``particle_mass``. Computes the
    ids (8 bytes per particle) to check that they are a permutation of
    ``0 .. N-1`` (SnapshotError for duplicate, missing or out-of-range ids).
    Ids already equal to ``arange(N)`` (the generators' layout) return the
    arrays unchanged and lazy; otherwise rows are permuted with a dask fancy
    index (a shuffle).
    """
    shape, _ = _lagrangian(snap)
    n = snap.n_particles
    if int(np.prod(shape)) != n:
        raise SnapshotError(f"lagrangian_shape {shape} does not match {n} particles")
    mass = snap.mass if _particle_mass(snap) is None else None
    ids = host(snap.ids.compute()).astype(np.int64, copy=False)
    if np.array_equal(ids, np.arange(n)):
        return snap.pos, mass
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise SnapshotError(f"ids must lie in [0, {n}) for lagrangian_shape {shape}")
    counts = np.bincount(ids, minlength=n)
    if np.any(counts != 1):
        raise SnapshotError(
            f"ids are not a permutation of 0..{n - 1}: {int(np.sum(counts > 1))} duplicated, "
            f"{int(np.sum(counts == 0))} missing")
    order = np.argsort(ids, kind="stable")
    return snap.pos[order], None if mass is None else mass[order]


def id_ordered_positions(snap):
    """(N, 3) dask array of positions in id order; see :func:`id_ordered`."""
    return id_ordered(snap)[0]


def _particle_mass(snap):
    """The single particle mass, or None when the snapshot carries a mass array."""
    if snap.mass is None:
        if snap.particle_mass is None:
            snap.particle_masses()  # raises the standard error
        return float(snap.particle_mass)
    return None


# --------------------------------------------------------------------------- block columns
class BlockColumns(NamedTuple):
    """Lagrangian sub-blocks grouped in columns, the unit of data in the PSE graphs.

    Column ``(bi, bj)`` holds the corner particles of the blocks ``(bi, bj, bk)``
    for every ``bk``: planes ``i0 .. i1`` and rows ``j0 .. j1`` of the
    Lagrangian grid (one extra layer each, wrapped when periodic) and every
    ``k`` (plus one wrapped layer). ``values`` are dask Delayed objects, one per
    column, usually persisted (in worker memory under a distributed client);
    each computes to ``(corners (a+1, b+1, nz', 3), cell_mass (a, b, ncz) or
    None)`` in the snapshot's dtype and array module.

    ``blocks``: the :class:`LagrangianBlocks` (bounding boxes of every block);
    ``column_of_block`` (B,) column index of each block; ``particle_mass``:
    the single particle mass, or None when ``cell_mass`` arrays are carried.
    """

    values: list
    blocks: LagrangianBlocks
    column_of_block: np.ndarray
    box_size: float | None
    particle_mass: float | None


def _grid_index(lo, hi, n, periodic):
    """Indices ``lo .. hi`` inclusive, wrapped modulo ``n`` when periodic."""
    r = np.arange(lo, hi + 1)
    return r % n if periodic else r


def _column(slab_pos, slab_mass, shape, j0, j1, periodic):
    """Corner window of one column from its x-slab of id-ordered rows."""
    ny, nz = shape[1], shape[2]
    jj = _grid_index(j0, j1, ny, periodic)
    kk = _grid_index(0, nz if periodic else nz - 1, nz, periodic)
    xp = array_module(slab_pos)
    pos = slab_pos.reshape(-1, ny, nz, 3)[:, xp.asarray(jj)][:, :, xp.asarray(kk)]
    if slab_mass is None:
        return pos, None
    m = slab_mass.reshape(-1, ny, nz)[:-1][:, xp.asarray(jj[:-1])][:, :, xp.asarray(kk[:-1])]
    return pos, xp.asarray(m, dtype=xp.float64)


def _column_bboxes(column, block, ncz, box_size):
    """``(lo (nbk, 3), hi (nbk, 3), n_tets (nbk,))`` of the blocks of one column.

    The boxes of the blocks' tetrahedra (the unwrapped cell corners), built for
    the whole column at once by ``column_bboxes_kernel``; ``lo``/``hi`` stay on the
    column's array module (a CuPy column: one kernel, no tetrahedra made, no copy
    to the host).
    """
    nbk = -(-ncz // block)
    a, b = column[0].shape[0] - 1, column[0].shape[1] - 1
    k0 = np.arange(nbk) * block
    counts = (6 * a * b * (np.minimum(k0 + block, ncz) - k0)).astype(np.int64)
    return (*column_bboxes_kernel(column, block, ncz, box_size), counts)


def _stack_bboxes(*boxes):
    """One ``(lo, hi, n_tets)`` for all columns, on the host (one copy from a GPU)."""
    xp = array_module(boxes[0][0])
    lo = host(xp.concatenate([b[0] for b in boxes]).reshape(-1, 3))
    hi = host(xp.concatenate([b[1] for b in boxes]).reshape(-1, 3))
    return lo, hi, np.concatenate([b[2] for b in boxes])


def _x_slab(arr, shape, i0, count, periodic):
    """Rows of ``count`` consecutive Lagrangian x-planes from ``i0`` (wrapping)."""
    plane = shape[1] * shape[2]
    if not periodic:
        return arr[i0 * plane:(i0 + count) * plane]
    parts = [arr[s] for s in _plane_rows(i0, count, shape[0], plane)]
    return parts[0] if len(parts) == 1 else da.concatenate(parts)


def _plane_rows(i0: int, count: int, nx: int, plane: int):
    """Row slices of ``count`` consecutive x-planes from ``i0`` (wrapping at nx)."""
    idx = (i0 + np.arange(count)) % nx
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


def block_columns(snap, block: int = 8, *, label: str | None = None) -> BlockColumns:
    """Build (and persist) the block columns of a snapshot and every block's bounding box.

    One dask task per column reads the ``block + 1`` x-planes and ``block + 1``
    rows of id-ordered positions it needs (the x-slab is shared by the columns
    of one block row); the columns are persisted (worker memory under a
    distributed client), then one small task per column returns the bounding
    boxes of its blocks, computed from the unwrapped cell corners (the same
    coordinates the tetrahedra get). Cost: one pass over the positions; the
    columns hold ~(1 + 1/block)^2 of them.
    """
    block = check_block(block)
    shape, box = _lagrangian(snap)
    periodic = box is not None
    ncells = cells_shape(shape, periodic)
    pos, mass = id_ordered(snap)
    pm = _particle_mass(snap)
    nb = [-(-c // block) for c in ncells]
    slabs = []  # (positions, masses or None) of each block row, one chunk each
    for bi in range(nb[0]):
        i0 = bi * block
        count = min(i0 + block, ncells[0]) - i0 + 1
        slabs.append([None if a is None else _x_slab(a, shape, i0, count, periodic).rechunk(-1)
                      for a in (pos, mass)])
    g = TaskGraph([a for pair in slabs for a in pair if a is not None])
    keys = []
    for bi, (slab, mslab) in enumerate(slabs):
        inputs = (slab.name, None if mslab is None else mslab.name, shape, periodic)
        args = (g.chunk(slab, 0, 0), None if mslab is None else g.chunk(mslab, 0), shape)
        for bj in range(nb[1]):
            j0 = bj * block
            j1 = min(j0 + block, ncells[1])
            keys.append(g.add(f"pse-column-{bi}-{bj}-{tokenize(*inputs, j0, j1)}", _column,
                              *args, j0, j1, periodic).key)
    values = g.persist(keys, label=label or "PSE: Lagrangian block columns")
    g = TaskGraph(values)
    token = tokenize(keys, block, ncells[2], box)
    boxes = [g.add((f"pse-bbox-{token}", c), _column_bboxes, g.ref(v), block, ncells[2], box)
             for c, v in enumerate(values)]
    ((lo, hi, n_tets),) = g.compute([g.add(f"pse-bboxes-{token}", _stack_bboxes, *boxes).key],
                                    label="PSE: block bounding boxes")
    index = np.array([(bi, bj, bk) for bi in range(nb[0]) for bj in range(nb[1])
                      for bk in range(nb[2])], np.int64).reshape(-1, 3)
    blocks = LagrangianBlocks(index, lo, hi, n_tets, block, ncells)
    column_of_block = index[:, 0] * nb[1] + index[:, 1]
    return BlockColumns(values, blocks, column_of_block, box, pm)


def lagrangian_blocks(snap, block: int = 8) -> LagrangianBlocks:
    """Blocks of ``block^3`` Lagrangian cells and their bounding boxes.

    Returns
    -------
    LagrangianBlocks
        ``index`` (B, 3) in C order of ``(bi, bj, bk)``, ``lo``/``hi`` (B, 3),
        ``n_tets`` (B,), ``block``, ``cells_shape``. See :func:`block_columns`.
    """
    return block_columns(snap, block).blocks


def block_tetrahedra(snap, block_index, block: int = 8):
    """Tetrahedra and masses of one Lagrangian block (NumPy, for tests and inspection).

    Parameters
    ----------
    snap : Snapshot
        With ``ids`` and ``lagrangian_shape``.
    block_index : (int, int, int)
        ``(bi, bj, bk)`` as in :func:`lagrangian_blocks`.
    block : int
        Cells per block side.

    Returns
    -------
    tets : ndarray (T, 4, 3) float64
        ``T = 6 * cells in the block``; cells in C order, 6 Kuhn tetrahedra each;
        periodic ones unwrapped next to the block's first particle.
    mass : ndarray (T,) float64
        Cell mass / 6.
    """
    block = check_block(block)
    shape, box = _lagrangian(snap)
    periodic = box is not None
    ncells = cells_shape(shape, periodic)
    bi, bj, bk = (int(b) for b in block_index)
    nb = [-(-c // block) for c in ncells]
    if not all(0 <= b < n for b, n in zip((bi, bj, bk), nb, strict=True)):
        raise ParameterError(f"block index {tuple(block_index)} outside the block grid {nb}")
    pos, mass = id_ordered(snap)
    i0 = bi * block
    count = min(i0 + block, ncells[0]) - i0 + 1
    slab = _x_slab(pos, shape, i0, count, periodic)
    mslab = None if mass is None else _x_slab(mass, shape, i0, count, periodic)
    slab, mslab = dask.compute(slab, mslab)
    j0 = bj * block
    col = _column(slab, mslab, shape, j0, min(j0 + block, ncells[1]), periodic)
    tets, m = column_tets_kernel(col, [bk], block, ncells[2], box, _particle_mass(snap))
    return host(tets), host(m)


def snapshot_tetrahedra(snap):
    """All tetrahedra of a (small) snapshot in memory: ``(tets (T, 4, 3), mass (T,))``.

    Cells in C order of ``(i, j, k)``, 6 Kuhn tetrahedra each (``T = 6 * cells``),
    each cell unwrapped about its own corner 000 (no block shift). Memory ~300
    bytes per particle: for tests and small boxes; large snapshots go block by
    block (:func:`block_columns`).
    """
    shape, box = _lagrangian(snap)
    periodic = box is not None
    pos, mass = id_ordered(snap)
    pos, mass = dask.compute(pos, mass)
    grid = host(pos).reshape(*shape, 3)
    if periodic:
        grid = np.pad(grid, ((0, 1), (0, 1), (0, 1), (0, 0)), mode="wrap")
    pm = _particle_mass(snap)
    if pm is None:
        ncells = cells_shape(shape, periodic)
        cm = host(mass).reshape(shape)[:ncells[0], :ncells[1], :ncells[2]]
    else:
        cm = pm
    return block_tets_from_corners(grid, cm, box)
