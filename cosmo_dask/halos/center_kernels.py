"""Halo-centre kernels on the CPU (numba, numpy, scipy).

The halos' members are grouped in contiguous *segments* of a particle array
(particles sorted by halo): segment ``s`` is rows ``starts[s]:starts[s+1]``.
The kernels here follow the centre finders of HACC's PISTON analysis
(Sewell et al. 2015, "Utilizing many-core accelerators for halo and center
finding within a cosmology simulation"):

* :func:`segment_potentials` -- the exact pairwise potential of every particle
  due to the other members of its segment, ``O(sum n_s**2)`` work, in parallel
  over particles (so one giant halo still uses every core).
* :func:`member_potentials` -- the same exact potential for chosen members of
  one halo only, ``O(r n)`` work for ``r`` rows.
* :func:`segment_mbp` -- each segment's most bound particle, the same answer as
  the exact potentials' argmin, but only the members that an octree's rigorous
  potential bounds (per group of members, then per member) cannot rule out get
  their exact potential: about ``O(n log n)`` per segment instead of ``O(n**2)``.
* :func:`segmented_argmin` -- the row of the smallest value in each segment;
  with the potentials it gives each halo's most bound particle (MBP).
* :func:`mcp_rows` -- the row with the most friends in each segment, the most
  connected particle (MCP).
* :func:`segment_max` -- the largest of each segment's non-negative values (the
  catalog's ``r_max``).
* :func:`grid_mbp` -- the MBP of one halo found with the grid-Poisson method:
  cloud-in-cell mass on a cubic grid over the halo, the potential solved with
  a zero (Dirichlet) boundary by discrete sine transforms, then exact
  potentials only for the members within a few cells of the grid minimum.
  Work ``O(n_grid**3 log n_grid + r n)`` for ``r`` candidates instead of
  ``O(n**2)``.

Units: positions, ``box_size`` and ``softening`` are in one length unit,
masses in one mass unit and ``G`` in length**3 / (mass time**2); potentials
are then in length**2 / time**2 (with the default ``G = 1``: mass / length).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import scipy.fft
import scipy.ndimage

from ..core.errors import ParameterError

__all__ = [
    "grid_mbp",
    "grid_potential",
    "mcp_rows",
    "member_potentials",
    "poisson_dirichlet",
    "segment_max",
    "segment_mbp",
    "segment_potentials",
    "segmented_argmin",
]

# Reassociation lets LLVM vectorise the inner sums; no approximate reciprocals
# or square roots are allowed (no 'arcp' / 'afn').
_FASTMATH = {"nsz", "reassoc", "contract"}
# Work chunks per thread in the pair kernels (chunks of equal pair count).
_CHUNKS_PER_THREAD = 8
# Empty cells between the members' extent and the zero-potential boundary of
# the grid in grid_potential / grid_mbp, on every side.
_PAD_CELLS = 4
# segment_mbp and grid_mbp: halos at least this large are pruned with tree bounds (in
# segment_mbp all of them in one forest), octrees with leaves of at most _TREE_LEAF
# members, walked once per group of at most _TREE_GROUP members with the opening angles
# _GROUP_THETAS, then once per member with _TREE_THETAS, in turn (each round bounds the
# rows the last one left);
# _BOUND_MARGIN (relative) covers rounding in the bounds and the exact sums.
_TREE_MIN = 2000
_TREE_LEAF = 16
_TREE_GROUP = 32
_GROUP_THETAS = (0.7, 0.5, 0.35)
_TREE_THETAS = (0.3, 0.2)
_BOUND_MARGIN = 1e-8
# Sums taken with float32 reciprocal square roots (_sum_open_f32) are within this
# relative error (a factor 3 above the worst case) when every squared separation lies
# in [_F32_TINY, _F32_HUGE] (float32 normal numbers, far from both ends).
_APPROX_ERR = 2.0**-21
_F32_TINY = 2.0**-100
_F32_HUGE = 2.0**100
# ... and the exact potentials of this many members with the best lower bounds seed
# the pruning threshold.
_SEEDS = 4
# Before round r >= 1 of those (_GROUP_THETAS then _TREE_THETAS), a halo with fewer
# members than _DIRECT_BELOW[r - 1] (none where the tuple has no entry) leaves the rounds:
# its rows left get float32 direct sums (as the small halos' prefilter), which cost
# n * 0.72 ns a row against some 6, 21, 63 and 140 us a row for the rest of the rounds
# from the second, third, fourth and fifth on (the blobs catalog, one thread).
_DIRECT_BELOW = (9000, 30000, 90000, 200000)
# grid_mbp prunes its candidates only when it has more than this many (below, their
# exact potentials cost less than the octree)
_GRID_PRUNE = 512
# grid_mbp evaluates the members near this many of the deepest local minima of
# the grid potential (1 = the global minimum only, as in Sewell et al. 2015).
_N_WELLS = 4


# --------------------------------------------------------------------------- #
# pairwise potentials
# --------------------------------------------------------------------------- #


@numba.njit(fastmath=_FASTMATH, inline="always", cache=True)
def _sum_open(x, y, z, m, xi, yi, zi, j0, j1, eps2):
    """``sum_j m_j / sqrt(r_ij**2 + eps2)`` over ``j0 <= j < j1``; zero distances add 0."""
    acc = 0.0
    for j in range(j0, j1):
        dx = x[j] - xi
        dy = y[j] - yi
        dz = z[j] - zi
        s = dx * dx + dy * dy + dz * dz + eps2
        if s > 0.0:
            acc += m[j] / math.sqrt(s)
    return acc


@numba.njit(fastmath=_FASTMATH, inline="always", cache=True)
def _sum_periodic(x, y, z, m, xi, yi, zi, j0, j1, eps2, L, inv_L):
    """As :func:`_sum_open` with minimum-image separations in a box of side ``L``."""
    acc = 0.0
    for j in range(j0, j1):
        dx = x[j] - xi
        dy = y[j] - yi
        dz = z[j] - zi
        dx -= L * np.rint(dx * inv_L)
        dy -= L * np.rint(dy * inv_L)
        dz -= L * np.rint(dz * inv_L)
        s = dx * dx + dy * dy + dz * dz + eps2
        if s > 0.0:
            acc += m[j] / math.sqrt(s)
    return acc


@numba.njit(fastmath=_FASTMATH, error_model="numpy", inline="always", cache=True)
def _sum_open_f32(x, y, z, m, xi, yi, zi, j0, j1, eps2):
    """``(acc, tiny)``: :func:`_sum_open` over ``j0 <= j < j1`` with ``1 / sqrt`` taken in
    float32 (separations and the sum in float64; one loop over the whole range, so a
    point ``j`` at ``(xi, yi, zi)`` itself adds :func:`_self_f32` when ``eps2 > 0``),
    and the count of squared separations in ``(0, _F32_TINY)`` (then ``acc`` is not to
    be used; with ``eps2 >= _F32_TINY`` there is none, and the loop tests no term).
    Without such, and with every squared separation below ``_F32_HUGE``,
    ``|acc - exact| <= _APPROX_ERR * acc / 2``: the float32 rounding of ``s``, its
    square root and the reciprocal add at most ``2.5 * 2**-24`` relative to each term,
    the float64 sum ``n * 2**-53``."""
    xs = x[j0:j1]  # a loop from 0 vectorises well (no index wraparound to check)
    ys = y[j0:j1]
    zs = z[j0:j1]
    ms = m[j0:j1]
    acc = 0.0
    tiny = 0
    if eps2 >= _F32_TINY:  # every s >= eps2: none tiny or zero, no test per term
        for j in range(xs.shape[0]):
            dx = xs[j] - xi
            dy = ys[j] - yi
            dz = zs[j] - zi
            s = dx * dx + dy * dy + dz * dz + eps2
            acc += ms[j] * np.float64(np.float32(1.0) / np.sqrt(np.float32(s)))
        return acc, tiny
    for j in range(xs.shape[0]):
        dx = xs[j] - xi
        dy = ys[j] - yi
        dz = zs[j] - zi
        s = dx * dx + dy * dy + dz * dz + eps2
        r = np.float32(1.0) / np.sqrt(np.float32(s))
        acc += ms[j] * np.float64(r) if s > 0.0 else 0.0
        tiny += 1 if (s < _F32_TINY) & (s > 0.0) else 0
    return acc, tiny


@numba.njit(fastmath=_FASTMATH, error_model="numpy", inline="always", cache=True)
def _self_f32(m, eps2):
    """The term of a point itself in :func:`_sum_open_f32`, ``m / eps`` in float32."""
    if eps2 > 0.0:
        return m * np.float64(np.float32(1.0) / np.sqrt(np.float32(eps2)))
    return 0.0


@numba.njit(nogil=True, parallel=True, fastmath=_FASTMATH, error_model="numpy", cache=True)
def _pot_rows(x, y, z, m, rows, lo, hi, wrap, chunk_bounds, eps2, L, G, approx, out):
    """Potentials of the particles ``rows[k]`` due to rows ``lo[k]:hi[k]`` (self excluded).

    ``chunk_bounds`` splits ``range(len(rows))`` into chunks of about equal
    pair count; the chunks are spread over the threads. Separations use the
    minimum image in a box of side ``L`` where ``wrap[k]`` is true. Results
    go to ``out[k]``; with ``approx``, rows without wrapping get ``-G`` times their
    sum *including the row itself* (:func:`_self_f32`) by :func:`_sum_open_f32`
    (float32 reciprocal square roots, error at most ``_APPROX_ERR / 2`` relative to
    that sum when no squared separation exceeds ``_F32_HUGE``; summed exactly, plus the
    self term, where one is below ``_F32_TINY``).
    """
    inv_L = 1.0 / L if L > 0.0 else 0.0
    nchunk = chunk_bounds.shape[0] - 1
    for c in numba.prange(nchunk):
        for k in range(chunk_bounds[c], chunk_bounds[c + 1]):
            i = rows[k]
            xi = x[i]
            yi = y[i]
            zi = z[i]
            if wrap[k]:
                acc = _sum_periodic(x, y, z, m, xi, yi, zi, lo[k], i, eps2, L, inv_L)
                acc += _sum_periodic(x, y, z, m, xi, yi, zi, i + 1, hi[k], eps2, L, inv_L)
            else:  # the exact sum inlined once, also where float32 cannot serve
                acc = 0.0
                tiny = 1
                if approx:
                    acc, tiny = _sum_open_f32(x, y, z, m, xi, yi, zi, lo[k], hi[k], eps2)
                if tiny > 0:
                    acc = _sum_open(x, y, z, m, xi, yi, zi, lo[k], i, eps2)
                    acc += _sum_open(x, y, z, m, xi, yi, zi, i + 1, hi[k], eps2)
                    if approx:  # as the float32 sum, which holds the self term
                        acc += _self_f32(m[i], eps2)
            out[k] = -G * acc


def _potentials(pos, mass, starts, rows, L, eps, G, approx=False, unwrapped=None):
    """Exact potentials of ``pos[rows]`` due to the other members of their segments
    (with ``approx``, within a relative ``_APPROX_ERR`` where no wrapping is needed:
    see :func:`_pot_rows`).

    Periodic segments are first moved, in coordinates relative to their first
    member, to the minimum image of that member (or ``unwrapped``, what
    :func:`_unwrapped` gave for them, is used); a segment whose extent is
    then below ``L / 2`` on every axis needs no further wrapping (every pair
    separation is already its minimum image), the others wrap every pair.
    Rows outside every segment get 0.
    """
    h = starts.shape[0] - 1
    out = np.zeros(rows.shape[0], dtype=np.float64)
    if h == 0 or rows.shape[0] == 0:
        return out
    pos, wrap_seg = _unwrapped(pos, starts, L) if unwrapped is None else unwrapped
    rseg = np.searchsorted(starts, rows, side="right") - 1  # the non-empty one
    inside = (rseg >= 0) & (rseg < h)
    rseg = np.where(inside, rseg, 0)
    lo = np.where(inside, starts[rseg], rows)
    hi = np.where(inside, starts[rseg + 1], rows + 1)
    wrap = inside & wrap_seg[rseg]
    bounds = _work_chunks((hi - lo).astype(np.float64))
    x, y, z = _soa(pos)
    _pot_rows(x, y, z, mass, rows, lo, hi, wrap, bounds, eps * eps, L, G, approx, out)
    return out


def _unwrapped(pos, starts, L):
    """``(rel, wrap)``: with a period ``L > 0``, every segment moved, in coordinates
    relative to its first member, to the minimum image of that member, and whether the
    segment still spans half the box or more on some axis (then every pair must take
    the minimum image); without a period, ``pos`` and no wrapping."""
    h = starts.shape[0] - 1
    wrap_seg = np.zeros(h, dtype=np.bool_)
    n = pos.shape[0]
    if not (L > 0.0 and n > 0 and h > 0):
        return pos, wrap_seg
    counts = np.diff(starts)
    rel = pos.copy()  # rows outside every segment: relative to themselves
    rel[starts[0]:starts[-1]] -= np.repeat(pos[starts[:-1]], counts, axis=0)
    rel[:starts[0]] = 0.0
    rel[starts[-1]:] = 0.0
    rel -= L * np.rint(rel / L)
    full = np.flatnonzero(counts > 0)
    if full.size:
        first = starts[full]
        ext = np.maximum.reduceat(rel[starts[0]:starts[-1]], first - starts[0], axis=0)
        ext -= np.minimum.reduceat(rel[starts[0]:starts[-1]], first - starts[0], axis=0)
        wrap_seg[full] = np.any(ext >= 0.5 * L, axis=1)
    return rel, wrap_seg


def _work_chunks(work: np.ndarray) -> np.ndarray:
    """Bounds of contiguous chunks of ``work`` (per-item costs) with about equal sums."""
    n = work.shape[0]
    nchunk = max(1, min(n, _CHUNKS_PER_THREAD * numba.get_num_threads()))
    cum = np.cumsum(work, dtype=np.float64)
    total = cum[-1] if n else 0.0
    targets = total * np.arange(1, nchunk, dtype=np.float64) / nchunk
    inner = np.searchsorted(cum, targets, side="left") + 1
    bounds = np.concatenate(([0], inner, [n])).astype(np.int64)
    return np.maximum.accumulate(np.minimum(bounds, n))


def _check_pos_mass(pos, mass):
    pos = np.ascontiguousarray(pos, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ParameterError(f"pos must have shape (n, 3), got {pos.shape}")
    n = pos.shape[0]
    mass = np.asarray(mass, dtype=np.float64)
    if mass.ndim == 0:
        mass = np.full(n, float(mass))
    if mass.shape != (n,):
        raise ParameterError(f"mass must have shape ({n},) like pos, got {mass.shape}")
    if not (np.isfinite(pos).all() and np.isfinite(mass).all()):
        raise ParameterError("pos and mass must be finite")
    return pos, np.ascontiguousarray(mass)


def check_common(box_size, softening, G):
    """Check box_size, softening and G (shared with the GPU kernels); returns (L, eps, G)."""
    if box_size is None:
        L = 0.0
    else:
        L = float(box_size)
        if not (np.isfinite(L) and L > 0.0):
            raise ParameterError(f"box_size must be None or a finite number > 0, got {box_size}")
    eps = float(softening)
    if not (np.isfinite(eps) and eps >= 0.0):
        raise ParameterError(f"softening must be finite and >= 0, got {softening}")
    G = float(G)
    if not np.isfinite(G):
        raise ParameterError(f"G must be finite, got {G}")
    return L, eps, G


def check_starts(starts, n: int) -> np.ndarray:
    """Check segment bounds (shared with the GPU kernels); returns them as int64."""
    starts = np.asarray(starts)
    if starts.ndim != 1 or starts.shape[0] < 1 or not np.issubdtype(starts.dtype, np.integer):
        raise ParameterError("starts must be a 1-d integer array of h + 1 segment bounds")
    starts = starts.astype(np.int64)
    if starts[0] < 0 or starts[-1] > n or np.any(np.diff(starts) < 0):
        raise ParameterError(
            f"starts must be non-decreasing within [0, {n}], got {starts[0]} .. {starts[-1]}"
        )
    return starts


def _soa(pos: np.ndarray):
    return (np.ascontiguousarray(pos[:, 0]), np.ascontiguousarray(pos[:, 1]),
            np.ascontiguousarray(pos[:, 2]))


def segment_potentials(pos, mass, starts, *, box_size=None, softening=0.0, G=1.0) -> np.ndarray:
    """Exact gravitational potential of every particle due to its own segment.

    ``phi_i = -G * sum_{j in seg(i), j != i} m_j / sqrt(|r_i - r_j|**2 + eps**2)``
    with Plummer softening ``eps = softening``. With ``softening = 0`` a pair
    of distinct particles at the same position contributes 0 (instead of
    ``-inf``); give ``softening > 0`` when duplicates are physical.

    Parameters
    ----------
    pos : numpy.ndarray
        float64 positions, shape ``(n, 3)``, in length units.
    mass : numpy.ndarray or float
        float64 masses, shape ``(n,)`` (a scalar is used for every particle),
        in mass units.
    starts : numpy.ndarray
        int64 segment bounds, shape ``(h + 1,)``, non-decreasing within
        ``[0, n]``: segment ``s`` is rows ``starts[s]:starts[s+1]``. Rows
        outside every segment get potential 0.
    box_size : float, optional
        Side of the periodic box (length units); separations then use the
        minimum image. Segments are first unwrapped around their first
        member; one still spanning half the box or more wraps every pair.
    softening : float, optional
        Plummer softening length ``eps >= 0`` (length units).
    G : float, optional
        Gravitational constant (length**3 / (mass time**2)).

    Returns
    -------
    numpy.ndarray
        float64 potentials, shape ``(n,)``, in G mass / length
        (length**2 / time**2); 0 for a segment of one particle.

    Raises
    ------
    ParameterError
        On wrong shapes, non-finite values, unsorted or out-of-range
        ``starts``, ``box_size <= 0`` or ``softening < 0``.

    Notes
    -----
    Work is ``sum_s n_s**2`` pair evaluations, spread over the numba threads in
    chunks of equal pair count (so a single halo uses every core); timings for
    1e4 and 1e5 members: benchmarks/RESULTS.md, most-bound particles. Periodic
    boxes cost the same (segments are unwrapped first).
    """
    pos, mass = _check_pos_mass(pos, mass)
    L, eps, G = check_common(box_size, softening, G)
    n = pos.shape[0]
    starts = check_starts(starts, n)
    return _potentials(pos, mass, starts, np.arange(n, dtype=np.int64), L, eps, G)


def member_potentials(pos, mass, rows, *, box_size=None, softening=0.0,
                      G=1.0) -> np.ndarray:
    """Exact potential of chosen members of one halo due to all its other members.

    The potential of :func:`segment_potentials` (one segment holding every row of
    ``pos``), evaluated only at ``rows``: ``O(len(rows) * n)`` work instead of
    ``O(n**2)``, with the same arithmetic, so the values are identical.

    Parameters
    ----------
    pos : numpy.ndarray
        float64 positions of all the halo's members, shape ``(n, 3)`` (length units).
    mass : numpy.ndarray or float
        Masses, shape ``(n,)`` or a scalar (mass units).
    rows : array_like
        Integer rows of ``pos`` to evaluate, shape ``(r,)``, each in ``[0, n)``.
    box_size : float, optional
        Periodic box side (length units); separations use the minimum image.
    softening : float, optional
        Plummer softening length ``eps >= 0`` (length units).
    G : float, optional
        Gravitational constant (length**3 / (mass time**2)).

    Returns
    -------
    numpy.ndarray
        float64 potentials of ``pos[rows]``, shape ``(r,)`` (length**2 / time**2).

    Raises
    ------
    ParameterError
        On wrong shapes, non-finite values, rows out of range, ``box_size <= 0``
        or ``softening < 0``.
    """
    pos, mass = _check_pos_mass(pos, mass)
    L, eps, G = check_common(box_size, softening, G)
    n = pos.shape[0]
    rows = np.asarray(rows)
    if rows.ndim != 1 or not (rows.size == 0 or np.issubdtype(rows.dtype, np.integer)):
        raise ParameterError("rows must be a 1-d integer array")
    rows = rows.astype(np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise ParameterError(f"rows must lie in [0, {n}), got {rows.min()} .. {rows.max()}")
    return _potentials(pos, mass, np.array([0, n], dtype=np.int64), rows, L, eps, G)


# --------------------------------------------------------------------------- #
# exact most bound particle with tree bounds
# --------------------------------------------------------------------------- #


@numba.njit(fastmath=_FASTMATH, inline="always", cache=True)
def _node_bound(node, x0, x1, x2, d0, d1, d2, dd, com, bmax, lo, hi, nmass, quad, second,
                eps2):
    """``(upper, lower)`` bounds on ``sum_q m_q / sqrt(|x - x_q|**2 + eps2)`` over the
    members ``q`` of ``node``, for a point ``x = (x0, x1, x2)`` at ``d = x - com``
    (``dd = |d|**2``) farther than ``bmax`` from the centre of mass (see
    :func:`_bound_sums`)."""
    r = bmax[node]
    m = nmass[node]
    s2 = dd + eps2
    sd = math.sqrt(s2)
    inv = 1.0 / sd
    inv2 = inv * inv
    uqu = (quad[node, 0] * d0 * d0 + quad[node, 3] * d1 * d1
           + quad[node, 5] * d2 * d2
           + 2.0 * (quad[node, 1] * d0 * d1 + quad[node, 2] * d0 * d2
                    + quad[node, 4] * d1 * d2))
    sec = second[node]
    est = m * inv + 0.5 * (uqu - sec * eps2) * inv2 * inv2 * inv
    rem = r * sec * inv2 * inv / (sd - r)
    e0 = max(lo[node, 0] - x0, x0 - hi[node, 0], 0.0)
    e1 = max(lo[node, 1] - x1, x1 - hi[node, 1], 0.0)
    e2 = max(lo[node, 2] - x2, x2 - hi[node, 2], 0.0)
    f0 = max(abs(x0 - lo[node, 0]), abs(x0 - hi[node, 0]))
    f1 = max(abs(x1 - lo[node, 1]), abs(x1 - hi[node, 1]))
    f2 = max(abs(x2 - lo[node, 2]), abs(x2 - hi[node, 2]))
    return (min(est + rem, m / math.sqrt(e0 * e0 + e1 * e1 + e2 * e2 + eps2)),
            max(est - rem, m / math.sqrt(f0 * f0 + f1 * f1 + f2 * f2 + eps2)))


@numba.njit(nogil=True, parallel=True, fastmath=_FASTMATH, cache=True)
def _bound_sums(pos, pmass, start, count, first_child, n_child, com, bmax, lo, hi, nmass,
                quad, second, eps2, theta, targets, roots, chunk, up, low):
    """Bounds ``low[k] <= sum_{q != p} m_q / sqrt(|x_p - x_q|**2 + eps2) <= up[k]`` for
    the particles ``p = targets[k]`` of an octree or forest (sorted order), one walk each
    of the tree below node ``roots[k]`` (the root of the target's halo).

    A node is accepted when its centre of mass is farther than ``bmax / theta`` from
    ``x_p``; its members' sum is then its quadrupole expansion within a rigorous
    remainder. With ``u = x_p - com``, ``s = sqrt(|u|**2 + eps2)``, ``r_q = x_q - com``:
    ``1 / |(u, eps) - (r_q, 0)|`` (a distance in four dimensions) is the Legendre
    series ``sum_l r_q**l / s**(l+1) P_l(cos)``; the dipole sums to zero about the
    centre of mass, the quadrupole is ``(u.Q.u - S eps2) / (2 s**5)`` (``Q`` the
    traceless quadrupole, ``S = sum m r**2``), and since ``|P_l| <= 1`` the rest is at
    most ``bmax S / (s**3 (s - bmax))``. The nearest and farthest points of the
    node's bounding box bound the sum too; the tighter bound is kept. Leaves not
    accepted add their members exactly. Needs non-negative masses.
    """
    n = targets.shape[0]
    nchunk = (n + chunk - 1) // chunk
    for c in numba.prange(nchunk):
        stack = np.empty(512, dtype=np.int64)
        for k in range(c * chunk, min(n, (c + 1) * chunk)):
            p = targets[k]
            x0 = pos[p, 0]
            x1 = pos[p, 1]
            x2 = pos[p, 2]
            u = 0.0
            w = 0.0
            top = 1
            stack[0] = roots[k]
            while top > 0:
                top -= 1
                node = stack[top]
                d0 = x0 - com[node, 0]
                d1 = x1 - com[node, 1]
                d2 = x2 - com[node, 2]
                dd = d0 * d0 + d1 * d1 + d2 * d2
                r = bmax[node]
                if dd * (theta * theta) > r * r:
                    nu, nw = _node_bound(node, x0, x1, x2, d0, d1, d2, dd, com, bmax, lo, hi,
                                         nmass, quad, second, eps2)
                    u += nu
                    w += nw
                elif first_child[node] < 0:
                    acc = 0.0
                    for q in range(start[node], start[node] + count[node]):
                        if q != p:
                            e0 = pos[q, 0] - x0
                            e1 = pos[q, 1] - x1
                            e2 = pos[q, 2] - x2
                            t = e0 * e0 + e1 * e1 + e2 * e2 + eps2
                            if t > 0.0:
                                acc += pmass[q] / math.sqrt(t)
                    u += acc
                    w += acc
                else:
                    for child in range(first_child[node], first_child[node] + n_child[node]):
                        stack[top] = child
                        top += 1
            up[k] = u
            low[k] = w


@numba.njit(fastmath=_FASTMATH, inline="always", cache=True)
def _offset(c0, c1, c2, node, com):
    """``(d0, d1, d2, |d|**2)`` for ``d = c - com[node]``."""
    d0 = c0 - com[node, 0]
    d1 = c1 - com[node, 1]
    d2 = c2 - com[node, 2]
    return d0, d1, d2, d0 * d0 + d1 * d1 + d2 * d2


@numba.njit(nogil=True, parallel=True, fastmath=_FASTMATH, error_model="numpy", cache=True)
def _group_bounds(x, y, z, pmass, start, count, first_child, n_child, com, bmax, lo, hi, nmass,
                  quad, second, root_ms, eps2, theta, approx, groups, roots, leaf_at, want,
                  chunk, up, low):
    """Bounds ``low[p] <= sum_{q != p} m_q / sqrt(|x_p - x_q|**2 + eps2) <= up[p]`` for
    every particle ``p`` (sorted order) of the octree (or forest) nodes ``groups``, one
    walk per group of the tree below node ``roots[k]`` (the root of the halo of
    ``groups[k]``); ``leaf_at[j]`` is the leaf starting at sorted particle ``j``,
    ``root_ms`` is ``sqrt(mass * second)`` of every node.

    The group's members lie within ``rb`` of its box centre ``c``. A node whose centre
    of mass is farther than ``(rb + bmax) / theta`` from ``c`` is accepted (never one
    that holds a member, as ``theta < 1``); with ``s = sqrt(|c - com|**2 + eps2)``,
    ``D = c - com``, ``d = x_p - c`` and ``t_q = d - r_q`` (``r_q = x_q - com``),
    ``1 / |(D, eps) + (t_q, 0)|`` (a distance in four dimensions) is the Legendre series
    ``sum_l (-1)**l |t_q|**l / s**(l+1) P_l(cos)``; the terms up to ``l = 2`` summed
    over the node's members give a quadratic in ``d`` (the node's local expansion about
    ``c``, from its mass, traceless quadrupole ``Q`` and ``S = sum m r**2``; the dipole
    about the centre of mass is zero), and since ``|P_l| <= 1`` the rest is at most
    ``sum_q m_q |t_q|**3 / (s**3 (s - |t_q|))`` with ``|t_q| <= rb + r_q``, bounded by
    ``(m rb**3 + 3 rb**2 sqrt(m S) + 3 rb S + bmax S) / (s**3 (s - rb - bmax))``.
    The group sums every accepted node's expansion and remainder once; each member then
    evaluates the quadratic and adds the leaves not accepted exactly, as
    :func:`_sum_open` (itself left out), or with ``approx`` as :func:`_sum_open_f32` and
    the bounds widened by its error ``_APPROX_ERR`` (relative; the caller checks that
    every squared separation in a halo is below ``_F32_HUGE``; a member with one below
    ``_F32_TINY`` sums exactly). Needs non-negative masses.
    """
    nl = groups.shape[0]
    nchunk = (nl + chunk - 1) // chunk
    n_nodes = start.shape[0]
    for ch in numba.prange(nchunk):
        stack = np.empty(512, dtype=np.int64)
        near = np.empty(n_nodes, dtype=np.int64)
        accept = np.empty(n_nodes, dtype=np.int64)
        first = np.empty(n_nodes, dtype=np.int64)
        r0 = np.empty(n_nodes, dtype=np.int64)
        r1 = np.empty(n_nodes, dtype=np.int64)
        bx = np.empty(0)  # the near members' copy, grown as needed
        by = np.empty(0)
        bz = np.empty(0)
        bm = np.empty(0)
        for k in range(ch * chunk, min(nl, (ch + 1) * chunk)):
            group = groups[k]
            b0 = start[group]
            b1 = b0 + count[group]
            c0 = 0.5 * (lo[group, 0] + hi[group, 0])  # the group's box centre
            c1 = 0.5 * (lo[group, 1] + hi[group, 1])
            c2 = 0.5 * (lo[group, 2] + hi[group, 2])
            rb2 = 0.0
            for p in range(b0, b1):
                e0 = x[p] - c0
                e1 = y[p] - c1
                e2 = z[p] - c2
                rb2 = max(rb2, e0 * e0 + e1 * e1 + e2 * e2)
            rb = math.sqrt(rb2) * (1.0 + 1e-12)
            # local expansion a0 + a.d + d.A.d (A symmetric) and its remainder
            a0 = 0.0
            ax = 0.0
            ay = 0.0
            az = 0.0
            axx = 0.0
            ayy = 0.0
            azz = 0.0
            axy = 0.0
            axz = 0.0
            ayz = 0.0
            rem = 0.0
            nn = 0
            na = 0
            top = 1
            stack[0] = roots[k]
            while top > 0:
                top -= 1
                node = stack[top]
                d0, d1, d2, dd = _offset(c0, c1, c2, node, com)
                rho = rb + bmax[node]
                if dd * (theta * theta) > rho * rho:  # never a node holding a member
                    accept[na] = node
                    na += 1
                elif first_child[node] < 0:
                    near[nn] = node
                    nn += 1
                else:
                    for child in range(first_child[node], first_child[node] + n_child[node]):
                        stack[top] = child
                        top += 1
            for i in range(na):  # the accepted nodes' expansions, in one loop
                node = accept[i]
                d0, d1, d2, dd = _offset(c0, c1, c2, node, com)
                r = bmax[node]
                rho = rb + r
                s2 = dd + eps2
                m = nmass[node]
                sec = second[node]
                s = math.sqrt(s2)
                inv = 1.0 / s
                inv2 = inv * inv
                inv3 = inv2 * inv
                inv5 = inv3 * inv2
                dqd = (quad[node, 0] * d0 * d0 + quad[node, 3] * d1 * d1
                       + quad[node, 5] * d2 * d2
                       + 2.0 * (quad[node, 1] * d0 * d1 + quad[node, 2] * d0 * d2
                                + quad[node, 4] * d1 * d2))
                a0 += m * inv + 0.5 * (dqd - sec * eps2) * inv5
                g = m * inv3
                ax -= g * d0
                ay -= g * d1
                az -= g * d2
                h = 1.5 * m * inv5
                hd = 0.5 * g
                axx += h * d0 * d0 - hd
                ayy += h * d1 * d1 - hd
                azz += h * d2 * d2 - hd
                axy += h * d0 * d1
                axz += h * d0 * d2
                ayz += h * d1 * d2
                t3 = m * rb * rb2 + 3.0 * rb2 * root_ms[node] + (3.0 * rb + r) * sec
                rem += t3 * inv3 / (s - rho)
            for i in range(nn):  # the near leaves by first particle (insertion sort)
                j0 = start[near[i]]
                j = i
                while j > 0 and first[j - 1] > j0:
                    first[j] = first[j - 1]
                    j -= 1
                first[j] = j0
            # the leaves not accepted as ranges of sorted particles, adjacent ones merged
            nr = 0
            for i in range(nn):
                j0 = first[i]
                j1 = j0 + count[leaf_at[j0]]
                if nr > 0 and r1[nr - 1] == j0:
                    r1[nr - 1] = j1
                else:
                    r0[nr] = j0
                    r1[nr] = j1
                    nr += 1
            nb = 0
            if approx:  # the near members in one contiguous copy: one long loop a member
                for i in range(nr):
                    nb += r1[i] - r0[i]
                if nb > bx.shape[0]:
                    bx = np.empty(2 * nb)
                    by = np.empty(2 * nb)
                    bz = np.empty(2 * nb)
                    bm = np.empty(2 * nb)
                nb = 0
                for i in range(nr):
                    for j in range(r0[i], r1[i]):
                        bx[nb] = x[j]
                        by[nb] = y[j]
                        bz[nb] = z[j]
                        bm[nb] = pmass[j]
                        nb += 1
            for p in range(b0, b1):
                if not want[p]:
                    continue
                e0 = x[p] - c0
                e1 = y[p] - c1
                e2 = z[p] - c2
                far = (a0 + ax * e0 + ay * e1 + az * e2
                       + axx * e0 * e0 + ayy * e1 * e1 + azz * e2 * e2
                       + 2.0 * (axy * e0 * e1 + axz * e0 * e2 + ayz * e1 * e2))
                xi = x[p]
                yi = y[p]
                zi = z[p]
                acc = 0.0
                err = 0.0
                tiny = 1
                if approx:  # float32 sums; the exact ones (below) only if these cannot serve
                    acc, tiny = _sum_open_f32(bx, by, bz, bm, xi, yi, zi, 0, nb, eps2)
                    err = acc * _APPROX_ERR  # also covers taking off the member's own term
                    acc -= _self_f32(pmass[p], eps2)
                if tiny > 0:
                    acc = 0.0
                    err = 0.0
                    for i in range(nr):
                        j0 = r0[i]
                        j1 = r1[i]
                        if j0 <= p < j1:
                            acc += _sum_open(x, y, z, pmass, xi, yi, zi, j0, p, eps2)
                            acc += _sum_open(x, y, z, pmass, xi, yi, zi, p + 1, j1, eps2)
                        else:
                            acc += _sum_open(x, y, z, pmass, xi, yi, zi, j0, j1, eps2)
                up[p] = acc + far + rem + err
                low[p] = acc + far - rem - err


def _approx_ok(rel, eps):
    """Whether every squared separation (softened) among ``rel`` stays below
    ``_F32_HUGE``, so that float32 sums (:func:`_sum_open_f32`) may serve for bounds."""
    if rel.shape[0] == 0:
        return False
    span = max(float(np.ptp(rel[:, a])) for a in range(3))  # per column: a fast reduction
    return 3.0 * span * span + eps * eps < _F32_HUGE


@numba.njit(nogil=True, cache=True)
def _segment_top(values, first, end, k):
    """Indices of the (at most) ``k`` largest ``values`` in each run
    ``first[r]:end[r]`` (NaNs never chosen), run by run."""
    out = np.empty(first.shape[0] * k, dtype=np.int64)
    nout = 0
    top = np.empty(k, dtype=np.int64)
    for r in range(first.shape[0]):
        nt = 0
        for i in range(first[r], end[r]):
            v = values[i]
            if not v == v:
                continue
            if nt < k:
                top[nt] = i
                nt += 1
                j = nt - 1
            elif v > values[top[nt - 1]]:
                j = nt - 1
                top[j] = i
            else:
                continue
            while j > 0 and values[top[j - 1]] < v:  # keep top sorted, largest first
                top[j] = top[j - 1]
                top[j - 1] = i
                j -= 1
        out[nout:nout + nt] = top[:nt]
        nout += nt
    return out[:nout]


def _segment_runs(seg):
    """``(first, end)``: bounds of the runs of equal values of the non-decreasing ``seg``."""
    first = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))
    return first, np.append(first[1:], seg.shape[0])


def _mbp_candidates(rel, mass, eps, starts, rows, approx):
    """The rows, among ``rows`` (sorted), of the halos ``starts[s]:starts[s+1]`` (they
    tile ``rel``) that may have their halo's lowest potential for ``G > 0`` (positions
    unwrapped so that plain differences are minimum images, masses >= 0): every row
    whose upper bound on ``sum_q m_q f(r_pq)`` reaches the largest such sum known in
    its halo (the best lower bound, or the exact sum of one of the members with the
    best lower bounds), less a relative ``_BOUND_MARGIN`` against rounding. One forest
    (an octree per halo, :func:`~cosmo_dask.spatial.octree.build_forest`) serves every
    halo; the first bounds come from one tree walk per group (:func:`_group_bounds`,
    opening angles ``_GROUP_THETAS``); the rows left are bounded again by one walk each
    (:func:`_bound_sums`) with the opening angles ``_TREE_THETAS`` in turn. A halo
    leaves the rounds once it has at most ``16 * _SEEDS`` rows left (they are all
    candidates), or, with ``approx``, before round ``r >= 1`` when it has fewer than
    ``_DIRECT_BELOW[r - 1]`` members: then its rows left are picked by float32 direct
    sums (:func:`_mbp_prefilter`, with the threshold of the rounds so far)."""
    from ..spatial.octree import build_forest, node_second_moment

    n = rel.shape[0]
    h = starts.shape[0] - 1
    tree = build_forest(rel, mass, starts, max_leaf=_TREE_LEAF, max_group=_TREE_GROUP)
    where = np.empty(n, dtype=np.int64)
    where[tree.order] = np.arange(n)
    pos_s = tree.pos
    second = node_second_moment(tree)
    threads = _CHUNKS_PER_THREAD * numba.get_num_threads()
    seg_of = np.repeat(np.arange(h, dtype=np.int64), np.diff(starts))  # == the root node
    groups = tree.groups  # they tile the sorted particles, in order
    group_root = seg_of[tree.start[groups]]
    group_of = np.repeat(np.arange(groups.shape[0]), tree.count[groups])
    leaves = np.flatnonzero(tree.first_child < 0)
    leaf_at = np.full(n, -1, dtype=np.int64)
    leaf_at[tree.start[leaves]] = leaves
    root_ms = np.sqrt(tree.mass * second)
    x, y, z = _soa(pos_s)
    best = np.full(h, -np.inf)
    done = []
    direct = []
    sizes = np.diff(starts)
    rounds = [(True, t) for t in _GROUP_THETAS] + [(False, t) for t in _TREE_THETAS]
    for r, (per_group, theta) in enumerate(rounds):
        if approx and 0 < r <= len(_DIRECT_BELOW):  # small enough for direct sums
            small = sizes[seg_of[rows]] < _DIRECT_BELOW[r - 1]
            direct.append(rows[small])
            rows = rows[~small]
            if rows.shape[0] == 0:
                break
        rseg = seg_of[rows]
        if per_group:  # the rows, one walk per group holding some
            want = np.zeros(n, dtype=np.bool_)
            want[where[rows]] = True
            need = np.zeros(groups.shape[0], dtype=np.bool_)
            need[group_of[where[rows]]] = True
            need = np.flatnonzero(need)
            up_s = np.empty(n)
            low_s = np.empty(n)
            _group_bounds(x, y, z, tree.pmass, tree.start, tree.count, tree.first_child,
                          tree.n_child, tree.com, tree.bmax, tree.lo, tree.hi, tree.mass,
                          tree.quad, second, root_ms, eps * eps, theta, approx, groups[need],
                          group_root[need],
                          leaf_at, want, max(1, need.shape[0] // threads + 1), up_s, low_s)
            up, low = up_s[where[rows]], low_s[where[rows]]
        else:  # one walk per row
            up = np.empty(rows.shape[0])
            low = np.empty(rows.shape[0])
            chunk = max(16, rows.shape[0] // threads + 1)
            _bound_sums(pos_s, tree.pmass, tree.start, tree.count, tree.first_child,
                        tree.n_child, tree.com, tree.bmax, tree.lo, tree.hi, tree.mass,
                        tree.quad, second, eps * eps, theta, where[rows], rseg, chunk, up, low)
        # per halo: the best lower bound and the exact sums of the _SEEDS best lower bounds
        first, end = _segment_runs(rseg)
        sid = rseg[first]
        seed = where[rows[_segment_top(low, first, end, _SEEDS)]]
        exact = np.empty(seed.shape[0])  # in the forest's order: equal up to rounding
        lo, hi = starts[seg_of[seed]], starts[seg_of[seed] + 1]
        _pot_rows(x, y, z, tree.pmass, seed, lo, hi, np.zeros(seed.shape[0], np.bool_),
                  _work_chunks((hi - lo).astype(np.float64)), eps * eps, 0.0, -1.0, False,
                  exact)
        best[sid] = np.maximum(best[sid], np.maximum.reduceat(low, first))
        np.maximum.at(best, seg_of[seed], exact)
        rows = rows[up >= best[rseg] * (1.0 - _BOUND_MARGIN)]
        left = np.bincount(seg_of[rows], minlength=h)
        fin = left[seg_of[rows]] <= _SEEDS * 16
        done.append(rows[fin])
        rows = rows[~fin]
        if rows.shape[0] == 0:
            break
    done.append(rows)
    direct = np.concatenate(direct) if direct else rows[:0]
    if direct.shape[0]:
        done.append(_mbp_prefilter(rel, mass, eps, starts, np.sort(direct), approx, best))
    return np.sort(np.concatenate(done))


def _mbp_prefilter(rel, mass, eps, starts, rows, approx, known=None):
    """The rows, among ``rows`` (sorted; of the halos ``starts[s]:starts[s+1]`` that
    tile ``rel``, holding every member of a halo that may have its largest sum), whose
    sum ``sum_q m_q f(r_pq)`` may be their halo's largest, from float32 sums
    (:func:`_potentials` with ``approx``, needs ``approx``) within a relative
    ``_APPROX_ERR``: a row is kept when its upper bound reaches its halo's best lower
    bound (the largest of those sums' lower bounds and ``known[s]``, a lower bound on
    halo ``s``'s largest sum where given), less a relative ``_BOUND_MARGIN``."""
    full = _potentials(rel, mass, starts, rows, 0.0, eps, -1.0, approx=True)
    err = full * _APPROX_ERR  # also covers taking off the self terms
    if eps > 0.0:
        full -= mass[rows] * np.float64(np.float32(1.0) / np.sqrt(np.float32(eps * eps)))
    seg = np.repeat(np.arange(starts.shape[0] - 1), np.diff(starts))[rows]
    first, end = _segment_runs(seg)
    best = np.repeat(np.maximum.reduceat(full - err, first), end - first)
    if known is not None:
        best = np.maximum(best, known[seg])
    return rows[full + err >= best * (1.0 - _BOUND_MARGIN)]


def segment_mbp(pos, mass, starts, *, box_size=None, softening=0.0,
                G=1.0) -> tuple[np.ndarray, np.ndarray]:
    """Most bound particle of every segment, exact, and its potential.

    The same answer as ``segmented_argmin(segment_potentials(...))`` (the same
    potentials, bit for bit, and the same row, ties to the first), computed
    without every potential: in segments of at least 2000 members an octree of
    the segment (one forest for all of them) bounds each member's potential from
    above and below (rigorous bounds from each node's mass, centre of mass, second
    moments and bounding box, nearby members summed with float32 reciprocal square
    roots within a rigorous relative error), in rounds of tighter bounds for the
    members left, until the float32 sums of those members over the whole segment
    cost less (Notes); in smaller segments every member's sum is taken that way. Only
    the members whose lower bound reaches the best upper bound get their exact
    potential. Segments spanning half a periodic
    box or more, any negative mass, or ``G <= 0`` evaluate every member exactly.

    Parameters
    ----------
    pos : numpy.ndarray
        float64 positions, shape ``(n, 3)`` (length units).
    mass : numpy.ndarray or float
        Masses, shape ``(n,)`` or a scalar (mass units).
    starts : numpy.ndarray
        int64 segment bounds, shape ``(h + 1,)`` (see :func:`segment_potentials`).
    box_size : float, optional
        Periodic box side (length units); separations use the minimum image.
    softening : float, optional
        Plummer softening length ``eps >= 0`` (length units).
    G : float, optional
        Gravitational constant (length**3 / (mass time**2)).

    Returns
    -------
    rows : numpy.ndarray
        int64, shape ``(h,)``: absolute row of each segment's most bound member;
        -1 for an empty segment.
    potentials : numpy.ndarray
        float64, shape ``(h,)``: its potential (length**2 / time**2); NaN for an
        empty segment.

    Raises
    ------
    ParameterError
        As :func:`segment_potentials`.

    Notes
    -----
    The first bounds cost one tree walk per group of at most 32 members (opening
    angle 0.7, then 0.5 and 0.35 for the members left; the group's accepted nodes
    summed as one local expansion, its own neighbourhood directly), then one walk per
    member left (0.3, then 0.2); the threshold is the best lower bound or the exact
    potential of one of the four members with the best lower bounds. A halo leaves
    the rounds for float32 direct sums of its members left (``O(r n)`` for ``r``
    rows, 0.72 ns a pair) where these cost less than the rounds to come: before the
    second round below 9,000 members, the third 30,000, the fourth 90,000, the fifth
    200,000 (the rounds from the second, third, fourth and fifth on cost some 6, 21,
    63 and 140 us a row on a clustered catalog of Plummer blobs, one thread:
    benchmarks/RESULTS.md, catalogs). What remains
    is ``O(r n)`` for the ``r`` members left, a few dozen in a Plummer or NFW core.
    Every tree-sized halo shares one forest and each round is one kernel call for all
    of them. The direct sums (smaller halos, the neighbourhoods in the group walks)
    take ``1 / sqrt`` in float32 (error at most ``2**-21`` relative, taken into the
    bounds; exact sums where a squared separation is below ``2**-100``; with
    ``softening**2 >= 2**-100`` none can be, and the loop tests no term: 0.72 ns a pair
    against 1.1 for the float64 sum, 0.88 without softening, one thread of the 2-core
    development machine). Work is about ``O(n log n)`` a segment: a
    Plummer halo of 1e5 members takes some 15 times less time than the exact double sum,
    and one forest for every halo beats an octree and a round of kernel calls per
    halo (benchmarks/RESULTS.md, most-bound particles).
    """
    pos, mass = _check_pos_mass(pos, mass)
    L, eps, G = check_common(box_size, softening, G)
    n = pos.shape[0]
    starts = check_starts(starts, n)
    sizes = np.diff(starts)
    rel, wrap_seg = _unwrapped(pos, starts, L)
    bounded = G > 0.0 and not np.any(mass < 0.0)  # the most bound: the largest sum
    tree = (sizes >= _TREE_MIN) & ~wrap_seg & bounded
    approx = bounded and _approx_ok(rel, eps)
    pre = ~tree & ~wrap_seg & (sizes > 2) & approx  # float32 sums pick the candidates
    every = np.zeros(n, dtype=np.bool_)
    every[starts[0]:starts[-1]] = np.repeat(~tree & ~pre, sizes)
    rows = [np.flatnonzero(every)]
    for sel, pick in ((np.flatnonzero(tree), _mbp_candidates),
                      (np.flatnonzero(pre), _mbp_prefilter)):
        if sel.size:  # these halos at once
            sub = np.concatenate(([0], np.cumsum(sizes[sel])))
            idx = np.arange(sub[-1], dtype=np.int64) + np.repeat(starts[sel] - sub[:-1],
                                                                 sizes[sel])
            rows.append(idx[pick(rel[idx], mass[idx], eps, sub, np.arange(sub[-1]), approx)])
    rows = np.sort(np.concatenate(rows))
    pot = np.full(n, np.nan)
    pot[rows] = _potentials(pos, mass, starts, rows, L, eps, G, unwrapped=(rel, wrap_seg))
    best = segmented_argmin(pot, starts)
    return best, np.where(best >= 0, pot[np.maximum(best, 0)], np.nan)


# --------------------------------------------------------------------------- #
# per-segment selections
# --------------------------------------------------------------------------- #


@numba.njit(nogil=True, parallel=True, cache=True)
def _segmented_argmin(values, starts, out):
    h = starts.shape[0] - 1
    for s in numba.prange(h):
        best = -1
        bv = 0.0
        for j in range(starts[s], starts[s + 1]):
            v = values[j]
            if v == v and (best < 0 or v < bv):  # NaN skipped, ties keep the first
                best = j
                bv = v
        out[s] = best


def segmented_argmin(values, starts) -> np.ndarray:
    """Row of the smallest value in every segment.

    Parameters
    ----------
    values : numpy.ndarray
        Real values, shape ``(n,)`` (e.g. potentials, length**2 / time**2).
    starts : numpy.ndarray
        int64 segment bounds, shape ``(h + 1,)`` (see :func:`segment_potentials`).

    Returns
    -------
    numpy.ndarray
        int64, shape ``(h,)``: absolute row index of each segment's minimum;
        ties go to the first row, NaNs are skipped, and an empty or all-NaN
        segment gives -1.
    """
    values = np.ascontiguousarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ParameterError(f"values must be 1-d, got shape {values.shape}")
    starts = check_starts(starts, values.shape[0])
    out = np.empty(starts.shape[0] - 1, dtype=np.int64)
    _segmented_argmin(values, starts, out)
    return out


@numba.njit(nogil=True, parallel=True, cache=True)
def _mcp_rows(friends, ids, starts, out):
    h = starts.shape[0] - 1
    for s in numba.prange(h):
        best = -1
        for j in range(starts[s], starts[s + 1]):
            if best < 0 or friends[j] > friends[best] or (
                friends[j] == friends[best] and ids[j] < ids[best]
            ):
                best = j
        out[s] = best


def segment_max(values, starts) -> np.ndarray:
    """The largest value of each segment (rows ``starts[s]:starts[s+1]``, none empty) of
    non-negative float64 ``values`` (NaN propagates): float64 ``(h,)``, exact (a maximum
    does not round). The CPU kernel of the contract
    :data:`cosmo_dask.halos.dispatch.segment_max` (GPU twin:
    :func:`cosmo_dask.halos.center_kernels_gpu.segment_max_gpu`)."""
    values = np.asarray(values, dtype=np.float64)
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size < 2:
        return np.empty(0)
    return np.maximum.reduceat(values, starts[:-1])


def mcp_rows(friends, ids, starts) -> np.ndarray:
    """Row of the most connected particle (most friends) in every segment.

    Parameters
    ----------
    friends : numpy.ndarray
        Integer friend counts (dimensionless), shape ``(n,)``.
    ids : numpy.ndarray
        Integer particle ids, shape ``(n,)``; they break ties.
    starts : numpy.ndarray
        int64 segment bounds, shape ``(h + 1,)`` (see :func:`segment_potentials`).

    Returns
    -------
    numpy.ndarray
        int64, shape ``(h,)``: absolute row of the particle with the most
        friends in each segment; among equal counts the one with the smallest
        id; -1 for an empty segment.
    """
    friends = np.ascontiguousarray(friends)
    ids = np.ascontiguousarray(ids)
    if friends.ndim != 1 or ids.shape != friends.shape:
        raise ParameterError(
            f"friends and ids must be 1-d of one shape, got {friends.shape} and {ids.shape}"
        )
    if not (np.issubdtype(friends.dtype, np.integer) and np.issubdtype(ids.dtype, np.integer)):
        raise ParameterError("friends and ids must be integer arrays")
    starts = check_starts(starts, friends.shape[0])
    out = np.empty(starts.shape[0] - 1, dtype=np.int64)
    _mcp_rows(friends.astype(np.int64), ids.astype(np.int64), starts, out)
    return out


# --------------------------------------------------------------------------- #
# grid-Poisson most bound particle
# --------------------------------------------------------------------------- #


def poisson_dirichlet(rho, cell, *, G=1.0) -> np.ndarray:
    """Solve ``laplacian(phi) = 4 pi G rho`` on a grid with ``phi = 0`` outside it.

    The 7-point Laplacian is inverted exactly with type-1 discrete sine
    transforms: ``rho`` holds the interior nodes, the nodes one step beyond
    each face are the zero boundary. The discrete eigenvalues are
    ``-(4 / cell**2) * sum_a sin(pi k_a / (2 (N_a + 1)))**2``, ``k_a = 1..N_a``.

    Parameters
    ----------
    rho : numpy.ndarray
        Density on the interior nodes, shape ``(N0, N1, N2)``, in
        mass / length**3.
    cell : float
        Node spacing (length units), the same on every axis.
    G : float, optional
        Gravitational constant (length**3 / (mass time**2)).

    Returns
    -------
    numpy.ndarray
        float64 potential on the nodes, shape of ``rho``, in length**2 / time**2.
    """
    rho = np.asarray(rho, dtype=np.float64)
    if rho.ndim != 3 or min(rho.shape) < 1:
        raise ParameterError(f"rho must be a non-empty 3-d array, got shape {rho.shape}")
    cell = float(cell)
    if not (np.isfinite(cell) and cell > 0.0):
        raise ParameterError(f"cell must be finite and > 0, got {cell}")
    lam = np.zeros(rho.shape, dtype=np.float64)
    for a, N in enumerate(rho.shape):
        k = np.arange(1, N + 1, dtype=np.float64)
        s2 = np.sin(np.pi * k / (2.0 * (N + 1))) ** 2
        shape = [1, 1, 1]
        shape[a] = N
        lam = lam + s2.reshape(shape)
    lam *= -4.0 / (cell * cell)
    rho_hat = scipy.fft.dstn(rho, type=1)
    return scipy.fft.idstn(rho_hat * (4.0 * np.pi * float(G) / lam), type=1)


@numba.njit(nogil=True, cache=True)
def _cic_deposit(pos, mass, origin, inv_cell, grid):
    """Cloud-in-cell deposit of ``mass`` onto node masses ``grid`` (node k at origin + k cell)."""
    n0, n1, n2 = grid.shape
    for i in range(pos.shape[0]):
        t0 = (pos[i, 0] - origin[0]) * inv_cell
        t1 = (pos[i, 1] - origin[1]) * inv_cell
        t2 = (pos[i, 2] - origin[2]) * inv_cell
        t0 = min(max(t0, 0.0), n0 - 1.0)
        t1 = min(max(t1, 0.0), n1 - 1.0)
        t2 = min(max(t2, 0.0), n2 - 1.0)
        a0 = min(int(t0), n0 - 2)
        a1 = min(int(t1), n1 - 2)
        a2 = min(int(t2), n2 - 2)
        f0 = t0 - a0
        f1 = t1 - a1
        f2 = t2 - a2
        m = mass[i]
        for d0 in range(2):
            w0 = f0 if d0 else 1.0 - f0
            for d1 in range(2):
                w1 = f1 if d1 else 1.0 - f1
                for d2 in range(2):
                    w2 = f2 if d2 else 1.0 - f2
                    grid[a0 + d0, a1 + d1, a2 + d2] += m * w0 * w1 * w2


def _unwrap(pos: np.ndarray, L: float) -> np.ndarray:
    """Positions moved by whole boxes to the minimum image of the first member."""
    if L <= 0.0 or pos.shape[0] == 0:
        return pos
    rel = pos - pos[0]
    rel -= L * np.rint(rel / L)
    return pos[0] + rel


def _grid_geometry(upos: np.ndarray, n_grid: int):
    """Origin (node 0) and spacing of a cubic grid of n_grid**3 nodes around ``upos``."""
    lo = upos.min(axis=0)
    hi = upos.max(axis=0)
    extent = float((hi - lo).max())
    span = n_grid + 1 - 2 * _PAD_CELLS  # cells across the largest extent
    cell = extent / span if extent > 0.0 else 1.0
    origin = 0.5 * (lo + hi) - 0.5 * (n_grid - 1) * cell
    return origin, cell


def _check_n_grid(n_grid) -> int:
    n_grid = int(n_grid)
    if n_grid < 2 * _PAD_CELLS + 2:
        raise ParameterError(f"n_grid must be >= {2 * _PAD_CELLS + 2}, got {n_grid}")
    return n_grid


def grid_potential(pos, mass, *, box_size=None, G=1.0, n_grid=64):
    """Grid potential of one halo: CIC mass on a cubic grid, Dirichlet-DST Poisson solve.

    With ``box_size`` the members are first moved to the minimum image of the
    first member. The grid has ``n_grid**3`` nodes; the largest extent of the
    members spans ``n_grid + 1 - 8`` cells, centred, so at least 4 empty
    cells separate them from the zero-potential boundary (the nodes just
    beyond the grid).

    Parameters
    ----------
    pos : numpy.ndarray
        float64 member positions, shape ``(n, 3)`` (length units), ``n >= 1``.
    mass : numpy.ndarray or float
        Member masses, shape ``(n,)`` or a scalar (mass units).
    box_size : float, optional
        Periodic box side (length units); the halo must be smaller than half of it.
    G : float, optional
        Gravitational constant (length**3 / (mass time**2)).
    n_grid : int, optional
        Nodes per axis (>= 10).

    Returns
    -------
    phi : numpy.ndarray
        float64 potential at the nodes, shape ``(n_grid,) * 3``
        (length**2 / time**2).
    origin : numpy.ndarray
        float64 position of node ``(0, 0, 0)``, shape ``(3,)`` (length units,
        in the unwrapped frame); node ``k`` is at ``origin + k * cell``.
    cell : float
        Node spacing (length units).
    """
    pos, mass = _check_pos_mass(pos, mass)
    L, _, G = check_common(box_size, 0.0, G)
    n_grid = _check_n_grid(n_grid)
    if pos.shape[0] == 0:
        raise ParameterError("grid_potential needs at least one member")
    phi, origin, cell, _ = _grid_solve(pos, mass, L, G, n_grid)
    return phi, origin, cell


def _grid_solve(pos, mass, L, G, n_grid):
    upos = _unwrap(pos, L)
    origin, cell = _grid_geometry(upos, n_grid)
    node_mass = np.zeros((n_grid, n_grid, n_grid), dtype=np.float64)
    _cic_deposit(upos, mass, origin, 1.0 / cell, node_mass)
    phi = poisson_dirichlet(node_mass / cell**3, cell, G=G)
    return phi, origin, cell, upos


def _deepest_minima(phi: np.ndarray, k: int) -> np.ndarray:
    """Nodes (float64, shape ``(<= k, 3)``) of the ``k`` deepest local minima of ``phi``.

    A local minimum is a node not above any of its 26 neighbours (outside
    the grid counts as 0, the boundary value). The global minimum is first.
    """
    low = scipy.ndimage.minimum_filter(phi, size=3, mode="constant", cval=0.0)
    cand = np.flatnonzero((phi <= low).ravel())
    order = np.argsort(phi.ravel()[cand], kind="stable")[:k]
    return np.array(np.unravel_index(cand[order], phi.shape), dtype=np.float64).T


def grid_mbp(pos, mass, *, box_size=None, softening=0.0, G=1.0, n_grid=64,
             search_radius_cells=2.0) -> int:
    """Most bound particle of one halo by the grid-Poisson method.

    The potential is solved on a grid (:func:`grid_potential`); the members
    within ``search_radius_cells`` cells, along every axis, of the grid's
    minimum node -- and of the next deepest local minima, up to 4 wells in
    all -- get their exact potential (as in :func:`segment_potentials`, due
    to all members), and the one with the lowest wins (ties: the first row).
    If no member is that close, every member is evaluated.

    Parameters
    ----------
    pos : numpy.ndarray
        float64 positions of all the halo's members, shape ``(n, 3)``
        (length units), ``n >= 1``.
    mass : numpy.ndarray or float
        Masses, shape ``(n,)`` or a scalar (mass units).
    box_size : float, optional
        Periodic box side (length units); the halo must be smaller than half of it.
    softening : float, optional
        Plummer softening of the exact potentials (length units).
    G : float, optional
        Gravitational constant (length**3 / (mass time**2)).
    n_grid : int, optional
        Grid nodes per axis (>= 10).
    search_radius_cells : float, optional
        Half-width, in cells, of the cube around the minimum node whose
        members are evaluated exactly.

    Returns
    -------
    int
        Row (in ``pos``) of the particle with the lowest exact potential among
        the candidates.

    Notes
    -----
    Sewell et al. (2015) search around the global grid minimum only. A
    compact clump whose centre is more bound than the main body's, but whose
    cusp the grid cannot resolve, then gives a particle of the wrong
    structure: on 300 Plummer / NFW halos of 1000-4000 particles, 60 % of
    them with an offset clump of 5-20 % of the mass, one well found the exact
    MBP in 283 (misses 0.03 % to 20 % above the true minimum), four wells in
    300. With ``softening = 0`` a chance close pair can be the exact MBP;
    no grid can find that, so give the simulation's softening. Cost:
    ``O(n + n_grid**3 log n_grid)``, plus, for ``r`` candidates, ``O(r n)`` in
    halos below 2000 members, else an octree of the halo and its tree walks (the
    bounds of :func:`segment_mbp`) before the exact potentials of
    the candidates those bounds cannot rule out (the same answer as evaluating
    every candidate; timings: benchmarks/RESULTS.md, most-bound particles).
    """
    pos, mass = _check_pos_mass(pos, mass)
    L, eps, G = check_common(box_size, softening, G)
    n_grid = _check_n_grid(n_grid)
    radius = float(search_radius_cells)
    if not (np.isfinite(radius) and radius >= 0.0):
        raise ParameterError(f"search_radius_cells must be finite and >= 0, got {radius}")
    n = pos.shape[0]
    if n == 0:
        raise ParameterError("grid_mbp needs at least one member")
    if n == 1:
        return 0
    phi, origin, cell, upos = _grid_solve(pos, mass, L, G, n_grid)
    near = np.zeros(n, dtype=np.bool_)
    for node in _deepest_minima(phi, _N_WELLS):
        centre = origin + node * cell
        near |= np.all(np.abs(upos - centre) <= radius * cell, axis=1)
    rows = np.flatnonzero(near).astype(np.int64)
    if rows.size == 0:
        rows = np.arange(n, dtype=np.int64)
    starts = np.array([0, n], dtype=np.int64)
    if n >= _TREE_MIN and rows.size > _GRID_PRUNE and G > 0.0 and np.all(mass >= 0.0):
        rel, wrap = _unwrapped(pos, starts, L)
        if not wrap[0]:  # the candidates that tree bounds cannot rule out
            rows = _mbp_candidates(rel, mass, eps, starts, rows, _approx_ok(rel, eps))
    pot = _potentials(pos, mass, starts, rows, L, eps, G)
    return int(rows[int(np.argmin(pot))])
