"""Octree construction on one GPU with CuPy (layout: :mod:`cosmo_dask.spatial.octree_layout`).

Steps, all on the device:

1. Morton keys (21 bits per axis, x the most significant bit of each triple) by an
   elementwise kernel, then one stable sort (``cupy.argsort``, a radix sort).
2. Nodes level by level (breadth first): for every node of level ``L`` holding more than
   ``max_leaf`` particles, one thread per (node, octant) finds the child's particle range by
   a binary search of the sorted keys; the non-empty children of the level are compacted
   with a prefix sum, so the children of a node are contiguous and in Morton order.
3. Multipoles in float64: leaves directly from their particles (one warp per leaf,
   shuffle reductions), parents from their children level by level (bottom up) with the
   parallel-axis theorem; ``bmax`` exactly (one block per internal node over its particles).
4. Groups: nodes with ``count <= max_group`` whose parent holds more (or big leaves).
"""

from __future__ import annotations

import numpy as np

from .. import cuda
from ..core.errors import ParameterError
from .morton import check_pos, check_root, wrap_positions
from .octree_layout import MORTON_BITS, Octree

_cache: dict = {}


def _kernels() -> dict:
    """The kernels of ``octree.cu`` (``"mod"``) and the Morton-key elementwise kernel
    (``"morton"``, device functions from ``octree_morton.cu``) on the current device."""
    import cupy as cp

    dev = cp.cuda.runtime.getDevice()
    if dev not in _cache:
        _cache[dev] = {"mod": cuda.module("octree"), "morton": cp.ElementwiseKernel(
            "float64 x, float64 y, float64 z, float64 lox, float64 loy, float64 loz, "
            "float64 scale",
            "uint64 key",
            "key = (spread21(cell21(x, lox, scale)) << 2) | (spread21(cell21(y, loy, scale)) << 1)"
            " | spread21(cell21(z, loz, scale));",
            "cosmo_dask_morton21",
            preamble=cuda.source("octree_morton"),
        )}
    return _cache[dev]


def _check_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ParameterError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def morton_keys_gpu(pos, root_lo, root_size: float, *, box_size: float | None = None):
    """Morton keys (uint64, 21 bits per axis) of positions on the GPU: the GPU kernel of
    the contract :data:`cosmo_dask.spatial.dispatch.morton_keys` (the checks and the
    periodic wrap of :func:`cosmo_dask.spatial.morton.morton_keys`).

    Parameters
    ----------
    pos : (N, 3) cupy.ndarray
        Positions (length units).
    root_lo : (3,) array_like
        Lower corner of the root cube (length units).
    root_size : float
        Side of the root cube (length units); ``>= box_size`` when periodic.
    box_size : float, optional
        Periodic box side (length units): positions are wrapped into
        ``[root_lo, root_lo + box_size)`` first.

    Returns
    -------
    cupy.ndarray
        (N,) uint64 keys; cell coordinates are clipped to ``[0, 2**21 - 1]``.
    """
    check_pos(pos)
    root_lo, root_size = check_root(root_lo, root_size, box_size)
    if box_size is not None:
        pos = wrap_positions(pos, root_lo, float(box_size))
    return _keys(pos, root_lo, root_size)


def _keys(pos, root_lo, root_size: float):
    """The elementwise Morton kernel on checked (and wrapped) CuPy positions."""
    import cupy as cp

    k = _kernels()["morton"]
    p = pos.astype(cp.float64, copy=False)
    scale = float(2**MORTON_BITS) / float(root_size)
    lo = [float(v) for v in np.asarray(root_lo, dtype=np.float64)]
    return k(p[:, 0], p[:, 1], p[:, 2], lo[0], lo[1], lo[2], scale)


def build_with_moments(pos, mass, *, max_leaf=64, max_group=64, root_lo=None, root_size=None,
           box_size=None, timer=None):
    """Build the tree; returns ``(Octree, s2, pos64)`` where ``s2 = sum m |x - com|^2``
    per node (float64) and ``pos64`` the sorted positions in float64 (both used by the
    force kernels)."""
    import cupy as cp

    max_leaf = _check_int(max_leaf, "max_leaf")
    max_group = _check_int(max_group, "max_group")
    pos = cp.asarray(pos)
    if pos.ndim != 2 or pos.shape[1] != 3 or pos.shape[0] < 1:
        raise ParameterError(f"pos must have shape (N, 3) with N >= 1, got {pos.shape}")
    if pos.dtype.kind != "f":
        raise ParameterError(f"pos must be a float array, got dtype {pos.dtype}")
    n = int(pos.shape[0])
    if np.ndim(mass) == 0:
        m = float(mass)
        if not np.isfinite(m) or m < 0:
            raise ParameterError(f"mass must be a finite non-negative number, got {mass!r}")
        pm_in = cp.full(n, m, dtype=cp.float64)
    else:
        pm_in = cp.asarray(mass)
        if pm_in.shape != (n,):
            raise ParameterError(f"mass must be a scalar or have shape ({n},), got {pm_in.shape}")
        pm_in = pm_in.astype(cp.float64, copy=False)
    # per-column full reductions of a contiguous copy (an axis-0 reduction of the (N, 3)
    # array has only 3 outputs to spread over the GPU's threads, and was slow: see
    # benchmarks/RESULTS.md, Gravity, part (c))
    cols = cp.ascontiguousarray(pos.T)
    ext = cp.stack([cols[a].min() for a in range(3)] + [cols[a].max() for a in range(3)])
    ext = cp.asnumpy(ext.astype(cp.float64))
    lo_h, hi_h = ext[:3], ext[3:]
    del cols
    if not (np.all(np.isfinite(lo_h)) and np.all(np.isfinite(hi_h))):
        raise ParameterError("pos contains NaN or infinite values")
    if box_size is not None:
        box = float(box_size)
        if not np.isfinite(box) or box <= 0:
            raise ParameterError(f"box_size must be a positive number, got {box_size!r}")
        if lo_h.min() < 0 or hi_h.max() >= box:
            raise ParameterError(f"particles outside the periodic box [0, {box}): "
                                 f"min {lo_h.min()}, max {hi_h.max()}")
        rlo, rsize = np.zeros(3), box
    elif root_lo is not None or root_size is not None:
        if root_lo is None or root_size is None:
            raise ParameterError("root_lo and root_size must be given together")
        rlo = np.asarray(root_lo, dtype=np.float64).reshape(3)
        rsize = float(root_size)
        if not rsize > 0:
            raise ParameterError(f"root_size must be positive, got {root_size!r}")
        if np.any(lo_h < rlo) or np.any(hi_h >= rlo + rsize):
            raise ParameterError("particles outside the root cube [root_lo, root_lo + root_size)")
    else:
        ext = float((hi_h - lo_h).max())
        rsize = ext * (1.0 + 1e-6) if ext > 0 else 1.0
        rlo = lo_h - 0.5 * (rsize - (hi_h - lo_h))
    kern = _kernels()
    mod = kern["mod"]
    if timer:
        timer.mark("build_bbox")
    keys = _keys(pos, rlo, rsize)
    if timer:
        timer.mark("build_keys")
    order = cp.argsort(keys)  # stable (radix) sort: ties keep the input order
    if timer:
        timer.mark("build_sort")
    keys = keys[order]
    spos = pos[order]
    pos64 = spos.astype(cp.float64, copy=False)
    pos64 = cp.ascontiguousarray(pos64)
    pmass = pm_in[order]
    if timer:
        timer.mark("build_gather")

    # ---- nodes, level by level
    lv_start = [cp.zeros(1, dtype=cp.int64)]
    lv_count = [cp.full(1, n, dtype=cp.int64)]
    lv_parent = [cp.full(1, -1, dtype=cp.int64)]
    lv_fc, lv_nc = [], []
    offset = 0  # global index of the first node of the current level
    child_bounds = mod.get_function("child_bounds")
    level = 0
    while True:
        cnt = lv_count[level]
        n_cur = int(cnt.shape[0])
        fc = cp.full(n_cur, -1, dtype=cp.int64)
        nc = cp.zeros(n_cur, dtype=cp.int8)
        split = cp.nonzero(cnt > max_leaf)[0] if level < MORTON_BITS else cp.zeros(0, cp.int64)
        n_split = int(split.shape[0])
        if n_split == 0:
            lv_fc.append(fc)
            lv_nc.append(nc)
            break
        pstart = lv_start[level][split]
        pcount = cnt[split]
        bounds = cp.empty(n_split * 9, dtype=cp.int64)
        shift = 3 * (MORTON_BITS - level - 1)
        threads = 256
        child_bounds(((n_split * 9 + threads - 1) // threads,), (threads,),
                     (keys, pstart, pcount, np.int32(n_split), np.int32(shift), bounds))
        bounds = bounds.reshape(n_split, 9)
        cstart = bounds[:, :8]
        ccount = bounds[:, 1:] - bounds[:, :8]
        nonempty = ccount > 0
        per_parent = nonempty.sum(axis=1)
        first = cp.cumsum(per_parent) - per_parent  # exclusive prefix within the next level
        flat = cp.nonzero(nonempty.ravel())[0]
        next_offset = offset + n_cur
        fc[split] = next_offset + first
        nc[split] = per_parent.astype(cp.int8)
        lv_fc.append(fc)
        lv_nc.append(nc)
        lv_start.append(cstart.ravel()[flat])
        lv_count.append(ccount.ravel()[flat])
        lv_parent.append(offset + split[flat // 8])
        offset = next_offset
        level += 1
    n_levels = level + 1
    sizes = [int(a.shape[0]) for a in lv_start]
    start = cp.concatenate(lv_start)
    count = cp.concatenate(lv_count)
    parent = cp.concatenate(lv_parent)
    first_child = cp.concatenate(lv_fc)
    n_child = cp.concatenate(lv_nc)
    lvl = cp.concatenate([cp.full(s, i, dtype=cp.int8) for i, s in enumerate(sizes)])
    m_nodes = int(start.shape[0])
    if timer:
        timer.mark("build_nodes")

    # ---- multipoles
    nmass = cp.empty(m_nodes, dtype=cp.float64)
    com = cp.empty((m_nodes, 3), dtype=cp.float64)
    quad = cp.empty((m_nodes, 6), dtype=cp.float64)
    s2 = cp.empty(m_nodes, dtype=cp.float64)
    bmax = cp.empty(m_nodes, dtype=cp.float64)
    lo = cp.empty((m_nodes, 3), dtype=cp.float64)
    hi = cp.empty((m_nodes, 3), dtype=cp.float64)
    is_leaf = first_child < 0
    leaves = cp.nonzero(is_leaf)[0]
    n_leaf = int(leaves.shape[0])
    threads = 256
    mod.get_function("leaf_moments")(
        ((n_leaf * 32 + threads - 1) // threads,), (threads,),
        (pos64, pmass, leaves, np.int32(n_leaf), start, count, nmass, com, quad, s2, bmax,
         lo, hi))
    parent_moments = mod.get_function("parent_moments")
    bounds_lv = np.concatenate([[0], np.cumsum(sizes)])
    internal_all = []
    for lv in range(n_levels - 2, -1, -1):
        a, b = int(bounds_lv[lv]), int(bounds_lv[lv + 1])
        internal = a + cp.nonzero(~is_leaf[a:b])[0]
        k = int(internal.shape[0])
        if k == 0:
            continue
        internal_all.append(internal)
        parent_moments(((k + threads - 1) // threads,), (threads,),
                       (internal, np.int32(k), first_child, n_child, count, nmass, com, quad,
                        s2, lo, hi))
    if internal_all:
        internal = cp.concatenate(internal_all)
        mod.get_function("node_bmax")((int(internal.shape[0]),), (256,),
                                      (pos64, internal, start, count, com, bmax))

    if timer:
        timer.mark("build_multipoles")
    # ---- groups
    pc = cp.where(parent >= 0, count[cp.maximum(parent, 0)], n + max_group + 1)
    is_group = ((count <= max_group) | is_leaf) & (pc > max_group)
    gnodes = cp.nonzero(is_group)[0]
    groups = gnodes[cp.argsort(start[gnodes])]
    tree = Octree(root_lo=cp.asarray(rlo, dtype=cp.float64), root_size=float(rsize),
                  max_leaf=max_leaf, max_group=max_group, order=order.astype(cp.int64),
                  pos=spos, pmass=pmass, keys=keys, level=lvl, start=start, count=count,
                  first_child=first_child, n_child=n_child, parent=parent, lo=lo, hi=hi,
                  mass=nmass, com=com, quad=quad, bmax=bmax, groups=groups)
    return tree, s2, pos64


def build_octree_gpu(pos, mass, *, max_leaf: int = 64, max_group: int = 64, root_lo=None,
                     root_size: float | None = None, box_size: float | None = None) -> Octree:
    """Build the octree of particles on the GPU (CuPy arrays in the returned :class:`Octree`).

    Parameters
    ----------
    pos : (N, 3) cupy.ndarray
        Positions (length units), float32 or float64; ``tree.pos`` keeps this dtype.
    mass : (N,) cupy.ndarray or float
        Particle masses (mass units), or one mass for all particles. Stored as float64.
    max_leaf : int
        A node is a leaf when it holds ``<= max_leaf`` particles (or is at level 21).
    max_group : int
        Groups hold ``<= max_group`` particles (except leaves of level 21 that hold more).
    root_lo, root_size : array_like of 3 floats, float, optional
        The root cube (length units); default: the cube around the particles' bounding box.
    box_size : float, optional
        Periodic box side (length units): the root is ``[0, box_size)^3`` and every particle
        must lie inside.

    Returns
    -------
    Octree
        See :mod:`cosmo_dask.spatial.octree_layout`; every array (``root_lo`` included)
        is a CuPy array.

    Raises
    ------
    ParameterError
        Bad shapes, non-finite positions, particles outside the root or box, bad sizes.
    """
    return build_with_moments(pos, mass, max_leaf=max_leaf, max_group=max_group, root_lo=root_lo,
                  root_size=root_size, box_size=box_size)[0]
