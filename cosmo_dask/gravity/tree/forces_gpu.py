"""Tree gravity entirely on one GPU (CuPy): build, group walks, M2P + P2P.

Pipeline (all device work; the host only launches and reads a few scalars):

1. :func:`cosmo_dask.spatial.octree_gpu.build_octree_gpu` (Morton sort, nodes level by
   level, float64 multipoles bottom up, groups).
2. Tree walk, one thread per group (stack-based, Octgrav style), run twice: the first pass
   counts, a prefix sum gives every group its slice, the second pass writes the group's
   cell list (nodes accepted for M2P) and its P2P list as particle ranges (a leaf that
   follows the previous one in sorted order extends the last range, so sibling leaves
   become one range). A node is accepted when the distance ``d`` from its centre of mass
   to the group's bounding box satisfies ``d * theta > bmax`` (``bmax``: the node's largest
   particle distance from its centre of mass), and, with spline softening, ``d - bmax >
   2.8 eps`` (all pairs Newtonian). With the truncated kernel also ``bmax < theta *
   TRUNC_OPEN_SPLITS * rs`` (the kernel varies on the scale ``rs``); a node whose box (or
   bounding sphere) lies at least ``r_cut`` from the group box is dropped, and one is accepted
   only when its box (or bounding sphere) lies within ``r_cut`` of every point of the
   group box; nodes across the cut sphere are opened, so the cut is applied per particle
   pair (the rule of the CPU walk, :mod:`cosmo_dask.gravity.tree.walk`).
3. One thread block per group (``BLOCK`` threads; a group of ``c < BLOCK`` particles gives
   each i-particle ``BLOCK / c'`` threads, ``c'`` the next power of two, which split its
   sources and add up in shared memory; bigger groups loop): the cells are staged in
   shared memory ``BLOCK`` at a time for the M2P (monopole + traceless quadrupole), then
   the particles of the P2P ranges, packed ``BLOCK`` at a time across ranges (a range is
   typically a few leaves, ~50 particles). Positions are made
   relative to the group's box centre in float64, with the periodic minimum image, then
   cast to the arithmetic precision. Results are written straight to the input order.

M2P expansions: for a radial pair potential ``-G m g(r)`` the node's field to second order
is ``-G [M g + (A q + s2 C) / 6]`` with ``q = r.Q.r``, ``s2 = sum m |d|^2``,
``A = (g'' - g'/r) / r^2`` and ``C = A r^2 + 3 g'/r`` (the Laplacian of g). Newtonian:
``C = 0``; Plummer: ``g = u^1/2``, ``u = 1/(r^2+eps^2)``, ``A = 3 u^5/2``,
``C = -3 eps^2 u^5/2``; truncated (``g = erfc(r/2rs)/r``): ``C = exp(-x^2) / (2 sqrt(pi)
rs^3)``, and ``A``, ``A'`` from the force factor ``T`` and its radial derivatives. With
Plummer softening and the truncated kernel the M2P applies the softening as a factor
``(r^2/(r^2+eps^2))^{3/2}`` (force) / ``r/sqrt(r^2+eps^2)`` (potential) to the truncated
expansion, accurate to second order in ``bmax/d`` times ``(eps/d)^2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import cuda
from ...core.checks import PRECISIONS
from ...core.errors import ParameterError
from ..parameters import KERNELS, THETA_DEFAULT, TRUNC_OPEN_SPLITS, check_theta, default_r_cut
from ..truncated import fit_defines

#: threads per group block: the fastest of 32, 64 and 128 (benchmarks/RESULTS.md, Gravity,
#: part (c))
BLOCK = 128


def _module(dtype, spline: bool, trunc: bool, block: int):
    """``tree.cu`` for one arithmetic dtype, softening kernel, truncation and block size
    (the float fit's coefficients among its defines), on the current device."""
    defines = {"REAL_IS_DOUBLE": int(np.dtype(dtype) == np.float64),
               "SPLINE": int(bool(spline)), "TRUNC": int(bool(trunc)), "BLOCK": block,
               **fit_defines()}
    return cuda.module("tree", defines)


def _check_params(theta, softening, softening_kernel, precision, G, box_size, rs, r_cut):  # noqa: N803
    theta = check_theta(theta)
    softening = float(softening)
    if not (softening >= 0.0 and math.isfinite(softening)):
        raise ParameterError(f"softening must be a finite number >= 0, got {softening!r}")
    if softening_kernel not in KERNELS:
        raise ParameterError(f"softening_kernel must be 'plummer' or 'spline', "
                             f"got {softening_kernel!r}")
    if precision not in PRECISIONS:
        raise ParameterError(f"precision must be 'float32' or 'float64', got {precision!r}")
    G = float(G)  # noqa: N806
    if not (G > 0 and math.isfinite(G)):
        raise ParameterError(f"G must be a positive number, got {G!r}")
    if rs is None and r_cut is not None:
        raise ParameterError("r_cut needs rs (the truncated short-range kernel)")
    if rs is not None:
        rs = float(rs)
        if not (rs > 0 and math.isfinite(rs)):
            raise ParameterError(f"rs must be a positive number, got {rs!r}")
        r_cut = default_r_cut(rs) if r_cut is None else float(r_cut)
        if not (r_cut > 0 and math.isfinite(r_cut)):
            raise ParameterError(f"r_cut must be a positive number, got {r_cut!r}")
    if box_size is not None:
        box_size = float(box_size)
        if not (box_size > 0 and math.isfinite(box_size)):
            raise ParameterError(f"box_size must be a positive number, got {box_size!r}")
        # without rs: Newtonian forces of the nearest image of every particle and node
        # (as the CPU tree and the direct sum; no Ewald sum)
        if r_cut is not None and r_cut >= 0.5 * box_size:
            raise ParameterError(f"r_cut ({r_cut}) must be smaller than half the box "
                                 f"({0.5 * box_size})")
    return theta, softening, G, box_size, rs, r_cut


class _Timer:
    """CUDA-event phase timer (seconds per named phase)."""

    def __init__(self):
        import cupy as cp

        self.cp = cp
        self.marks = []

    def mark(self, name: str):
        ev = self.cp.cuda.Event()
        ev.record()
        self.marks.append((name, ev))

    def phases(self) -> dict:
        self.marks[-1][1].synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks[:-1], self.marks[1:], strict=True):
            out[name] = out.get(name, 0.0) + self.cp.cuda.get_elapsed_time(a, b) / 1e3
        return out


@dataclass
class KernelSettings:
    """The checked parameters of a GPU tree evaluation and its compiled module."""

    mod: Any
    dtype: np.dtype
    theta: float
    h_guard: float
    bcap: float
    trunc: bool
    r_cut: float
    box: float
    G: float
    softening: float
    rs: float
    quadrupole: bool
    block: int


def kernel_settings(*, G, theta, softening, softening_kernel, precision, box_size, rs,  # noqa: N803
                    r_cut, quadrupole: bool = True, block: int = BLOCK) -> KernelSettings:
    """Check the parameters once and compile (or fetch) the module they need."""
    theta, softening, G, box_size, rs, r_cut = _check_params(  # noqa: N806
        theta, softening, softening_kernel, precision, G, box_size, rs, r_cut)
    trunc = rs is not None
    spline = softening_kernel == "spline" and softening > 0
    dtype = np.dtype(precision)
    return KernelSettings(
        mod=_module(dtype, spline, trunc, block), dtype=dtype, theta=theta,
        h_guard=2.8 * softening if (spline or trunc) else 0.0,
        bcap=theta * TRUNC_OPEN_SPLITS * rs if trunc else math.inf, trunc=trunc,
        r_cut=0.0 if r_cut is None else r_cut, box=0.0 if box_size is None else box_size,
        G=G, softening=softening, rs=rs or 0.0, quadrupole=bool(quadrupole), block=block)


def walk_forces(nodes, s2, groups, pos64, pmass, order, n_out: int, st: KernelSettings, *,
                potential: bool, timer=None, stats=None, max_entries: int = 1 << 30):
    """Walk ``nodes`` (an :class:`~cosmo_dask.spatial.octree_layout.Octree` or a node set
    with the same attributes) for every group node ``groups`` and evaluate the M2P and P2P.

    ``pos64`` and ``pmass`` are the particles the node ranges index (float64, sorted
    order), ``order`` maps a sorted row to its output row (``< n_out``); a group's
    particles are the i-particles. Returns ``(acc (n_out, 3), pot (n_out,) or None)`` of
    dtype ``st.dtype``: rows of particles in no group are left uninitialised.
    """
    import cupy as cp

    n_groups = int(groups.shape[0])
    walk = st.mod.get_function("tree_walk")
    force = st.mod.get_function("group_forces")
    i32 = np.int32
    acc = cp.empty((n_out, 3), dtype=st.dtype)
    pot = cp.empty(n_out if potential else 1, dtype=st.dtype)
    if n_groups == 0:
        return acc, (pot if potential else None)
    ncell = cp.empty(n_groups, dtype=cp.int32)
    nrange = cp.empty(n_groups, dtype=cp.int32)
    dummy64 = cp.zeros(1, dtype=cp.int64)
    dummy32 = cp.zeros(1, dtype=cp.int32)
    wt = 128
    node_args = (nodes.lo, nodes.hi, nodes.com, nodes.bmax, nodes.first_child,
                 nodes.n_child, nodes.start, nodes.count, np.float64(st.theta),
                 np.float64(st.h_guard), np.float64(st.bcap), i32(st.trunc),
                 np.float64(st.r_cut), np.float64(st.box))
    walk(((n_groups + wt - 1) // wt,), (wt,),
         (i32(n_groups), i32(0), groups) + node_args
         + (i32(0), ncell, nrange, dummy64, dummy64, dummy32, dummy32, dummy32))
    cum_c = cp.cumsum(ncell, dtype=cp.int64)
    cum_r = cp.cumsum(nrange, dtype=cp.int64)
    tot_c, tot_r = (int(v) for v in cp.asnumpy(cp.stack([cum_c[-1], cum_r[-1]])))
    if timer:
        timer.mark("walk_count")
    # batches of groups whose lists fit in max_entries entries
    if tot_c + tot_r <= max_entries:
        cuts = [0, n_groups]
    else:
        both = cp.asnumpy(cum_c + cum_r)
        cuts = [0]
        while cuts[-1] < n_groups:
            base = both[cuts[-1] - 1] if cuts[-1] > 0 else 0
            nxt = int(np.searchsorted(both, base + max_entries, side="right"))
            cuts.append(min(n_groups, max(nxt, cuts[-1] + 1)))
    for g0, g1 in zip(cuts[:-1], cuts[1:], strict=True):
        nb = g1 - g0
        c0 = int(cum_c[g0 - 1]) if g0 > 0 else 0
        r0 = int(cum_r[g0 - 1]) if g0 > 0 else 0
        c_off = cum_c[g0:g1] - ncell[g0:g1] - c0
        r_off = cum_r[g0:g1] - nrange[g0:g1] - r0
        c_tot = int(cum_c[g1 - 1]) - c0 if len(cuts) > 2 else tot_c
        r_tot = int(cum_r[g1 - 1]) - r0 if len(cuts) > 2 else tot_r
        cells = cp.empty(max(c_tot, 1), dtype=cp.int32)
        rstart = cp.empty(max(r_tot, 1), dtype=cp.int32)
        rcount = cp.empty(max(r_tot, 1), dtype=cp.int32)
        nc_b, nr_b = ncell[g0:g1], nrange[g0:g1]
        walk(((nb + wt - 1) // wt,), (wt,),
             (i32(g1), i32(g0), groups) + node_args
             + (i32(1), nc_b, nr_b, c_off, r_off, cells, rstart, rcount))
        if timer:
            timer.mark("walk_write")
        force((nb,), (st.block,),
              (i32(g1), i32(g0), groups, nodes.lo, nodes.hi, nodes.start, nodes.count, pos64,
               pmass, order, c_off, nc_b, cells, nodes.com, nodes.mass, nodes.quad, s2,
               i32(st.quadrupole), r_off, nr_b, rstart, rcount, np.float64(st.G),
               np.float64(st.softening), np.float64(st.rs), np.float64(st.r_cut),
               np.float64(st.box), i32(bool(potential)), acc, pot))
        if timer:
            timer.mark("forces")
        if stats is not None:
            gcnt = nodes.count[groups[g0:g1]]
            jcum = cp.concatenate([cp.zeros(1, cp.int64), cp.cumsum(rcount, dtype=cp.int64)])
            jper = jcum[r_off + nr_b] - jcum[r_off]
            stats["m2p"] = stats.get("m2p", 0) + int((gcnt * nc_b).sum())
            stats["p2p"] = stats.get("p2p", 0) + int((gcnt * jper).sum())
    if stats is not None:
        stats.update(n_groups=n_groups, n_nodes=int(nodes.lo.shape[0]), cells=tot_c,
                     ranges=tot_r, batches=len(cuts) - 1)
    return acc, (pot if potential else None)


def _forces(pos, mass, *, G, theta, softening, softening_kernel, precision, potential,  # noqa: N803
            max_leaf, max_group, quadrupole, box_size, rs, r_cut, timer=None, stats=None,
            max_entries: int = 1 << 30, block: int = BLOCK):
    from ...spatial.octree_gpu import build_with_moments

    st = kernel_settings(G=G, theta=theta, softening=softening,
                         softening_kernel=softening_kernel, precision=precision,
                         box_size=box_size, rs=rs, r_cut=r_cut, quadrupole=quadrupole,
                         block=block)
    if timer:
        timer.mark("start")
    tree, s2, pos64 = build_with_moments(pos, mass, max_leaf=max_leaf, max_group=max_group,
                                         box_size=box_size, timer=timer)
    if timer:
        timer.mark("build_groups")
    return walk_forces(tree, s2, tree.groups, pos64, tree.pmass, tree.order, tree.n_particles,
                       st, potential=potential, timer=timer, stats=stats,
                       max_entries=max_entries)


def tree_forces_gpu(pos, mass, *, G: float = 1.0, theta: float = THETA_DEFAULT,  # noqa: N803
                    softening: float = 0.0, softening_kernel: str = "plummer",
                    precision: str = "float64", potential: bool = True, max_leaf: int = 64,
                    max_group: int = 64, quadrupole: bool = True,
                    box_size: float | None = None, rs: float | None = None,
                    r_cut: float | None = None):
    """Tree accelerations and potentials of particles on one GPU (CuPy in, CuPy out).

    Parameters
    ----------
    pos : (N, 3) cupy.ndarray
        Positions (length units), float32 or float64.
    mass : (N,) cupy.ndarray or float
        Particle masses (mass units) or one mass for every particle.
    G : float
        Gravitational constant (length^3 / (mass time^2)).
    theta : float
        Opening angle, ``0 < theta < 1.5``: a node is used as a multipole when
        ``bmax < theta * d`` (``d``: distance from its centre of mass to the group's box).
    softening : float
        Plummer-equivalent softening length ``eps`` (length units), >= 0.
    softening_kernel : {"plummer", "spline"}
        Plummer, or the Gadget-2 cubic spline with support ``2.8 eps``.
    precision : {"float32", "float64"}
        Arithmetic precision of the kernels (positions are made relative to the group's
        centre in float64 first) and dtype of the outputs.
    potential : bool
        Also return the specific potential.
    max_leaf, max_group : int
        Leaf and group sizes of the octree (particles).
    quadrupole : bool
        Include the quadrupole in the M2P (monopole only when False).
    box_size : float, optional
        Periodic box side (length units): minimum-image separations, particles must lie in
        ``[0, box_size)^3``. Needs ``rs`` (periodic forces are the TreePM short range only).
    rs : float, optional
        Split scale of the truncated short-range kernel (length units): pair forces are
        multiplied by ``T(x) = erfc(x) + 2x/sqrt(pi) exp(-x^2)``, potentials by ``erfc(x)``,
        ``x = r/(2 rs)``: exactly in float64, in float32 from one ``exp2f`` and a
        polynomial (``cd_trunc_fit`` of :mod:`cosmo_dask.gravity.truncated`, relative
        error <= 1.1e-6 on ``x <= 3``, the float32 floor there).
    r_cut : float, optional
        Cutoff radius of the truncated kernel (default ``4.5 rs``); pairs with
        ``r >= r_cut`` contribute nothing.

    Returns
    -------
    acc : (N, 3) cupy.ndarray
        Accelerations in the input order, dtype ``precision``.
    pot : (N,) cupy.ndarray or None
        Specific potentials (self-pairs excluded), or None when ``potential`` is False.

    Raises
    ------
    ParameterError
        Bad parameters or inputs (see :mod:`cosmo_dask.gravity` conventions).
    NotImplementedError
        ``box_size`` without ``rs`` (periodic Newtonian forces need Ewald sums).
    """
    return _forces(pos, mass, G=G, theta=theta, softening=softening,
                   softening_kernel=softening_kernel, precision=precision, potential=potential,
                   max_leaf=max_leaf, max_group=max_group, quadrupole=quadrupole,
                   box_size=box_size, rs=rs, r_cut=r_cut)


__all__ = ["KernelSettings", "kernel_settings", "tree_forces_gpu", "walk_forces"]
