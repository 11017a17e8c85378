"""Barnes-Hut tree forces on the CPU (numba): build, group walks, list evaluation.

One octree over all particles (:func:`cosmo_dask.spatial.octree.build_octree`);
one walk per group of ``<= max_group`` particles against it
(:func:`cosmo_dask.gravity.tree_walk.interaction_lists` semantics), fused with the
evaluation of its lists in :func:`cosmo_dask.gravity.tree_kernels.evaluate_lists`
(M2P monopole + quadrupole, P2P over leaves): the lists never reach memory.
In-memory NumPy arrays; the Dask graph version (per-domain tasks, LETs) is
:mod:`cosmo_dask.gravity.tree_graph`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import host
from ..checks import check_positive
from ..errors import ParameterError
from ..spatial.octree import build_octree, node_second_moment
from .parameters import (
    MAX_GROUP_DEFAULT,
    MAX_LEAF_DEFAULT,
    THETA_DEFAULT,
    check_theta,
    default_r_cut,
)
from .tree_kernels import KERNEL_CODES, evaluate_lists

__all__ = ["tree_forces"]


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
    if precision not in ("float32", "float64"):
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
