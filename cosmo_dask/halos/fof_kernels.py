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
4. Each friend pair (distance ``<= ll``, minimum image on periodic axes)
   increments both friend counts and is merged in a union-find forest (path
   halving, the smaller index becomes the root). With ``min_friends = k > 1``
   a first pass counts friends and a second pass merges only pairs whose two
   members both have at least ``k`` friends.

The labels returned are canonical: each particle's label is the smallest input
index in its group.
"""

from __future__ import annotations

import numba
import numpy as np

from ..errors import ParameterError

__all__ = ["canonical_labels", "check_arguments", "fof_local"]

# Cells are made this much (relatively) larger than the linking length, so that
# rounding in the cell index can never separate a pair at distance <= ll by two
# cells.
_SIDE_MARGIN = 1e-6
# At most this many cells along an axis (cell ids stay below 2**60).
_MAX_CELLS_PER_AXIS = 1 << 20

# Pass modes of _pair_pass.
_COUNT_AND_LINK = 0
_COUNT_ONLY = 1
_LINK_CORES = 2


@numba.njit(cache=True, inline="always")
def _wrap(x, L):
    """``x`` taken into ``[0, L)``; values at or beyond the ends included."""
    if x < 0.0 or x >= L:
        x = x - L * np.floor(x / L)
        if x >= L or x < 0.0:  # rounding at the ends of the period
            x = 0.0
    return x


@numba.njit(cache=True, nogil=True)
def _cell_ids(pos, periods, ll):
    """Integer cell id of every particle.

    Returns ``(ids, dims)``: the int64 cell ids and the number of cells per
    axis. Periodic coordinates are wrapped into ``[0, L)`` first; open axes
    use halved coordinates so that the extent cannot overflow.
    """
    m = pos.shape[0]
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
            lo = np.float64(pos[0, a])
            hi = lo
            for i in range(m):
                x = np.float64(pos[i, a])
                if x < lo:
                    lo = x
                elif x > hi:
                    hi = x
            half_lo = 0.5 * lo
            half_extent = 0.5 * hi - half_lo
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
    return ids, dims


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


@numba.njit(cache=True, inline="always")
def _find(parent, i):
    while parent[i] != i:
        p = parent[parent[i]]
        parent[i] = p
        i = p
    return i


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
def _visit(spos, i, j, L0, L1, L2, h0, h1, h2, ll2, count, link, friends, parent):
    """One candidate pair: when friends, count both and/or link them."""
    if _pair(spos, i, j, L0, L1, L2, h0, h1, h2, ll2):
        if count:
            friends[i] += 1
            friends[j] += 1
        if link:
            _union(parent, i, j)


@numba.njit(cache=True, nogil=True)
def _pair_pass(spos, cell_keys, cell_start, dims, periods, ll, mode, friends, parent, kmin):
    """Visit every particle pair in neighbouring cells once.

    ``mode`` 0 counts friends and links every friend pair, 1 only counts,
    2 only links pairs whose members both have ``friends >= kmin``.
    """
    nocc = cell_keys.shape[0]
    nx = dims[0]
    ny = dims[1]
    nz = dims[2]
    nyz = ny * nz
    per0 = periods[0] > 0.0
    per1 = periods[1] > 0.0
    per2 = periods[2] > 0.0
    L0 = periods[0]
    L1 = periods[1]
    L2 = periods[2]
    h0 = 0.5 * L0 if per0 else np.inf
    h1 = 0.5 * L1 if per1 else np.inf
    h2 = 0.5 * L2 if per2 else np.inf
    ll2 = ll * ll
    count = mode != _LINK_CORES
    link = mode != _COUNT_ONLY
    cores_only = mode == _LINK_CORES

    xs = np.empty(3, dtype=np.int64)
    ys = np.empty(3, dtype=np.int64)
    zlo = np.empty(2, dtype=np.int64)
    zhi = np.empty(2, dtype=np.int64)
    hints = np.zeros(18, dtype=np.int64)

    for a in range(nocc):
        key = cell_keys[a]
        cx = key // nyz
        rem = key - cx * nyz
        cy = rem // nz
        cz = rem - cy * nz
        sa = cell_start[a]
        ea = cell_start[a + 1]

        # pairs inside the cell
        for i in range(sa, ea):
            if cores_only and friends[i] < kmin:
                continue
            for j in range(i + 1, ea):
                if cores_only and friends[j] < kmin:
                    continue
                _visit(spos, i, j, L0, L1, L2, h0, h1, h2, ll2, count, link, friends, parent)

        # pairs with neighbour cells of larger id
        nxn = _axis_neighbours(cx, nx, per0, xs)
        nyn = _axis_neighbours(cy, ny, per1, ys)
        nzr = _last_axis_runs(cz, nz, per2, zlo, zhi)
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
                    if hi == lo:
                        continue
                    sb = cell_start[lo]
                    eb = cell_start[hi]
                    for i in range(sa, ea):
                        if cores_only and friends[i] < kmin:
                            continue
                        for j in range(sb, eb):
                            if cores_only and friends[j] < kmin:
                                continue
                            _visit(spos, i, j, L0, L1, L2, h0, h1, h2, ll2, count, link,
                                   friends, parent)


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


def _fof_impl(pos, periods, ll, min_friends):
    """The kernel on checked input; the steps run as separate calls so that each
    buffer is released as soon as it is done with (the memory peak is the sort,
    about 24 bytes per particle, or the pair pass, 36 with float32 positions).
    """
    m = pos.shape[0]
    itype = np.int32 if m < 2**31 - 1 else np.int64
    keys, dims = _cell_ids(pos, periods, ll)
    maxkey = int(dims[0] * dims[1] * dims[2] - 1)
    perm, skeys = _radix_argsort(keys, maxkey, np.empty(m, itype), np.empty(m, itype),
                                 np.empty(m, np.int64))
    del keys
    spos = _sorted_positions(pos, perm)
    cell_keys, cell_start = _occupied_cells(skeys, perm)
    del skeys
    friends = np.zeros(m, dtype=np.int32)
    parent = np.arange(m, dtype=itype)
    if min_friends <= 1:
        _pair_pass(spos, cell_keys, cell_start, dims, periods, ll, _COUNT_AND_LINK, friends,
                   parent, 0)
    else:
        _pair_pass(spos, cell_keys, cell_start, dims, periods, ll, _COUNT_ONLY, friends,
                   parent, 0)
        _pair_pass(spos, cell_keys, cell_start, dims, periods, ll, _LINK_CORES, friends,
                   parent, min_friends)
    del spos, cell_keys, cell_start
    return _input_order(parent, perm, friends)


def check_arguments(pos_shape, periods, linking_length, min_friends):
    """Check ``fof_local``'s arguments (shared with the GPU kernel); returns ``(per, ll, kmin)``."""
    if len(pos_shape) != 2 or pos_shape[1] != 3:
        raise ParameterError(f"pos must have shape (m, 3), got {tuple(pos_shape)}")
    if type(periods).__module__.split(".")[0] == "cupy":
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
    pos: np.ndarray, periods, linking_length: float, min_friends: int = 1
) -> tuple[np.ndarray, np.ndarray]:
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

    Returns
    -------
    root : numpy.ndarray
        int64, shape ``(m,)``: the smallest index of each particle's group.
    friends : numpy.ndarray
        int32, shape ``(m,)``: number of other particles within the linking
        length of each particle (independent of ``min_friends``).

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
    if m == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int32)
    finite, inside = _scan_coordinates(pos, per)
    if not finite:
        raise ParameterError("pos contains non-finite coordinates")
    if not inside:  # wrapped in float64, as the reference wraps before measuring
        pos = _wrapped(pos, per)
    return _fof_impl(pos, per, ll, kmin)


def canonical_labels(labels) -> np.ndarray:
    """Relabel a partition so each element's label is the smallest index of its group.

    Parameters
    ----------
    labels : array_like
        Any labelling, shape ``(m,)``; equal labels mean the same group.

    Returns
    -------
    numpy.ndarray
        int64, shape ``(m,)``: for each element the smallest index carrying the
        same label. Two labellings describe the same partition exactly when
        their canonical forms are equal.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ParameterError(f"labels must be one-dimensional, got shape {labels.shape}")
    if labels.size == 0:
        return np.empty(0, dtype=np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    return first[inverse].astype(np.int64)


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
