"""Exact volume of the intersection of tetrahedra with axis-aligned cubes (numba).

Two kernels: :func:`tet_cube_volume_cpu` clips each (tetrahedron, cube) pair on its
own; :func:`deposit_tets_cpu` voxelises each tetrahedron onto a regular grid in one
pass. Both are exact up to float64 rounding.

Pairwise clip (Kaehler's phase-space-element deposit, ADECO section 6.3)
------------------------------------------------------------------------
The tetrahedron is moved to cube-local coordinates (cube corner at the origin)
and clipped successively against the cube's six planes ``x >= 0``, ``x <= h``,
``y >= 0``, ... . Clipping one tetrahedron against one plane leaves nothing
(no vertex strictly inside), the tetrahedron itself (no vertex outside), one
smaller tetrahedron (one vertex inside) or a triangular prism (two or three
vertices inside) that is split into three tetrahedra. The pieces are processed
depth first, so at most ``1 + 2*6 = 13`` tetrahedra are held at once (a fixed
16-slot stack, no allocation per call); the volume is the sum of ``|det|/6`` of
the pieces that survive all six planes. Intersection points get the plane
coordinate exactly (0 or ``h``), so neighbouring cubes split a tetrahedron
along the same plane.

Fast paths, tried first and in this order: bounding boxes disjoint (0); the
tetrahedron's bounding box inside the cube (its volume); zero-volume tetrahedron
(0); the cube entirely outside one face plane of the tetrahedron (0); all 8 cube
corners inside all 4 face planes (``h^3``). For the face-plane tests the extreme
corner of the cube along each face normal is found from the normal's signs, so
the 8-corner test costs 4 dot products.

Cost: a fast path costs a few dozen flops; a full clip up to ~6 * 13 plane
tests and ~3^k prism splits for the k planes that cut (in practice a cut cell
makes 5-30 pieces, ~1-3 microseconds on one core). Arithmetic is float64
throughout: float32 inputs are converted to float64 first, results are float64.

Grid deposit: the four faces, cut hierarchically
------------------------------------------------
A stretched z=0 tetrahedron cuts most cells of its bounding box, so clipping
each cell afresh made the deposit cost ~1 microsecond per cut cell. Instead, in
the spirit of r3d's voxelisation (Powell & Abel 2015, ADECO ref. 24), each
tetrahedron is cut once per grid plane, but what is cut are its four faces, not
the solid, which leaves only convex polygons (no polyhedron topology):

* Divergence theorem with the field ``(0, 0, z - k)`` on the part of the
  tetrahedron in cell ``(i, j, k)``: the column's walls are vertical and the
  cell's bottom has ``z = k``, so neither contributes, and the cell's volume
  is the sum over the four faces of the xy integral of ``clamp(z, k, k+1) - k``
  over the face's piece in column ``(i, j)``, counted + for faces looking up
  and - for faces looking down (the sign of the piece's xy orientation).
* The face triangles are cut (Sutherland-Hodgman, both sides kept) once per x
  plane into slab pieces, those once per y plane into column pieces, and each
  column piece from the top down once per z plane into bands. The band in cell
  k adds its integral of ``z - k`` (fan triangles; exact for linear z) plus
  the area of the bands above it; the cells below the piece get its whole
  area, so cells the tetrahedron fills cost no geometry. Each level's extent
  comes from its own pieces, so only columns and cells the faces reach are
  visited, and a partly outside tetrahedron (a patch of a larger grid) is cut
  at the grid's edge first.
* Cut points are interpolated from the end below the plane and get the plane
  coordinate exactly, so the two faces of an edge cut it at the same point.
  Coordinates are relative to the tetrahedron's first cell. The local z
  (flux) axis is the grid axis along which the tetrahedron's projected area is
  smallest: smaller face terms, hence smaller rounding (and ~6% less work).
* Polygons have room for 32 vertices (a triangle cut by six planes has 9). A
  rounding pathology that would overflow resumes the tetrahedron from the
  failed column with 4x the room (same arithmetic, same result).

Cost: ~5 microseconds per tetrahedron of a z=0 Zel'dovich snapshot on one core;
throughput, agreement with the per-cell clips and exact-arithmetic checks are in
``benchmarks/RESULTS.md`` (Densities, tetrahedron deposit on the CPU).

Entry points: :func:`tet_cube_volume_cpu` (many tetrahedra x many cubes) and
:func:`deposit_tets_cpu` (mass of tetrahedra onto a regular grid), the CPU kernels
of the contracts ``tet_cube_volume_kernel`` and ``deposit_tets_kernel``
(:mod:`.dispatch`; GPU twins in :mod:`.tet_volume_gpu`). The public functions
:func:`~cosmo_dask.density.tet_cube_volume` and :func:`~cosmo_dask.density.deposit_tets`
are in :mod:`.tetrahedra`.
"""

from __future__ import annotations

import numba
import numpy as np

from ..core.errors import ParameterError

_STACK = 16


# --------------------------------------------------------------------------- geometry core
@numba.njit(cache=True, inline="always")
def _det6(s, t):
    """6 x signed volume of tetrahedron ``s[t]`` (``s`` is (K, 4, 3))."""
    ax = s[t, 1, 0] - s[t, 0, 0]
    ay = s[t, 1, 1] - s[t, 0, 1]
    az = s[t, 1, 2] - s[t, 0, 2]
    bx = s[t, 2, 0] - s[t, 0, 0]
    by = s[t, 2, 1] - s[t, 0, 1]
    bz = s[t, 2, 2] - s[t, 0, 2]
    cx = s[t, 3, 0] - s[t, 0, 0]
    cy = s[t, 3, 1] - s[t, 0, 1]
    cz = s[t, 3, 2] - s[t, 0, 2]
    return ax * (by * cz - bz * cy) - ay * (bx * cz - bz * cx) + az * (bx * cy - by * cx)


@numba.njit(cache=True, inline="always")
def _cut(cur, d, p, q, ax, plane, out, t, slot):
    """out[t, slot] = point on edge p-q (p inside, q outside) where the plane cuts it."""
    w = d[p] / (d[p] - d[q])
    for c in range(3):
        out[t, slot, c] = cur[p, c] + w * (cur[q, c] - cur[p, c])
    out[t, slot, ax] = plane


@numba.njit(cache=True, inline="always")
def _copy_pt(cur, p, out, t, slot):
    for c in range(3):
        out[t, slot, c] = cur[p, c]


@numba.njit(nogil=True, cache=True)
def _prism(tmp, out, t):
    """Split prism tmp[0..2] (bottom) / tmp[3..5] (top, lateral edges i - i+3) into 3 tets."""
    # (a0, a1, a2, b0), (a1, a2, b0, b1), (a2, b0, b1, b2)
    order = ((0, 1, 2, 3), (1, 2, 3, 4), (2, 3, 4, 5))
    for k in range(3):
        for v in range(4):
            src = order[k][v]
            for c in range(3):
                out[t + k, v, c] = tmp[src, c]


@numba.njit(nogil=True, cache=True)
def clip_volume(stack, lev, cur, d, tmp, h, inside, outside):
    """Volume of ``stack[0]`` (cube-local coordinates) inside the cube ``[0, h]^3``.

    ``stack`` (16, 4, 3), ``lev`` (>= 16,) int, ``cur`` (4, 3), ``d`` (4,), ``tmp`` (6, 3),
    ``inside``/``outside`` (4,) int are scratch buffers owned by the caller.
    Depth-first clipping against the six planes; returns the float64 volume (>= 0).
    """
    vol = 0.0
    top = 1
    lev[0] = 0
    while top > 0:
        top -= 1
        for v in range(4):
            for c in range(3):
                cur[v, c] = stack[top, v, c]
        level = lev[top]
        dropped = False
        split = False
        while level < 6:
            ax = level >> 1
            upper = level & 1
            plane = h if upper else 0.0
            nin = 0
            nout = 0
            for v in range(4):
                dv = (h - cur[v, ax]) if upper else cur[v, ax]
                d[v] = dv
                if dv > 0.0:
                    inside[nin] = v
                    nin += 1
                else:
                    outside[nout] = v
                    nout += 1
            if nin == 0:
                dropped = True
                break
            if nout == 0:
                level += 1
                continue
            t = top
            if nin == 1:
                a = inside[0]
                _copy_pt(cur, a, stack, t, 0)
                for k in range(3):
                    _cut(cur, d, a, outside[k], ax, plane, stack, t, k + 1)
                lev[t] = level + 1
                top += 1
            elif nin == 2:
                a = inside[0]
                b = inside[1]
                c0 = outside[0]
                c1 = outside[1]
                # bottom (a, ac0, ac1), top (b, bc0, bc1)
                for c in range(3):
                    tmp[0, c] = cur[a, c]
                    tmp[3, c] = cur[b, c]
                wa0 = d[a] / (d[a] - d[c0])
                wa1 = d[a] / (d[a] - d[c1])
                wb0 = d[b] / (d[b] - d[c0])
                wb1 = d[b] / (d[b] - d[c1])
                for c in range(3):
                    tmp[1, c] = cur[a, c] + wa0 * (cur[c0, c] - cur[a, c])
                    tmp[2, c] = cur[a, c] + wa1 * (cur[c1, c] - cur[a, c])
                    tmp[4, c] = cur[b, c] + wb0 * (cur[c0, c] - cur[b, c])
                    tmp[5, c] = cur[b, c] + wb1 * (cur[c1, c] - cur[b, c])
                tmp[1, ax] = plane
                tmp[2, ax] = plane
                tmp[4, ax] = plane
                tmp[5, ax] = plane
                _prism(tmp, stack, t)
                lev[t] = level + 1
                lev[t + 1] = level + 1
                lev[t + 2] = level + 1
                top += 3
            else:  # nin == 3
                e = outside[0]
                for k in range(3):
                    a = inside[k]
                    w = d[a] / (d[a] - d[e])
                    for c in range(3):
                        tmp[k, c] = cur[a, c]
                        tmp[k + 3, c] = cur[a, c] + w * (cur[e, c] - cur[a, c])
                    tmp[k + 3, ax] = plane
                _prism(tmp, stack, t)
                lev[t] = level + 1
                lev[t + 1] = level + 1
                lev[t + 2] = level + 1
                top += 3
            split = True
            break
        if dropped or split:
            continue
        # survived all planes
        for v in range(4):
            for c in range(3):
                stack[top, v, c] = cur[v, c]
        vol += abs(_det6(stack, top)) / 6.0
    return vol


@numba.njit(nogil=True, cache=True)
def _face_planes(v, nrm, off):
    """Inward face planes of tetrahedron ``v`` (4, 3): ``nrm[f] . x + off[f] >= 0`` inside.

    Face f is opposite vertex f. Returns 6 x signed volume (0 for a degenerate tet).
    """
    faces = ((1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2))
    for f in range(4):
        a, b, c = faces[f]
        ux = v[b, 0] - v[a, 0]
        uy = v[b, 1] - v[a, 1]
        uz = v[b, 2] - v[a, 2]
        wx = v[c, 0] - v[a, 0]
        wy = v[c, 1] - v[a, 1]
        wz = v[c, 2] - v[a, 2]
        nx = uy * wz - uz * wy
        ny = uz * wx - ux * wz
        nz = ux * wy - uy * wx
        o = -(nx * v[a, 0] + ny * v[a, 1] + nz * v[a, 2])
        s = nx * v[f, 0] + ny * v[f, 1] + nz * v[f, 2] + o
        if s < 0.0:
            nx, ny, nz, o = -nx, -ny, -nz, -o
        nrm[f, 0] = nx
        nrm[f, 1] = ny
        nrm[f, 2] = nz
        off[f] = o
    ax = v[1, 0] - v[0, 0]
    ay = v[1, 1] - v[0, 1]
    az = v[1, 2] - v[0, 2]
    bx = v[2, 0] - v[0, 0]
    by = v[2, 1] - v[0, 1]
    bz = v[2, 2] - v[0, 2]
    cx = v[3, 0] - v[0, 0]
    cy = v[3, 1] - v[0, 1]
    cz = v[3, 2] - v[0, 2]
    return ax * (by * cz - bz * cy) - ay * (bx * cz - bz * cx) + az * (bx * cy - by * cx)


@numba.njit(nogil=True, cache=True)
def _classify(nrm, off, lo, h):
    """-1: cube outside a face plane (volume 0); 1: cube inside all four; 0: undecided."""
    all_in = True
    for f in range(4):
        base = nrm[f, 0] * lo[0] + nrm[f, 1] * lo[1] + nrm[f, 2] * lo[2] + off[f]
        pos = 0.0
        neg = 0.0
        for c in range(3):
            t = nrm[f, c] * h
            if t > 0.0:
                pos += t
            else:
                neg += t
        if base + pos <= 0.0:
            return -1
        if base + neg < 0.0:
            all_in = False
    return 1 if all_in else 0


@numba.njit(nogil=True, cache=True)
def _pair_volume(v, vol, nrm, off, bmin, bmax, lo, h, stack, lev, cur, d, tmp):
    """Overlap of tet ``v`` (precomputed volume, planes, bbox) with cube ``lo + [0, h]^3``."""
    inside_box = True
    for c in range(3):
        if bmax[c] <= lo[c] or bmin[c] >= lo[c] + h:
            return 0.0
        if bmin[c] < lo[c] or bmax[c] > lo[c] + h:
            inside_box = False
    if inside_box:
        return vol
    if vol == 0.0:
        return 0.0
    cls = _classify(nrm, off, lo, h)
    if cls < 0:
        return 0.0
    if cls > 0:
        return h * h * h
    for k in range(4):
        for c in range(3):
            stack[0, k, c] = v[k, c] - lo[c]
    return clip_volume(stack, lev, cur, d, tmp, h, lev[_STACK:_STACK + 4],
                       lev[_STACK + 4:_STACK + 8])


@numba.njit(nogil=True, cache=True, parallel=True)
def _volumes_cpu(tets, lo, h, out):
    nt = tets.shape[0]
    nc = lo.shape[0]
    for t in numba.prange(nt):
        stack = np.empty((_STACK, 4, 3))
        lev = np.empty(_STACK + 8, np.int64)
        cur = np.empty((4, 3))
        d = np.empty(4)
        tmp = np.empty((6, 3))
        nrm = np.empty((4, 3))
        off = np.empty(4)
        bmin = np.empty(3)
        bmax = np.empty(3)
        v = tets[t]
        vol = abs(_face_planes(v, nrm, off)) / 6.0
        for c in range(3):
            bmin[c] = min(min(v[0, c], v[1, c]), min(v[2, c], v[3, c]))
            bmax[c] = max(max(v[0, c], v[1, c]), max(v[2, c], v[3, c]))
        for j in range(nc):
            out[t, j] = _pair_volume(v, vol, nrm, off, bmin, bmax, lo[j], h[j],
                                     stack, lev, cur, d, tmp)


# --------------------------------------------------------------------------- deposit
# Face polygons live in one flat array Q: polygon (slot, face) starts at w * (4 * slot +
# face), w = 3 * capacity, and holds C[4 * slot + face] vertices (x, y, z). Slots: 0 the
# tetrahedron's faces; 1, 2 their parts above the current x plane; 3 the x slab piece;
# 4, 5 the parts above the current y plane; 6 the column piece; 7, 8 the part below the
# current z plane; 9 the z band.
_CAP = 32  # vertices per polygon; convex pieces have at most 9 (a triangle cut by 6 planes)
_NPOLY = 10
# levels: (piece slot, remainder slots, axis[, slot of the faces]); _column hard-codes the
# z level's. Read from arrays, not written as literal ints, so that numba compiles _peel
# and _cell_range once each instead of once per combination of literal arguments.
_XLEV = np.array([3, 1, 2, 0, 0], dtype=np.int64)
_YLEV = np.array([6, 4, 5, 1], dtype=np.int64)
_ZLEV = np.array([9, 7, 8, 2], dtype=np.int64)
# faces of a positively oriented tetrahedron, counter-clockwise seen from outside
_FACES = np.array([[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]], dtype=np.int64)


@numba.njit(cache=True, inline="always")
def _split_poly(Q, C, w, f, s, lo, hi, ax, c):
    """Cut polygon (``s``, ``f``) by the plane ``x[ax] = c``: the part below goes to
    (``lo``, ``f``), the part above to (``hi``, ``f``) (``w``: polygon stride). False if
    an output could overflow (only for polygons of more than w / 6 vertices).

    Sutherland-Hodgman with both outputs: vertices on the plane go to both sides, and a
    polygon with no vertex strictly on one side goes whole to the other (that side is
    left empty). A cut point is interpolated from the end below the plane, so an edge
    shared by two faces is cut at the same point in both, and gets ``x[ax] = c`` exactly.
    """
    ps = 4 * s + f
    pl = 4 * lo + f
    ph = 4 * hi + f
    n = C[ps]
    if 6 * n > w:
        return False
    bs = w * ps
    bl = w * pl
    bh = w * ph
    below = False
    above = False
    nlo = 0
    nhi = 0
    p = bs + 3 * (n - 1)
    dp = Q[p + ax] - c
    for v in range(n):
        pv = bs + 3 * v
        dv = Q[pv + ax] - c
        if (dp < 0.0 and dv > 0.0) or (dp > 0.0 and dv < 0.0):
            if dp < 0.0:
                a = p
                b = pv
                da = dp
                db = dv
            else:
                a = pv
                b = p
                da = dv
                db = dp
            t = da / (da - db)
            ol = bl + 3 * nlo
            oh = bh + 3 * nhi
            for q in range(3):
                y = Q[a + q] + t * (Q[b + q] - Q[a + q])
                Q[ol + q] = y
                Q[oh + q] = y
            Q[ol + ax] = c
            Q[oh + ax] = c
            nlo += 1
            nhi += 1
        if dv <= 0.0:
            below |= dv < 0.0
            ol = bl + 3 * nlo
            Q[ol] = Q[pv]
            Q[ol + 1] = Q[pv + 1]
            Q[ol + 2] = Q[pv + 2]
            nlo += 1
        if dv >= 0.0:
            above |= dv > 0.0
            oh = bh + 3 * nhi
            Q[oh] = Q[pv]
            Q[oh + 1] = Q[pv + 1]
            Q[oh + 2] = Q[pv + 2]
            nhi += 1
        p = pv
        dp = dv
    # nothing strictly on one side: no cut points, the other side holds the whole polygon
    C[pl] = nlo if below else 0
    C[ph] = nhi if above else 0
    return True


@numba.njit(cache=True, inline="always")
def _band(Q, C, w, f, s, k):
    """(xy area, xy integral of ``z - k``) of polygon (``s``, ``f``), signed by its
    orientation seen from +z (fan triangles from vertex 0, in vertex-relative units)."""
    p = 4 * s + f
    n = C[p]
    b = w * p
    x0 = Q[b]
    y0 = Q[b + 1]
    w0 = Q[b + 2] - k
    area2 = 0.0
    mom6 = 0.0
    ax = Q[b + 3] - x0
    ay = Q[b + 4] - y0
    wa = Q[b + 5] - k
    for v in range(2, n):
        q = b + 3 * v
        bx = Q[q] - x0
        by = Q[q + 1] - y0
        wb = Q[q + 2] - k
        a2 = ax * by - ay * bx
        area2 += a2
        mom6 += a2 * (w0 + wa + wb)
        ax = bx
        ay = by
        wa = wb
    return 0.5 * area2, mom6 / 6.0


@numba.njit(nogil=True, cache=True)
def _cell_range(Q, C, w, s, ax):
    """Cells ``(first, last)`` (local) along ``ax`` that the four polygons of slot ``s``
    reach; ``first > last`` if all are empty. Touching a cell's lower face only does not
    count."""
    lo = np.inf
    hi = -np.inf
    for f in range(4):
        p = 4 * s + f
        b = w * p + ax
        for v in range(C[p]):
            x = Q[b + 3 * v]
            lo = min(lo, x)
            hi = max(hi, x)
    if lo > hi:
        return 1, 0
    first = int(np.floor(lo))
    last = int(np.floor(hi))
    if last > first and hi == last:
        last -= 1
    return first, last


@numba.njit(nogil=True, cache=True)
def _peel(Q, C, w, cur, lev, c):
    """Cut the four polygons of slot ``cur`` at ``x[ax] = c`` (``lev``: piece slot,
    remainder slots ra, rb, axis): the parts below go to the piece slot, those above to
    ra or rb (whichever is not ``cur``), which is returned (-1 on overflow)."""
    piece = lev[0]
    ra = lev[1]
    rb = lev[2]
    ax = lev[3]
    nxt = rb if cur == ra else ra
    for f in range(4):
        if C[4 * cur + f] == 0:
            C[4 * piece + f] = 0
            C[4 * nxt + f] = 0
        elif not _split_poly(Q, C, w, f, cur, piece, nxt, ax, c):
            return -1
    return nxt


@numba.njit(nogil=True, cache=True)
def _column(Q, C, w, s, acc, k0, k1):
    """Overlap volumes of one column's cells ``k0 .. k1`` (local z) into ``acc[k - k0]``.

    Divergence theorem with the field ``(0, 0, z - k)`` on the part of the tetrahedron
    in cell k: the column's walls are vertical and the cell's bottom has ``z = k``, so
    neither adds anything, and the cell's volume is the sum over the four faces of the
    xy integral of ``clamp(z, k, k + 1) - k`` over the face's piece in this column (its
    polygon in slot ``s``), counted positive for faces looking up and negative for faces
    looking down (the sign of the polygon's xy orientation). Each piece is cut into z
    bands from the top down; the band in cell k adds its integral of ``z - k`` plus the
    area of the bands above it, and the cells below the piece add its whole area.
    ``k0 .. k1`` may be clamped to the grid. False on polygon overflow.
    """
    for f in range(4):
        n = C[4 * s + f]
        if n < 3:
            continue
        b = w * (4 * s + f) + 2
        zlo = Q[b]
        zhi = zlo
        for v in range(1, n):
            z = Q[b + 3 * v]
            zlo = min(zlo, z)
            zhi = max(zhi, z)
        kl = int(np.floor(zlo))
        kh = int(np.floor(zhi))
        if kh > kl and zhi == kh:
            kh -= 1
        if kh < k0:  # below the grid (non-periodic): adds nothing
            continue
        if kl > k1:  # above the grid (non-periodic): only its area counts
            above, mom = _band(Q, C, w, f, s, 0.0)
            kfill = k1 + 1
        else:
            # cut at the planes c = top .. bottom; the part above plane c is the band of
            # cell c (for c = k1 + 1: the part above the grid, of which only the area counts)
            klow = max(kl, k0)
            clip_low = kl < klow  # part below the grid to cut off
            above = 0.0  # area of the piece above the current plane
            cur = s
            for c in range(min(kh, k1 + 1), klow - 1 if clip_low else klow, -1):
                nxt = 8 if cur == 7 else 7
                if not _split_poly(Q, C, w, f, cur, nxt, 9, 2, float(c)):
                    return False
                cur = nxt
                area = 0.0
                mom = 0.0
                if C[36 + f] >= 3:
                    area, mom = _band(Q, C, w, f, 9, float(c))
                if c <= k1:
                    acc[c - k0] += mom + above
                above += area
            if not clip_low and C[4 * cur + f] >= 3:  # the rest: band of cell klow
                area, mom = _band(Q, C, w, f, cur, float(klow))
                acc[klow - k0] += mom + above
                above += area
            elif not clip_low:
                acc[klow - k0] += above
            kfill = klow
        for k in range(kfill - k0):  # cells below the piece: its whole area
            acc[k] += above
    return True


@numba.njit(nogil=True, cache=True)
def _load_faces(Q, C, w, u, o, perm, det):
    """The tetrahedron's four faces into slot 0: outward, in local axes (local axis a is
    axis ``perm[a]`` of ``u``; ``perm`` is a cyclic shift, so orientations are kept),
    relative to the corner of cell ``o`` (local). Faces seen edge-on along the local z
    axis (zero xy area) add nothing and are left empty."""
    for f in range(4):
        b = w * f
        for q in range(3):
            v = _FACES[f, q if det > 0.0 or q == 0 else 3 - q]
            for c in range(3):
                Q[b + 3 * q + c] = u[v, perm[c]] - o[c]
        a2 = ((Q[b + 3] - Q[b]) * (Q[b + 7] - Q[b + 1])
              - (Q[b + 4] - Q[b + 1]) * (Q[b + 6] - Q[b]))
        C[f] = 3 if a2 != 0.0 else 0


@numba.njit(nogil=True, cache=True)
def _flux_axis(u):
    """Axis along which the tetrahedron's projected area is smallest: the face terms of
    :func:`_column` are then smallest, and so are their rounding errors (a flat or
    needle-like tetrahedron seen edge-on or end-on)."""
    best = 0
    area = np.inf
    for e in range(3):
        e1 = 1 if e == 0 else 0
        e2 = 1 if e == 2 else 2
        a = 0.0
        for f in range(4):
            i0 = _FACES[f, 0]
            i1 = _FACES[f, 1]
            i2 = _FACES[f, 2]
            a += abs((u[i1, e1] - u[i0, e1]) * (u[i2, e2] - u[i0, e2])
                     - (u[i1, e2] - u[i0, e2]) * (u[i2, e1] - u[i0, e1]))
        if a < area:
            area = a
            best = e
    return best


@numba.njit(nogil=True, cache=True)
def _deposit_tet(Q, C, w, acc, o, ca, cb, top, m, vol, nn, perm, grid, skip):
    """Deposit the tetrahedron whose faces are in slot 0 (see :func:`_load_faces`).

    Cells ``ca .. cb`` (clamped to the grid unless periodic) are filled x slab by x slab
    and column by column: the four face polygons are cut once per x plane into slabs,
    each slab's once per y plane into columns (each level's extent from its own vertices,
    so only columns the faces reach are visited), and each column is filled by
    :func:`_column`. ``top``: last cell of the bounding box. All in local axes: local
    axis a is grid axis ``perm[a]``, with ``nn[a]`` cells. Columns before
    ``(skip[0], skip[1])`` (in visiting order) are computed but not deposited. On a
    polygon overflow, returns with ``skip[2] = 1`` and ``skip[:2]`` = the column to
    resume from (with more room). Returns the mass deposited.
    """
    dep = 0.0
    skip[2] = 0
    g = skip[3:6]  # grid index, by grid axis
    p0 = perm[0]
    p1 = perm[1]
    p2 = perm[2]
    nz = nn[2]
    xr = _XLEV[4]  # slot of the faces' parts above the current x plane: at first 0
    if ca[0] > o[0]:
        xr = _peel(Q, C, w, xr, _XLEV, float(ca[0] - o[0]))
    for i in range(ca[0], cb[0] + 1):
        if xr >= 0 and i < top[0]:
            slab = 3
            xr = _peel(Q, C, w, xr, _XLEV, float(i + 1 - o[0]))
        else:
            slab = xr
        if xr < 0:
            skip[0] = i
            skip[1] = ca[1]
            skip[2] = 1
            return dep
        jl, jh = _cell_range(Q, C, w, slab, _YLEV[3])
        ja = max(jl + o[1], ca[1])
        jb = min(jh + o[1], cb[1])
        yr = slab
        if ja > jl + o[1]:
            yr = _peel(Q, C, w, slab, _YLEV, float(ja - o[1]))
        g[p0] = i % nn[0]
        for j in range(ja, jb + 1):
            if yr >= 0 and j < jh + o[1]:
                col = 6
                yr = _peel(Q, C, w, yr, _YLEV, float(j + 1 - o[1]))
            else:
                col = yr
            if yr >= 0:
                kl, kh = _cell_range(Q, C, w, col, _ZLEV[3])
                k0 = max(kl, ca[2] - o[2])
                k1 = min(kh, cb[2] - o[2])
                if k0 > k1 or i < skip[0] or (i == skip[0] and j < skip[1]):
                    continue
                for k in range(k1 - k0 + 1):
                    acc[k] = 0.0
                if _column(Q, C, w, col, acc, k0, k1):
                    g[p1] = j % nn[1]
                    gk = (k0 + o[2]) % nz
                    for k in range(k1 - k0 + 1):
                        a = acc[k]
                        if a > 0.0:
                            dm = m * (a / vol)
                            g[p2] = gk
                            grid[g[0], g[1], g[2]] += dm
                            dep += dm
                        gk += 1
                        if gk == nz:
                            gk = 0
                    continue
            skip[0] = i
            skip[1] = j
            skip[2] = 1
            return dep
    return dep


@numba.njit(nogil=True, cache=True)
def _deposit_cpu(tets, mass, glo, cs, nx, ny, nz, periodic, grid, cap=_CAP):
    """Serial deposit in cell units: returns the mass that fell outside a non-periodic grid.

    ``cap``: initial polygon capacity (vertices); after an overflow the tetrahedron is
    resumed with 4x the room. Tests lower it to exercise that path.
    """
    w = 3 * cap
    Q = np.empty(_NPOLY * 4 * w)
    C = np.zeros(_NPOLY * 4, np.int64)
    acc = np.empty(64)
    u = np.empty((4, 3))
    o = np.empty(3, np.int64)
    top = np.empty(3, np.int64)
    ca = np.empty(3, np.int64)
    cb = np.empty(3, np.int64)
    # the same in local axes (local axis a = axis perm[a]; local z = flux axis)
    lo_ = np.empty(3, np.int64)
    ltop = np.empty(3, np.int64)
    lca = np.empty(3, np.int64)
    lcb = np.empty(3, np.int64)
    lnn = np.empty(3, np.int64)
    perm = np.empty(3, np.int64)
    skip = np.empty(6, np.int64)
    nn = (nx, ny, nz)
    lost = 0.0
    for t in range(tets.shape[0]):
        m = mass[t]
        for k in range(4):
            for c in range(3):
                u[k, c] = (tets[t, k, c] - glo[c]) / cs
        det = _det6(u.reshape((1, 4, 3)), 0)
        vol = abs(det) / 6.0
        single = True
        for c in range(3):
            bmin = min(min(u[0, c], u[1, c]), min(u[2, c], u[3, c]))
            bmax = max(max(u[0, c], u[1, c]), max(u[2, c], u[3, c]))
            o[c] = int(np.floor(bmin))
            top[c] = int(np.floor(bmax))
            if top[c] > o[c] and bmax == top[c]:
                top[c] -= 1  # touching the upper cell's face only: no overlap there
            if top[c] > o[c]:
                single = False
        if vol == 0.0:
            # degenerate: whole mass to the cell holding the vertex centroid
            ok = True
            for c in range(3):
                gc = int(np.floor(0.25 * (u[0, c] + u[1, c] + u[2, c] + u[3, c])))
                if periodic:
                    gc %= nn[c]
                elif gc < 0 or gc >= nn[c]:
                    ok = False
                ca[c] = gc
            if ok:
                grid[ca[0], ca[1], ca[2]] += m
            else:
                lost += m
            continue
        empty = False
        for c in range(3):
            ca[c] = o[c]
            cb[c] = top[c]
            if not periodic:
                ca[c] = max(ca[c], 0)
                cb[c] = min(cb[c], nn[c] - 1)
                empty |= ca[c] > cb[c]
        if empty:  # bounding box outside the grid
            lost += m
            continue
        if single:  # inside one cell: all the mass
            grid[o[0] % nx, o[1] % ny, o[2] % nz] += m
            continue
        fa = _flux_axis(u)
        for c in range(3):
            a = (fa + 1 + c) % 3
            perm[c] = a
            lo_[c] = o[a]
            ltop[c] = top[a]
            lca[c] = ca[a]
            lcb[c] = cb[a]
            lnn[c] = nn[a]
        if ltop[2] - lo_[2] + 1 > acc.shape[0]:
            acc = np.empty(2 * (ltop[2] - lo_[2] + 1))
        _load_faces(Q, C, w, u, lo_, perm, det)
        skip[0] = lca[0]
        skip[1] = lca[1]
        dep = _deposit_tet(Q, C, w, acc, lo_, lca, lcb, ltop, m, vol, lnn, perm, grid, skip)
        w2 = w
        while skip[2]:  # polygon overflow: resume from the failed column with more room
            w2 *= 4
            Q2 = np.empty(_NPOLY * 4 * w2)
            C2 = np.zeros(_NPOLY * 4, np.int64)
            _load_faces(Q2, C2, w2, u, lo_, perm, det)
            dep += _deposit_tet(Q2, C2, w2, acc, lo_, lca, lcb, ltop, m, vol, lnn, perm,
                                grid, skip)
        if not periodic:
            lost += m - dep
    return lost


# --------------------------------------------------------------------------- entry points
def _as_cubes(cube_lo, cube_size, xp):
    lo = xp.asarray(cube_lo, dtype=xp.float64)
    single = lo.ndim == 1
    if single:
        lo = lo[None, :]
    if lo.ndim != 2 or lo.shape[1] != 3:
        raise ParameterError(f"cube_lo must have shape (C, 3) or (3,), got {tuple(lo.shape)}")
    h = xp.asarray(cube_size, dtype=xp.float64)
    if h.ndim == 0:
        h = xp.full(lo.shape[0], float(h))
    elif h.shape != (lo.shape[0],):
        raise ParameterError(
            f"cube_size must be a scalar or have shape ({lo.shape[0]},), got {tuple(h.shape)}")
    if bool(xp.any(~(h > 0))):
        raise ParameterError("cube_size must be positive")
    return xp.ascontiguousarray(lo), xp.ascontiguousarray(h), single


def _as_tets(tets, xp):
    t = xp.asarray(tets)
    if t.ndim == 2 and t.shape == (4, 3):
        t = t[None]
    if t.ndim != 3 or t.shape[1:] != (4, 3):
        raise ParameterError(f"tets must have shape (T, 4, 3), got {tuple(t.shape)}")
    if t.dtype not in (np.float32, np.float64):
        t = t.astype(np.float64)
    return t


def tet_cube_volume_cpu(tets, cube_lo, cube_size):
    """CPU kernel of :func:`cosmo_dask.density.tet_cube_volume` (contract
    ``tet_cube_volume_kernel``): NumPy in, float64 NumPy out, numba ``prange`` over
    tetrahedra. Arguments, shapes and results as there."""
    t = np.ascontiguousarray(_as_tets(tets, np), dtype=np.float64)
    lo, h, single = _as_cubes(cube_lo, cube_size, np)
    out = np.zeros((t.shape[0], lo.shape[0]))
    if t.shape[0] and lo.shape[0]:
        _volumes_cpu(t, lo, h, out)
    return out[:, 0] if single else out


def deposit_tets_cpu(tets, mass, grid_lo, cell_size, shape, *, periodic=False, out=None):
    """CPU kernel of :func:`cosmo_dask.density.deposit_tets` (contract
    ``deposit_tets_kernel``): NumPy in, float64 NumPy grid out, a serial numba loop
    (deterministic sums). Arguments and result as there."""
    t = np.ascontiguousarray(_as_tets(tets, np), dtype=np.float64)
    m = np.broadcast_to(np.asarray(mass, dtype=np.float64), (t.shape[0],))
    m = np.ascontiguousarray(m)
    glo, cs, shp = check_grid(grid_lo, cell_size, shape)
    grid = np.zeros(shp) if out is None else out
    if grid.shape != shp or grid.dtype != np.float64:
        raise ParameterError(f"out must be a float64 array of shape {shp}")
    if t.shape[0]:
        _deposit_cpu(t, m, glo, cs, shp[0], shp[1], shp[2], bool(periodic), grid)
    return grid


def check_grid(grid_lo, cell_size, shape):
    """Validated ``(grid_lo (3,) float64, cell_size float, shape tuple)``."""
    glo = np.asarray(grid_lo, dtype=np.float64).reshape(-1)
    if glo.shape != (3,) or not np.all(np.isfinite(glo)):
        raise ParameterError(f"grid_lo must be 3 finite numbers, got {grid_lo!r}")
    cs = float(cell_size)
    if not (cs > 0 and np.isfinite(cs)):
        raise ParameterError(f"cell_size must be positive, got {cell_size!r}")
    shp = tuple(int(s) for s in shape)
    if len(shp) != 3 or min(shp) < 1:
        raise ParameterError(f"shape must be 3 positive integers, got {shape!r}")
    return glo, cs, shp
