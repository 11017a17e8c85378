"""Barnes-Hut tree forces on the CPU (numba): build, group walks, list evaluation.

:func:`tree_forces`: one octree over all particles
(:func:`cosmo_dask.spatial.octree.build_octree`); one walk per group of ``<= max_group``
particles against it (:func:`cosmo_dask.gravity.tree.walk.interaction_lists` semantics),
fused with the evaluation of its lists in
:func:`cosmo_dask.gravity.tree.list_kernels.evaluate_lists` (M2P monopole + quadrupole, P2P
over leaves): the lists never reach memory. In-memory NumPy arrays.

:func:`domain_tree`, :func:`domain_let`, :func:`domain_forces`: the CPU kernels of the
multi-domain tree graph (:mod:`cosmo_dask.gravity.tree.graph`): a domain's octree, the
locally essential tree (LET) of a source tree for a target box, and a batch of a
domain's group walks against its own tree and the LETs received.

All are the CPU kernels of contracts of :mod:`cosmo_dask.gravity.dispatch` (GPU twins:
:mod:`~cosmo_dask.gravity.tree.forces_gpu`, :mod:`~cosmo_dask.gravity.tree.let_gpu`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.backend import host
from ...core.checks import PRECISIONS, check_positive
from ...core.errors import ParameterError
from ...core.task_graph import task_payload
from ...spatial.octree import build_octree, node_second_moment
from ...spatial.octree_layout import Octree
from ..parameters import (
    MAX_GROUP_DEFAULT,
    MAX_LEAF_DEFAULT,
    THETA_DEFAULT,
    check_theta,
    default_r_cut,
)
from .list_kernels import KERNEL_CODES, evaluate_lists
from .walk import interaction_lists, let_subtree

__all__ = ["DomainTree", "domain_forces", "domain_let", "domain_tree", "group_batch",
           "tree_forces"]


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "compute") and not isinstance(x, np.ndarray):
        x = x.compute()
    return host(x)


def tree_forces(pos: Any, mass: Any, *, G: float = 1.0, theta: float = THETA_DEFAULT,  # noqa: N803
                softening: float = 0.0, softening_kernel: str = "plummer",
                precision: str = "float64", potential: bool = True,
                max_leaf: int = MAX_LEAF_DEFAULT, max_group: int = MAX_GROUP_DEFAULT,
                quadrupole: bool = True, box_size: float | None = None, rs: float | None = None,
                r_cut: float | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Accelerations and potentials by a group Barnes-Hut tree (CPU, numba).

    Parameters
    ----------
    pos : (N, 3) float array
        Positions (length). NumPy (dask/CuPy inputs are computed/copied to host).
    mass : (N,) float array or float
        Masses (mass units); a scalar is the mass of every particle.
    G : float
        Gravitational constant (length^3 / (mass time^2)).
    theta : float
        Opening angle in (0, 1.5): a cell is one M2P for a group when the
        distance from the group's box to the cell's centre of mass exceeds
        ``bmax / theta``.
    softening : float
        Plummer-equivalent softening length ``eps`` (length), >= 0.
    softening_kernel : {"plummer", "spline"}
        ``"spline"``: Gadget-2 cubic spline with support ``2.8 eps``.
    precision : {"float32", "float64"}
        Arithmetic dtype of the P2P sums and dtype of the outputs.
    potential : bool
        Also return the specific potential.
    max_leaf, max_group : int
        Leaf and group sizes (particles).
    quadrupole : bool
        Monopole + quadrupole M2P (default) or monopole only.
    box_size : float, optional
        Periodic box side (length): minimum-image separations in every kernel
        (positions are wrapped into the box).
    rs : float, optional
        Split scale of the truncated short-range (TreePM) kernel (length);
        ``None``: Newtonian.
    r_cut : float, optional
        Sharp cutoff of the short-range kernel (length), default ``4.5 rs``;
        only with ``rs``.

    Returns
    -------
    acc : (N, 3) array of ``precision``
        Accelerations (length / time^2), input order.
    pot : (N,) array of ``precision`` or None
        Specific potentials (length^2 / time^2), input order; self-pairs excluded.
    """
    theta = check_theta(theta)
    G = check_positive(G, "G")  # noqa: N806
    eps = check_positive(softening, "softening", allow_zero=True)
    if softening_kernel not in KERNEL_CODES:
        raise ParameterError(f"softening_kernel must be 'plummer' or 'spline', "
                             f"got {softening_kernel!r}")
    if precision not in PRECISIONS:
        raise ParameterError(f"precision must be 'float32' or 'float64', got {precision!r}")
    if box_size is not None:
        box_size = check_positive(box_size, "box_size")
    if rs is not None:
        rs = check_positive(rs, "rs")
        r_cut = default_r_cut(rs) if r_cut is None else check_positive(r_cut, "r_cut")
        if box_size is not None and r_cut > 0.5 * box_size:
            raise ParameterError(f"r_cut ({r_cut}) must be at most half of box_size "
                                 f"({box_size})")
    elif r_cut is not None:
        raise ParameterError("r_cut is only valid with the truncated kernel: give rs too")
    pos = _as_numpy(pos)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ParameterError(f"pos must have shape (N, 3), got {pos.shape}")
    n = pos.shape[0]
    if np.ndim(mass) != 0:
        mass = _as_numpy(mass)
        if mass.shape != (n,):
            raise ParameterError(f"mass must be a number or have shape ({n},), "
                                 f"got {mass.shape}")
    if eps == 0.0:
        softening_kernel = "plummer"  # identical kernels, plummer has the fast path
    out_dtype = np.dtype(precision)
    if n == 0:
        return np.zeros((0, 3), out_dtype), (np.zeros(0, out_dtype) if potential else None)

    tree = build_octree(pos, mass, max_leaf=max_leaf, max_group=max_group, box_size=box_size)
    groups = tree.groups
    glo = tree.lo[groups]
    ghi = tree.hi[groups]
    trace = node_second_moment(tree) if (quadrupole and (eps > 0 or rs is not None)) \
        else np.zeros(tree.n_nodes)
    acc_s, pot_s = evaluate_lists(tree.pos, tree.start[groups], tree.count[groups],
                                  0.5 * (glo + ghi), None, tree, trace, G=G, softening=eps,
                                  softening_kernel=softening_kernel, precision=precision,
                                  quadrupole=quadrupole, box_size=box_size, rs=rs, r_cut=r_cut,
                                  theta=theta, g_lo=glo, g_hi=ghi)
    acc = np.empty((n, 3), dtype=out_dtype)
    acc[tree.order] = acc_s
    pot = None
    if potential:
        pot = np.empty(n, dtype=out_dtype)
        pot[tree.order] = pot_s
    return acc, pot


# --------------------------------------------------------------------------- domain trees
@task_payload
@dataclass
class DomainTree:
    """One domain's tree: the octree, each node's ``sum m |x - com|^2`` (M2P with
    softening or the truncated kernel) and the global index of every particle
    (input order of the tree, increasing)."""

    tree: Octree
    trace: np.ndarray
    index: np.ndarray


def domain_tree(pos, mass, index, opts: Mapping[str, Any]) -> DomainTree:
    """The octree of one domain's own particles, with node second moments when the
    kernel needs them (softening or the truncated kernel).

    Parameters
    ----------
    pos : (n, 3) numpy.ndarray
        Positions (length units).
    mass : (n,) numpy.ndarray or float
        Masses (mass units), or one mass for every particle.
    index : (n,) numpy.ndarray
        The particles' global indices, increasing.
    opts : mapping
        The tree options of :func:`~cosmo_dask.gravity.tree.graph.tree_accelerations`
        (``max_leaf``, ``max_group``, ``box_size``, ``softening``, ``rs`` used here).
    """
    pos = host(pos).astype(np.float64, copy=False)
    m = mass if np.ndim(mass) == 0 else host(mass).astype(np.float64)
    tree = build_octree(pos, m, max_leaf=opts["max_leaf"], max_group=opts["max_group"],
                        box_size=opts["box_size"])
    need_trace = opts["softening"] > 0 or opts["rs"] is not None
    trace = node_second_moment(tree) if need_trace and tree.n_nodes else np.zeros(tree.n_nodes)
    return DomainTree(tree, trace, host(index))


def domain_let(dt: DomainTree, box_lo, box_hi, opts: Mapping[str, Any]):
    """The part of ``dt``'s tree a walk from inside the box ``[box_lo, box_hi]`` (host
    (3,) arrays, length units) may use: ``(let Octree, its nodes' traces)``, or None for an
    empty tree (:func:`~cosmo_dask.gravity.tree.walk.let_subtree`)."""
    if dt.tree.n_particles == 0:
        return None
    let, node_index = let_subtree(dt.tree, box_lo, box_hi, opts["theta"],
                                  box_size=opts["box_size"], r_cut=opts["r_cut"], rs=opts["rs"])
    return let, dt.trace[node_index]


def group_batch(tree: Octree, b: int, n_batches: int) -> tuple[int, int]:
    """Groups ``[g0, g1)`` of batch ``b`` of ``n_batches``: consecutive runs of
    ``tree.groups`` with about equal particle counts (a group is never split, so
    a batch may be empty)."""
    n_groups = len(tree.groups)
    if n_groups == 0 or tree.n_particles == 0:  # an empty domain: no batch has work
        return 0, 0
    ends = np.cumsum(tree.count[tree.groups])
    targets = ends[-1] * np.arange(1, n_batches) / n_batches
    cuts = np.concatenate([[0], np.searchsorted(ends, targets, side="left") + 1, [n_groups]])
    cuts = np.maximum.accumulate(cuts.clip(0, n_groups))
    return int(cuts[b]), int(cuts[b + 1])


def _evaluate(tree: Octree, groups, rows, source: Octree, trace, opts):
    glo, ghi = tree.lo[groups], tree.hi[groups]
    lists = interaction_lists(glo, ghi, source, opts["theta"], box_size=opts["box_size"],
                              r_cut=opts["r_cut"], rs=opts["rs"])
    return evaluate_lists(tree.pos[rows[0]:rows[1]], tree.start[groups] - rows[0],
                          tree.count[groups], 0.5 * (glo + ghi),
                          lists, source, trace, G=opts["G"], softening=opts["softening"],
                          softening_kernel=opts["softening_kernel"],
                          precision=opts["precision"], quadrupole=True,
                          box_size=opts["box_size"], rs=opts["rs"], r_cut=opts["r_cut"])


def domain_forces(dt: DomainTree, lets: Sequence, batch: tuple[int, int],
                  opts: Mapping[str, Any]):
    """Batch ``batch = (b, n_batches)`` of a domain's groups (:func:`group_batch`) against
    the domain's tree and the LETs (:func:`domain_let` results; None entries skipped).

    Returns ``(index, acc (n, 3) float64, pot (n,) float64)`` of the batch's particles,
    in increasing (global) index; accelerations in length / time^2, potentials in
    length^2 / time^2.
    """
    tree = dt.tree
    g0, g1 = group_batch(tree, *batch)
    groups = tree.groups[g0:g1]
    if len(groups) == 0:
        return dt.index[:0], np.zeros((0, 3)), np.zeros(0)
    rows = (int(tree.start[groups[0]]), int(tree.start[groups[-1]] + tree.count[groups[-1]]))
    acc, pot = _evaluate(tree, groups, rows, tree, dt.trace, opts)
    for item in lets:
        if item is None:
            continue
        let, trace = item
        a, p = _evaluate(tree, groups, rows, let, trace, opts)
        acc += a
        pot += p
    index = dt.index[tree.order[rows[0]:rows[1]]]
    order = np.argsort(index, kind="stable")
    return index[order], acc[order], pot[order]
