"""Tetrahedra of a column's blocks in one CUDA launch (the GPU path of ``column_block_tets``).

The NumPy/CuPy-array version in :mod:`.tessellation_kernels` builds a block's
tetrahedra with about 30 array operations. Called for every (leaf, column)
pair of a PSE deposit, that is tens of thousands of small kernel launches.
This kernel does the same arithmetic, in the same order, for all requested
blocks of a column at once: one thread per Lagrangian cell. For each cell it
takes the unwrapped corners ``anchor = ref + minimage(c000 - ref)``,
``corner = anchor + minimage(corner - c000)``, where ``ref`` is the block's
first particle. It then writes the 6 Kuhn tetrahedra (``KUHN_TETS`` order)
plus the block's shift, and the masses ``cell_mass / 6 * particle_mass``.
Compiled with ``--fmad=false``, so the result equals the CPU path bit for bit.
"""

from __future__ import annotations

import collections
import functools

import numpy as np

from .. import cuda
from .tessellation_kernels import KUHN_TETS


def _kernel(device_id: int, name: str = "column_tets"):
    """A kernel of ``tessellation.cu`` (no fused multiply-adds) on device ``device_id``."""
    import cupy

    with cupy.cuda.Device(device_id):
        return cuda.module("tessellation", options=cuda.NO_FMAD).get_function(name)


@functools.cache
def _kuhn(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.asarray(KUHN_TETS.astype(np.int32))


def _requests(columns, rows, block, ncz):
    """The int64 request table of the kernels (see the CUDA source), on the GPU.

    ``rows`` (R, 5) int64: ``(slot, bk, sx, sy, sz)``, block ``bk`` of column
    ``columns[slot]`` shifted by ``(sx, sy, sz)`` boxes. Returns ``(meta,
    n_requests, n_cells, held)``; ``held`` keeps the contiguous float64 columns
    the table points into alive until the launch.
    """
    import cupy

    rows = np.asarray(rows, np.int64).reshape(-1, 5)
    slots, where = np.unique(rows[:, 0], return_inverse=True)
    cols = [(cupy.ascontiguousarray(columns[s][0], dtype=cupy.float64),
             None if columns[s][1] is None
             else cupy.ascontiguousarray(columns[s][1], dtype=cupy.float64)) for s in slots]
    info = np.array([(p.shape[0] - 1, p.shape[1] - 1, p.shape[2], p.data.ptr,
                      0 if m is None else m.data.ptr) for p, m in cols],
                    np.uint64).reshape(-1, 5).view(np.int64)
    k0 = rows[:, 1] * block
    k1 = np.minimum(k0 + block, ncz)
    req = np.column_stack([where, k0, k1, rows[:, 2:]])
    first = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(info[where, 0] * info[where, 1] * (k1 - k0), out=first[1:])
    meta = np.concatenate([[len(rows)], req.reshape(-1), first, info.reshape(-1)])
    return upload(meta.astype(np.int64)), len(rows), int(first[-1]), cols


def block_rows(bks, shifts=None, slot: int = 0) -> np.ndarray:
    """Request rows ``(slot, bk, sx, sy, sz)`` for blocks ``bks`` of one column."""
    bks = np.asarray(bks, np.int64).reshape(-1)
    sh = (np.zeros((len(bks), 3), np.int64) if shifts is None
          else np.rint(np.asarray(shifts, np.float64)).astype(np.int64).reshape(-1, 3))
    return np.column_stack([np.full(len(bks), slot, np.int64), bks, sh])


#: pinned host buffers of uploads still in flight, with the event that ends each
_IN_FLIGHT: collections.deque = collections.deque()


def upload(table: np.ndarray):
    """Copy a host array to the GPU without making the host wait for queued kernels.

    ``cupy.asarray`` of pageable memory returns only once the copy is done,
    which is after every kernel queued before it: each PSE task would wait
    for the previous task's deposit. Staging through pinned memory makes the
    copy asynchronous; the buffer is kept until its event has passed.
    """
    import cupy

    while _IN_FLIGHT and _IN_FLIGHT[0][0].done:
        _IN_FLIGHT.popleft()
    mem = cupy.cuda.alloc_pinned_memory(max(table.nbytes, 1))
    staged = np.frombuffer(mem, table.dtype, table.size).reshape(table.shape)
    staged[...] = table
    out = cupy.empty(table.shape, table.dtype)
    stream = cupy.cuda.get_current_stream()
    out.set(staged, stream=stream)
    _IN_FLIGHT.append((stream.record(), mem))
    return out


def rows_tets_gpu(columns, rows, block, ncz, box_size, particle_mass):
    """Tetrahedra and masses of many columns' blocks in one launch (CuPy).

    ``rows`` (R, 5) int64 ``(slot, bk, sx, sy, sz)``: block ``bk`` of the CuPy
    column ``columns[slot]`` (``(corners, cell_mass or None)``), translated by
    ``(sx, sy, sz) * box_size``. Output in row order, cells in C order: the
    same as concatenating :func:`.tessellation_kernels.column_block_tets` per row.
    No host synchronisation.
    """
    import cupy

    meta, _, n_cells, held = _requests(columns, rows, block, ncz)
    tets = cupy.empty((n_cells * 6, 4, 3))
    mass = cupy.empty(n_cells * 6)
    if n_cells == 0:
        return tets, mass
    dev = cupy.cuda.Device().id
    threads = 128
    blocks = int(min(-(-n_cells // threads), 65535))
    _kernel(dev)((blocks,), (threads,), (
        meta, _kuhn(dev), np.int32(ncz), np.float64(box_size or 0.0),
        np.int32(box_size is not None),
        np.float64(1.0 if particle_mass is None else particle_mass), tets, mass))
    del held
    return tets, mass


def column_bboxes_gpu(column, block, ncz, box_size):
    """``(lo (nbk, 3), hi (nbk, 3))`` CuPy: bounding boxes of every block of one column.

    The boxes of the unwrapped cell corners that :func:`rows_tets_gpu` would
    write (one launch, one thread block per block; no tetrahedra are made).
    """
    import cupy

    nbk = -(-ncz // block)
    meta, n_req, _, held = _requests([column], block_rows(np.arange(nbk)), block, ncz)
    lo = cupy.empty((n_req, 3))
    hi = cupy.empty((n_req, 3))
    dev = cupy.cuda.Device().id
    _kernel(dev, "column_bboxes")((int(min(n_req, 65535)),), (256,), (
        meta, np.float64(box_size or 0.0), np.int32(box_size is not None), lo, hi))
    del held
    return lo, hi


def column_block_tets_gpu(column, bks, block, ncz, box_size, particle_mass, shifts=None):
    """GPU twin of :func:`.tessellation_kernels.column_block_tets` for one column.

    ``shifts`` here are translations (whole boxes), as there.
    """
    img = None
    if shifts is not None:
        img = np.asarray(shifts, np.float64) / (box_size if box_size else 1.0)
    return rows_tets_gpu([column], block_rows(bks, img), block, ncz, box_size, particle_mass)
