"""CPU (numba) construction of the :class:`~cosmo_dask.spatial.octree_layout.Octree`.

Steps: Morton keys and a stable sort (:mod:`cosmo_dask.spatial.morton`); nodes
level by level (breadth first), the children of a node contiguous and in Morton
order, found by splitting the node's sorted key range on the next 3 key bits;
multipoles of every node from its particles (float64, in parallel over nodes,
``O(N depth)`` work); groups.

With ``box_size`` (periodic) the positions stored in the tree (``Octree.pos``)
are wrapped into ``[root_lo, root_lo + box_size)``; bounds and centres of mass
refer to these wrapped positions.

Groups: a group is a node that is a leaf or holds ``<= max_group`` particles,
whose parent holds ``> max_group`` particles (or the root when it qualifies).
This is the layout's definition, extended to leaves larger than ``max_group``
(possible when ``max_group < max_leaf`` or at level 21), so groups always tile
the sorted particles.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ..core.errors import ParameterError
from .morton import morton_keys, sort_by_key, wrap_positions
from .octree_layout import MORTON_BITS, Octree

__all__ = ["build_forest", "build_octree", "default_root", "node_second_moment"]


@numba.njit(nogil=True, cache=True)
def _build_nodes(keys, roots, max_leaf, cap):
    """Breadth-first nodes below the roots ``roots[r]:roots[r+1]`` of sorted particles
    (nodes ``0 .. len(roots) - 2``); returns arrays and the node count (-1 if ``cap`` is
    too small)."""
    level = np.empty(cap, dtype=np.int8)
    start = np.empty(cap, dtype=np.int64)
    count = np.empty(cap, dtype=np.int64)
    first_child = np.full(cap, -1, dtype=np.int64)
    n_child = np.zeros(cap, dtype=np.int8)
    parent = np.empty(cap, dtype=np.int64)
    m = roots.shape[0] - 1
    if m > cap:
        return level, start, count, first_child, n_child, parent, -1
    for r in range(m):
        level[r] = 0
        start[r] = roots[r]
        count[r] = roots[r + 1] - roots[r]
        parent[r] = -1
    i = 0
    while i < m:
        c = count[i]
        lev = np.int64(level[i])
        if c > max_leaf and lev < MORTON_BITS:
            shift = np.uint64(3 * (MORTON_BITS - lev - 1))
            s = start[i]
            e = s + c
            first_child[i] = m
            p = s
            while p < e:
                d = (keys[p] >> shift) & np.uint64(7)
                q = p + 1
                # children hold few particles relative to the parent: gallop then bisect
                step = 1
                while q + step <= e and ((keys[q + step - 1] >> shift) & np.uint64(7)) == d:
                    q += step
                    step *= 2
                hi = min(q + step, e)
                while q < hi:
                    mid = (q + hi) // 2
                    if ((keys[mid] >> shift) & np.uint64(7)) == d:
                        q = mid + 1
                    else:
                        hi = mid
                if m >= cap:
                    return level, start, count, first_child, n_child, parent, -1
                level[m] = lev + 1
                start[m] = p
                count[m] = q - p
                parent[m] = i
                n_child[i] += 1
                m += 1
                p = q
        i += 1
    return level, start, count, first_child, n_child, parent, m


@numba.njit(nogil=True, cache=True, parallel=True)
def _node_moments(pos, pmass, start, count, mass, com, quad, bmax, lo, hi):
    m = start.shape[0]
    for i in numba.prange(m):
        s = start[i]
        e = s + count[i]
        mt = 0.0
        cx = 0.0
        cy = 0.0
        cz = 0.0
        l0 = np.inf
        l1 = np.inf
        l2 = np.inf
        h0 = -np.inf
        h1 = -np.inf
        h2 = -np.inf
        for p in range(s, e):
            x = np.float64(pos[p, 0])
            y = np.float64(pos[p, 1])
            z = np.float64(pos[p, 2])
            w = np.float64(pmass[p])
            mt += w
            cx += w * x
            cy += w * y
            cz += w * z
            l0 = min(l0, x)
            l1 = min(l1, y)
            l2 = min(l2, z)
            h0 = max(h0, x)
            h1 = max(h1, y)
            h2 = max(h2, z)
        if mt > 0.0:
            cx /= mt
            cy /= mt
            cz /= mt
        else:  # massless node: geometric centre of its particles
            cx = 0.0
            cy = 0.0
            cz = 0.0
            for p in range(s, e):
                cx += pos[p, 0]
                cy += pos[p, 1]
                cz += pos[p, 2]
            cx /= max(e - s, 1)
            cy /= max(e - s, 1)
            cz /= max(e - s, 1)
        qxx = 0.0
        qxy = 0.0
        qxz = 0.0
        qyy = 0.0
        qyz = 0.0
        qzz = 0.0
        b2 = 0.0
        for p in range(s, e):
            dx = pos[p, 0] - cx
            dy = pos[p, 1] - cy
            dz = pos[p, 2] - cz
            w = np.float64(pmass[p])
            d2 = dx * dx + dy * dy + dz * dz
            b2 = max(b2, d2)
            qxx += w * (3.0 * dx * dx - d2)
            qxy += w * (3.0 * dx * dy)
            qxz += w * (3.0 * dx * dz)
            qyy += w * (3.0 * dy * dy - d2)
            qyz += w * (3.0 * dy * dz)
            qzz += w * (3.0 * dz * dz - d2)
        mass[i] = mt
        com[i, 0] = cx
        com[i, 1] = cy
        com[i, 2] = cz
        quad[i, 0] = qxx
        quad[i, 1] = qxy
        quad[i, 2] = qxz
        quad[i, 3] = qyy
        quad[i, 4] = qyz
        quad[i, 5] = qzz
        bmax[i] = np.sqrt(b2)
        lo[i, 0] = l0
        lo[i, 1] = l1
        lo[i, 2] = l2
        hi[i, 0] = h0
        hi[i, 1] = h1
        hi[i, 2] = h2


@numba.njit(nogil=True, cache=True, parallel=True)
def _second_moment(pos, pmass, start, count, com):
    m = start.shape[0]
    out = np.zeros(m, dtype=np.float64)
    for i in numba.prange(m):
        acc = 0.0
        for p in range(start[i], start[i] + count[i]):
            dx = pos[p, 0] - com[i, 0]
            dy = pos[p, 1] - com[i, 1]
            dz = pos[p, 2] - com[i, 2]
            acc += pmass[p] * (dx * dx + dy * dy + dz * dz)
        out[i] = acc
    return out


def default_root(pos: np.ndarray, box_size: float | None = None) -> tuple[np.ndarray, float]:
    """Default root cube ``(root_lo, root_size)``.

    The periodic box ``[0, box_size)^3`` when ``box_size`` is given, else a cube
    centred on the particles' bounding box with a side 1.0001 times its largest
    extent (at least a tiny positive size).
    """
    if box_size is not None:
        return np.zeros(3), float(box_size)
    if pos.shape[0] == 0:
        return np.zeros(3), 1.0
    lo = pos.min(axis=0).astype(np.float64)
    hi = pos.max(axis=0).astype(np.float64)
    ext = float(np.max(hi - lo))
    scale = max(float(np.max(np.abs(np.concatenate([lo, hi])))), 1e-300)
    size = max(ext * 1.0001, scale * 1e-12, 1e-300)
    centre = 0.5 * (lo + hi)
    return centre - 0.5 * size, size


def build_octree(pos: Any, mass: Any, *, max_leaf: int = 64, max_group: int = 64,
                 root_lo: Any = None, root_size: float | None = None,
                 box_size: float | None = None) -> Octree:
    """Build the octree of a particle set on the CPU (numba).

    Parameters
    ----------
    pos : (N, 3) float array
        Positions (length). NumPy (a CuPy array is copied to the host).
    mass : (N,) float array or float
        Particle masses (mass units); a scalar means equal masses.
    max_leaf : int
        A node with more particles is split (unless at level 21). >= 1.
    max_group : int
        Largest group (particles sharing one tree walk). >= 1.
    root_lo, root_size : optional
        Root cube (length); default :func:`default_root`. Both or neither.
    box_size : float, optional
        Periodic box side (length): positions are wrapped into the root, whose
        default is then ``[0, box_size)^3``.

    Returns
    -------
    Octree
        NumPy arrays as described in :mod:`cosmo_dask.spatial.octree_layout`.
    """
    pos = np.asarray(pos.get() if hasattr(pos, "get") else pos)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ParameterError(f"pos must have shape (N, 3), got {pos.shape}")
    if not np.issubdtype(pos.dtype, np.floating):
        pos = pos.astype(np.float64)
    n = pos.shape[0]
    if np.ndim(mass) == 0:
        pm = np.full(n, float(mass), dtype=np.float64)
    else:
        pm = np.asarray(mass.get() if hasattr(mass, "get") else mass)
        if pm.shape != (n,):
            raise ParameterError(f"mass must be a scalar or have shape ({n},), got {pm.shape}")
    if not np.all(np.isfinite(pos)):
        raise ParameterError("pos contains non-finite values")
    for name, val in (("max_leaf", max_leaf), ("max_group", max_group)):
        if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < 1:
            raise ParameterError(f"{name} must be a positive integer, got {val!r}")
    if (root_lo is None) != (root_size is None):
        raise ParameterError("give both root_lo and root_size, or neither")
    if root_lo is None:
        lo, size = default_root(pos, box_size)
    else:
        lo, size = np.asarray(root_lo, dtype=np.float64).reshape(3), float(root_size)
    keys = morton_keys(pos, lo, size, box_size=box_size)
    order = sort_by_key(keys)
    keys_s = keys[order]
    if box_size is not None:
        pos_s = wrap_positions(pos[order], lo, float(box_size)).astype(pos.dtype)
    else:
        pos_s = np.ascontiguousarray(pos[order])
    pmass_s = np.ascontiguousarray(pm[order])

    return _assemble(lo, size, int(max_leaf), int(max_group), order, pos_s, pmass_s, keys_s,
                     np.array([0, n], dtype=np.int64))


def _assemble(lo, size, max_leaf, max_group, order, pos_s, pmass_s, keys_s, roots):
    """The :class:`Octree` of sorted particles (nodes below the roots ``roots``)."""
    n = keys_s.shape[0]
    cap = max(64, 4 * (n // max(max_leaf, 1) + 1) * 2, 2 * roots.shape[0])
    while True:
        level, start, count, first_child, n_child, parent, m = _build_nodes(
            keys_s, roots, max_leaf, cap)
        if m >= 0:
            break
        cap *= 2
    level, start, count = level[:m].copy(), start[:m].copy(), count[:m].copy()
    first_child, n_child, parent = first_child[:m].copy(), n_child[:m].copy(), parent[:m].copy()

    mass_n = np.empty(m)
    com = np.empty((m, 3))
    quad = np.empty((m, 6))
    bmax = np.empty(m)
    lo_n = np.empty((m, 3))
    hi_n = np.empty((m, 3))
    _node_moments(pos_s, pmass_s, start, count, mass_n, com, quad, bmax, lo_n, hi_n)

    leaf = first_child < 0
    small = (count <= max_group) | leaf
    par_ok = parent < 0
    par_ok[~par_ok] = ~small[parent[~par_ok]]
    if roots.shape[0] > 2:  # a forest: no groups of empty segments
        par_ok &= count > 0
    gnodes = np.flatnonzero(small & par_ok)
    groups = gnodes[np.argsort(start[gnodes], kind="stable")].astype(np.int64)

    return Octree(root_lo=lo, root_size=size, max_leaf=max_leaf, max_group=max_group,
                  order=order, pos=pos_s, pmass=pmass_s, keys=keys_s, level=level, start=start,
                  count=count, first_child=first_child, n_child=n_child, parent=parent,
                  lo=lo_n, hi=hi_n, mass=mass_n, com=com, quad=quad, bmax=bmax, groups=groups)


@numba.njit(nogil=True, cache=True, parallel=True)
def _segment_argsort(keys, starts):
    """Stable argsort of ``keys`` within each segment ``starts[s]:starts[s+1]``."""
    order = np.arange(keys.shape[0])
    for s in numba.prange(starts.shape[0] - 1):
        a = starts[s]
        b = starts[s + 1]
        if b - a > 1:
            order[a:b] = a + np.argsort(keys[a:b], kind="mergesort")
    return order


def build_forest(pos: np.ndarray, mass: np.ndarray, starts: np.ndarray, *,
                 max_leaf: int = 64, max_group: int = 64) -> Octree:
    """One octree per segment ``starts[s]:starts[s+1]`` of ``pos``, built at once.

    Node ``s`` is the root of segment ``s``: the cube around the segment's particles of
    :func:`default_root` (open boundaries). The particles are sorted by Morton key
    within their segment, so every segment keeps its rows ``starts[s]:starts[s+1]`` in
    the sorted order, and the nodes below the roots follow the layout of
    :mod:`cosmo_dask.spatial.octree_layout` (``parent`` is -1 for every root); groups
    tile each non-empty segment. ``root_lo`` and ``root_size`` are those of the cube
    ``[0, 1)^3`` of the keys: each segment's key ``k`` holds its own cube scaled to it.

    Parameters
    ----------
    pos : (N, 3) float64 numpy.ndarray
        Positions (length units).
    mass : (N,) float64 numpy.ndarray
        Particle masses (mass units).
    starts : (h + 1,) int64 numpy.ndarray
        Segment bounds, non-decreasing from 0 to ``N``.
    max_leaf, max_group : int
        As :func:`build_octree`.

    Returns
    -------
    Octree
        Its ``order`` maps sorted rows to input rows within each segment.
    """
    pos = np.ascontiguousarray(pos, dtype=np.float64)
    pm = np.ascontiguousarray(mass, dtype=np.float64)
    starts = np.asarray(starts, dtype=np.int64)
    n = pos.shape[0]
    if pos.ndim != 2 or pos.shape[1] != 3 or pm.shape != (n,):
        raise ParameterError(f"pos must have shape (N, 3) and mass (N,), got {pos.shape}, "
                             f"{pm.shape}")
    if starts.shape[0] < 1 or starts[0] != 0 or starts[-1] != n or np.any(np.diff(starts) < 0):
        raise ParameterError(f"starts must be non-decreasing from 0 to {n}")
    sizes = np.diff(starts)
    full = np.flatnonzero(sizes > 0)
    lo = np.zeros((sizes.shape[0], 3))
    ext = np.ones(sizes.shape[0])
    if full.size:
        first = starts[full]
        lo[full] = np.minimum.reduceat(pos, first, axis=0)
        span = np.maximum.reduceat(pos, first, axis=0) - lo[full]
        scale = np.maximum(np.abs(lo[full]).max(axis=1), 1e-300)
        ext[full] = np.maximum(span.max(axis=1) * 1.0001, np.maximum(scale * 1e-12, 1e-300))
    unit = pos - np.repeat(lo, sizes, axis=0)  # repeat: faster than a gather by segment
    unit /= np.repeat(ext, sizes)[:, None]
    keys = morton_keys(unit, np.zeros(3), 1.0)
    order = _segment_argsort(keys, starts)
    return _assemble(np.zeros(3), 1.0, int(max_leaf), int(max_group), order,
                     np.ascontiguousarray(pos[order]), np.ascontiguousarray(pm[order]),
                     keys[order], starts)


def node_second_moment(tree: Octree) -> np.ndarray:
    """``S = sum m |x - com|^2`` of every node (mass * length^2), float64.

    The trace that the traceless ``quad`` leaves out; the quadrupole M2P of a
    kernel whose Laplacian is not zero (softened or truncated) needs it. Nodes
    with ``start < 0`` (pruned nodes of a locally essential tree) get 0.
    """
    start = np.asarray(tree.start)
    count = np.where(start < 0, 0, np.asarray(tree.count))
    return _second_moment(tree.pos, tree.pmass, np.maximum(start, 0), count, tree.com)
