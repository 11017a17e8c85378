"""Locally essential trees on the GPU: the multi-domain tree of CuPy workers.

With several domains on GPU workers (:mod:`cosmo_dask.gravity.tree.graph`), every step
runs on the GPU of the worker that holds the domain. The three functions are the GPU
kernels of the contracts ``domain_tree``, ``domain_let`` and ``domain_forces`` of
:mod:`cosmo_dask.gravity.dispatch` (CPU twins in :mod:`cosmo_dask.gravity.tree.forces`, same
signatures; ``opts`` is the tree options mapping of
:func:`~cosmo_dask.gravity.tree.graph.tree_accelerations`):

:func:`domain_tree_gpu`
    The domain's octree over its own particles
    (:func:`~cosmo_dask.spatial.octree_gpu.build_with_moments`).
:func:`domain_let_gpu`
    The part of a source domain's tree that a target box needs, cut on the source's
    GPU (:func:`let_cut`) with the opening rule of the GPU walk kernel
    (:mod:`cosmo_dask.gravity.tree.forces_gpu`) applied to the whole target box: a node
    is kept as a multipole (no children, no particles) when every group inside the box
    would accept it, dropped (kept as an empty stub) when every group would drop it (the
    truncated kernel's ``r_cut``), otherwise opened: its children are kept, or, for a
    leaf, its particles are copied. Each test is made stricter by a relative margin of
    ``LET_MARGIN`` so that rounding cannot make a group open a node the LET cut short.
    One kernel launch (``let.cu``: a thread per node tests it and climbs its ancestors,
    a node being kept when all of them are opened) replaces a pass per tree level, then
    scans and gathers lay the LET out with one host round trip. Only this pruned tree
    (node moments and the particles of opened leaves) moves between workers.
:func:`domain_forces_gpu`
    The domain's groups against its own tree and against every LET received, each with
    the walk and force kernels of :mod:`cosmo_dask.gravity.tree.forces_gpu` (the LET nodes and
    the domain's group boxes share one node array, so the kernels need no second tree),
    summed in float64 in a fixed order.

A group whose box lies in the target box sees in the LET exactly the nodes a walk of
the whole source tree would accept or open down to the level the LET keeps, so the
domain split changes which trees exist, not the accuracy criterion (results equal the
single-domain GPU tree to the tree's own error level).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import cuda
from ...core.task_graph import task_payload
from .forces_gpu import KernelSettings, kernel_settings, walk_forces

#: relative margin by which the LET's box-level accept and drop tests are stricter than
#: the group-level tests of the walk kernel (float64 rounding is ~1e-16)
LET_MARGIN = 1e-9
#: threads per block of the LET cut kernel (``let.cu``, grid-stride over the nodes)
LET_BLOCK = 256


@task_payload
@dataclass
class GPUDomainTree:
    """A domain's GPU tree: the octree (CuPy arrays), its nodes' ``sum m |x - com|^2``,
    the sorted float64 positions and the global index of every particle (tree input
    order, increasing)."""

    tree: Any
    s2: Any
    pos64: Any
    index: Any


@task_payload
@dataclass
class GPULET:
    """A pruned source tree in the :class:`~cosmo_dask.spatial.octree_layout.Octree` node
    layout (breadth first, the root first, each node's children consecutive), with the
    particles of its opened leaves (``start``/``count`` index ``pos``/``pmass``)."""

    lo: Any
    hi: Any
    com: Any
    bmax: Any
    mass: Any
    quad: Any
    s2: Any
    first_child: Any
    n_child: Any
    start: Any
    count: Any
    pos: Any
    pmass: Any


def settings_of(opts: Mapping[str, Any]) -> KernelSettings:
    """The walk kernels' settings (:func:`~cosmo_dask.gravity.tree.forces_gpu.kernel_settings`)
    for the tree options ``opts``."""
    return kernel_settings(G=opts["G"], theta=opts["theta"], softening=opts["softening"],
                           softening_kernel=opts["softening_kernel"],
                           precision=opts["precision"], box_size=opts["box_size"],
                           rs=opts["rs"], r_cut=opts["r_cut"])


def domain_tree_gpu(pos, mass, index, opts: Mapping[str, Any]) -> GPUDomainTree:
    """The GPU octree of one domain's own particles (``pos`` CuPy (n, 3), ``mass`` CuPy
    (n,) or a float, ``index`` their global indices in increasing order; ``max_leaf``,
    ``max_group`` and ``box_size`` from ``opts``). The node second moments are always
    made (the GPU build computes them with the multipoles)."""
    import cupy as cp

    from ...spatial.octree_gpu import build_with_moments

    if pos.shape[0] == 0:
        return GPUDomainTree(None, None, None, cp.asarray(index))
    tree, s2, pos64 = build_with_moments(pos, mass, max_leaf=opts["max_leaf"],
                                         max_group=opts["max_group"],
                                         box_size=opts["box_size"])
    return GPUDomainTree(tree, s2, pos64, cp.asarray(index))


def _expand(xp, first, counts, total: int):
    """``concatenate([arange(f, f + c) for f, c in zip(first, counts)])`` without a loop."""
    ends = xp.cumsum(counts)
    k = xp.arange(total, dtype=np.int64)
    j = xp.searchsorted(ends, k, side="right")
    return first[j] + (k - (ends[j] - counts[j]))


def let_cut(xp, mark, tree, box_lo, box_hi, st, margin: float = LET_MARGIN):
    """Which nodes and particles of ``tree`` the LET for the box ``[box_lo, box_hi]`` holds.

    ``mark`` is the ``let_mark`` kernel of ``let.cu`` (a CuPy kernel, or its host build in
    the tests, with ``xp`` NumPy): one launch gives every node its state in the LET (-1
    out, 0 dropped, 1 accepted, 2 opened); scans and gathers then lay the kept nodes out
    in the source's breadth-first order (children stay consecutive) with one host round
    trip (the sizes). ``st`` holds the walk settings (``box``, ``theta``, ``bcap``,
    ``h_guard``, ``r_cut``, ``trunc``; see :func:`settings_of`).

    Returns None when the root is dropped (nothing of the tree acts on the box), else
    ``(src, first_child, n_child, start, count, pidx)``: the source node of every LET
    node, its children in the LET (-1 and 0 unless opened), the range of its particles
    in the LET's particle list (opened leaves only) and the source particle (sorted
    order) of every LET particle.
    """
    box_lo = np.asarray(box_lo, np.float64).reshape(3)
    box_hi = np.asarray(box_hi, np.float64).reshape(3)
    n_nodes = int(tree.first_child.shape[0])
    state = xp.empty(n_nodes, dtype=np.int32)
    grid = max(1, min(-(-n_nodes // LET_BLOCK), 1 << 16))
    mark((grid,), (LET_BLOCK,),
         (np.int64(n_nodes), tree.lo, tree.hi, tree.com, tree.bmax, tree.parent,
          xp.asarray(0.5 * (box_lo + box_hi)), xp.asarray(0.5 * (box_hi - box_lo)),
          np.float64(st.box), np.float64(st.theta), np.float64(st.bcap),
          np.float64(st.h_guard), np.float64(st.r_cut), np.int32(bool(st.trunc)),
          np.float64(margin), state))
    opened = state == 2
    leaf = tree.first_child < 0
    slot = xp.cumsum(state >= 0)  # 1 + the LET index of each kept node
    cnt = xp.where(opened & leaf, tree.count, 0)
    sizes = xp.stack([slot[-1], cnt.sum(), state[0].astype(np.int64)])
    n_let, n_parts, root = (int(v) for v in getattr(xp, "asnumpy", np.asarray)(sizes))
    if root == 0:
        return None
    src = xp.searchsorted(slot, xp.arange(1, n_let + 1, dtype=slot.dtype), side="left")
    inner = (opened & ~leaf)[src]
    first_child = xp.where(inner, slot[xp.maximum(tree.first_child[src], 0)] - 1, -1)
    n_child = xp.where(inner, tree.n_child[src], 0).astype(np.int8)
    count = cnt[src]
    start = xp.where(count > 0, xp.cumsum(count) - count, 0)
    pidx = _expand(xp, tree.start[src], count, n_parts)
    return src, first_child.astype(np.int64), n_child, start.astype(np.int64), count, pidx


def domain_let_gpu(dt: GPUDomainTree, box_lo, box_hi, opts: Mapping[str, Any]) -> GPULET | None:
    """The LET of ``dt``'s tree for the target box ``[box_lo, box_hi]`` (host (3,) arrays),
    or None when nothing of it can act on the box (an empty source, or every node beyond
    the cut): :func:`let_cut` on the source's GPU."""
    import cupy as cp

    if dt.tree is None:
        return None
    tree = dt.tree
    mark = cuda.module("let", (), cuda.NO_FMAD).get_function("let_mark")
    cut = let_cut(cp, mark, tree, box_lo, box_hi, settings_of(opts))
    if cut is None:
        return None
    src, first_child, n_child, start, count, pidx = cut
    return GPULET(lo=tree.lo[src], hi=tree.hi[src], com=tree.com[src], bmax=tree.bmax[src],
                  mass=tree.mass[src], quad=tree.quad[src], s2=dt.s2[src],
                  first_child=first_child, n_child=n_child, start=start, count=count,
                  pos=dt.pos64[pidx], pmass=tree.pmass[pidx])


def _let_with_groups(let: GPULET, dt: GPUDomainTree):
    """One node set: the LET's nodes, then the target's group boxes (unreachable from the
    LET's root, so the walk never enters them); the LET's particles, then the target's."""
    from types import SimpleNamespace

    import cupy as cp

    tree = dt.tree
    groups = tree.groups
    n_let, n_lp = int(let.lo.shape[0]), int(let.pos.shape[0])

    def cat(a, b):
        return cp.concatenate([a, b])

    nodes = SimpleNamespace(
        lo=cat(let.lo, tree.lo[groups]), hi=cat(let.hi, tree.hi[groups]),
        com=cat(let.com, tree.com[groups]), bmax=cat(let.bmax, tree.bmax[groups]),
        mass=cat(let.mass, tree.mass[groups]), quad=cat(let.quad, tree.quad[groups]),
        first_child=cat(let.first_child, cp.full(groups.shape[0], -1, dtype=cp.int64)),
        n_child=cat(let.n_child, cp.zeros(groups.shape[0], dtype=cp.int8)),
        start=cat(let.start, tree.start[groups] + n_lp), count=cat(let.count, tree.count[groups]))
    s2 = cat(let.s2, dt.s2[groups])
    gnodes = cp.arange(n_let, n_let + groups.shape[0], dtype=cp.int64)
    pos = cat(let.pos, dt.pos64)
    pmass = cat(let.pmass, tree.pmass)
    order = cat(cp.zeros(n_lp, dtype=cp.int64), tree.order)
    return nodes, s2, gnodes, pos, pmass, order


def domain_forces_gpu(dt: GPUDomainTree, lets: Sequence, batch: tuple[int, int],
                      opts: Mapping[str, Any]):
    """Accelerations and potentials of a domain's particles from its own tree and the
    LETs (None entries skipped): ``(index, acc (n, 3) float64, pot (n,) float64)`` in
    increasing index, CuPy. A GPU domain is one batch: ``batch`` is ``(0, 1)`` (the
    graph gives GPU domains one batch each; the argument keeps the contract's
    signature)."""
    import cupy as cp

    st = settings_of(opts)
    n = int(dt.index.shape[0])
    acc = cp.zeros((n, 3), dtype=cp.float64)
    pot = cp.zeros(n, dtype=cp.float64)
    if n == 0:
        return dt.index, acc, pot
    tree = dt.tree
    a, p = walk_forces(tree, dt.s2, tree.groups, dt.pos64, tree.pmass, tree.order, n, st,
                       potential=True)
    acc += a
    pot += p
    for let in lets:
        if let is None:
            continue
        nodes, s2, gnodes, pos, pmass, order = _let_with_groups(let, dt)
        a, p = walk_forces(nodes, s2, gnodes, pos, pmass, order, n, st, potential=True)
        acc += a
        pot += p
    return dt.index, acc, pot

__all__ = ["GPULET", "LET_MARGIN", "GPUDomainTree", "domain_forces_gpu", "domain_tree_gpu",
           "domain_let_gpu", "let_cut", "settings_of"]
