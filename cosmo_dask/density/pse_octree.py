"""The adaptive octree of the phase-space-element deposit (ADECO section 4).

The tree is refined from the Lagrangian sub-blocks' bounding boxes, never from
individual tetrahedra. The number of tetrahedra overlapping a node is
estimated as ``sum_b n_tets_b * |bbox_b & node| / |bbox_b|``: each block's
tetrahedra are assumed spread evenly over its bounding box. A node is split
into its 8 children while that estimate exceeds ``max_tets_per_node`` and
its depth is below ``max_level``. Every leaf, whether refined or not, empty or
not, carries one ``patch_size^3`` grid patch, so the leaves tile the root cube.

Periodic boxes: a block's bounding box lies in unwrapped coordinates (within
about a block of its first particle), so it may stick out of ``[0, box)``.
Each block enters as "pieces", one per periodic image (a shift by whole boxes,
``-1, 0, +1`` per axis) whose box overlaps the root. A leaf then deposits each
piece's tetrahedra translated by that shift, so a tetrahedron that straddles
the box edge is deposited whole: the part of each image that falls inside the
leaf.

Everything here is small NumPy work on the client: O(pieces x depth) with one
row per (node, piece) overlap.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from ..spatial.morton import cell_keys

_CHILD = np.array(list(itertools.product((0, 1), repeat=3)), np.int64)
_IMAGES = np.array(list(itertools.product((-1, 0, 1), repeat=3)), np.int64)


class OctreeLayout(NamedTuple):
    """Leaves of the PSE octree and, per leaf, the block pieces that overlap it.

    ``level`` (L,), ``origin`` (L, 3): node depth and integer index at that depth.
    ``est_tets`` (L,): estimated overlapping tetrahedra (the refinement measure).
    ``leaf_ptr`` (L+1,): leaf ``i``'s pieces are rows ``leaf_ptr[i]:leaf_ptr[i+1]``
    of ``piece_block`` (block index) and ``piece_shift`` (whole-box image shift,
    (P, 3) integers). ``root_lo`` (3,), ``root_size``: the root cube.
    """

    level: np.ndarray
    origin: np.ndarray
    est_tets: np.ndarray
    leaf_ptr: np.ndarray
    piece_block: np.ndarray
    piece_shift: np.ndarray
    root_lo: np.ndarray
    root_size: float


def default_root(lo, hi, box_size):
    """``(root_lo, root_size)``: the periodic box, or the bounding cube of all blocks.

    The bounding cube is centred on the blocks' joint bounding box and padded by
    1e-9 of its side, so no tetrahedron vertex lies on its upper faces.
    """
    if box_size is not None:
        return np.zeros(3), float(box_size)
    a = np.min(lo, axis=0)
    b = np.max(hi, axis=0)
    side = float(np.max(b - a))
    side = side * (1 + 2e-9) if side > 0 else 1.0
    return (a + b) / 2 - side / 2, side


def _pieces(lo, hi, box_size, root_lo, root_size):
    """Block pieces ``(block, shift, lo, hi)`` that overlap the root."""
    nb = len(lo)
    if box_size is None:
        blk = np.arange(nb)
        shift = np.zeros((nb, 3), np.int64)
    else:
        blk = np.repeat(np.arange(nb), len(_IMAGES))
        shift = np.tile(_IMAGES, (nb, 1))
    s = shift * (0.0 if box_size is None else float(box_size))
    plo, phi = lo[blk] + s, hi[blk] + s
    keep = _overlaps(plo, phi, root_lo[None], root_lo[None] + root_size)
    return blk[keep], shift[keep], plo[keep], phi[keep]


def _overlaps(plo, phi, nlo, nhi):
    """Piece boxes that share volume with node boxes (or touch them, if flat)."""
    inside = (plo < nhi) & (phi > nlo)
    flat = (plo == phi) & (plo >= nlo) & (plo < nhi)
    return np.all(inside | flat, axis=-1)


def _fraction(plo, phi, nlo, nhi):
    """Fraction of each piece box inside its node box (per-axis product)."""
    ext = phi - plo
    ov = np.clip(np.minimum(phi, nhi) - np.maximum(plo, nlo), 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where(ext > 0, ov / np.where(ext > 0, ext, 1.0),
                     ((plo >= nlo) & (plo < nhi)).astype(float))
    return np.prod(f, axis=-1)


def build_octree(blocks, *, root_lo, root_size, box_size, max_level: int,
                 max_tets_per_node: float) -> OctreeLayout:
    """Refine the octree from block bounding boxes.

    Parameters
    ----------
    blocks : LagrangianBlocks
        Bounding boxes ``lo``/``hi`` and ``n_tets`` per block.
    root_lo, root_size
        The root cube (see :func:`default_root`).
    box_size : float or None
        Periodic box side (block images are considered) or None.
    max_level : int
        Deepest level (root = 0).
    max_tets_per_node : float
        Split a node while its estimated tetrahedron count exceeds this.

    Returns
    -------
    OctreeLayout
        Leaves in depth-first (Morton) order.
    """
    root_lo = np.asarray(root_lo, np.float64)
    root_size = float(root_size)
    blk, shift, plo, phi = _pieces(np.asarray(blocks.lo, np.float64),
                                   np.asarray(blocks.hi, np.float64), box_size,
                                   root_lo, root_size)
    weight = np.asarray(blocks.n_tets, np.float64)[blk]
    # rows: (node, piece) overlaps of the current level
    node_origin = np.zeros((1, 3), np.int64)
    row_node = np.zeros(len(blk), np.int64)
    row_piece = np.arange(len(blk))
    leaves = []  # (level, origin (n,3), est (n,), rows per leaf)
    for level in range(max_level + 1):
        side = root_size / 2.0**level
        nlo = root_lo + node_origin * side
        est = np.bincount(row_node, weights=weight[row_piece]
                          * _fraction(plo[row_piece], phi[row_piece], nlo[row_node],
                                      nlo[row_node] + side),
                          minlength=len(node_origin))
        split = est > max_tets_per_node if level < max_level else np.zeros(len(est), bool)
        keep = ~split
        leaf_rows = keep[row_node]
        leaves.append((level, node_origin[keep], est[keep],
                       np.flatnonzero(keep), row_node[leaf_rows], row_piece[leaf_rows]))
        if not split.any():
            break
        parents = np.flatnonzero(split)
        new_id = -np.ones(len(node_origin), np.int64)
        new_id[parents] = np.arange(len(parents))
        child_origin = (2 * node_origin[parents][:, None, :] + _CHILD[None]).reshape(-1, 3)
        srow = split[row_node]
        pr_node = np.repeat(new_id[row_node[srow]], 8) * 8 + np.tile(np.arange(8), srow.sum())
        pr_piece = np.repeat(row_piece[srow], 8)
        cside = side / 2
        clo = root_lo + child_origin[pr_node] * cside
        ok = _overlaps(plo[pr_piece], phi[pr_piece], clo, clo + cside)
        node_origin, row_node, row_piece = child_origin, pr_node[ok], pr_piece[ok]
    return _assemble(leaves, blk, shift, root_lo, root_size)


def _morton(level, origin, max_level):
    """Morton keys of nodes at their finest-level corner (depth-first order)."""
    return cell_keys(origin << (max_level - level)[:, None])


def _assemble(leaves, blk, shift, root_lo, root_size):
    levels, origins, ests, ptr_rows = [], [], [], []
    offset = 0
    for level, origin, est, kept, rnode, rpiece in leaves:
        local = -np.ones(int(kept.max()) + 1 if len(kept) else 0, np.int64)
        local[kept] = np.arange(len(kept))
        levels.append(np.full(len(origin), level, np.int64))
        origins.append(origin)
        ests.append(est)
        ptr_rows.append((local[rnode] + offset, rpiece))
        offset += len(origin)
    level = np.concatenate(levels)
    origin = np.concatenate(origins).reshape(-1, 3)
    est = np.concatenate(ests)
    leaf_of_row = np.concatenate([r[0] for r in ptr_rows])
    piece_of_row = np.concatenate([r[1] for r in ptr_rows])
    order = np.argsort(_morton(level, origin, int(level.max())), kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    leaf_of_row = rank[leaf_of_row]
    ro = np.lexsort((piece_of_row, leaf_of_row))
    leaf_of_row, piece_of_row = leaf_of_row[ro], piece_of_row[ro]
    ptr = np.zeros(len(order) + 1, np.int64)
    np.cumsum(np.bincount(leaf_of_row, minlength=len(order)), out=ptr[1:])
    return OctreeLayout(level[order], origin[order], est[order], ptr, blk[piece_of_row],
                        shift[piece_of_row], root_lo, root_size)
