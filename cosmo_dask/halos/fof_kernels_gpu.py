"""Single-domain friends-of-friends on the GPU (CuPy + CUDA C).

Same contract as :func:`cosmo_dask.halos.fof_kernels.fof_local`, bit for bit:
friends when the float64 distance is ``<= linking_length`` (minimum image on
axes of period ``L > 0``), ``friends[i]`` counts the other particles within the
linking length, ``root[i]`` is the smallest input index of ``i``'s group, and
with ``min_friends = k > 1`` only pairs whose two members both have at least
``k`` friends link. As on the CPU there are two paths: plain FOF without
friend counts (``count_friends=False``, ``min_friends == 1``: what
``fof_labels`` runs) links dense cells as units, so that its cost is bounded by
particles and occupied cells; with counts every pair in neighbouring cells is
tested.

Method (the binned "virtual edge list" of HACC's PISTON halo finder, with a
lock-free union-find instead of PISTON's iterated min-label propagation):

1. One pass checks the positions (read in their dtype, float32 or float64):
   non-finite values are an error; periodic coordinates outside ``[0, L)`` are
   wrapped in float64 when read. Coarse cells have side at least the linking
   length, as on the CPU (``n = max(1, floor(L / ll))`` cells of side ``L / n``
   on a periodic axis, cells of side ``ll`` from the smallest coordinate on an
   open axis). Without counts each coarse cell is cut into ``k0 x k1 x k2``
   fine cells of side at most ``ll / sqrt(3)`` (the CPU's sub-division, fewer
   if the key would overflow). Each particle gets the int64 key
   ``coarse id * (k0 k1 k2) + fine id`` (the fine id is 0 with counts).
2. The particles are sorted by key (``cupy.argsort``); the wrapped coordinates
   are gathered in sorted order (structure of arrays; float32 when the input is
   float32 with nothing to wrap, else float64). The runs of equal keys are the
   occupied cells (fine cells without counts), found with a flag and one
   ``flatnonzero``.
3. **With friend counts** (the PISTON scheme): one thread per sorted particle
   walks the distinct neighbour coarse cells (27, fewer when a periodic axis
   has fewer than three cells or at the edges of an open axis); the up to three
   cells along the last axis are one run of consecutive ids unless they wrap,
   so nine (or fewer) runs are located by a galloping binary search in the
   sorted occupied-cell ids, started from the particle's own cell. Every friend
   is counted (each thread owns its count: no atomics); friends ``j > i`` are
   merged in a union-find forest. With ``min_friends > 1`` a first launch only
   counts, a second links core pairs. Each pair is tested twice.
4. **Without counts** (dense-cell linking, the GPU twin of the CPU's
   ``_dense_pass``): a fine cell whose bounding box proves every pair inside it
   friends is one *unit*; any other fine cell (one particle, or not provable,
   e.g. with a period shorter than ``3 ll``) is split into one-particle units.
   Units are the nodes of the union-find forest (32-bit below 2^31 particles).
   Three launches link them: (a) one thread per unit joins it to the later
   units of its coarse cell; (b) one thread per coarse cell marks the cells
   whose units are now one set; (c) one thread per unit, or one per coarse cell
   whose units are one set (the cell then acts as one node with its bounding
   box), walks the neighbour coarse cells of larger id. A neighbour cell
   already in the same set is skipped whole, a neighbour unit in the same set is
   skipped; otherwise the two bounding boxes decide: no pair can be friends
   (skip), every pair is (join), or undecided, and then particle pairs are
   tested (a point-against-box test skips or accepts whole rows) until the
   first friend pair, which joins the two units. The work per unit is a few
   ``find`` and box tests per neighbour unit, not one test per particle pair.
5. Union-find: both roots are found (path halving) and the larger root is
   hooked under the smaller with ``atomicCAS(parent[r], r, other)``, retrying
   from the value a failed CAS returns. ``parent[x] <= x`` always holds, so the
   forest cannot form a cycle and every root is its tree's smallest node. At the
   end the smallest input index of each tree is taken with ``atomicMin`` and
   labels (and counts) are scattered back to input order.

Exactness: the kernels are compiled with ``--fmad=false`` so the distance test
``d*d + e*e + f*f <= ll*ll`` and the wrapping ``x - L*floor(x/L)`` round exactly
as the (unfused) numba code does; the test is symmetric in ``i`` and ``j``. The
box tests are exact, as on the CPU: the pair test computes ``fl(x_i - x_j)``,
one minimum-image shift, squares and their sum, each monotone in IEEE
arithmetic, so the same operations on the boxes' extreme coordinates bound
every pair's computed ``d2``; where the pairs would take different
minimum-image branches the test answers "undecided". Partitions therefore do
not depend on the path, the sub-division or the order in which threads run.

Performance and memory figures (both paths, 256^3 and 512^3) are in
``benchmarks/RESULTS.md``, "Halos" (``bash benchmarks/device.sh halos``).

Memory: indices, cell and unit offsets and the forest are int32 below 2^31
particles (int64 above); the permutation and the keys are int64. Besides the
input, the sort holds the keys and the permutation (16 bytes per particle) plus
CuPy's sort buffers. Then both paths keep 8 (permutation) + 12 (float32 sorted
coordinates; 24 in float64) bytes per particle; the counting path adds 12 per
particle (cell index, forest, counts); the dense path 16 per unit (offset, box
row, cell, forest), 13 per occupied coarse cell and 48 per multi-particle unit,
and while the units are built about 36 per fine cell. With every particle in a
cell of its own (uniform data) that is about 70 bytes per particle at the peak,
much less on clustered data (estimated from the buffers; measured 5.6x the float32
input at the peak on clustered and uniform 256^3 sets).

Limits: ``friends`` is int32 as on the CPU.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import cuda
from ..core.backend import host
from ..core.errors import ParameterError
from .fof_kernels import _sub_cells, cell_grid, check_arguments

__all__ = ["fof_local_gpu", "group_rows_gpu"]

_BLOCK = 256
_PAIR_BLOCK = 128
_MAX_GRID = 1 << 24
#: combined (coarse, fine) keys stay below this
_MAX_KEY = 1 << 62
#: below this many particles indices and the forest are int32 (int64 at and above)
INT32_ROWS = 2**31 - 1

# Pass modes of fof_pairs (as in fof_kernels._pair_pass).
_COUNT_AND_LINK = 0
_COUNT_ONLY = 1
_LINK_CORES = 2

#: the storage types a module is compiled for: coordinates as given, sorted copies,
#: indices (int below 2^31 particles)
TYPE_COMBINATIONS = tuple((coord, sort, index)
                          for coord, sort in (("float", "float"), ("float", "double"),
                                              ("double", "double"))
                          for index in ("int", "long long"))

_KERNEL_NAMES = ("fof_check", "fof_cell_keys", "fof_gather", "fof_pairs", "fof_roots",
                 "fof_scatter", "fof_fine_count", "fof_fine_units", "fof_link_inner",
                 "fof_cell_sets", "fof_link_outer", "fof_unit_min", "fof_unit_labels",
                 "group_reduce")


def cuda_defines(coord: str = "double", sort: str = "double", index: str = "int") -> dict:
    """The defines of ``fof.cu`` for one combination of storage types (see
    :data:`TYPE_COMBINATIONS`): ``coord`` the input coordinates, ``sort`` the sorted copies
    ("float" or "double"; arithmetic is double either way), ``index`` indices, offsets and
    the union-find forest ("int" or "long long"); the host tests compile the same
    ``cosmo_dask.cuda.source("fof", cuda_defines(...))``."""
    return {"COORD_T": coord, "SORT_T": sort, "IDX_T": index}


@functools.cache
def _module(device_id: int, coord: str, sort: str, index: str) -> dict:
    """The compiled kernels for one device and storage types (compiled on first use,
    then cached). No fused multiply-adds, so float64 arithmetic rounds as in numba."""
    import cupy

    with cupy.cuda.Device(device_id):
        module = cuda.module("fof", cuda_defines(coord, sort, index), cuda.NO_FMAD)
        return {name: module.get_function(name) for name in _KERNEL_NAMES}


def _cupy_kernels(coord: str, sort: str, index: str) -> dict:
    import cupy

    return _module(cupy.cuda.Device().id, coord, sort, index)


def _launch(m: int, block: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for ``m`` items of a grid-stride loop."""
    return (max(1, min(-(-m // block), _MAX_GRID)),), (block,)


def _cell_grid(per, ll, lo, hi):
    """:func:`~cosmo_dask.halos.fof_kernels.cell_grid` (the CPU kernel's grid) as Python
    ints and floats: ``(dims, origin, inv)`` lists of 3."""
    dims, origin, inv = cell_grid(np.asarray(per, dtype=np.float64), float(ll),
                                  np.asarray(lo, dtype=np.float64),
                                  np.asarray(hi, dtype=np.float64))
    return [int(d) for d in dims], [float(o) for o in origin], [float(v) for v in inv]


def _fine_cells(per, inv, ll, dims) -> list[int]:
    """Fine cells per coarse cell along each axis: the CPU's sub-division (sides at most
    ``ll / sqrt(3)``), halved on the largest axis while the combined keys would reach
    :data:`_MAX_KEY` (any sub-division gives the same partition: every unit is proven by
    its bounding box)."""
    ks = [int(k) for k in _sub_cells(np.asarray(per, dtype=np.float64),
                                     np.asarray(inv, dtype=np.float64), ll)]
    ncoarse = dims[0] * dims[1] * dims[2]
    while ncoarse * ks[0] * ks[1] * ks[2] >= _MAX_KEY and max(ks) > 1:
        a = ks.index(max(ks))
        ks[a] = (ks[a] + 1) // 2
    return ks


def _mark(events, name):
    if events is not None:
        events(name)


def fof_pipeline(xp, kernels, pos, per, ll: float, kmin: int, counts: bool, events=None):
    """The GPU pipeline on checked arguments and C-contiguous float32 or float64 ``(m, 3)``
    positions (``m >= 1``), read in their dtype.

    ``xp`` is the array module (CuPy) and ``kernels(coord, sort, index)`` returns the
    launchable kernels of ``fof.cu`` for those types (``name -> f(grid, block,
    args)``); ``events``, when given, is called with a stage name after each stage.
    Returns ``(root, friends)`` (``friends`` None unless ``counts``).
    """
    m = pos.shape[0]
    small = m < INT32_ROWS
    index = "int" if small else "long long"
    itype = np.int32 if small else np.int64
    coord = "float" if pos.dtype == np.float32 else "double"
    i64, f64 = np.int64, np.float64
    mm = i64(m)
    L0, L1, L2 = (f64(x) for x in per)
    inf = float("inf")
    h0, h1, h2 = (f64(0.5 * float(x) if float(x) > 0.0 else inf) for x in per)
    ll2 = f64(ll * ll)
    geometry = (L0, L1, L2, h0, h1, h2, ll2)

    # 1. one pass over the input: non-finite values, coordinates to wrap
    flags = xp.zeros(1, dtype=np.int32)
    kernels(coord, coord, index)["fof_check"](*_launch(m, _BLOCK), (pos, mm, L0, L1, L2, flags))
    found = int(host(flags)[0])
    if found & 1:
        raise ParameterError("pos contains non-finite coordinates")
    sort = "float" if coord == "float" and not found & 2 else "double"
    stype = np.float32 if sort == "float" else np.float64
    k = kernels(coord, sort, index)
    open_axes = [a for a in range(3) if not per[a] > 0.0]
    lo = [0.0, 0.0, 0.0]
    hi = [0.0, 0.0, 0.0]
    if open_axes:
        ext = host(xp.stack([pos.min(axis=0), pos.max(axis=0)]))
        for a in open_axes:
            lo[a] = float(ext[0, a])
            hi[a] = float(ext[1, a])
    dims, origin, inv = _cell_grid(per, ll, lo, hi)
    ks = [1, 1, 1] if counts else _fine_cells(per, inv, ll, dims)
    _mark(events, "check")

    # 2. keys, sort, sorted coordinates, runs of equal keys (cells)
    keys = xp.empty(m, dtype=np.int64)
    k["fof_cell_keys"](*_launch(m, _BLOCK), (
        pos, mm, L0, L1, L2, f64(origin[0]), f64(origin[1]), f64(origin[2]),
        f64(inv[0]), f64(inv[1]), f64(inv[2]), i64(dims[0]), i64(dims[1]), i64(dims[2]),
        i64(ks[0]), i64(ks[1]), i64(ks[2]), keys))
    _mark(events, "keys")
    perm = xp.argsort(keys)
    _mark(events, "sort")
    skeys = keys[perm]
    del keys
    sx, sy, sz = (xp.empty(m, dtype=stype) for _ in range(3))
    k["fof_gather"](*_launch(m, _BLOCK), (pos, perm, mm, L0, L1, L2, sx, sy, sz))
    new = xp.empty(m, dtype=np.bool_)
    new[0] = True
    xp.not_equal(skeys[1:], skeys[:-1], out=new[1:])
    starts = xp.flatnonzero(new)
    nrun = int(starts.size)
    run_start = xp.empty(nrun + 1, dtype=itype)
    run_start[:nrun] = starts
    run_start[nrun] = m
    run_keys = skeys[starts]
    del skeys, starts
    _mark(events, "cells")

    # the buffers go to the path in a dict it empties, so that each is freed when done
    bufs = {"sx": sx, "sy": sy, "sz": sz, "perm": perm, "run_keys": run_keys,
            "run_start": run_start}
    del sx, sy, sz, perm, run_keys, run_start
    if counts:
        pcell = xp.cumsum(new, dtype=itype)
        pcell -= 1
        del new
        bufs["pcell"] = pcell
        del pcell
        return _count_path(xp, k, bufs, m, dims, per, geometry, kmin, itype, events)
    del new
    return _dense_path(xp, k, bufs, m, dims, per, geometry, ks, itype, events), None


def _count_path(xp, k, bufs, m, dims, per, geometry, kmin, itype, events):
    """Friend counts and links by pair tests (step 3 of the module docstring)."""
    sx, sy, sz, pcell, perm = (bufs.pop(n) for n in ("sx", "sy", "sz", "pcell", "perm"))
    cell_keys, cell_start = bufs.pop("run_keys"), bufs.pop("run_start")
    i64, i32 = np.int64, np.int32
    mm = i64(m)
    friends_s = xp.zeros(m, dtype=np.int32)
    parent = xp.arange(m, dtype=itype)
    per_flags = [i32(1 if float(x) > 0.0 else 0) for x in per]
    head = (sx, sy, sz, pcell, cell_keys, cell_start, i64(cell_keys.size), mm,
            i64(dims[0]), i64(dims[1]), i64(dims[2]), *per_flags, *geometry)
    tail = (i32(min(kmin, 2**31 - 1)), friends_s, parent)
    for mode in ((_COUNT_AND_LINK,) if kmin <= 1 else (_COUNT_ONLY, _LINK_CORES)):
        k["fof_pairs"](*_launch(m, _PAIR_BLOCK), head + (i32(mode),) + tail)
    del head
    _mark(events, "pairs")
    del sx, sy, sz, pcell, cell_keys, cell_start
    minidx = xp.full(m, m, dtype=itype)
    k["fof_roots"](*_launch(m, _BLOCK), (parent, perm, mm, minidx))
    root = xp.empty(m, dtype=np.int64)
    friends = xp.empty(m, dtype=np.int32)
    k["fof_scatter"](*_launch(m, _BLOCK), (parent, perm, minidx, friends_s, mm, root, friends))
    _mark(events, "labels")
    return root, friends


def _dense_path(xp, k, bufs, m, dims, per, geometry, ks, itype, events):
    """Labels by dense-cell linking (step 4 of the module docstring)."""
    sx, sy, sz, perm = (bufs.pop(n) for n in ("sx", "sy", "sz", "perm"))
    fine_keys, fine_start = bufs.pop("run_keys"), bufs.pop("run_start")
    i64, i32 = np.int64, np.int32
    nfine = int(fine_keys.size)
    K = i64(ks[0] * ks[1] * ks[2])
    coords = (sx, sy, sz)
    n_units = xp.empty(nfine, dtype=itype)
    n_boxes = xp.empty(nfine, dtype=itype)
    new_cell = xp.empty(nfine, dtype=itype)
    k["fof_fine_count"](*_launch(nfine, _BLOCK), (
        fine_keys, fine_start, i64(nfine), K, *coords, *geometry, n_units, n_boxes, new_cell))
    unit_end = xp.cumsum(n_units, dtype=itype)
    del n_units
    box_end = xp.cumsum(n_boxes, dtype=itype)
    del n_boxes
    cell_end = xp.cumsum(new_cell, dtype=itype)
    del new_cell
    nunits, nboxes, ncell = (int(v) for v in host(xp.stack([unit_end[-1], box_end[-1],
                                                             cell_end[-1]])))
    unit_start = xp.empty(nunits + 1, dtype=itype)
    unit_box = xp.empty(nunits, dtype=itype)
    unit_cell = xp.empty(nunits, dtype=itype)
    boxes = xp.empty(6 * max(nboxes, 1), dtype=np.float64)
    cell_keys = xp.empty(ncell, dtype=np.int64)
    cell_unit = xp.empty(ncell + 1, dtype=itype)
    k["fof_fine_units"](*_launch(nfine, _BLOCK), (
        fine_keys, fine_start, i64(nfine), K, unit_end, box_end, cell_end, *coords,
        unit_start, unit_box, unit_cell, boxes, cell_keys, cell_unit))
    del fine_keys, fine_start, unit_end, box_end, cell_end
    unit_start[nunits] = m
    cell_unit[ncell] = nunits
    _mark(events, "units")

    parent = xp.arange(nunits, dtype=itype)
    units = (unit_start, unit_box, unit_cell, boxes)
    k["fof_link_inner"](*_launch(nunits, _PAIR_BLOCK), (
        *units, cell_unit, i64(nunits), *coords, *geometry, parent))
    cell_one = xp.empty(ncell, dtype=np.uint8)
    k["fof_cell_sets"](*_launch(ncell, _BLOCK), (cell_unit, i64(ncell), parent, cell_one))
    per_flags = [i32(1 if float(x) > 0.0 else 0) for x in per]
    k["fof_link_outer"](*_launch(nunits, _PAIR_BLOCK), (
        *units, cell_keys, cell_unit, cell_one, i64(ncell), i64(nunits),
        i64(dims[0]), i64(dims[1]), i64(dims[2]), *per_flags, *coords, *geometry, parent))
    _mark(events, "link")
    del units, unit_box, unit_cell, boxes, cell_keys, cell_unit, cell_one, coords, sx, sy, sz

    minidx = xp.full(nunits, m, dtype=itype)
    k["fof_unit_min"](*_launch(nunits, _BLOCK), (unit_start, perm, i64(nunits), parent, minidx))
    root = xp.empty(m, dtype=np.int64)
    k["fof_unit_labels"](*_launch(nunits, _BLOCK), (
        unit_start, perm, i64(nunits), parent, minidx, root))
    _mark(events, "labels")
    return root


def fof_local_gpu(pos, periods, linking_length: float, min_friends: int = 1,
                  count_friends: bool = True, *, events=None):
    """Friends-of-friends groups of one domain's particles, on the current GPU.

    The GPU twin of :func:`cosmo_dask.halos.fof_kernels.fof_local`: same
    arguments, checks and results element for element (see there and the module
    docstring for the method and its cost).

    Parameters
    ----------
    pos : cupy.ndarray or numpy.ndarray
        Particle positions, shape ``(m, 3)``, float32 or float64 (read in that
        dtype; other dtypes are converted to float64); NumPy input is copied to
        the GPU.
    periods : array_like
        Three per-axis periods (``0`` = open axis), as for ``fof_local``.
    linking_length : float
        Friends are at distance ``<= linking_length`` (float64).
    min_friends : int, optional
        ``k > 1``: only pairs whose members both have at least ``k`` friends link.
    count_friends : bool, optional
        Whether to return friend counts (default True). With ``False`` and
        ``min_friends == 1`` dense cells are linked as units (much faster on
        clustered data) and ``friends`` is ``None``.
    events : callable, optional
        Called with a stage name after each stage (for profiling, e.g. to record
        CUDA events); not called for empty input.

    Returns
    -------
    root : cupy.ndarray
        int64, shape ``(m,)``: the smallest index of each particle's group.
    friends : cupy.ndarray or None
        int32, shape ``(m,)``: friends of each particle; ``None`` when
        ``count_friends`` is False and ``min_friends == 1``.

    Raises
    ------
    ParameterError
        As ``fof_local``: wrong shapes, non-finite values, a negative period,
        ``linking_length <= 0`` or ``min_friends < 1``.
    """
    import cupy

    return fof_local(cupy, _cupy_kernels, pos, periods, linking_length, min_friends,
                     count_friends, events)


def fof_local(xp, kernels, pos, periods, linking_length: float, min_friends: int = 1,
              count_friends: bool = True, events=None):
    """:func:`fof_local_gpu` with the array module and kernels given (see
    :func:`fof_pipeline`), as :func:`group_rows` is to :func:`group_rows_gpu`."""
    pos = xp.asarray(pos)
    per, ll, kmin = check_arguments(pos.shape, periods, linking_length, min_friends)
    counts = bool(count_friends) or kmin > 1
    if pos.shape[0] == 0:
        return (xp.empty(0, dtype=np.int64), xp.empty(0, dtype=np.int32) if counts else None)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = xp.ascontiguousarray(pos)  # kept in its dtype: no float64 copy of the input
    return fof_pipeline(xp, kernels, pos, per, ll, kmin, counts, events)


def group_rows(xp, kernels, root, cls, ids, crossing, min_members: int) -> np.ndarray:
    """:func:`group_rows_gpu` with the array module and kernels given (see
    :func:`fof_pipeline`)."""
    n = int(root.size)
    index = "int" if n < INT32_ROWS else "long long"
    itype = np.int32 if index == "int" else np.int64
    root = xp.ascontiguousarray(root, dtype=itype)
    count = xp.zeros(n, dtype=np.int32)
    min_id = xp.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    kernels("float", "float", index)["group_reduce"](*_launch(n, _BLOCK), (
        root, xp.ascontiguousarray(ids, dtype=np.int64), np.int64(n), count, min_id))
    keep = (count >= min_members) | ((count > 0) & xp.asarray(crossing, dtype=bool))
    sel = xp.flatnonzero(keep)
    return host(xp.stack([xp.asarray(cls, dtype=np.int64)[sel], count[sel].astype(np.int64),
                          min_id[sel]], axis=1))


def group_rows_gpu(root, cls, ids, crossing, min_members: int) -> np.ndarray:
    """Rows ``(class, count, smallest id)`` of one domain's local groups that have at least
    ``min_members`` members here or cross a domain face (int64, on the host), without
    sorting the particles: the GPU twin of :func:`cosmo_dask.halos.fof_kernels.group_rows`
    (see there for the arguments, here CuPy arrays; the same rows in the same order), the
    counts and smallest ids reduced with atomics.
    """
    import cupy

    return group_rows(cupy, _cupy_kernels, root, cls, ids, crossing, min_members)
