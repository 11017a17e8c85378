"""Single-domain friends-of-friends on the CPU (numba).

The method is the cell-list scheme used by HACC's PISTON halo finder:

1. Particles are binned into cells of side at least the linking length ``ll``.
   Along a periodic axis of period ``L`` the axis is cut into
   ``n = max(1, floor(L / ll))`` equal cells, so the cells tile the period
   exactly (coordinates are first wrapped into ``[0, L)``); along an open axis
   cells of side ``ll`` start at the smallest coordinate. (Cells are made
   ``1e-6`` relatively larger than ``ll`` against rounding, and an axis has
   at most ``2**20`` cells; beyond that its cells grow.)
2. Each particle gets an integer cell id ``(cx * ny + cy) * nz + cz`` and the
   particles are sorted by it (stable LSD radix sort). The occupied cells are the runs of
   equal ids; no dense cell grid is ever allocated, since with ``ll`` a fifth
   of the mean spacing there are ~125 cells per particle.
3. For every occupied cell the particle ranges of its neighbour cells are found
   by (galloping) binary search in the sorted array of occupied cell ids. The
   up to three neighbour cells along the last axis have consecutive ids unless
   they wrap, and consecutive occupied cells hold consecutive particles, so one
   search per ``(dx, dy)`` run gives one contiguous particle range. Only cells
   with a larger id than the current one are visited (plus the cell itself),
   so each unordered pair of cells, and each pair of particles, is examined
   once. Periodic axes with fewer than three cells have their neighbour
   offsets deduplicated.
4. Friend counts (``count_friends``, the default, or ``min_friends > 1``) are made
   over the units of step 5 (built on both paths): each unordered pair of
   neighbouring cells once, as in step 3. Every pair inside a unit is a friend
   pair, so a unit adds ``size - 1`` to each member; a pair of units whose bounding
   boxes prove all pairs friends adds the other's size to each member of both (into a
   per-unit accumulator, handed to the members once at the end), one that proves none
   is skipped, and an undecided one tests each row of the smaller unit against the
   other's box (skip it, or count the whole unit) before testing the rows left pair by
   pair. The box tests are step 5's exact ones, so the counts are the pair path's.
   Pair tests are a branch-free loop over float64 coordinate arrays (so that it
   vectorises) with :func:`_pair`'s arithmetic (distance ``<= ll``, minimum image on
   periodic axes) adding one to both counts of each friend pair; blocks of cells that
   are neighbours without wrapping around a period (at least four cells per period)
   skip the minimum-image step, which cannot change their answer. That loop is
   cheap (a few ns a pair, long runs), so a pair of cells with fewer than
   ``_PAIRS_PER_UNIT_PAIR`` (64) particle pairs per unit pair takes it directly, whole:
   per unit pair a box test costs about as much as a few dozen pair tests, and the
   loops over single units are short. Work thus drops where cells are dense (Plummer
   cores of 155 friends a particle, 2,379 at most: the box tests decide half of the
   pairs, the count takes about 0.8x the pair path's CPU time) and stays the pair
   path's elsewhere (29 friends a particle: equal; ``docs/halos.md``); it still grows
   with the pairs near the ``ll`` sphere's surface. With ``min_friends = k > 1`` a
   second pass links the friend pairs whose two members both have at least ``k``
   friends in a union-find forest (path halving, the smaller index becomes the
   root).
5. Plain FOF (``min_friends == 1``; with or without counts, which are then a
   separate pass over the same units) links *units*, so that its cost is bounded by particles and
   occupied cells rather than by pairs:

   * Each coarse cell is cut into fine cells of side at most ``ll / sqrt(3)``
     (2 per axis for cells of side ~``ll``) and its particles are sorted by
     fine cell. A fine cell with several particles whose bounding box proves
     every pair inside it friends is one unit, its particles joined at once
     without a distance test (any two points in it are within ``ll``); a
     fine cell that cannot be proven so (only with capped sub-division, or
     a period shorter than ``ll``) is split into single-particle units.
   * The coarse-cell stencil of step 3 is walked as before, but over units
     (each unordered pair of units at most once). Two single particles take
     the pair test. Otherwise the pair is skipped when the two units are
     already in one set (``find``); else the two bounding boxes decide: no
     pair can be friends (skip), every pair is (join once), or neither, and
     then the per-pair tests stop at the first friend pair (one link joins
     the two units, each already one set); a point-against-box test skips or
     accepts whole rows of those tests.
   * Once a coarse cell's units are all in one set (dense cells, right after
     their internal unit pairs), the cell is one node: a neighbour block whose
     coarse cells are each known to be in that set is skipped whole (cells
     found to be one set are remembered; sets only merge), and each other
     neighbour unit is skipped when in the set, tested against the cell's
     bounding box (skip, or join once), and only then tried unit by unit
     until one link. In a dense halo the work per cell is thus about one
     ``find`` per neighbour coarse cell, not one test per pair of particles.
   * The box tests are exact, not approximate: :func:`_pair` computes
     ``fl(x_i - x_j)``, one minimum-image shift, squares and their sum, all
     monotone in IEEE arithmetic, so applying the same operations to the
     boxes' extreme coordinates bounds every pair's computed distance;
     where the pairs would take different minimum-image branches the test
     answers "undecided" and the pairs are tested one by one. The result is
     thus identical to the pair path's.
   * Extra memory: unit offsets and box indices (O(particles)) and 48 bytes
     per multi-particle unit (and 4 bytes a unit for the counts' accumulator).

The labels returned are canonical: each particle's label is the smallest input
index in its group.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..core.backend import array_module
from ..core.errors import ParameterError

__all__ = ["check_arguments", "fof_local", "group_rows"]

# Cells are made this much (relatively) larger than the linking length, so that
# rounding in the cell index can never separate a pair at distance <= ll by two
# cells.
_SIDE_MARGIN = 1e-6
# At most this many cells along an axis (cell ids stay below 2**60).
_MAX_CELLS_PER_AXIS = 1 << 20


@numba.njit(cache=True)
def _wrap(x, L):
    """``x`` taken into ``[0, L)``; values at or beyond the ends included."""
    if x < 0.0 or x >= L:
        x = x - L * np.floor(x / L)
        if x >= L or x < 0.0:  # rounding at the ends of the period
            x = 0.0
    return x


@numba.njit(cache=True, nogil=True)
def cell_grid(periods, ll, lo, hi):
    """The coarse cell grid of the CPU and GPU kernels: ``(dims, origin, inv)``.

    ``lo`` / ``hi`` (float64, 3) are the smallest / largest coordinates per axis
    (read on open axes only). A coordinate ``x`` maps to the cell coordinate
    ``t = wrap(x) * inv`` on a periodic axis and ``t = (x / 2 - origin) * inv`` on
    an open one (halved coordinates, so that the extent cannot overflow); its cell
    is ``int(t)`` clamped to ``[0, dims)``.
    """
    dims = np.ones(3, dtype=np.int64)
    origin = np.zeros(3, dtype=np.float64)
    inv = np.zeros(3, dtype=np.float64)
    side_min = ll * (1.0 + _SIDE_MARGIN)
    for a in range(3):
        L = periods[a]
        if L > 0.0:
            nf = np.floor(L / side_min)
            n = 1
            if nf > 1.0:
                n = int(min(nf, float(_MAX_CELLS_PER_AXIS)))
            while n > 1 and L / n < side_min:  # cells of side L / n >= side_min
                n -= 1
            dims[a] = n
            inv[a] = n / L
        else:
            half_lo = 0.5 * lo[a]
            half_extent = 0.5 * hi[a] - half_lo
            half_side = 0.5 * side_min
            nf = np.floor(half_extent / half_side) + 1.0
            n = 1
            if nf > 1.0:
                if nf > _MAX_CELLS_PER_AXIS:
                    n = _MAX_CELLS_PER_AXIS
                    half_side = half_extent / (n - 1)
                else:
                    n = int(nf)
            dims[a] = n
            origin[a] = half_lo
            inv[a] = 1.0 / half_side
    return dims, origin, inv


@numba.njit(cache=True, nogil=True)
def _grid(pos, periods, ll):
    """The coarse cell grid of ``pos`` (:func:`cell_grid`): ``(dims, origin, inv)``."""
    m = pos.shape[0]
    lo = np.zeros(3, dtype=np.float64)
    hi = np.zeros(3, dtype=np.float64)
    for a in range(3):
        if not periods[a] > 0.0:
            lo[a] = np.float64(pos[0, a])
            hi[a] = lo[a]
            for i in range(m):
                x = np.float64(pos[i, a])
                if x < lo[a]:
                    lo[a] = x
                elif x > hi[a]:
                    hi[a] = x
    return cell_grid(periods, ll, lo, hi)


@numba.njit(cache=True, nogil=True)
def _cell_ids(pos, periods, ll):
    """Integer cell id of every particle.

    Returns ``(ids, dims, origin, inv)``: the int64 cell ids, the number of
    cells per axis and the grid's mapping (see :func:`_grid`).
    """
    m = pos.shape[0]
    dims, origin, inv = _grid(pos, periods, ll)
    ny = dims[1]
    nz = dims[2]
    ids = np.empty(m, dtype=np.int64)
    cell = np.empty(3, dtype=np.int64)
    for i in range(m):
        for a in range(3):
            L = periods[a]
            x = np.float64(pos[i, a])
            if L > 0.0:
                t = _wrap(x, L) * inv[a]
            else:
                t = (0.5 * x - origin[a]) * inv[a]
            c = int(t)
            if c >= dims[a]:
                c = dims[a] - 1
            elif c < 0:
                c = 0
            cell[a] = c
        ids[i] = (cell[0] * ny + cell[1]) * nz + cell[2]
    return ids, dims, origin, inv


@numba.njit(cache=True, nogil=True)
def _radix_argsort(keys, maxkey, idx, idx2, kout):
    """Stable argsort of non-negative int64 ``keys`` (all ``<= maxkey``), LSD radix.

    Works in the caller's buffers: ``keys`` is overwritten, ``kout`` (int64) and
    ``idx``/``idx2`` (the index dtype) are scratch. Returns ``(perm, sorted_keys)``,
    two of those four buffers.
    """
    m = keys.shape[0]
    nbits = 1
    while nbits < 63 and (maxkey >> nbits) > 0:
        nbits += 1
    npass = (nbits + 10) // 11
    bits = (nbits + npass - 1) // npass
    nb = 1 << bits
    mask = nb - 1
    for i in range(m):
        idx[i] = i
    kin = keys
    count = np.empty(nb, dtype=np.int64)
    for p in range(npass):
        shift = p * bits
        count[:] = 0
        for i in range(m):
            count[(kin[i] >> shift) & mask] += 1
        tot = 0
        for b in range(nb):
            c = count[b]
            count[b] = tot
            tot += c
        for i in range(m):
            d = (kin[i] >> shift) & mask
            o = count[d]
            count[d] = o + 1
            kout[o] = kin[i]
            idx2[o] = idx[i]
        kin, kout = kout, kin
        idx, idx2 = idx2, idx
    return idx, kin


@numba.njit(cache=True, nogil=True)
def _lower_bound(keys, target, hint):
    """First index ``k`` with ``keys[k] >= target``, galloping from ``hint``."""
    n = keys.shape[0]
    if hint >= n:
        hint = n - 1
    if hint < 0:
        hint = 0
    if keys[hint] < target:
        lo = hint  # keys[lo] < target
        step = 1
        hi = hint + 1
        while hi < n and keys[hi] < target:
            lo = hi
            step *= 2
            hi = lo + step
        if hi > n:
            hi = n
    else:
        hi = hint  # keys[hi] >= target
        step = 1
        lo = hint - 1
        while lo >= 0 and keys[lo] >= target:
            hi = lo
            step *= 2
            lo = hi - step
        if lo < -1:
            lo = -1
    # answer in (lo, hi]
    l = lo + 1
    r = hi
    while l < r:
        mid = (l + r) >> 1
        if keys[mid] < target:
            l = mid + 1
        else:
            r = mid
    return l


@numba.njit(cache=True)
def _find(parent, i):
    while parent[i] != i:
        p = parent[parent[i]]
        parent[i] = p
        i = p
    return i


@numba.njit(cache=True)
def _union(parent, i, j):
    ri = _find(parent, i)
    rj = _find(parent, j)
    if ri < rj:
        parent[rj] = ri
    elif rj < ri:
        parent[ri] = rj


@numba.njit(cache=True, nogil=True)
def _axis_neighbours(c, n, periodic, out):
    """Distinct neighbour coordinates of cell ``c`` along an axis; returns count."""
    k = 0
    if periodic:
        if n == 1:
            out[0] = 0
            k = 1
        elif n == 2:
            out[0] = 0
            out[1] = 1
            k = 2
        else:
            out[0] = c - 1 if c > 0 else n - 1
            out[1] = c
            out[2] = c + 1 if c < n - 1 else 0
            k = 3
    else:
        if c > 0:
            out[k] = c - 1
            k += 1
        out[k] = c
        k += 1
        if c < n - 1:
            out[k] = c + 1
            k += 1
    return k


@numba.njit(cache=True, nogil=True)
def _last_axis_runs(c, n, periodic, lo, hi):
    """Runs of consecutive neighbour coordinates along the last axis; returns count."""
    if periodic:
        if n <= 2:
            lo[0] = 0
            hi[0] = n - 1
            return 1
        if c == 0:
            lo[0] = 0
            hi[0] = 1
            lo[1] = n - 1
            hi[1] = n - 1
            return 2
        if c == n - 1:
            lo[0] = n - 2
            hi[0] = n - 1
            lo[1] = 0
            hi[1] = 0
            return 2
        lo[0] = c - 1
        hi[0] = c + 1
        return 1
    lo[0] = c - 1 if c > 0 else 0
    hi[0] = c + 1 if c < n - 1 else n - 1
    return 1


@numba.njit(cache=True)
def _pair(spos, i, j, L0, L1, L2, h0, h1, h2, ll2):
    """True when particles ``i`` and ``j`` (sorted order) are within the linking length.

    Arithmetic is float64 whatever the storage dtype (float32 converts exactly)."""
    d = np.float64(spos[i, 0]) - np.float64(spos[j, 0])
    if d > h0:
        d -= L0
    elif d < -h0:
        d += L0
    d2 = d * d
    if d2 > ll2:
        return False
    e = np.float64(spos[i, 1]) - np.float64(spos[j, 1])
    if e > h1:
        e -= L1
    elif e < -h1:
        e += L1
    f = np.float64(spos[i, 2]) - np.float64(spos[j, 2])
    if f > h2:
        f -= L2
    elif f < -h2:
        f += L2
    return d2 + e * e + f * f <= ll2


@numba.njit(cache=True)
def _neighbour_blocks(cell_keys, a, dims, periods, xs, ys, zlo, zhi, hints, blocks):
    """The neighbour cells of occupied cell ``a`` with a larger id, as runs
    ``blocks[t] = (lo, hi)`` of occupied-cell indices (``t < `` the count returned, at
    most 18): one galloping search per ``(dx, dy)`` run of the last axis, from the
    previous cell's answers in ``hints``. Every unordered pair of neighbouring cells
    is thus met once. ``xs``, ``ys`` (3), ``zlo``, ``zhi`` (2) are scratch."""
    nocc = cell_keys.shape[0]
    ny = dims[1]
    nz = dims[2]
    cx, cy, cz = _cell_axes(cell_keys[a], dims)
    key = cell_keys[a]
    nxn = _axis_neighbours(cx, dims[0], periods[0] > 0.0, xs)
    nyn = _axis_neighbours(cy, ny, periods[1] > 0.0, ys)
    nzr = _last_axis_runs(cz, nz, periods[2] > 0.0, zlo, zhi)
    k = 0
    for ix in range(nxn):
        for iy in range(nyn):
            base = (xs[ix] * ny + ys[iy]) * nz
            for iz in range(nzr):
                klo = base + zlo[iz]
                khi = base + zhi[iz]
                if khi <= key:
                    continue
                if klo <= key:
                    klo = key + 1
                slot = (ix * 3 + iy) * 2 + iz
                lo = _lower_bound(cell_keys, klo, hints[slot])
                hints[slot] = lo
                hi = lo
                while hi < nocc and cell_keys[hi] <= khi:
                    hi += 1
                if hi > lo:
                    blocks[k, 0] = lo
                    blocks[k, 1] = hi
                    k += 1
    return k


@numba.njit(cache=True)
def _stencil_scratch():
    """Scratch of :func:`_neighbour_blocks`: ``(xs, ys, zlo, zhi, hints, blocks)``."""
    return (np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64),
            np.empty(2, dtype=np.int64), np.empty(2, dtype=np.int64),
            np.zeros(18, dtype=np.int64), np.empty((18, 2), dtype=np.int64))


@numba.njit(cache=True)
def _half_periods(periods):
    """``(L0, L1, L2, h0, h1, h2)``: periods and half periods (inf on open axes)."""
    L0 = periods[0]
    L1 = periods[1]
    L2 = periods[2]
    h0 = 0.5 * L0 if L0 > 0.0 else np.inf
    h1 = 0.5 * L1 if L1 > 0.0 else np.inf
    h2 = 0.5 * L2 if L2 > 0.0 else np.inf
    return L0, L1, L2, h0, h1, h2


@numba.njit(cache=True, nogil=True)
def _pair_pass(spos, cell_keys, cell_start, dims, periods, ll, friends, parent, kmin):
    """Link every friend pair of neighbouring cells whose two members both have
    ``friends >= kmin`` (the cores of ``min_friends > 1``), each pair visited once."""
    nocc = cell_keys.shape[0]
    L0, L1, L2, h0, h1, h2 = _half_periods(periods)
    ll2 = ll * ll
    xs, ys, zlo, zhi, hints, blocks = _stencil_scratch()

    for a in range(nocc):
        sa = cell_start[a]
        ea = cell_start[a + 1]
        for i in range(sa, ea):  # pairs inside the cell
            if friends[i] < kmin:
                continue
            for j in range(i + 1, ea):
                if friends[j] >= kmin and _pair(spos, i, j, L0, L1, L2, h0, h1, h2, ll2):
                    _union(parent, i, j)
        nb = _neighbour_blocks(cell_keys, a, dims, periods, xs, ys, zlo, zhi, hints, blocks)
        for t in range(nb):
            sb = cell_start[blocks[t, 0]]
            eb = cell_start[blocks[t, 1]]
            for i in range(sa, ea):
                if friends[i] < kmin:
                    continue
                for j in range(sb, eb):
                    if friends[j] >= kmin and _pair(spos, i, j, L0, L1, L2, h0, h1, h2, ll2):
                        _union(parent, i, j)


@numba.njit(cache=True, nogil=True)
def _count_block(x, y, z, i0, i1, j0, j1, L0, L1, L2, h0, h1, h2, ll2, wrap, friends):
    """Friends of rows ``i0 <= i < i1`` among ``j0 <= j < j1`` (with ``j0 < 0``: among
    the rows after ``i`` up to ``i1``, the pairs inside a cell), added to both sides.

    ``x, y, z`` are float64 coordinate arrays (sorted order), so that the branch-free
    inner loops vectorise. The arithmetic is :func:`_pair`'s (float64 differences, one
    minimum-image shift, ``(dx*dx + dy*dy) + dz*dz <= ll2``; subtracting or adding
    ``L * False`` is exact), so the counts are the same. With ``wrap`` False the shift
    is left out: the caller passes False only for cells whose indices differ by at
    most one on every axis with at least four cells per period, whose pairs have
    ``|d| <= h`` or, just past a cell edge by rounding, are far beyond ``ll`` either
    way, so the counts are unchanged."""
    for i in range(i0, i1):
        xi = x[i]
        yi = y[i]
        zi = z[i]
        lo = i + 1 if j0 < 0 else j0
        hi = i1 if j0 < 0 else j1
        c = 0
        if wrap:
            for j in range(lo, hi):
                d = xi - x[j]
                d = d - L0 * (d > h0) + L0 * (d < -h0)
                e = yi - y[j]
                e = e - L1 * (e > h1) + L1 * (e < -h1)
                f = zi - z[j]
                f = f - L2 * (f > h2) + L2 * (f < -h2)
                k = np.int32(d * d + e * e + f * f <= ll2)
                c += k
                friends[j] += k
        else:
            for j in range(lo, hi):
                d = xi - x[j]
                e = yi - y[j]
                f = zi - z[j]
                k = np.int32(d * d + e * e + f * f <= ll2)
                c += k
                friends[j] += k
        friends[i] += c


@numba.njit(cache=True)
def _cell_axes(key, dims):
    """The three cell indices of cell id ``key``."""
    nyz = dims[1] * dims[2]
    cx = key // nyz
    rem = key - cx * nyz
    cy = rem // dims[2]
    return cx, cy, rem - cy * dims[2]


# ----------------------------------------------------------------------------- dense cells
# Fine cells ("units") for the links of plain FOF and for the friend counts; see the
# module docstring.

# Fine cells per coarse cell along an axis are capped (sub-cell keys stay small);
# a fine cell too large to be linked internally is split into single particles.
_MAX_SUB_PER_AXIS = 1024
# Coarse cells at most this occupied are sorted by insertion sort.
_INSERTION_SORT_MAX = 24


@numba.njit(cache=True)
def _axis_range(rmin, rmax, L, h):
    """``(ok, lo, hi)``: the range of ``|d|`` for every pair whose raw difference
    ``fl(x_i - x_j)`` lies in ``[rmin, rmax]``, after :func:`_pair`'s minimum-image
    step; ``ok`` is False when the pairs do not all take one branch of that step."""
    if rmin > h:
        dmin = rmin - L
        dmax = rmax - L
    elif rmax < -h:
        dmin = rmin + L
        dmax = rmax + L
    elif rmin >= -h and rmax <= h:
        dmin = rmin
        dmax = rmax
    else:
        return False, 0.0, 0.0
    if dmin >= 0.0:
        return True, dmin, dmax
    if dmax <= 0.0:
        return True, -dmax, -dmin
    return True, 0.0, max(-dmin, dmax)


@numba.njit(cache=True)
def _box_status(a0, b0, a1, b1, a2, b2, c0, e0, c1, e1, c2, e2,
                L0, L1, L2, h0, h1, h2, ll2):
    """Whether all pairs between box ``[a, b]`` and box ``[c, e]`` (per-axis lows and
    highs) are friends (1), none is (-1), or undecided (0).

    Exact: :func:`_pair` computes ``fl(x_i - x_j)``, one minimum-image shift, the
    squares and their sum, each a monotone operation in IEEE arithmetic, so the
    same operations on the boxes' extremes bound every pair's computed ``d2``.
    """
    ok0, lo0, hi0 = _axis_range(a0 - e0, b0 - c0, L0, h0)
    ok1, lo1, hi1 = _axis_range(a1 - e1, b1 - c1, L1, h1)
    ok2, lo2, hi2 = _axis_range(a2 - e2, b2 - c2, L2, h2)
    if not (ok0 and ok1 and ok2):
        return 0
    d2 = lo0 * lo0
    if d2 + lo1 * lo1 + lo2 * lo2 > ll2:
        return -1
    d2 = hi0 * hi0
    if d2 + hi1 * hi1 + hi2 * hi2 <= ll2:
        return 1
    return 0


@numba.njit(cache=True)
def _sub_key(spos, k, periods, dims, origin, inv, k0, k1, k2):
    """Fine sub-cell of particle ``k`` inside its coarse cell."""
    s0 = 0
    s1 = 0
    s2 = 0
    for a in range(3):
        L = periods[a]
        x = np.float64(spos[k, a])
        if L > 0.0:
            t = _wrap(x, L) * inv[a]
        else:
            t = (0.5 * x - origin[a]) * inv[a]
        c = int(t)
        if c >= dims[a]:
            c = dims[a] - 1
        elif c < 0:
            c = 0
        ka = k0 if a == 0 else (k1 if a == 1 else k2)
        s = int((t - c) * ka)
        if s >= ka:
            s = ka - 1
        elif s < 0:
            s = 0
        if a == 0:
            s0 = s
        elif a == 1:
            s1 = s
        else:
            s2 = s
    return (s0 * k1 + s1) * k2 + s2


@numba.njit(cache=True, nogil=True)
def _build_units(spos, perm, cell_start, periods, dims, origin, inv, ks, ll):
    """Sort each coarse cell's particles by fine sub-cell (``spos`` and ``perm`` in
    place) and cut the fine cells into units.

    A fine cell with several particles is one unit when its bounding box proves
    every pair inside it friends (:func:`_box_status`), else each of its particles
    is a unit. Returns ``(unit_start, cell_unit, unit_box, boxes)``: particle
    offsets of the units, unit offsets of the coarse cells, each unit's row in
    ``boxes`` (float64 ``lo0, hi0, lo1, hi1, lo2, hi2``) or -1 for one particle.
    """
    m = spos.shape[0]
    ncell = cell_start.shape[0] - 1
    k0 = ks[0]
    k1 = ks[1]
    k2 = ks[2]
    L0 = periods[0]
    L1 = periods[1]
    L2 = periods[2]
    h0 = 0.5 * L0 if L0 > 0.0 else np.inf
    h1 = 0.5 * L1 if L1 > 0.0 else np.inf
    h2 = 0.5 * L2 if L2 > 0.0 else np.inf
    ll2 = ll * ll
    itype = perm.dtype
    maxn = 1
    for c in range(ncell):
        n = cell_start[c + 1] - cell_start[c]
        if n > maxn:
            maxn = n
    keys = np.empty(maxn, dtype=np.int64)
    order = np.empty(maxn, dtype=np.int64)
    rkeys = np.empty(maxn, dtype=np.int64)  # scratch of the radix sort (the index
    ridx = np.empty(maxn, dtype=itype)  # dtype of _fof_impl's call: one compiled sort)
    rbuf = np.empty(maxn, dtype=itype)
    rkout = np.empty(maxn, dtype=np.int64)
    maxsub = k0 * k1 * k2 - 1
    tpos = np.empty((maxn, 3), dtype=spos.dtype)
    tperm = np.empty(maxn, dtype=itype)
    sorted_keys = np.empty(maxn, dtype=np.int64)
    unit_start = np.empty(m + 1, dtype=itype)
    unit_box = np.empty(m, dtype=itype)
    cell_unit = np.empty(ncell + 1, dtype=itype)
    boxes = np.empty((max(16, m // 64), 6), dtype=np.float64)
    nu = 0
    nb = 0
    for c in range(ncell):
        s = cell_start[c]
        e = cell_start[c + 1]
        n = e - s
        cell_unit[c] = nu
        if n == 1:
            unit_start[nu] = s
            unit_box[nu] = -1
            nu += 1
            continue
        for q in range(n):
            keys[q] = _sub_key(spos, s + q, periods, dims, origin, inv, k0, k1, k2)
        if n <= _INSERTION_SORT_MAX:
            for q in range(n):
                order[q] = q
            for q in range(1, n):
                o = order[q]
                kq = keys[o]
                r = q - 1
                while r >= 0 and keys[order[r]] > kq:
                    order[r + 1] = order[r]
                    r -= 1
                order[r + 1] = o
        else:  # stable LSD radix sort of the fine-cell keys (all below ks[0] ks[1] ks[2])
            for q in range(n):
                rkeys[q] = keys[q]
            rorder, _ = _radix_argsort(rkeys[:n], maxsub, ridx[:n], rbuf[:n], rkout[:n])
            for q in range(n):
                order[q] = rorder[q]
        for q in range(n):
            o = order[q]
            tpos[q, 0] = spos[s + o, 0]
            tpos[q, 1] = spos[s + o, 1]
            tpos[q, 2] = spos[s + o, 2]
            tperm[q] = perm[s + o]
        for q in range(n):
            sorted_keys[q] = keys[order[q]]
            spos[s + q, 0] = tpos[q, 0]
            spos[s + q, 1] = tpos[q, 1]
            spos[s + q, 2] = tpos[q, 2]
            perm[s + q] = tperm[q]
        q = 0
        while q < n:
            r = q + 1
            while r < n and sorted_keys[r] == sorted_keys[q]:
                r += 1
            if r - q == 1:
                unit_start[nu] = s + q
                unit_box[nu] = -1
                nu += 1
            else:
                lo0 = np.float64(spos[s + q, 0])
                lo1 = np.float64(spos[s + q, 1])
                lo2 = np.float64(spos[s + q, 2])
                hi0 = lo0
                hi1 = lo1
                hi2 = lo2
                for k in range(s + q + 1, s + r):
                    x = np.float64(spos[k, 0])
                    y = np.float64(spos[k, 1])
                    z = np.float64(spos[k, 2])
                    lo0 = min(lo0, x)
                    hi0 = max(hi0, x)
                    lo1 = min(lo1, y)
                    hi1 = max(hi1, y)
                    lo2 = min(lo2, z)
                    hi2 = max(hi2, z)
                st = _box_status(lo0, hi0, lo1, hi1, lo2, hi2, lo0, hi0, lo1, hi1, lo2, hi2,
                                 L0, L1, L2, h0, h1, h2, ll2)
                if st == 1:
                    if nb == boxes.shape[0]:
                        grown = np.empty((2 * nb, 6), dtype=np.float64)
                        for k in range(nb):
                            for a in range(6):
                                grown[k, a] = boxes[k, a]
                        boxes = grown
                    boxes[nb, 0] = lo0
                    boxes[nb, 1] = hi0
                    boxes[nb, 2] = lo1
                    boxes[nb, 3] = hi1
                    boxes[nb, 4] = lo2
                    boxes[nb, 5] = hi2
                    unit_start[nu] = s + q
                    unit_box[nu] = nb
                    nu += 1
                    nb += 1
                else:  # not provably one set: its particles are units of their own
                    for k in range(s + q, s + r):
                        unit_start[nu] = k
                        unit_box[nu] = -1
                        nu += 1
            q = r
    cell_unit[ncell] = nu
    unit_start[nu] = m
    return unit_start[:nu + 1].copy(), cell_unit, unit_box[:nu].copy(), boxes[:nb].copy()


@numba.njit(cache=True)
def _unit_lohi(spos, unit_start, unit_box, boxes, u):
    k = unit_box[u]
    if k >= 0:
        return (boxes[k, 0], boxes[k, 1], boxes[k, 2], boxes[k, 3], boxes[k, 4], boxes[k, 5])
    i = unit_start[u]
    x = np.float64(spos[i, 0])
    y = np.float64(spos[i, 1])
    z = np.float64(spos[i, 2])
    return (x, x, y, y, z, z)


@numba.njit(cache=True)
def _link_units(spos, unit_start, unit_box, boxes, parent, u, ri, v,
                L0, L1, L2, h0, h1, h2, ll2):
    """Join unit ``v`` to unit ``u`` (root ``ri``; each unit already one set) when some
    pair is friends. Returns the root of ``u``'s set afterwards."""
    i0 = unit_start[u]
    i1 = unit_start[u + 1]
    j0 = unit_start[v]
    j1 = unit_start[v + 1]
    if i1 - i0 == 1 and j1 - j0 == 1:
        if not _pair(spos, i0, j0, L0, L1, L2, h0, h1, h2, ll2):
            return ri
        rj = _find(parent, j0)
    else:
        rj = _find(parent, j0)
        if ri == rj:
            return ri
        a0, b0, a1, b1, a2, b2 = _unit_lohi(spos, unit_start, unit_box, boxes, u)
        c0, e0, c1, e1, c2, e2 = _unit_lohi(spos, unit_start, unit_box, boxes, v)
        st = _box_status(a0, b0, a1, b1, a2, b2, c0, e0, c1, e1, c2, e2,
                         L0, L1, L2, h0, h1, h2, ll2)
        if st < 0:
            return ri
        if st == 0:
            found = False
            for i in range(i0, i1):
                if j1 - j0 > 1:
                    x = np.float64(spos[i, 0])
                    y = np.float64(spos[i, 1])
                    z = np.float64(spos[i, 2])
                    sp = _box_status(x, x, y, y, z, z, c0, e0, c1, e1, c2, e2,
                                     L0, L1, L2, h0, h1, h2, ll2)
                    if sp < 0:
                        continue
                    if sp > 0:
                        found = True
                        break
                for j in range(j0, j1):
                    if _pair(spos, i, j, L0, L1, L2, h0, h1, h2, ll2):
                        found = True
                        break
                if found:
                    break
            if not found:
                return ri
    if ri < rj:
        parent[rj] = ri
        return ri
    if rj < ri:
        parent[ri] = rj
    return rj


@numba.njit(cache=True)
def _one_set(parent, unit_start, ua, ub, r):
    """Whether units ``ua .. ub-1`` all have root ``r``."""
    for u in range(ua, ub):
        if _find(parent, unit_start[u]) != r:
            return False
    return True


@numba.njit(cache=True)
def _cell_root(parent, unit_start, cell_unit, cell_set, c):
    """Root of coarse cell ``c``'s set when all its units are in one set, else -1.

    ``cell_set`` remembers a member of cells found to be one set (sets only merge,
    so they stay one), making the test O(1) after the first success."""
    r = cell_set[c]
    if r >= 0:
        return _find(parent, r)
    ua = cell_unit[c]
    r = _find(parent, unit_start[ua])
    if _one_set(parent, unit_start, ua + 1, cell_unit[c + 1], r):
        cell_set[c] = r
        return r
    return -1


@numba.njit(cache=True, nogil=True)
def _dense_pass(spos, cell_keys, cell_unit, unit_start, unit_box, boxes, dims, periods, ll,
                parent):
    """Link every friend pair, with fine cells (units) as the nodes: the coarse-cell
    stencil of :func:`_pair_pass`, each pair of units tested at most once; a cell
    whose units are one set is handled as one node (see the module docstring)."""
    nocc = cell_keys.shape[0]
    L0, L1, L2, h0, h1, h2 = _half_periods(periods)
    ll2 = ll * ll

    # every unit is one set: its particles hang off its first
    for u in range(unit_start.shape[0] - 1):
        s = unit_start[u]
        for i in range(s + 1, unit_start[u + 1]):
            parent[i] = s

    xs, ys, zlo, zhi, hints, blocks = _stencil_scratch()
    cell_set = np.full(nocc, -1, dtype=parent.dtype)

    for a in range(nocc):
        ua = np.int64(cell_unit[a])  # unit indices and roots int64 throughout, so that
        ub = np.int64(cell_unit[a + 1])  # each helper compiles for one set of types

        for u in range(ua, ub - 1):
            ri = _find(parent, unit_start[u])
            for v in range(u + 1, ub):
                ri = _link_units(spos, unit_start, unit_box, boxes, parent, u, np.int64(ri),
                                 v, L0, L1, L2, h0, h1, h2, ll2)
        # A cell whose units are one set is treated as a whole: each neighbour unit is
        # skipped when already in that set or out of reach of the cell's bounding box,
        # joined when the boxes prove all pairs friends, else tried unit by unit until
        # one link. A lone particle just takes pair tests.
        lone = unit_start[ua + 1] - unit_start[ua] == 1 and ub - ua == 1
        ra = -1
        if not lone:
            ra = _cell_root(parent, unit_start, cell_unit, cell_set, a)
        if ra >= 0:
            a0, b0, a1, b1, a2, b2 = _unit_lohi(spos, unit_start, unit_box, boxes, ua)
            for u in range(ua + 1, ub):
                c0, e0, c1, e1, c2, e2 = _unit_lohi(spos, unit_start, unit_box, boxes, u)
                a0 = min(a0, c0)
                b0 = max(b0, e0)
                a1 = min(a1, c1)
                b1 = max(b1, e1)
                a2 = min(a2, c2)
                b2 = max(b2, e2)

        nb = _neighbour_blocks(cell_keys, a, dims, periods, xs, ys, zlo, zhi, hints, blocks)
        for t in range(nb):
            lo = blocks[t, 0]
            hi = blocks[t, 1]
            va = np.int64(cell_unit[lo])
            vb = np.int64(cell_unit[hi])
            if lone and unit_start[vb] - unit_start[va] == vb - va:
                i = unit_start[ua]  # particle against single particles
                ri = -1
                for j in range(unit_start[va], unit_start[vb]):
                    if _pair(spos, i, j, L0, L1, L2, h0, h1, h2, ll2):
                        if ri < 0:
                            ri = _find(parent, i)
                        rj = _find(parent, j)
                        if ri < rj:
                            parent[rj] = ri
                        elif rj < ri:
                            parent[ri] = rj
                            ri = rj
                continue
            if ra < 0:
                for u in range(ua, ub):
                    ri = _find(parent, unit_start[u])
                    for v in range(va, vb):
                        ri = _link_units(spos, unit_start, unit_box, boxes, parent, u,
                                         np.int64(ri), v, L0, L1, L2, h0, h1, h2, ll2)
                continue
            ra = _find(parent, ra)
            c = lo  # the whole block already in this cell's set?
            while c < hi and _cell_root(parent, unit_start, cell_unit, cell_set,
                                        c) == ra:
                c += 1
            if c == hi:
                continue
            for v in range(va, vb):
                rv = _find(parent, unit_start[v])
                if rv == ra:
                    continue
                c0, e0, c1, e1, c2, e2 = _unit_lohi(spos, unit_start, unit_box, boxes,
                                                    v)
                st = _box_status(a0, b0, a1, b1, a2, b2, c0, e0, c1, e1, c2, e2,
                                 L0, L1, L2, h0, h1, h2, ll2)
                if st < 0:
                    continue
                if st > 0:
                    if ra < rv:
                        parent[rv] = ra
                    else:
                        parent[ra] = rv
                        ra = rv
                    continue
                for u in range(ua, ub):
                    ra = _link_units(spos, unit_start, unit_box, boxes, parent, u,
                                     np.int64(ra), v, L0, L1, L2, h0, h1, h2, ll2)
                    if _find(parent, unit_start[v]) == ra:
                        break


# A cell pair whose particles make fewer than this many pairs per pair of units is
# counted pair by pair (:func:`_count_block`, vectorised), not unit by unit (read at
# each call: 0 sends every cell pair through the units, a huge value none).
_PAIRS_PER_UNIT_PAIR = 64


@numba.njit(cache=True)
def _count_units(x, y, z, spos, unit_start, unit_box, boxes, u, v,
                 L0, L1, L2, h0, h1, h2, ll2, wrap, friends, unit_add):
    """Friends between units ``u != v``, added to both sides: all at once when the two
    bounding boxes decide every pair (:func:`_box_status`; a friend to each member of a
    unit goes to ``unit_add``), else each row of the smaller unit against the other's
    box (the same exact test), and the rows left undecided pair by pair
    (:func:`_count_block`, with ``wrap`` as there)."""
    i0 = np.int64(unit_start[u])
    i1 = np.int64(unit_start[u + 1])
    j0 = np.int64(unit_start[v])
    j1 = np.int64(unit_start[v + 1])
    rows = False  # test each row against the other unit's box
    if i1 - i0 > 1 or j1 - j0 > 1:
        a0, b0, a1, b1, a2, b2 = _unit_lohi(spos, unit_start, unit_box, boxes, u)
        c0, e0, c1, e1, c2, e2 = _unit_lohi(spos, unit_start, unit_box, boxes, v)
        st = _box_status(a0, b0, a1, b1, a2, b2, c0, e0, c1, e1, c2, e2,
                         L0, L1, L2, h0, h1, h2, ll2)
        if st < 0:
            return
        if st > 0:
            unit_add[u] += j1 - j0
            unit_add[v] += i1 - i0
            return
        if i1 - i0 > j1 - j0:  # rows from the smaller unit, against the larger one's box
            i0, i1, j0, j1 = j0, j1, i0, i1
            c0, e0, c1, e1, c2, e2 = a0, b0, a1, b1, a2, b2
            v = u
        rows = i1 - i0 > 1  # one row: the box test above was its test
    nj = j1 - j0
    for i in range(i0, i1):  # one call site of each helper: less to compile
        if rows:
            sp = _box_status(x[i], x[i], y[i], y[i], z[i], z[i], c0, e0, c1, e1, c2, e2,
                             L0, L1, L2, h0, h1, h2, ll2)
            if sp < 0:
                continue
            if sp > 0:
                friends[i] += nj
                unit_add[v] += 1
                continue
        _count_block(x, y, z, i, i + 1, j0, j1, L0, L1, L2, h0, h1, h2, ll2, wrap, friends)


@numba.njit(cache=True, nogil=True)
def _count_pass(x, y, z, spos, cell_keys, cell_start, cell_unit, unit_start, unit_box,
                boxes, dims, periods, ll, min_pairs, friends):
    """Friend counts over units: each unordered pair of neighbouring cells once (by
    :func:`_neighbour_blocks`); a unit's inner pairs are all friends (``size - 1`` to
    each member), unit pairs go through :func:`_count_units`, and cell pairs with few
    particles per unit pair (below ``min_pairs`` pairs per unit pair) take the pair loop
    :func:`_count_block` directly, without the minimum-image step where no pair needs
    it (see there)."""
    nocc = cell_keys.shape[0]
    L0, L1, L2, h0, h1, h2 = _half_periods(periods)
    ll2 = ll * ll
    few = False  # a periodic axis of fewer than four cells: every block takes the shift
    for a in range(3):
        if periods[a] > 0.0 and dims[a] < 4:
            few = True
    xs, ys, zlo, zhi, hints, blocks = _stencil_scratch()
    nunit = unit_start.shape[0] - 1
    unit_add = np.zeros(nunit, dtype=np.int32)  # friends of every member of a unit
    for a in range(nocc):
        sa = np.int64(cell_start[a])
        ea = np.int64(cell_start[a + 1])
        ua = np.int64(cell_unit[a])
        ub = np.int64(cell_unit[a + 1])
        if (ea - sa) * (ea - sa) < min_pairs * (ub - ua) * (ub - ua):
            _count_block(x, y, z, sa, ea, np.int64(-1), np.int64(-1), L0, L1, L2,
                         h0, h1, h2, ll2, bool(few), friends)
        else:
            for u in range(ua, ub):
                unit_add[u] += unit_start[u + 1] - unit_start[u] - 1
                for v in range(u + 1, ub):
                    _count_units(x, y, z, spos, unit_start, unit_box, boxes, u, v,
                                 L0, L1, L2, h0, h1, h2, ll2, bool(few), friends, unit_add)
        ax, ay, az = _cell_axes(cell_keys[a], dims)
        nb = _neighbour_blocks(cell_keys, a, dims, periods, xs, ys, zlo, zhi, hints, blocks)
        for t in range(nb):
            wrap = few
            for b in (blocks[t, 0], blocks[t, 1] - 1):  # a run along the last axis
                bx, by, bz = _cell_axes(cell_keys[b], dims)
                if abs(bx - ax) > 1 or abs(by - ay) > 1 or abs(bz - az) > 1:
                    wrap = True
            sb = np.int64(cell_start[blocks[t, 0]])
            eb = np.int64(cell_start[blocks[t, 1]])
            va = np.int64(cell_unit[blocks[t, 0]])
            vb = np.int64(cell_unit[blocks[t, 1]])
            if (ea - sa) * (eb - sb) < min_pairs * (ub - ua) * (vb - va):
                _count_block(x, y, z, sa, ea, sb, eb, L0, L1, L2, h0, h1, h2, ll2,
                             bool(wrap), friends)
                continue
            for u in range(ua, ub):
                for v in range(va, vb):
                    _count_units(x, y, z, spos, unit_start, unit_box, boxes, u, v,
                                 L0, L1, L2, h0, h1, h2, ll2, bool(wrap), friends,
                                 unit_add)
    for u in range(nunit):
        add = unit_add[u]
        if add:
            for i in range(unit_start[u], unit_start[u + 1]):
                friends[i] += add


def _friend_counts(spos, cell_keys, cell_start, units, dims, periods, ll) -> np.ndarray:
    """int32 friend count of every particle (sorted order; cells contiguous, each cut
    into ``units = (unit_start, cell_unit, unit_box, boxes)`` by :func:`_build_units`):
    every pair of neighbouring cells once, over units (:func:`_count_pass`)."""
    friends = np.zeros(spos.shape[0], dtype=np.int32)
    x, y, z = (np.ascontiguousarray(spos[:, a], dtype=np.float64) for a in range(3))
    unit_start, cell_unit, unit_box, boxes = units
    _count_pass(x, y, z, spos, cell_keys, cell_start, cell_unit, unit_start, unit_box,
                boxes, dims, periods, ll, np.int64(_PAIRS_PER_UNIT_PAIR), friends)
    return friends


def _sub_cells(periods, inv, ll):
    """Fine cells per coarse cell along each axis: sides at most ``ll / sqrt(3)``."""
    ks = np.ones(3, dtype=np.int64)
    for a in range(3):
        side = (1.0 if periods[a] > 0.0 else 2.0) / inv[a]
        k = math.ceil(side * math.sqrt(3.0) * (1.0 + _SIDE_MARGIN) / ll)
        ks[a] = min(max(k, 1), _MAX_SUB_PER_AXIS)
    return ks


@numba.njit(cache=True, nogil=True)
def _scan_coordinates(pos, periods):
    """(all finite, every periodic coordinate inside [0, L)) without temporaries."""
    finite = True
    inside = True
    for i in range(pos.shape[0]):
        for a in range(3):
            x = np.float64(pos[i, a])
            if not np.isfinite(x):
                finite = False
            elif periods[a] > 0.0 and (x < 0.0 or x >= periods[a]):
                inside = False
    return finite, inside


@numba.njit(cache=True, nogil=True)
def _wrapped(pos, periods):
    """float64 copy of ``pos`` with periodic coordinates wrapped into ``[0, L)``."""
    out = np.empty((pos.shape[0], 3), dtype=np.float64)
    for i in range(pos.shape[0]):
        for a in range(3):
            x = np.float64(pos[i, a])
            out[i, a] = _wrap(x, periods[a]) if periods[a] > 0.0 else x
    return out


@numba.njit(cache=True, nogil=True)
def _sorted_positions(pos, perm):
    """Positions in sorted order, in their own dtype."""
    m = perm.shape[0]
    spos = np.empty((m, 3), dtype=pos.dtype)
    for k in range(m):
        p = perm[k]
        spos[k, 0] = pos[p, 0]
        spos[k, 1] = pos[p, 1]
        spos[k, 2] = pos[p, 2]
    return spos


@numba.njit(cache=True, nogil=True)
def _occupied_cells(skeys, perm):
    """Occupied cells, the runs of equal sorted ids: their ids and start offsets
    (offsets in the index dtype of ``perm``)."""
    m = skeys.shape[0]
    nocc = 1
    for k in range(1, m):
        if skeys[k] != skeys[k - 1]:
            nocc += 1
    cell_keys = np.empty(nocc, dtype=np.int64)
    cell_start = np.empty(nocc + 1, dtype=perm.dtype)
    c = 0
    cell_keys[0] = skeys[0]
    cell_start[0] = 0
    for k in range(1, m):
        if skeys[k] != skeys[k - 1]:
            c += 1
            cell_keys[c] = skeys[k]
            cell_start[c] = k
    cell_start[nocc] = m
    return cell_keys, cell_start


@numba.njit(cache=True, nogil=True)
def _input_labels(parent, perm):
    """Label (smallest input index of the group) of every particle, in input order.
    ``parent`` is flattened in place."""
    m = perm.shape[0]
    for k in range(m):
        parent[k] = _find(parent, k)
    minidx = np.full(m, m, dtype=perm.dtype)
    for k in range(m):
        r = parent[k]
        if perm[k] < minidx[r]:
            minidx[r] = perm[k]
    root = np.empty(m, dtype=np.int64)
    for k in range(m):
        root[perm[k]] = minidx[parent[k]]
    return root


@numba.njit(cache=True, nogil=True)
def _input_order(parent, perm, friends):
    """Label (smallest input index of the group) and friend count of every particle,
    in input order. ``parent`` is flattened in place."""
    m = perm.shape[0]
    for k in range(m):
        parent[k] = _find(parent, k)
    minidx = np.full(m, m, dtype=perm.dtype)
    for k in range(m):
        r = parent[k]
        if perm[k] < minidx[r]:
            minidx[r] = perm[k]
    root = np.empty(m, dtype=np.int64)
    friends_out = np.empty(m, dtype=np.int32)
    for k in range(m):
        p = perm[k]
        root[p] = minidx[parent[k]]
        friends_out[p] = friends[k]
    return root, friends_out


def _fof_impl(pos, periods, ll, min_friends, count_friends=True):
    """The kernel on checked input; the steps run as separate calls so that each
    buffer is released as soon as it is done with (the memory peak is the sort,
    about 24 bytes per particle, or the friend counts: 24 bytes of float64 coordinates,
    4 of counts and the units, up to 12 more, beside the sorted positions).
    """
    m = pos.shape[0]
    itype = np.int32 if m < 2**31 - 1 else np.int64
    keys, dims, origin, inv = _cell_ids(pos, periods, ll)
    maxkey = int(dims[0] * dims[1] * dims[2] - 1)
    perm, skeys = _radix_argsort(keys, maxkey, np.empty(m, itype), np.empty(m, itype),
                                 np.empty(m, np.int64))
    del keys
    spos = _sorted_positions(pos, perm)
    cell_keys, cell_start = _occupied_cells(skeys, perm)
    del skeys
    parent = np.arange(m, dtype=itype)
    # units (fine cells, see the module docstring) for the links and the counts;
    # sorting particles by fine cell keeps every coarse cell's rows in place
    units = _build_units(spos, perm, cell_start, periods, dims, origin, inv,
                         _sub_cells(periods, inv, ll), ll)
    if min_friends > 1:
        friends = _friend_counts(spos, cell_keys, cell_start, units, dims, periods, ll)
        del units
        _pair_pass(spos, cell_keys, cell_start, dims, periods, ll, friends, parent,
                   min_friends)
        del spos, cell_keys, cell_start
        return _input_order(parent, perm, friends)
    unit_start, cell_unit, unit_box, boxes = units  # plain FOF: units link
    _dense_pass(spos, cell_keys, cell_unit, unit_start, unit_box, boxes, dims, periods,
                ll, parent)
    del cell_unit, unit_start, unit_box, boxes  # units holds them until the counts
    if not count_friends:
        del units
        return _input_labels(parent, perm), None
    friends = _friend_counts(spos, cell_keys, cell_start, units, dims, periods, ll)
    del spos, cell_keys, cell_start, units
    return _input_order(parent, perm, friends)


def check_arguments(pos_shape, periods, linking_length, min_friends):
    """Check ``fof_local``'s arguments (shared with the GPU kernel); returns ``(per, ll, kmin)``."""
    if len(pos_shape) != 2 or pos_shape[1] != 3:
        raise ParameterError(f"pos must have shape (m, 3), got {tuple(pos_shape)}")
    if array_module(periods) is not np:
        periods = periods.get()
    per = np.ascontiguousarray(periods, dtype=np.float64)
    if per.shape != (3,):
        raise ParameterError(f"periods must have 3 entries, got shape {per.shape}")
    if not np.all(np.isfinite(per)) or np.any(per < 0.0):
        raise ParameterError(f"periods must be finite and >= 0 (0 = open axis), got {per}")
    ll = float(linking_length)
    if not (np.isfinite(ll) and ll > 0.0):
        raise ParameterError(f"linking_length must be finite and > 0, got {linking_length!r}")
    if isinstance(min_friends, bool) or int(min_friends) != min_friends or min_friends < 1:
        raise ParameterError(f"min_friends must be an integer >= 1, got {min_friends!r}")
    return per, ll, int(min_friends)


def fof_local(
    pos: np.ndarray, periods, linking_length: float, min_friends: int = 1,
    count_friends: bool = True,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Friends-of-friends groups of one domain's particles.

    Parameters
    ----------
    pos : numpy.ndarray
        Particle positions, shape ``(m, 3)``, float32 or float64 (kept in
        their dtype; other dtypes are converted to float64). Distances are
        computed in float64. Periodic coordinates outside ``[0, L)`` are
        wrapped (into a float64 copy) before anything is measured.
    periods : array_like
        Three per-axis periods: ``L > 0`` for a periodic axis (coordinates are
        taken modulo ``L``, distances use the minimum image), ``0`` for an
        open axis. Mixed periodicity is allowed.
    linking_length : float
        Two particles are friends when their distance is ``<= linking_length``.
    min_friends : int, optional
        With 1 (default) every friend pair links. With ``k > 1`` only pairs
        whose two members both have at least ``k`` friends link; particles
        with fewer friends stay single (DBSCAN-like variant).
    count_friends : bool, optional
        Whether to return the friend counts (default True); they cost a pass of
        their own (over the units and pairs of neighbouring cells, see the module
        docstring), so ask only when a result reads them. With ``False`` and
        ``min_friends == 1`` ``friends`` is ``None``. With ``min_friends > 1`` the
        counts are computed anyway (they decide the links) and returned.

    Returns
    -------
    root : numpy.ndarray
        int64, shape ``(m,)``: the smallest index of each particle's group.
    friends : numpy.ndarray or None
        int32, shape ``(m,)``: number of other particles within the linking
        length of each particle (independent of ``min_friends``); ``None``
        when ``count_friends`` is False and ``min_friends == 1``.

    Raises
    ------
    ParameterError
        If the shapes are wrong, a value is not finite, a period is negative,
        ``linking_length <= 0`` or ``min_friends < 1``.
    """
    pos = np.asarray(pos)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = np.ascontiguousarray(pos)
    per, ll, kmin = check_arguments(pos.shape, periods, linking_length, min_friends)
    m = pos.shape[0]
    counts = bool(count_friends) or kmin > 1
    if m == 0:
        return np.empty(0, dtype=np.int64), (np.empty(0, dtype=np.int32) if counts else None)
    finite, inside = _scan_coordinates(pos, per)
    if not finite:
        raise ParameterError("pos contains non-finite coordinates")
    if not inside:  # wrapped in float64, as the reference wraps before measuring
        pos = _wrapped(pos, per)
    return _fof_impl(pos, per, ll, kmin, counts)


@numba.njit(cache=True, nogil=True)
def _class_rows(cls, order, ids, crossing, min_members):
    """(class, count, smallest id) of each run of ``cls[order]`` that has at least
    ``min_members`` rows or a crossing row; two passes, no per-particle temporaries."""
    m = order.shape[0]
    kept = 0
    for second in range(2):
        if second:
            out = np.empty((kept, 3), dtype=np.int64)
            kept = 0
        a = 0
        while a < m:
            c = cls[order[a]]
            b = a
            low = ids[order[a]]
            cross = False
            while b < m and cls[order[b]] == c:
                r = order[b]
                if ids[r] < low:
                    low = ids[r]
                cross = cross or crossing[r]
                b += 1
            if b - a >= min_members or cross:
                if second:
                    out[kept, 0] = c
                    out[kept, 1] = b - a
                    out[kept, 2] = low
                kept += 1
            a = b
    return out


def class_rows(cls, ids, crossing, min_members: int) -> np.ndarray:
    """Rows ``(class, count, smallest id)`` of the classes in ``cls`` that have at least
    ``min_members`` members or a ``crossing`` member, sorted by class (int64, host)."""
    order = np.argsort(cls)
    return _class_rows(cls, order, np.asarray(ids, dtype=np.int64), crossing, int(min_members))


@numba.njit(cache=True, nogil=True)
def _group_rows(root, cls, ids, crossing, min_members):
    """Counts and smallest ids per local group (indexed by its root row), then the rows of
    the groups kept, in root order; no sort."""
    n = root.shape[0]
    count = np.zeros(n, dtype=np.int64)
    low = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    for r in range(n):
        g = root[r]
        count[g] += 1
        if ids[r] < low[g]:
            low[g] = ids[r]
    kept = 0
    for g in range(n):
        if count[g] >= min_members or (count[g] > 0 and crossing[g]):
            kept += 1
    out = np.empty((kept, 3), dtype=np.int64)
    k = 0
    for g in range(n):
        if count[g] >= min_members or (count[g] > 0 and crossing[g]):
            out[k, 0] = cls[g]
            out[k, 1] = count[g]
            out[k, 2] = low[g]
            k += 1
    return out


def group_rows(root, cls, ids, crossing, min_members: int) -> np.ndarray:
    """Rows ``(class, count, smallest id)`` of one domain's local groups that have at least
    ``min_members`` members here or cross a domain face (int64), without sorting the
    particles; the CPU twin of
    :func:`cosmo_dask.halos.fof_kernels_gpu.group_rows_gpu` (same rows, same order).

    Parameters
    ----------
    root : numpy.ndarray
        (n,) local group of each owned row: the index of the group's smallest row
        (``root[r] == r`` for that row), as :func:`fof_local` returns for the owned rows,
        which come first.
    cls, crossing : numpy.ndarray
        (n,) class (int64) of each row and whether it crosses a domain face; both are the
        same for all rows of a local group.
    ids : numpy.ndarray
        (n,) particle ids (int64).
    min_members : int
        Groups with fewer rows here are kept only when they cross a face.

    Returns
    -------
    numpy.ndarray
        (rows, 3) int64 in increasing root order; a class can have several rows (local
        groups merged across domains): the catalog sums counts and takes the smallest id
        per class, as for :func:`class_rows`.
    """
    root = np.ascontiguousarray(root, dtype=np.int64)
    n = root.shape[0]
    if n and (root.min() < 0 or root.max() >= n):
        raise ParameterError(f"root must index the {n} rows given (owned rows first)")
    return _group_rows(root, np.ascontiguousarray(cls, dtype=np.int64),
                       np.ascontiguousarray(ids, dtype=np.int64),
                       np.ascontiguousarray(crossing, dtype=np.bool_), int(min_members))
