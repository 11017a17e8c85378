"""Pair counts of one domain in a periodic box (numba): the kernel of
:func:`cosmo_dask.analysis.correlation_function`.

A domain (:class:`~cosmo_dask.spatial.domains.DomainPart`) holds its owned particles
first and, after them, ghost copies of every particle within ``r_max`` of its region.
The kernel counts the pairs closer than ``r_max`` whose first member the domain owns,
binned in ``r`` (and in ``mu``, the cosine of the pair's angle to a line of sight):

* **auto** (one set): every pair ``(i, j)``, ``i != j``, with ``i`` owned, counted once
  per *ordered* pair: a pair of two owned particles counts 2, an owned-ghost pair 1.
  Summed over the domains this is twice the number of distinct pairs (every pair is
  counted by the domain of each member), Corrfunc's ``theory.DD`` convention for
  ``autocorr=1``.
* **cross** (two sets): every pair ``(i, j)`` with ``i`` an owned particle of the first
  set and ``j`` any particle of the second set's domain (owned or ghost), once.

Method: a cell list (cells of side at least ``r_max / k``, ``k`` = :data:`CELL_REFINE`)
over the domain's region plus its ghost shell, or over the whole period along an axis cut
into fewer than three domains (:func:`cell_geometry`); particles are sorted by cell with a
counting sort (owned particles first in each cell) into float64 coordinate arrays, so
that a cell is one contiguous range, and so is a run of consecutive cells along z. Each
cell visits the runs of its neighbour cells, a raw cell index outside ``[0, n)`` of a
wrapped axis standing for the image one period away (the run's shift). For auto counts
only the lexicographically positive half of the offsets is visited (a cell with itself
for ``j > i``), every pair's weight being ``own_i + own_j`` (1 for an owned particle, 0
for a ghost: ghost-ghost pairs count 0).

Counting without ``mu``: a (cell, run) block's squared separations are written to a
buffer row after row by a vectorised loop, those below ``r_max^2`` kept by a branch-free
compaction, and once the buffer holds :data:`FLUSH` values each squared edge ``e_t``
counts the values below it with a vectorised comparison: cumulative counts, whose
differences are the bins. No histogram scatter and no branch depends on a pair. With
``mu``: a scalar loop bins each pair (a table over ``[0, r_max^2)`` guesses the ``r`` bin,
two comparisons with the squared edges correct it; a binary search over the squared
``mu`` edges). Threads (``numba.prange``) take blocks of cells, each block with its own
histogram, summed at the end: the counts do not depend on the threads.

Exactness: separations are ``x_j - (x_i - shift)`` in float64 (float32 positions are
widened exactly), squared and summed in float64 without fused multiply-adds (no
``fastmath``), and compared with the float64 squares of the bin edges: a pair is in bin
``b`` when ``r_b^2 <= d^2 < r_{b+1}^2``, as in Corrfunc. ``mu = |d . los| / |d|`` (0 for
``d = 0``); bin ``m`` holds ``mu_m <= mu < mu_{m+1}``, the last bin closed.

Speed (2-core VM, 1e6 uniform particles in a 500 Mpc/h box, r_max = 20 Mpc/h, 20 bins):
``benchmarks/RESULTS.md``, "Correlation functions: ``xi``".
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

__all__ = ["CELL_REFINE", "bin_table", "cell_geometry", "count_bins", "pair_count"]

#: cells per ``r_max`` along an axis (cells of side ``>= r_max / CELL_REFINE``): 2 tests
#: about 125/8 ~ 16 cell volumes of r_max^3 / 8 per particle instead of 27 (k = 1)
CELL_REFINE = 2
#: slots of the first-guess bin table over ``[0, r_max^2)``
TABLE_SLOTS = 4096
#: kept squared separations counted at once (the counts' vector loops run long)
FLUSH = 1024
#: cells per particle at most (the cell arrays stay a few bytes per particle)
MAX_CELLS_PER_PARTICLE = 4


def cell_geometry(box: float, r_max: float, lo, width, shape, n_particles: int,
                  refine: int = CELL_REFINE) -> np.ndarray:
    """The cell list of one domain: a float64 ``(6, 3)`` table, one column per axis.

    Rows: ``base``, ``cut``, ``origin``, ``side``, ``n`` (cells), ``wrapped`` (1.0 or
    0.0). A coordinate's local value is ``u = (x - base) mod box``, less ``box`` when
    above ``cut``; its cell ``floor((u - origin) / side)``, clipped to ``[0, n)``.
    Along an axis cut into three domains or more the cells cover the domain and its
    ghost shell, ``[lo - r_max, lo + width + r_max)``, not wrapped; along an axis cut
    into one or two the cells cover the whole period and neighbours wrap. Cell sides
    are at least ``r_max / refine`` (so that ``refine`` cells either way hold every
    partner); fewer, larger cells keep the cell count at most
    :data:`MAX_CELLS_PER_PARTICLE` per particle (and 64 at least).
    """
    box, r_max = float(box), float(r_max)
    lo = np.asarray(lo, dtype=np.float64)
    width = np.asarray(width, dtype=np.float64)
    side = r_max / refine * (1 + 1e-12)
    geo = np.zeros((6, 3))
    n = np.zeros(3, dtype=np.int64)
    for a in range(3):
        if shape[a] < 3:
            n[a] = max(1, int(math.floor(box / side)))
        else:
            n[a] = max(1, int(math.ceil((width[a] + 2 * r_max) / side)) + 1)
    cap = max(64, MAX_CELLS_PER_PARTICLE * int(n_particles))
    while int(np.prod(n)) > cap:  # coarser cells along the finest axis
        a = int(np.argmax(n))
        n[a] = max(1, (n[a] * 3) // 4)
    for a in range(3):
        if shape[a] < 3:
            geo[:, a] = (0.0, 2.0 * box, 0.0, box / n[a], n[a], 1.0)
        else:
            s = max(side, (width[a] + 2 * r_max) / max(n[a] - 1, 1))
            geo[:, a] = (lo[a], 0.5 * (width[a] + box), -r_max * (1 + 1e-12), s, n[a], 0.0)
    return geo


def count_bins(r_edges, mu_edges, los):
    """The bins as the kernels (numba and CUDA) take them: ``(squared separation edges,
    r bins, mu bins, squared mu edges, line of sight)``, float64; one mu bin over
    ``[0, 0]`` and a zero line of sight without ``mu_edges``."""
    r_edges = np.asarray(r_edges, dtype=np.float64)
    if mu_edges is None:
        return r_edges * r_edges, len(r_edges) - 1, 1, np.zeros(2), np.zeros(3)
    mu = np.asarray(mu_edges, dtype=np.float64)
    return (r_edges * r_edges, len(r_edges) - 1, len(mu) - 1, mu * mu,
            np.asarray(los, dtype=np.float64))


def bin_table(edges2: np.ndarray, slots: int = TABLE_SLOTS) -> tuple[np.ndarray, float]:
    """``(table, scale)``: ``table[int(r2 * scale)]`` is a first guess of the bin of
    ``r2`` (``-1`` below the first edge, ``nbins`` from the last), ``edges2[-1]`` being
    ``r_max^2`` (slots past the last one read the last)."""
    scale = slots / float(edges2[-1])
    lows = np.arange(slots + 2, dtype=np.float64) / scale
    return np.searchsorted(edges2, lows, side="right").astype(np.int64) - 1, scale


# ----------------------------------------------------------------------------- cells
@nb.njit(cache=True)
def _sort_cells(pos, geo, box, owned_rows):
    """A counting sort of the particles by cell: sorted float64 coordinates (an axis
    cut into three domains or more: the image nearest the domain), ``start``
    (ncell + 1,) and ``own`` (1 for an owned particle, 0 for a ghost), owned particles
    (rows < owned_rows) first in each cell."""
    m = pos.shape[0]
    nx, ny, nz = int(geo[4, 0]), int(geo[4, 1]), int(geo[4, 2])
    ncell = nx * ny * nz
    ns = (nx, ny, nz)
    cid = np.empty(m, np.int64)
    loc = np.empty((m, 3), np.float64)
    for i in range(m):
        c = 0
        for a in range(3):
            x = float(pos[i, a])
            if x < 0.0 or x >= box:
                x = x - box * math.floor(x / box)
                if x >= box:
                    x = 0.0
            if geo[5, a] == 0.0:  # open axis: the image nearest the domain
                if x - geo[0, a] > geo[1, a]:
                    x -= box
                elif x - geo[0, a] <= geo[1, a] - box:
                    x += box
                u = x - geo[0, a]
            else:
                u = x
            t = int(math.floor((u - geo[2, a]) / geo[3, a]))
            if t < 0:
                t = 0
            elif t >= ns[a]:
                t = ns[a] - 1
            c = c * ns[a] + t
            loc[i, a] = x
        cid[i] = c
    start = np.zeros(ncell + 1, np.int64)
    n_own = np.zeros(ncell, np.int64)
    for i in range(m):
        start[cid[i] + 1] += 1
        if i < owned_rows:
            n_own[cid[i]] += 1
    for c in range(ncell):
        start[c + 1] += start[c]
    p_own = start[:-1].copy()
    p_ghost = start[:-1] + n_own
    xs = np.empty(m, np.float64)
    ys = np.empty(m, np.float64)
    zs = np.empty(m, np.float64)
    own = np.zeros(m, np.int64)
    for i in range(m):
        c = cid[i]
        if i < owned_rows:
            k = p_own[c]
            p_own[c] += 1
            own[k] = 1
        else:
            k = p_ghost[c]
            p_ghost[c] += 1
        xs[k] = loc[i, 0]
        ys[k] = loc[i, 1]
        zs[k] = loc[i, 2]
    return xs, ys, zs, start, n_own, own


# ----------------------------------------------------------------------------- counts
@nb.njit(cache=True, inline="always")
def _bin(r2, table, scale, e2x, top):
    """The bin of r2 plus one: 0 below the first edge, nbins + 1 from the last; exact
    (the table's guess is corrected by comparisons with the squared edges)."""
    f = r2 * scale
    if f > top:  # no branch in practice: compiled to a select
        f = top
    b = table[int(f)]
    while r2 >= e2x[b + 1]:
        b += 1
    while b >= 0 and r2 < e2x[b]:
        b -= 1
    return b + 1


@nb.njit(cache=True)
def _keep_below(buf, wbuf, n0, n, lim, weighted):
    """Compact ``buf[n0:n]`` (and ``wbuf``) to the values below ``lim``, in order, from
    ``n0`` on; returns the new end (a store and an add per value, no branch)."""
    m = n0
    if weighted:
        for q in range(n0, n):
            v = buf[q]
            buf[m] = v
            wbuf[m] = wbuf[q]
            m += v < lim
        return m
    for q in range(n0, n):
        v = buf[q]
        buf[m] = v
        m += v < lim
    return m


@nb.njit(cache=True)
def _count_below(cum, buf, wbuf, n, e2, weighted, w):
    """``cum[t] += weight of the values of buf[:n] below e2[t]`` for every edge ``t``
    (``wbuf``'s weights, or ``w`` each): one vectorised count per edge."""
    for t in range(e2.shape[0]):
        e = e2[t]
        c = 0
        if weighted:
            for q in range(n):
                c += wbuf[q] if buf[q] < e else 0
            cum[t] += c
        else:
            for q in range(n):
                c += buf[q] < e
            cum[t] += c * w


@nb.njit(cache=True)
def _smu_row(h, i, j0, j1, xi, yi, zi, wi, xs2, ys2, zs2, own_j, table, scale, e2x, top,
             nmu, mu2e, lx, ly, lz):
    """(r, mu) counts of the pairs of i (at (xi, yi, zi) in the run's frame) with
    [j0, j1): ``h[(bin + 1) * nmu + mu bin] += own_i + own_j``."""
    for j in range(j0, j1):
        dx = xs2[j] - xi
        dy = ys2[j] - yi
        dz = zs2[j] - zi
        r2 = dx * dx + dy * dy + dz * dz
        b = _bin(r2, table, scale, e2x, top)
        w = wi + own_j[j]
        if b == 0 or b == e2x.shape[0] - 1 or w == 0:
            continue
        q = 0.0
        if r2 > 0.0:
            d = dx * lx + dy * ly + dz * lz
            q = min(d * d / r2, 1.0)  # mu^2
        if q < mu2e[0] or q > mu2e[nmu]:
            continue
        m0, m1 = 0, nmu  # the largest m < nmu with mu2e[m] <= q
        while m1 - m0 > 1:
            mid = (m0 + m1) // 2
            if mu2e[mid] <= q:
                m0 = mid
            else:
                m1 = mid
        h[b * nmu + m0] += w


@nb.njit(cache=True)
def _block(i0, i1, j0, j1, xs, ys, zs, own_i, xs2, ys2, zs2, own_j, sx, sy, sz, self_,
           weighted, rmax2, buf, wbuf, n):
    """The pairs of particles i in [i0, i1) with the run [j0, j1) of neighbour cells
    shifted by (sx, sy, sz) (j > i when ``self_``): their squared separations are
    appended to ``buf[n:]`` row after row (a vectorised loop per row), with their
    weights ``own_i + own_j`` in ``wbuf`` when ``weighted``, and only those below
    ``r_max^2`` kept (:func:`_keep_below`). Returns the buffers (grown when too small)
    and the new end."""
    need = n + (i1 - i0) * (j1 - j0)
    if need > buf.shape[0]:
        grown = np.empty(2 * need, np.float64)
        grown[:n] = buf[:n]
        wgrown = np.empty(2 * need, np.int64)
        wgrown[:n] = wbuf[:n]
        buf, wbuf = grown, wgrown
    n0 = n
    for i in range(i0, i1):
        xi, yi, zi = xs[i] - sx, ys[i] - sy, zs[i] - sz
        lo = i + 1 if self_ else j0
        m = j1 - lo
        if m <= 0:
            continue
        b = buf[n:n + m]
        x, y, z = xs2[lo:j1], ys2[lo:j1], zs2[lo:j1]
        for q in range(m):
            dx = x[q] - xi
            dy = y[q] - yi
            dz = z[q] - zi
            b[q] = dx * dx + dy * dy + dz * dz
        if weighted:
            wb, ow, wi = wbuf[n:n + m], own_j[lo:j1], own_i[i]
            for q in range(m):
                wb[q] = wi + ow[q]
        n += m
    return buf, wbuf, _keep_below(buf, wbuf, n0, n, rmax2, weighted)


@nb.njit(cache=True, parallel=True)
def _count(xs, ys, zs, start, own, xs2, ys2, zs2, start2, own2, geo, k, box, auto, weighted,
           table, scale, e2x, nmu, mu2e, los, blocks):
    """Per block of cells: ``(blocks, nbins + 1)`` cumulative counts (pairs with
    ``r^2 < e2[t]``) without ``mu``; ``(blocks, (nbins + 2) nmu)`` binned counts
    (under- and overflow rows first and last) with ``mu``."""
    nx, ny, nz = int(geo[4, 0]), int(geo[4, 1]), int(geo[4, 2])
    wrap = (geo[5, 0] != 0.0, geo[5, 1] != 0.0, geo[5, 2] != 0.0)
    ncell = nx * ny * nz
    ne = e2x.shape[0] - 1  # the edges
    width = ne if nmu == 1 else (ne + 1) * nmu
    hist = np.zeros((blocks, width), np.int64)
    e2 = e2x[:ne].copy()
    rmax2 = e2[ne - 1]
    top = float(table.shape[0] - 1)
    lx, ly, lz = los[0], los[1], los[2]
    w = 1 if not auto else 2  # the weight of every pair when not weighted
    for blk in nb.prange(blocks):
        h = hist[blk]
        buf = np.empty(2 * FLUSH, np.float64)
        wbuf = np.empty(2 * FLUSH, np.int64)
        n = 0
        for a in range(blk * ncell // blocks, (blk + 1) * ncell // blocks):
            a0, a1 = start[a], start[a + 1]
            if a1 == a0:
                continue
            ax, rem = a // (ny * nz), a % (ny * nz)
            ay, az = rem // nz, rem % nz
            for ox in range(-k, k + 1):
                if auto and ox < 0:
                    continue  # half of the offsets, in lexicographic order
                tx, sx = ax + ox, 0.0
                if wrap[0]:
                    sx = box * (tx // nx)
                    tx = tx % nx
                elif tx < 0 or tx >= nx:
                    continue
                for oy in range(-k, k + 1):
                    if auto and ox == 0 and oy < 0:
                        continue
                    ty, sy = ay + oy, 0.0
                    if wrap[1]:
                        sy = box * (ty // ny)
                        ty = ty % ny
                    elif ty < 0 or ty >= ny:
                        continue
                    row = (tx * ny + ty) * nz
                    oz = 0 if auto and ox == 0 and oy == 0 else -k
                    # runs of consecutive cells along z with one shift: one range
                    while oz <= k:
                        self_ = auto and ox == 0 and oy == 0 and oz == 0
                        tz = az + oz
                        sz = 0.0
                        if wrap[2]:
                            sz = box * (tz // nz)
                            tz = tz % nz
                        elif tz < 0 or tz >= nz:
                            oz += 1
                            continue
                        tz_end = tz
                        while oz + 1 <= k and 0 <= az + oz and az + oz + 1 < nz:
                            oz += 1
                            tz_end += 1
                        oz += 1
                        j0, j1 = start2[row + tz], start2[row + tz_end + 1]
                        if j1 == j0:
                            continue
                        if nmu == 1:
                            buf, wbuf, n = _block(a0, a1, j0, j1, xs, ys, zs, own, xs2, ys2,
                                                  zs2, own2, sx, sy, sz, self_, weighted,
                                                  rmax2, buf, wbuf, n)
                            if n >= FLUSH:
                                _count_below(h, buf, wbuf, n, e2, weighted, w)
                                n = 0
                            continue
                        for i in range(a0, a1):
                            jl = i + 1 if self_ else j0
                            _smu_row(h, i, jl, j1, xs[i] - sx, ys[i] - sy, zs[i] - sz,
                                     own[i], xs2, ys2, zs2, own2, table, scale, e2x, top,
                                     nmu, mu2e, lx, ly, lz)
        if n > 0:
            _count_below(h, buf, wbuf, n, e2, weighted, w)
    return hist


def pair_count(pos, n_owned: int, geometry: np.ndarray, r_edges: np.ndarray,
               mu_edges: np.ndarray | None, los: np.ndarray | None, box_size: float,
               pos2=None) -> np.ndarray:
    """Pair counts of one domain (module docstring for the conventions).

    Parameters
    ----------
    pos : numpy.ndarray
        (m, 3) positions (float32 or float64, length units), the ``n_owned`` owned
        particles first, then ghosts; for a cross count only the owned rows are read.
    n_owned : int
        Owned rows of ``pos``.
    geometry : numpy.ndarray
        The domain's cell list, :func:`cell_geometry`.
    r_edges : numpy.ndarray
        (nr + 1,) increasing float64 separation bin edges (length units), the last
        one ``r_max``.
    mu_edges : numpy.ndarray or None
        (nmu + 1,) increasing edges in ``[0, 1]`` of ``mu`` bins (None: no ``mu``).
    los : numpy.ndarray or None
        Unit 3-vector of the line of sight (with ``mu_edges``).
    box_size : float
        The period (length units).
    pos2 : numpy.ndarray, optional
        A second set's domain (owned and ghost rows): cross counts of ``pos``'s
        owned rows with all of it.

    Returns
    -------
    numpy.ndarray
        int64 ``(nr, nmu)`` (``nmu = 1`` without ``mu``): ordered pairs whose first
        member is owned (auto), or owned-any pairs (cross).
    """
    e2, nr, nmu, mu2e, los = count_bins(r_edges, mu_edges, los)
    table, scale = bin_table(e2)
    e2x = np.append(e2, np.inf)
    geometry = np.ascontiguousarray(geometry, dtype=np.float64)
    box = float(box_size)
    auto = pos2 is None
    n_owned = int(n_owned)
    if n_owned == 0 or (not auto and len(pos2) == 0):
        return np.zeros((nr, nmu), np.int64)
    if auto:
        xs, ys, zs, start, _, own = _sort_cells(pos, geometry, box, n_owned)
        xs2, ys2, zs2, start2, own2 = xs, ys, zs, start, own
    else:  # weight own_i + own_j = 1 + 0 for every pair
        xs, ys, zs, start, _, own = _sort_cells(pos[:n_owned], geometry, box, n_owned)
        xs2, ys2, zs2, start2, _, own2 = _sort_cells(pos2, geometry, box, 0)
    blocks = max(1, min(len(start) - 1, 64 * nb.get_num_threads()))
    # weights own_i + own_j differ only in an auto count with ghosts
    weighted = auto and n_owned < len(pos)
    hist = _count(xs, ys, zs, start, own, xs2, ys2, zs2, start2, own2, geometry,
                  CELL_REFINE, box, auto, weighted, table, scale, e2x, nmu, mu2e, los,
                  blocks)
    hist = hist.sum(axis=0)
    if nmu == 1:
        return np.diff(hist).reshape(nr, 1)
    return hist.reshape(nr + 2, nmu)[1:-1]
