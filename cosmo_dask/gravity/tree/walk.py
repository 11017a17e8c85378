"""Group tree walks: interaction lists of target boxes against a source octree.

The walk is (target group boxes) x (source :class:`Octree`): the targets are only
axis-aligned boxes ``[group_lo, group_hi]``, so the same code walks the local
tree or a remote domain's pruned tree (the locally essential tree, LET, from
:func:`let_subtree`).

Opening criterion
-----------------
A source cell ``c`` is *accepted* (evaluated as one monopole + quadrupole M2P)
for a group box ``B`` when

    d(B, com_c) > bmax_c / theta,

``d(B, p)`` being the distance from the point ``p`` to the box (0 inside it, the
periodic minimum image with ``box_size``) and ``bmax_c`` the largest distance
from ``com_c`` to a particle of ``c``. Every target of the group is then farther
than ``bmax_c / theta`` from the centre of mass, so the ratio of the expansion
(``bmax / r <= theta``) is bounded for every particle, and the box test covers
the group's extent (the "bounding-box distance test"). A cell that is not
accepted is opened; an opened leaf goes to the P2P leaf list.

Short range (TreePM: the truncated kernel of split scale ``rs``, cut at
``r_cut``):

* a cell is dropped when no pair can be closer than ``r_cut``: its bounding box
  lies at least ``r_cut`` from the group box, or its bounding sphere does
  (``d(B, com_c) - bmax_c >= r_cut``; minimum image);
* a cell may be accepted only when it lies wholly inside the cut for every
  target: its bounding box, or its bounding sphere, within ``r_cut`` of every
  point of the group box. A cell across the cut sphere is opened, so the sharp
  cut is applied pair by pair in P2P and never to a multipole;
* the opening test is ``bmax_c < theta min(d(B, com_c), TRUNC_OPEN_SPLITS rs)``
  (``TRUNC_OPEN_SPLITS = 0.5``, :mod:`~cosmo_dask.gravity.parameters`): the
  truncated kernel varies on the scale ``rs`` as well as ``r``, so its
  expansion converges like the Newtonian one only for cells small against both
  (at ``r = 2 rs`` the third derivative of ``T`` is 23 times ``T``). Without
  the cap theta = 0.5 accepted cells of ``bmax ~ rs``, and a 64^3 Zel'dovich box at
  z = 9 had short-range errors of 1.1% (90th percentile) and 7.4% (99th); with
  it, 3e-7 (float32).

The CUDA walk of :mod:`~cosmo_dask.gravity.tree.forces_gpu` applies the same rules.
Two alternatives were measured on 64^3 boxes (``python -m benchmarks treepm-walk``,
``docs/gravity.md``) and rejected: accepting cells across the cut and cutting
them at their centre of mass (Gadget's rule: 3.4x fewer pairs, but 2.4x the
TreePM force error against Ewald at z = 9 and short-range errors of 6% at the
99th percentile), and the same smaller trees without the ``rs`` cap.

Lists are CSR: ``cells[cell_ptr[g]:cell_ptr[g+1]]`` and
``leaves[leaf_ptr[g]:leaf_ptr[g+1]]`` are source node indices for group ``g``,
in depth-first Morton order (deterministic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from ...core.errors import ParameterError
from ...spatial.octree_layout import Octree
from ..parameters import TRUNC_OPEN_SPLITS

__all__ = ["InteractionLists", "interaction_lists", "let_subtree", "let_node_mask"]

_STACK = 512  # depth-first stack: at most 7 * 21 + 1 entries are ever pending


@dataclass
class InteractionLists:
    """CSR interaction lists of ``G`` groups (node indices of the source tree).

    Attributes
    ----------
    cell_ptr : (G + 1,) int64
    cells : (n_cells,) int64
        Accepted cells (M2P, monopole + quadrupole).
    leaf_ptr : (G + 1,) int64
    leaves : (n_leaves,) int64
        Opened leaves (P2P with their particles).
    """

    cell_ptr: np.ndarray
    cells: np.ndarray
    leaf_ptr: np.ndarray
    leaves: np.ndarray

    @property
    def n_groups(self) -> int:
        return int(self.cell_ptr.shape[0] - 1)


@numba.njit(cache=True, inline="always")
def _axis_gap(p, lo, hi, box):
    """Distance along one axis from coordinate p to [lo, hi] (minimum image if box > 0)."""
    if box > 0.0:
        c = 0.5 * (lo + hi)
        h = 0.5 * (hi - lo)
        d = p - c
        d -= box * np.floor(d / box + 0.5)
        g = abs(d) - h
        return g if g > 0.0 else 0.0
    if p < lo:
        return lo - p
    if p > hi:
        return p - hi
    return 0.0


@numba.njit(cache=True, inline="always")
def _axis_far(p, lo, hi, box):
    """Largest distance along one axis from coordinate p to a point of [lo, hi]
    (minimum image if box > 0)."""
    c = 0.5 * (lo + hi)
    d = p - c
    if box > 0.0:
        d -= box * np.floor(d / box + 0.5)
    return abs(d) + 0.5 * (hi - lo)


@numba.njit(cache=True, inline="always")
def _box_gap(alo, ahi, blo, bhi, box):
    """Smallest and largest axis distances between two boxes (minimum image if box > 0)."""
    ca = 0.5 * (alo + ahi)
    cb = 0.5 * (blo + bhi)
    h = 0.5 * (ahi - alo) + 0.5 * (bhi - blo)
    d = ca - cb
    if box > 0.0:
        d -= box * np.floor(d / box + 0.5)
    d = abs(d)
    g = d - h
    return (g if g > 0.0 else 0.0), d + h


@numba.njit(cache=True, inline="always")
def _classify(glo, ghi, n, s_lo, s_hi, s_com, s_bmax, inv_theta2, box, r_cut2, cut, bcap):
    """0: drop, 1: accept (M2P), 2: open."""
    d2 = 0.0
    for a in range(3):
        g = _axis_gap(s_com[n, a], glo[a], ghi[a], box)
        d2 += g * g
    b = s_bmax[n]
    if cut:
        gap2 = 0.0
        far2 = 0.0
        com_far2 = 0.0
        for a in range(3):
            g, f = _box_gap(glo[a], ghi[a], s_lo[n, a], s_hi[n, a], box)
            gap2 += g * g
            far2 += f * f
            f = _axis_far(s_com[n, a], glo[a], ghi[a], box)
            com_far2 += f * f
        if gap2 >= r_cut2:  # no pair closer than r_cut: the boxes ...
            return 0
        near = math.sqrt(d2) - b
        if near > 0.0 and near * near >= r_cut2:  # ... or the bounding sphere
            return 0
        # a multipole only wholly inside the cut: box or bounding sphere
        if far2 >= r_cut2 and math.sqrt(com_far2) + b >= math.sqrt(r_cut2):
            return 2
    if d2 > b * b * inv_theta2 and b < bcap:
        return 1
    return 2


@numba.njit(nogil=True, cache=True)
def _walk_one(glo, ghi, s_first, s_nchild, s_start, s_lo, s_hi, s_com, s_bmax, inv_theta2,
              box, r_cut2, cut, bcap, cells_out, leaves_out, write):
    """One group's walk; returns (n_cells, n_leaves, n_missing).

    With ``write``, entries beyond the sizes of ``cells_out`` / ``leaves_out`` are
    counted but not stored (the caller retries with larger buffers). Callers pass
    ``write`` as ``np.bool_(...)``, not a literal, so that they share one compiled version.
    """
    stack = np.empty(_STACK, dtype=np.int64)
    top = 0
    stack[0] = 0
    top = 1
    nc = 0
    nl = 0
    missing = 0
    while top > 0:
        top -= 1
        n = stack[top]
        k = _classify(glo, ghi, n, s_lo, s_hi, s_com, s_bmax, inv_theta2, box, r_cut2, cut,
                      bcap)
        if k == 0:
            continue
        if k == 1:
            if write and nc < cells_out.shape[0]:
                cells_out[nc] = n
            nc += 1
            continue
        fc = s_first[n]
        if fc < 0:
            if s_start[n] < 0:  # pruned node of a LET: its particles were not shipped
                missing += 1
            else:
                if write and nl < leaves_out.shape[0]:
                    leaves_out[nl] = n
                nl += 1
            continue
        for c in range(s_nchild[n] - 1, -1, -1):  # reversed: popped in Morton order
            stack[top] = fc + c
            top += 1
    return nc, nl, missing


@numba.njit(nogil=True, cache=True, parallel=True)
def _walk_count(group_lo, group_hi, s_first, s_nchild, s_start, s_lo, s_hi, s_com, s_bmax,
                inv_theta2, box, r_cut2, cut, bcap):
    g_n = group_lo.shape[0]
    ncell = np.zeros(g_n, dtype=np.int64)
    nleaf = np.zeros(g_n, dtype=np.int64)
    nmiss = np.zeros(g_n, dtype=np.int64)
    dummy = np.empty(0, dtype=np.int64)
    for g in numba.prange(g_n):
        a, b, c = _walk_one(group_lo[g], group_hi[g], s_first, s_nchild, s_start, s_lo, s_hi,
                            s_com, s_bmax, inv_theta2, box, r_cut2, cut, bcap, dummy, dummy,
                            np.bool_(False))
        ncell[g] = a
        nleaf[g] = b
        nmiss[g] = c
    return ncell, nleaf, nmiss


@numba.njit(nogil=True, cache=True, parallel=True)
def _walk_fill(group_lo, group_hi, s_first, s_nchild, s_start, s_lo, s_hi, s_com, s_bmax,
               inv_theta2, box, r_cut2, cut, bcap, cell_ptr, cells, leaf_ptr, leaves):
    g_n = group_lo.shape[0]
    for g in numba.prange(g_n):
        _walk_one(group_lo[g], group_hi[g], s_first, s_nchild, s_start, s_lo, s_hi, s_com,
                  s_bmax, inv_theta2, box, r_cut2, cut, bcap,
                  cells[cell_ptr[g]:cell_ptr[g + 1]], leaves[leaf_ptr[g]:leaf_ptr[g + 1]],
                  np.bool_(True))


def _walk_params(theta: float, box_size: float | None, r_cut: float | None,
                 rs: float | None = None):
    """``(1/theta^2, box, r_cut^2, cut, bcap)`` of the walk kernels (``box = 0``: isolated;
    ``bcap``: the largest ``bmax`` a multipole may have, ``theta TRUNC_OPEN_SPLITS rs``
    with the truncated kernel, else infinite); ``theta`` was checked where the public
    call entered."""
    theta = float(theta)
    box = 0.0
    if box_size is not None:
        box = float(box_size)
        if not (math.isfinite(box) and box > 0):
            raise ParameterError(f"box_size must be a positive number or None, got {box_size!r}")
    cut = r_cut is not None
    r_cut2 = 0.0
    if cut:
        rc = float(r_cut)
        if not (math.isfinite(rc) and rc > 0):
            raise ParameterError(f"r_cut must be a positive number or None, got {r_cut!r}")
        if box > 0 and rc > 0.5 * box:
            raise ParameterError(f"r_cut ({rc}) must be at most half the box ({box})")
        r_cut2 = rc * rc
    bcap = math.inf
    if rs is not None:
        rs = float(rs)
        if not (math.isfinite(rs) and rs > 0):
            raise ParameterError(f"rs must be a positive number or None, got {rs!r}")
        bcap = theta * TRUNC_OPEN_SPLITS * rs
    return 1.0 / (theta * theta), box, r_cut2, cut, bcap


def interaction_lists(group_lo: Any, group_hi: Any, source: Octree, theta: float, *,
                      box_size: float | None = None, r_cut: float | None = None,
                      rs: float | None = None) -> InteractionLists:
    """Interaction lists of target group boxes against a source tree (numba, parallel).

    Parameters
    ----------
    group_lo, group_hi : (G, 3) float arrays
        Bounding boxes of the target groups (length).
    source : Octree
        Source tree (a full tree or a :func:`let_subtree`).
    theta : float
        Opening angle in (0, 1.5): accept a cell when the distance from the group
        box to its centre of mass exceeds ``bmax / theta``.
    box_size : float, optional
        Periodic box side (length): minimum-image distances.
    r_cut : float, optional
        Short-range cutoff (length): drop cells with no particle closer than
        ``r_cut`` to the group box, open cells across the cut sphere.
    rs : float, optional
        Split scale of the truncated kernel (length): a multipole must also have
        ``bmax < theta * TRUNC_OPEN_SPLITS * rs`` (see the module docstring).

    Returns
    -------
    InteractionLists

    Raises
    ------
    ParameterError
        Bad parameters, or a group needs particles of a pruned LET node (the
        group lies outside the box the LET was cut for).
    """
    inv_theta2, box, r_cut2, cut, bcap = _walk_params(theta, box_size, r_cut, rs)
    glo = np.ascontiguousarray(group_lo, dtype=np.float64).reshape(-1, 3)
    ghi = np.ascontiguousarray(group_hi, dtype=np.float64).reshape(-1, 3)
    if glo.shape != ghi.shape:
        raise ParameterError("group_lo and group_hi must have the same shape (G, 3)")
    g_n = glo.shape[0]
    if source.n_nodes == 0 or g_n == 0:
        z = np.zeros(g_n + 1, dtype=np.int64)
        return InteractionLists(z, np.zeros(0, np.int64), z.copy(), np.zeros(0, np.int64))
    args = (np.asarray(source.first_child), np.asarray(source.n_child),
            np.asarray(source.start), np.asarray(source.lo), np.asarray(source.hi),
            np.asarray(source.com), np.asarray(source.bmax), inv_theta2, box, r_cut2, cut, bcap)
    ncell, nleaf, nmiss = _walk_count(glo, ghi, *args)
    if nmiss.any():
        raise ParameterError(
            f"{int((nmiss > 0).sum())} target groups need particles that the pruned source "
            "tree (LET) does not hold: the groups lie outside the box it was cut for")
    cell_ptr = np.zeros(g_n + 1, dtype=np.int64)
    np.cumsum(ncell, out=cell_ptr[1:])
    leaf_ptr = np.zeros(g_n + 1, dtype=np.int64)
    np.cumsum(nleaf, out=leaf_ptr[1:])
    cells = np.empty(cell_ptr[-1], dtype=np.int64)
    leaves = np.empty(leaf_ptr[-1], dtype=np.int64)
    _walk_fill(glo, ghi, *args, cell_ptr, cells, leaf_ptr, leaves)
    return InteractionLists(cell_ptr, cells, leaf_ptr, leaves)


# --------------------------------------------------------------------------- LET
@numba.njit(nogil=True, cache=True)
def _let_mask(blo, bhi, s_first, s_nchild, s_lo, s_hi, s_com, s_bmax, inv_theta2, box,
              r_cut2, cut, bcap):
    m = s_first.shape[0]
    keep = np.zeros(m, dtype=np.bool_)
    expand = np.zeros(m, dtype=np.bool_)
    keep[0] = True
    for n in range(m):  # breadth first: a parent precedes its children
        if not keep[n]:
            continue
        k = _classify(blo, bhi, n, s_lo, s_hi, s_com, s_bmax, inv_theta2, box, r_cut2, cut,
                      bcap)
        if k == 2:  # dropped (0) and accepted (1) nodes stay as childless multipoles
            expand[n] = True
            fc = s_first[n]
            for c in range(s_nchild[n]):
                keep[fc + c] = True
    return keep, expand


def let_node_mask(source: Octree, box_lo: Any, box_hi: Any, theta: float, *,
                  box_size: float | None = None, r_cut: float | None = None,
                  rs: float | None = None):
    """Which source nodes any group inside a target box could need.

    A node is needed when its parent may be opened for some group inside
    ``[box_lo, box_hi]``. The box is the union bound of all such groups, so the
    distance from it to a centre of mass (or a cell box) is a lower bound of any
    group's, and the distance to its farthest point an upper bound: a cell
    dropped for the box (no pair closer than ``r_cut``) is dropped for every
    group inside it, and a cell accepted for the box (wholly inside the cut,
    opening test passed) is accepted or dropped by every group inside it --
    never opened. Only cells opened for the box keep their children.

    Returns
    -------
    keep : (M,) bool
        Nodes of the LET.
    expand : (M,) bool
        Kept nodes that may be opened (their children are kept; a kept leaf
        with ``expand`` needs its particles).
    """
    inv_theta2, box, r_cut2, cut, bcap = _walk_params(theta, box_size, r_cut, rs)
    blo = np.asarray(box_lo, dtype=np.float64).reshape(3)
    bhi = np.asarray(box_hi, dtype=np.float64).reshape(3)
    if source.n_nodes == 0:
        return np.zeros(0, bool), np.zeros(0, bool)
    return _let_mask(blo, bhi, np.asarray(source.first_child), np.asarray(source.n_child),
                     np.asarray(source.lo), np.asarray(source.hi), np.asarray(source.com),
                     np.asarray(source.bmax), inv_theta2, box, r_cut2, cut, bcap)


def let_subtree(source: Octree, box_lo: Any, box_hi: Any, theta: float, *,
                box_size: float | None = None, r_cut: float | None = None,
                rs: float | None = None) -> tuple[Octree, np.ndarray]:
    """The pruned source tree (locally essential tree) for targets inside a box.

    Walking the returned tree with :func:`interaction_lists` gives, for every
    group box inside ``[box_lo, box_hi]``, the same cells and leaves (mapped by
    ``node_index``) as walking ``source``, with the same ``theta``,
    ``box_size``, ``r_cut`` and ``rs``.

    Parameters
    ----------
    source : Octree
    box_lo, box_hi : (3,) float
        Target box (length), e.g. a domain's particle bounding box.
    theta, box_size, r_cut, rs
        As for :func:`interaction_lists`.

    Returns
    -------
    let : Octree
        Nodes in the source's breadth-first order (children stay contiguous).
        Only leaves that may be opened keep their particles (``pos``, ``pmass``,
        ``keys``, ``order``: source's input indices); a node whose children were
        pruned is a leaf with ``start = -1`` and ``count = 0`` (multipoles only).
        ``start``/``count`` of kept nodes index the shipped particles.
        ``groups`` is empty.
    node_index : (M_let,) int64
        Source node index of every LET node.
    """
    keep, expand = let_node_mask(source, box_lo, box_hi, theta, box_size=box_size, r_cut=r_cut,
                                 rs=rs)
    idx = np.flatnonzero(keep).astype(np.int64)
    remap = np.full(source.n_nodes, -1, dtype=np.int64)
    remap[idx] = np.arange(idx.size)
    first = np.asarray(source.first_child)[idx]
    has_kids = (first >= 0) & expand[idx]
    new_first = np.where(has_kids, remap[np.maximum(first, 0)], -1)
    new_nchild = np.where(has_kids, np.asarray(source.n_child)[idx], 0).astype(np.int8)
    par = np.asarray(source.parent)[idx]
    new_parent = np.where(par >= 0, remap[np.maximum(par, 0)], -1)
    # shipped particles: the kept leaves that may be opened
    s_start = np.asarray(source.start)
    s_count = np.asarray(source.count)
    ship = (np.asarray(source.first_child) < 0) & keep & expand
    nodes_ship = np.flatnonzero(ship)
    nodes_ship = nodes_ship[np.argsort(s_start[nodes_ship], kind="stable")]
    cnt = s_count[nodes_ship]
    new_off = np.zeros(cnt.size + 1, dtype=np.int64)
    np.cumsum(cnt, out=new_off[1:])
    part = (np.repeat(s_start[nodes_ship] - new_off[:-1], cnt)
            + np.arange(new_off[-1], dtype=np.int64))
    # a kept node covers the shipped particles of its kept leaves: prefix counts over sorted
    # source particles give each node's shipped range
    shipped = np.zeros(source.n_particles + 1, dtype=np.int64)
    flag = np.zeros(source.n_particles, dtype=np.int64)
    flag[part] = 1
    np.cumsum(flag, out=shipped[1:])
    st = s_start[idx]
    ct = s_count[idx]
    new_start = shipped[st]
    new_count = shipped[st + ct] - shipped[st]
    pruned = (first >= 0) & ~has_kids
    pruned |= (first < 0) & ~expand[idx]
    new_start = np.where(pruned, -1, new_start)
    new_count = np.where(pruned, 0, new_count)
    let = Octree(root_lo=source.root_lo, root_size=source.root_size, max_leaf=source.max_leaf,
                 max_group=source.max_group, order=np.asarray(source.order)[part],
                 pos=np.asarray(source.pos)[part], pmass=np.asarray(source.pmass)[part],
                 keys=np.asarray(source.keys)[part], level=np.asarray(source.level)[idx],
                 start=new_start, count=new_count, first_child=new_first, n_child=new_nchild,
                 parent=new_parent, lo=np.asarray(source.lo)[idx], hi=np.asarray(source.hi)[idx],
                 mass=np.asarray(source.mass)[idx], com=np.asarray(source.com)[idx],
                 quad=np.asarray(source.quad)[idx], bmax=np.asarray(source.bmax)[idx],
                 groups=np.zeros(0, dtype=np.int64))
    return let, idx
