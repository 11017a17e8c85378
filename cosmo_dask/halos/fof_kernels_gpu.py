"""Single-domain friends-of-friends on the GPU (CuPy + CUDA C).

Same contract as :func:`cosmo_dask.halos.fof_kernels.fof_local`, bit for bit:
friends when the float64 distance is ``<= linking_length`` (minimum image on
axes of period ``L > 0``), ``friends[i]`` counts the other particles within the
linking length, ``root[i]`` is the smallest input index of ``i``'s group, and
with ``min_friends = k > 1`` only pairs whose two members both have at least
``k`` friends link. As on the CPU there are two paths: plain FOF without
friend counts (``count_friends=False``, ``min_friends == 1``: what
``fof_labels`` runs) links dense cells as units, so that its cost is bounded by
particles and occupied cells; with counts every pair in neighbouring cells is
tested.

Method (the binned "virtual edge list" of HACC's PISTON halo finder, with a
lock-free union-find instead of PISTON's iterated min-label propagation):

1. One pass checks the positions (read in their dtype, float32 or float64):
   non-finite values are an error; periodic coordinates outside ``[0, L)`` are
   wrapped in float64 when read. Coarse cells have side at least the linking
   length, as on the CPU (``n = max(1, floor(L / ll))`` cells of side ``L / n``
   on a periodic axis, cells of side ``ll`` from the smallest coordinate on an
   open axis). Without counts each coarse cell is cut into ``k0 x k1 x k2``
   fine cells of side at most ``ll / sqrt(3)`` (the CPU's sub-division, fewer
   if the key would overflow). Each particle gets the int64 key
   ``coarse id * (k0 k1 k2) + fine id`` (the fine id is 0 with counts).
2. The particles are sorted by key (``cupy.argsort``); the wrapped coordinates
   are gathered in sorted order (structure of arrays; float32 when the input is
   float32 with nothing to wrap, else float64). The runs of equal keys are the
   occupied cells (fine cells without counts), found with a flag and one
   ``flatnonzero``.
3. **With friend counts** (the PISTON scheme): one thread per sorted particle
   walks the distinct neighbour coarse cells (27, fewer when a periodic axis
   has fewer than three cells or at the edges of an open axis); the up to three
   cells along the last axis are one run of consecutive ids unless they wrap,
   so nine (or fewer) runs are located by a galloping binary search in the
   sorted occupied-cell ids, started from the particle's own cell. Every friend
   is counted (each thread owns its count: no atomics); friends ``j > i`` are
   merged in a union-find forest. With ``min_friends > 1`` a first launch only
   counts, a second links core pairs. Each pair is tested twice.
4. **Without counts** (dense-cell linking, the GPU twin of the CPU's
   ``_dense_pass``): a fine cell whose bounding box proves every pair inside it
   friends is one *unit*; any other fine cell (one particle, or not provable,
   e.g. with a period shorter than ``3 ll``) is split into one-particle units.
   Units are the nodes of the union-find forest (32-bit below 2^31 particles).
   Three launches link them: (a) one thread per unit joins it to the later
   units of its coarse cell; (b) one thread per coarse cell marks the cells
   whose units are now one set; (c) one thread per unit, or one per coarse cell
   whose units are one set (the cell then acts as one node with its bounding
   box), walks the neighbour coarse cells of larger id. A neighbour cell
   already in the same set is skipped whole, a neighbour unit in the same set is
   skipped; otherwise the two bounding boxes decide: no pair can be friends
   (skip), every pair is (join), or undecided, and then particle pairs are
   tested (a point-against-box test skips or accepts whole rows) until the
   first friend pair, which joins the two units. The work per unit is a few
   ``find`` and box tests per neighbour unit, not one test per particle pair.
5. Union-find: both roots are found (path halving) and the larger root is
   hooked under the smaller with ``atomicCAS(parent[r], r, other)``, retrying
   from the value a failed CAS returns. ``parent[x] <= x`` always holds, so the
   forest cannot form a cycle and every root is its tree's smallest node. At the
   end the smallest input index of each tree is taken with ``atomicMin`` and
   labels (and counts) are scattered back to input order.

Exactness: the kernels are compiled with ``--fmad=false`` so the distance test
``d*d + e*e + f*f <= ll*ll`` and the wrapping ``x - L*floor(x/L)`` round exactly
as the (unfused) numba code does; the test is symmetric in ``i`` and ``j``. The
box tests are exact, as on the CPU: the pair test computes ``fl(x_i - x_j)``,
one minimum-image shift, squares and their sum, each monotone in IEEE
arithmetic, so the same operations on the boxes' extreme coordinates bound
every pair's computed ``d2``; where the pairs would take different
minimum-image branches the test answers "undecided". Partitions therefore do
not depend on the path, the sub-division or the order in which threads run.

Performance and memory figures (both paths, 256^3 and 512^3 on an H100) are in
``benchmarks/RESULTS.md`` (``benchmarks/device_halos.sh``).

Memory: indices, cell and unit offsets and the forest are int32 below 2^31
particles (int64 above); the permutation and the keys are int64. Besides the
input, the sort holds the keys and the permutation (16 bytes per particle) plus
CuPy's sort buffers. Then both paths keep 8 (permutation) + 12 (float32 sorted
coordinates; 24 in float64) bytes per particle; the counting path adds 12 per
particle (cell index, forest, counts); the dense path 16 per unit (offset, box
row, cell, forest), 13 per occupied coarse cell and 48 per multi-particle unit,
and while the units are built about 36 per fine cell. With every particle in a
cell of its own (uniform data) that is about 70 bytes per particle at the peak,
much less on clustered data (estimated from the buffers; measured 5.6x the float32
input at the peak on clustered and uniform 256^3 sets).

Limits: ``friends`` is int32 as on the CPU.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..backend import host
from ..cuda import include_options
from ..errors import ParameterError
from .fof_kernels import _MAX_CELLS_PER_AXIS, _SIDE_MARGIN, _sub_cells, check_arguments

__all__ = ["fof_local_gpu", "group_rows_gpu"]

_BLOCK = 256
_PAIR_BLOCK = 128
_MAX_GRID = 1 << 24
#: combined (coarse, fine) keys stay below this
_MAX_KEY = 1 << 62
#: below this many particles indices and the forest are int32 (int64 at and above)
INT32_ROWS = 2**31 - 1

# Pass modes of fof_pairs (as in fof_kernels._pair_pass).
_COUNT_AND_LINK = 0
_COUNT_ONLY = 1
_LINK_CORES = 2

#: the storage types a module is compiled for: coordinates as given, sorted copies,
#: indices (int below 2^31 particles)
TYPE_COMBINATIONS = tuple((coord, sort, index)
                          for coord, sort in (("float", "float"), ("float", "double"),
                                              ("double", "double"))
                          for index in ("int", "long long"))

CUDA_SOURCE = r"""
#include "periodic.cuh"
typedef long long i64;

// ------------------------------------------------------------------ cells
// x taken into [0, L); values at or beyond the ends included (as fof_kernels._wrap).
__device__ __forceinline__ double wrap_period(double x, double L)
{
    x = cd_wrap_box(x, L);
    if (x >= L || x < 0.0) {
        x = 0.0;
    }
    return x;
}

// Continuous cell coordinate of x along an axis (as fof_kernels._cell_ids).
__device__ __forceinline__ double cell_coord(double x, double L, double origin, double inv)
{
    return (L > 0.0) ? wrap_period(x, L) * inv : (0.5 * x - origin) * inv;
}

__device__ __forceinline__ i64 coarse_of(const double t, const i64 n)
{
    if (!(t < (double)n)) {
        return n - 1;
    }
    if (t < 0.0) {
        return 0;
    }
    return (i64)t;
}

// Fine cell (0 .. k-1) of continuous coordinate t inside its coarse cell c.
__device__ __forceinline__ i64 fine_of(const double t, const i64 c, const i64 k)
{
    const double f = (t - (double)c) * (double)k;
    if (!(f < (double)k)) {
        return k - 1;
    }
    if (f < 0.0) {
        return 0;
    }
    return (i64)f;
}

// flags |= 1 for a non-finite coordinate, |= 2 for a periodic one outside [0, L).
extern "C" __global__ void fof_check(
    const coord_t* __restrict__ pos, const i64 m,
    const double L0, const double L1, const double L2, int* flags)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    int found = 0;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += stride) {
        for (int a = 0; a < 3; ++a) {
            const double x = pos[3 * i + a];
            const double L = (a == 0) ? L0 : ((a == 1) ? L1 : L2);
            if (!(fabs(x) <= 1.7976931348623157e308)) {  // inf or nan
                found |= 1;
            } else if (L > 0.0 && (x < 0.0 || x >= L)) {
                found |= 2;
            }
        }
    }
    if (found) {
        atomicOr(flags, found);
    }
}

// key = coarse id * (k0 k1 k2) + fine id.
extern "C" __global__ void fof_cell_keys(
    const coord_t* __restrict__ pos, const i64 m,
    const double L0, const double L1, const double L2,
    const double o0, const double o1, const double o2,
    const double inv0, const double inv1, const double inv2,
    const i64 n0, const i64 n1, const i64 n2,
    const i64 k0, const i64 k1, const i64 k2,
    i64* __restrict__ keys)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 K = k0 * k1 * k2;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += stride) {
        const double t0 = cell_coord(pos[3 * i], L0, o0, inv0);
        const double t1 = cell_coord(pos[3 * i + 1], L1, o1, inv1);
        const double t2 = cell_coord(pos[3 * i + 2], L2, o2, inv2);
        const i64 c0 = coarse_of(t0, n0);
        const i64 c1 = coarse_of(t1, n1);
        const i64 c2 = coarse_of(t2, n2);
        i64 key = ((c0 * n1 + c1) * n2 + c2) * K;
        if (K > 1) {
            key += (fine_of(t0, c0, k0) * k1 + fine_of(t1, c1, k1)) * k2 + fine_of(t2, c2, k2);
        }
        keys[i] = key;
    }
}

extern "C" __global__ void fof_gather(
    const coord_t* __restrict__ pos, const i64* __restrict__ perm, const i64 m,
    const double L0, const double L1, const double L2,
    sort_t* __restrict__ sx, sort_t* __restrict__ sy, sort_t* __restrict__ sz)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < m; k += stride) {
        const i64 p = perm[k];
        const double x = pos[3 * p];
        const double y = pos[3 * p + 1];
        const double z = pos[3 * p + 2];
        sx[k] = (L0 > 0.0) ? wrap_period(x, L0) : x;
        sy[k] = (L1 > 0.0) ? wrap_period(y, L1) : y;
        sz[k] = (L2 > 0.0) ? wrap_period(z, L2) : z;
    }
}

// ------------------------------------------------------------------ neighbour cells
// First index k in [0, n) with keys[k] >= target (n if none), galloping from hint.
__device__ __forceinline__ i64 lower_bound_from(
    const i64* __restrict__ keys, const i64 n, const i64 target, i64 hint)
{
    if (hint >= n) {
        hint = n - 1;
    }
    if (hint < 0) {
        hint = 0;
    }
    i64 lo, hi;  // the answer lies in (lo, hi]
    if (keys[hint] < target) {
        lo = hint;
        hi = hint + 1;
        i64 step = 1;
        while (hi < n && keys[hi] < target) {
            lo = hi;
            step <<= 1;
            hi = lo + step;
        }
        if (hi > n) {
            hi = n;
        }
    } else {
        hi = hint;
        lo = hint - 1;
        i64 step = 1;
        while (lo >= 0 && keys[lo] >= target) {
            hi = lo;
            step <<= 1;
            lo = hi - step;
        }
        if (lo < -1) {
            lo = -1;
        }
    }
    i64 l = lo + 1;
    i64 r = hi;
    while (l < r) {
        const i64 mid = (l + r) >> 1;
        if (keys[mid] < target) {
            l = mid + 1;
        } else {
            r = mid;
        }
    }
    return l;
}

// Distinct neighbour coordinates of cell c along an axis of n cells; returns their count.
__device__ __forceinline__ int axis_neighbours(const i64 c, const i64 n, const int periodic,
                                               i64* out)
{
    int k = 0;
    if (periodic) {
        if (n == 1) {
            out[0] = 0;
            k = 1;
        } else if (n == 2) {
            out[0] = 0;
            out[1] = 1;
            k = 2;
        } else {
            out[0] = (c > 0) ? c - 1 : n - 1;
            out[1] = c;
            out[2] = (c < n - 1) ? c + 1 : 0;
            k = 3;
        }
    } else {
        if (c > 0) {
            out[k++] = c - 1;
        }
        out[k++] = c;
        if (c < n - 1) {
            out[k++] = c + 1;
        }
    }
    return k;
}

// Runs [lo, hi] of consecutive neighbour coordinates along the last axis; returns their count.
__device__ __forceinline__ int last_axis_runs(const i64 c, const i64 n, const int periodic,
                                              i64* lo, i64* hi)
{
    if (periodic) {
        if (n <= 2) {
            lo[0] = 0;
            hi[0] = n - 1;
            return 1;
        }
        if (c == 0) {
            lo[0] = 0;
            hi[0] = 1;
            lo[1] = n - 1;
            hi[1] = n - 1;
            return 2;
        }
        if (c == n - 1) {
            lo[0] = n - 2;
            hi[0] = n - 1;
            lo[1] = 0;
            hi[1] = 0;
            return 2;
        }
        lo[0] = c - 1;
        hi[0] = c + 1;
        return 1;
    }
    lo[0] = (c > 0) ? c - 1 : 0;
    hi[0] = (c < n - 1) ? c + 1 : n - 1;
    return 1;
}

// ------------------------------------------------------------------ union-find
__device__ __forceinline__ int cas_index(int* p, const int expected, const int value)
{
    return atomicCAS(p, expected, value);
}

__device__ __forceinline__ long long cas_index(long long* p, const long long expected,
                                               const long long value)
{
    return (long long)atomicCAS((unsigned long long*)p, (unsigned long long)expected,
                                (unsigned long long)value);
}

// Root of x's tree with path halving. parent[y] <= y always, and a node that is no
// longer a root never becomes one again, so a stale read is still an ancestor and
// the halving stores (plain stores, never to a root) are benign races.
__device__ __forceinline__ idx_t find_root(idx_t* parent, idx_t x)
{
    volatile idx_t* vp = parent;
    while (true) {
        const idx_t p = vp[x];
        if (p == x) {
            return x;
        }
        const idx_t g = vp[p];
        if (g == p) {
            return p;
        }
        vp[x] = g;
        x = g;
    }
}

// Merge the trees of a and b; returns the root of the merged tree (the smaller root).
__device__ __forceinline__ idx_t unite(idx_t* parent, idx_t a, idx_t b)
{
    a = find_root(parent, a);
    b = find_root(parent, b);
    while (a != b) {
        if (a < b) {
            const idx_t old = cas_index(parent + b, b, a);
            if (old == b) {
                return a;
            }
            b = find_root(parent, old);
        } else {
            const idx_t old = cas_index(parent + a, a, b);
            if (old == a) {
                return b;
            }
            a = find_root(parent, old);
        }
    }
    return a;
}

// ------------------------------------------------------------------ distances
// The pair test of fof_kernels._pair: float64, minimum image, early exit on x.
__device__ __forceinline__ bool friends_at(
    const double xi, const double yi, const double zi,
    const sort_t* __restrict__ sx, const sort_t* __restrict__ sy,
    const sort_t* __restrict__ sz, const i64 j,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2)
{
    double d = xi - (double)sx[j];
    if (d > h0) {
        d -= L0;
    } else if (d < -h0) {
        d += L0;
    }
    const double d2 = d * d;
    if (d2 > ll2) {
        return false;
    }
    double e = yi - (double)sy[j];
    if (e > h1) {
        e -= L1;
    } else if (e < -h1) {
        e += L1;
    }
    double f = zi - (double)sz[j];
    if (f > h2) {
        f -= L2;
    } else if (f < -h2) {
        f += L2;
    }
    return d2 + e * e + f * f <= ll2;
}

// Range [lo, hi] of |d| for every pair whose raw difference lies in [rmin, rmax], after
// the pair test's minimum-image step; false when the pairs do not all take one branch
// of that step (fof_kernels._axis_range).
__device__ __forceinline__ bool axis_range(const double rmin, const double rmax,
                                           const double L, const double h,
                                           double& lo, double& hi)
{
    double dmin, dmax;
    if (rmin > h) {
        dmin = rmin - L;
        dmax = rmax - L;
    } else if (rmax < -h) {
        dmin = rmin + L;
        dmax = rmax + L;
    } else if (rmin >= -h && rmax <= h) {
        dmin = rmin;
        dmax = rmax;
    } else {
        return false;
    }
    if (dmin >= 0.0) {
        lo = dmin;
        hi = dmax;
    } else if (dmax <= 0.0) {
        lo = -dmax;
        hi = -dmin;
    } else {
        lo = 0.0;
        hi = (-dmin > dmax) ? -dmin : dmax;
    }
    return true;
}

// Boxes are (lo0, hi0, lo1, hi1, lo2, hi2). 1: every pair between box a and box c is
// friends; -1: none is; 0: undecided (fof_kernels._box_status).
__device__ __forceinline__ int box_status(
    const double* a, const double* c,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2)
{
    double lo0, hi0, lo1, hi1, lo2, hi2;
    if (!axis_range(a[0] - c[1], a[1] - c[0], L0, h0, lo0, hi0)) {
        return 0;
    }
    if (!axis_range(a[2] - c[3], a[3] - c[2], L1, h1, lo1, hi1)) {
        return 0;
    }
    if (!axis_range(a[4] - c[5], a[5] - c[4], L2, h2, lo2, hi2)) {
        return 0;
    }
    double d2 = lo0 * lo0;
    if (d2 + lo1 * lo1 + lo2 * lo2 > ll2) {
        return -1;
    }
    d2 = hi0 * hi0;
    if (d2 + hi1 * hi1 + hi2 * hi2 <= ll2) {
        return 1;
    }
    return 0;
}

// Bounding box of sorted particles [s, e).
__device__ __forceinline__ void bbox_of(
    const i64 s, const i64 e, const sort_t* __restrict__ sx,
    const sort_t* __restrict__ sy, const sort_t* __restrict__ sz, double* b)
{
    b[0] = b[1] = sx[s];
    b[2] = b[3] = sy[s];
    b[4] = b[5] = sz[s];
    for (i64 k = s + 1; k < e; ++k) {
        const double x = sx[k];
        const double y = sy[k];
        const double z = sz[k];
        b[0] = fmin(b[0], x);
        b[1] = fmax(b[1], x);
        b[2] = fmin(b[2], y);
        b[3] = fmax(b[3], y);
        b[4] = fmin(b[4], z);
        b[5] = fmax(b[5], z);
    }
}

// ------------------------------------------------------------------ friend counts (pairs)
// One thread per sorted particle k. mode 0: count friends and link friend pairs;
// 1: count only; 2: link pairs whose members both have friends >= kmin.
extern "C" __global__ void fof_pairs(
    const sort_t* __restrict__ sx, const sort_t* __restrict__ sy,
    const sort_t* __restrict__ sz, const idx_t* __restrict__ pcell,
    const i64* __restrict__ cell_keys, const idx_t* __restrict__ cell_start,
    const i64 nocc, const i64 m, const i64 nx, const i64 ny, const i64 nz,
    const int per0, const int per1, const int per2,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2,
    const int mode, const int kmin, int* friends, idx_t* parent)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 nyz = ny * nz;
    const bool count = (mode != 2);
    const bool link = (mode != 1);
    const bool cores = (mode == 2);
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < m; k += stride) {
        if (cores && friends[k] < kmin) {
            continue;
        }
        const i64 a = pcell[k];
        const i64 key = cell_keys[a];
        const i64 cx = key / nyz;
        const i64 rem = key - cx * nyz;
        const i64 cy = rem / nz;
        const i64 cz = rem - cy * nz;
        const double xi = sx[k];
        const double yi = sy[k];
        const double zi = sz[k];

        i64 xs[3], ys[3], zlo[2], zhi[2];
        const int nxn = axis_neighbours(cx, nx, per0, xs);
        const int nyn = axis_neighbours(cy, ny, per1, ys);
        const int nzr = last_axis_runs(cz, nz, per2, zlo, zhi);

        int cnt = 0;
        idx_t u = (idx_t)k;
        for (int ix = 0; ix < nxn; ++ix) {
            i64 hint = a;
            for (int iy = 0; iy < nyn; ++iy) {
                const i64 base = (xs[ix] * ny + ys[iy]) * nz;
                for (int iz = 0; iz < nzr; ++iz) {
                    const i64 klo = base + zlo[iz];
                    const i64 khi = base + zhi[iz];
                    if (!count && khi < key) {
                        continue;  // linking only: these cells hold indices below k
                    }
                    const i64 lo = lower_bound_from(cell_keys, nocc, klo, hint);
                    hint = lo;
                    i64 hi = lo;
                    while (hi < nocc && cell_keys[hi] <= khi) {
                        ++hi;
                    }
                    if (hi == lo) {
                        continue;
                    }
                    i64 jb = cell_start[lo];
                    const i64 je = cell_start[hi];
                    if (!count && jb <= k) {
                        jb = k + 1;
                    }
                    for (i64 j = jb; j < je; ++j) {
                        if (j == k) {
                            continue;
                        }
                        if (cores && friends[j] < kmin) {
                            continue;
                        }
                        if (!friends_at(xi, yi, zi, sx, sy, sz, j, L0, L1, L2, h0, h1, h2,
                                        ll2)) {
                            continue;
                        }
                        if (count) {
                            ++cnt;
                        }
                        if (link && j > k) {
                            u = unite(parent, u, (idx_t)j);
                        }
                    }
                }
            }
        }
        if (count) {
            friends[k] = cnt;
        }
    }
}

// The smallest input index of every tree (one thread per sorted particle).
extern "C" __global__ void fof_roots(
    idx_t* parent, const i64* __restrict__ perm, const i64 m, idx_t* __restrict__ minidx)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < m; k += stride) {
        const idx_t r = find_root(parent, (idx_t)k);
        const idx_t p = (idx_t)perm[k];
        if (p < minidx[r]) {
            atomicMin(minidx + r, p);
        }
    }
}

// Labels and friend counts back to input order.
extern "C" __global__ void fof_scatter(
    idx_t* parent, const i64* __restrict__ perm, const idx_t* __restrict__ minidx,
    const int* __restrict__ friends_sorted, const i64 m,
    i64* __restrict__ root, int* __restrict__ friends)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < m; k += stride) {
        const i64 p = perm[k];
        root[p] = (i64)minidx[find_root(parent, (idx_t)k)];
        friends[p] = friends_sorted[k];
    }
}

// ------------------------------------------------------------------ dense cells (units)
// A unit's bounding box: its row of boxes, or its one particle.
__device__ __forceinline__ void unit_box_of(
    const idx_t u, const idx_t* __restrict__ unit_start, const idx_t* __restrict__ unit_box,
    const double* __restrict__ boxes, const sort_t* __restrict__ sx,
    const sort_t* __restrict__ sy, const sort_t* __restrict__ sz, double* b)
{
    const idx_t q = unit_box[u];
    if (q >= 0) {
        const double* r = boxes + 6 * (i64)q;
        for (int t = 0; t < 6; ++t) {
            b[t] = r[t];
        }
    } else {
        const i64 i = unit_start[u];
        b[0] = b[1] = sx[i];
        b[2] = b[3] = sy[i];
        b[4] = b[5] = sz[i];
    }
}

// Whether some particle of [us, ue) (box a) and some of [vs, ve) (box b) are friends:
// the boxes decide, else pairs are tested (rows skipped or accepted by a point-against-
// box test) until the first friend pair (fof_kernels._link_units).
__device__ __forceinline__ bool units_linked(
    const i64 us, const i64 ue, const i64 vs, const i64 ve,
    const double* a, const double* b, const sort_t* __restrict__ sx,
    const sort_t* __restrict__ sy, const sort_t* __restrict__ sz,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2)
{
    const int st = box_status(a, b, L0, L1, L2, h0, h1, h2, ll2);
    if (st != 0) {
        return st > 0;
    }
    for (i64 i = us; i < ue; ++i) {
        const double xi = sx[i];
        const double yi = sy[i];
        const double zi = sz[i];
        if (ve - vs > 1) {
            const double p[6] = {xi, xi, yi, yi, zi, zi};
            const int sp = box_status(p, b, L0, L1, L2, h0, h1, h2, ll2);
            if (sp < 0) {
                continue;
            }
            if (sp > 0) {
                return true;
            }
        }
        for (i64 j = vs; j < ve; ++j) {
            if (friends_at(xi, yi, zi, sx, sy, sz, j, L0, L1, L2, h0, h1, h2, ll2)) {
                return true;
            }
        }
    }
    return false;
}

// One thread per fine cell f: whether it starts a coarse cell, how many units it is
// (1, or its particle count when not provably linked internally) and whether it is
// one multi-particle unit (a row of boxes).
extern "C" __global__ void fof_fine_count(
    const i64* __restrict__ fine_keys, const idx_t* __restrict__ fine_start,
    const i64 nfine, const i64 K,
    const sort_t* __restrict__ sx, const sort_t* __restrict__ sy,
    const sort_t* __restrict__ sz,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2,
    idx_t* __restrict__ n_units, idx_t* __restrict__ n_boxes, idx_t* __restrict__ new_cell)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 f = (i64)blockIdx.x * blockDim.x + threadIdx.x; f < nfine; f += stride) {
        const i64 s = fine_start[f];
        const i64 e = fine_start[f + 1];
        new_cell[f] = (f == 0 || fine_keys[f] / K != fine_keys[f - 1] / K) ? 1 : 0;
        idx_t nu = 1;
        idx_t nb = 0;
        if (e - s > 1) {
            double b[6];
            bbox_of(s, e, sx, sy, sz, b);
            if (box_status(b, b, L0, L1, L2, h0, h1, h2, ll2) == 1) {
                nb = 1;
            } else {
                nu = (idx_t)(e - s);
            }
        }
        n_units[f] = nu;
        n_boxes[f] = nb;
    }
}

// One thread per fine cell f: its units (offsets, box rows, coarse cell) and, for the
// first fine cell of a coarse cell, that cell's key and first unit. unit_end, box_end
// and cell_end are the inclusive prefix sums of fof_fine_count's outputs.
extern "C" __global__ void fof_fine_units(
    const i64* __restrict__ fine_keys, const idx_t* __restrict__ fine_start,
    const i64 nfine, const i64 K, const idx_t* __restrict__ unit_end,
    const idx_t* __restrict__ box_end, const idx_t* __restrict__ cell_end,
    const sort_t* __restrict__ sx, const sort_t* __restrict__ sy,
    const sort_t* __restrict__ sz,
    idx_t* __restrict__ unit_start, idx_t* __restrict__ unit_box,
    idx_t* __restrict__ unit_cell, double* __restrict__ boxes,
    i64* __restrict__ cell_keys, idx_t* __restrict__ cell_unit)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 f = (i64)blockIdx.x * blockDim.x + threadIdx.x; f < nfine; f += stride) {
        const i64 s = fine_start[f];
        const i64 e = fine_start[f + 1];
        const idx_t u0 = (f > 0) ? unit_end[f - 1] : 0;
        const idx_t b0 = (f > 0) ? box_end[f - 1] : 0;
        const idx_t c = cell_end[f] - 1;
        if (f == 0 || cell_end[f - 1] != cell_end[f]) {
            cell_keys[c] = fine_keys[f] / K;
            cell_unit[c] = u0;
        }
        if (box_end[f] != b0) {
            double b[6];
            bbox_of(s, e, sx, sy, sz, b);
            double* r = boxes + 6 * (i64)b0;
            for (int t = 0; t < 6; ++t) {
                r[t] = b[t];
            }
            unit_start[u0] = (idx_t)s;
            unit_box[u0] = b0;
            unit_cell[u0] = c;
        } else {
            for (i64 k = s; k < e; ++k) {
                const idx_t u = u0 + (idx_t)(k - s);
                unit_start[u] = (idx_t)k;
                unit_box[u] = -1;
                unit_cell[u] = c;
            }
        }
    }
}

// One thread per unit u: links it with the later units of its coarse cell.
extern "C" __global__ void fof_link_inner(
    const idx_t* __restrict__ unit_start, const idx_t* __restrict__ unit_box,
    const idx_t* __restrict__ unit_cell, const double* __restrict__ boxes,
    const idx_t* __restrict__ cell_unit, const i64 nunits,
    const sort_t* __restrict__ sx, const sort_t* __restrict__ sy,
    const sort_t* __restrict__ sz,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2,
    idx_t* parent)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < nunits; t += stride) {
        const idx_t u = (idx_t)t;
        const idx_t ub = cell_unit[unit_cell[u] + 1];
        if (u + 1 >= ub) {
            continue;
        }
        double a[6];
        unit_box_of(u, unit_start, unit_box, boxes, sx, sy, sz, a);
        const i64 us = unit_start[u];
        const i64 ue = unit_start[u + 1];
        idx_t ru = find_root(parent, u);
        for (idx_t v = u + 1; v < ub; ++v) {
            const idx_t rv = find_root(parent, v);
            ru = find_root(parent, ru);
            if (rv == ru) {
                continue;
            }
            double b[6];
            unit_box_of(v, unit_start, unit_box, boxes, sx, sy, sz, b);
            if (units_linked(us, ue, unit_start[v], unit_start[v + 1], a, b, sx, sy, sz,
                             L0, L1, L2, h0, h1, h2, ll2)) {
                ru = unite(parent, ru, rv);
            }
        }
    }
}

// One thread per coarse cell: 1 when all its units are in one set.
extern "C" __global__ void fof_cell_sets(
    const idx_t* __restrict__ cell_unit, const i64 ncell, idx_t* parent,
    unsigned char* __restrict__ cell_one)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < ncell; c += stride) {
        const idx_t u0 = cell_unit[c];
        const idx_t u1 = cell_unit[c + 1];
        const idx_t r = find_root(parent, u0);
        unsigned char one = 1;
        for (idx_t u = u0 + 1; u < u1; ++u) {
            if (find_root(parent, u) != r) {
                one = 0;
                break;
            }
        }
        cell_one[c] = one;
    }
}

// Links across coarse cells: each unordered pair of neighbouring coarse cells is handled
// by the threads of the cell with the smaller id: one thread per unit, or only the
// cell's first unit's thread when the cell's units are one set (the cell is then one
// node with its bounding box).
extern "C" __global__ void fof_link_outer(
    const idx_t* __restrict__ unit_start, const idx_t* __restrict__ unit_box,
    const idx_t* __restrict__ unit_cell, const double* __restrict__ boxes,
    const i64* __restrict__ cell_keys, const idx_t* __restrict__ cell_unit,
    const unsigned char* __restrict__ cell_one, const i64 ncell, const i64 nunits,
    const i64 nx, const i64 ny, const i64 nz,
    const int per0, const int per1, const int per2,
    const sort_t* __restrict__ sx, const sort_t* __restrict__ sy,
    const sort_t* __restrict__ sz,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2,
    idx_t* parent)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 nyz = ny * nz;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < nunits; t += stride) {
        const idx_t u = (idx_t)t;
        const i64 a = unit_cell[u];
        const idx_t u0 = cell_unit[a];
        const idx_t u1 = cell_unit[a + 1];
        const bool whole = cell_one[a] != 0;
        if (whole && u != u0) {
            continue;
        }
        double A[6];
        unit_box_of(u, unit_start, unit_box, boxes, sx, sy, sz, A);
        if (whole) {
            for (idx_t w = u0 + 1; w < u1; ++w) {
                double b[6];
                unit_box_of(w, unit_start, unit_box, boxes, sx, sy, sz, b);
                A[0] = fmin(A[0], b[0]);
                A[1] = fmax(A[1], b[1]);
                A[2] = fmin(A[2], b[2]);
                A[3] = fmax(A[3], b[3]);
                A[4] = fmin(A[4], b[4]);
                A[5] = fmax(A[5], b[5]);
            }
        }
        const i64 key = cell_keys[a];
        const i64 cx = key / nyz;
        const i64 rem = key - cx * nyz;
        const i64 cy = rem / nz;
        const i64 cz = rem - cy * nz;
        i64 xs[3], ys[3], zlo[2], zhi[2];
        const int nxn = axis_neighbours(cx, nx, per0, xs);
        const int nyn = axis_neighbours(cy, ny, per1, ys);
        const int nzr = last_axis_runs(cz, nz, per2, zlo, zhi);
        idx_t ra = find_root(parent, u);
        for (int ix = 0; ix < nxn; ++ix) {
            i64 hint = a;
            for (int iy = 0; iy < nyn; ++iy) {
                const i64 base = (xs[ix] * ny + ys[iy]) * nz;
                for (int iz = 0; iz < nzr; ++iz) {
                    i64 klo = base + zlo[iz];
                    const i64 khi = base + zhi[iz];
                    if (khi <= key) {
                        continue;
                    }
                    if (klo <= key) {
                        klo = key + 1;
                    }
                    const i64 lo = lower_bound_from(cell_keys, ncell, klo, hint);
                    hint = lo;
                    for (i64 c = lo; c < ncell && cell_keys[c] <= khi; ++c) {
                        const idx_t v0 = cell_unit[c];
                        const idx_t v1 = cell_unit[c + 1];
                        ra = find_root(parent, ra);
                        if (cell_one[c] && find_root(parent, v0) == ra) {
                            continue;  // the whole neighbour cell is already in the set
                        }
                        for (idx_t v = v0; v < v1; ++v) {
                            const idx_t rv = find_root(parent, v);
                            ra = find_root(parent, ra);
                            if (rv == ra) {
                                continue;
                            }
                            double B[6];
                            unit_box_of(v, unit_start, unit_box, boxes, sx, sy, sz, B);
                            const int st = box_status(A, B, L0, L1, L2, h0, h1, h2, ll2);
                            if (st < 0) {
                                continue;
                            }
                            bool link = st > 0;
                            if (!link) {
                                const i64 vs = unit_start[v];
                                const i64 ve = unit_start[v + 1];
                                if (whole) {
                                    for (idx_t w = u0; w < u1 && !link; ++w) {
                                        double W[6];
                                        unit_box_of(w, unit_start, unit_box, boxes, sx, sy,
                                                    sz, W);
                                        link = units_linked(unit_start[w], unit_start[w + 1],
                                                            vs, ve, W, B, sx, sy, sz, L0, L1,
                                                            L2, h0, h1, h2, ll2);
                                    }
                                } else {
                                    link = units_linked(unit_start[u], unit_start[u + 1], vs,
                                                        ve, A, B, sx, sy, sz, L0, L1, L2, h0,
                                                        h1, h2, ll2);
                                }
                            }
                            if (link) {
                                ra = unite(parent, ra, rv);
                            }
                        }
                    }
                }
            }
        }
    }
}

// The smallest input index of every set of units (one thread per unit).
extern "C" __global__ void fof_unit_min(
    const idx_t* __restrict__ unit_start, const i64* __restrict__ perm, const i64 nunits,
    idx_t* parent, idx_t* __restrict__ minidx)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < nunits; t += stride) {
        const idx_t u = (idx_t)t;
        const idx_t r = find_root(parent, u);
        i64 low = perm[unit_start[u]];
        for (i64 k = (i64)unit_start[u] + 1; k < (i64)unit_start[u + 1]; ++k) {
            low = (perm[k] < low) ? perm[k] : low;
        }
        if ((idx_t)low < minidx[r]) {
            atomicMin(minidx + r, (idx_t)low);
        }
    }
}

// Every particle's label (its set's smallest input index), in input order.
extern "C" __global__ void fof_unit_labels(
    const idx_t* __restrict__ unit_start, const i64* __restrict__ perm, const i64 nunits,
    idx_t* parent, const idx_t* __restrict__ minidx, i64* __restrict__ root)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < nunits; t += stride) {
        const idx_t u = (idx_t)t;
        const i64 label = minidx[find_root(parent, u)];
        for (i64 k = unit_start[u]; k < (i64)unit_start[u + 1]; ++k) {
            root[perm[k]] = label;
        }
    }
}

// ------------------------------------------------------------------ per-group rows
// One thread per owned row i: member count and smallest id of its local group
// (root[i], a row index). Lanes of a warp with the same group add their count at once;
// the loop runs the same iterations on every lane of a warp (blockDim a multiple of 32).
extern "C" __global__ void group_reduce(
    const idx_t* __restrict__ root, const i64* __restrict__ ids, const i64 n,
    int* __restrict__ count, long long* __restrict__ min_id)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const int lane = threadIdx.x & 31;
    for (i64 w = (i64)blockIdx.x * blockDim.x + (threadIdx.x - lane); w < n; w += stride) {
        const i64 i = w + lane;
        const bool active = i < n;
        const unsigned mask = __ballot_sync(0xffffffffu, active);
        if (active) {
            const idx_t r = root[i];
            const unsigned same = __match_any_sync(mask, (long long)r);
            if (lane == __ffs(same) - 1) {
                atomicAdd(count + r, __popc(same));
            }
            const long long v = ids[i];
            if (v < min_id[r]) {
                atomicMin(min_id + r, v);
            }
        }
    }
}
"""

_KERNEL_NAMES = ("fof_check", "fof_cell_keys", "fof_gather", "fof_pairs", "fof_roots",
                 "fof_scatter", "fof_fine_count", "fof_fine_units", "fof_link_inner",
                 "fof_cell_sets", "fof_link_outer", "fof_unit_min", "fof_unit_labels",
                 "group_reduce")
#: the compiler options: no fused multiply-adds, so float64 arithmetic rounds as in numba
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")


def cuda_source(coord: str = "double", sort: str = "double", index: str = "int") -> str:
    """The CUDA source for one combination of storage types (see :data:`TYPE_COMBINATIONS`):
    ``coord`` the input coordinates, ``sort`` the sorted copies ("float" or "double";
    arithmetic is double either way), ``index`` indices, offsets and the union-find
    forest ("int" or "long long")."""
    return (f"typedef {coord} coord_t;\ntypedef {sort} sort_t;\ntypedef {index} idx_t;\n"
            + CUDA_SOURCE)


@functools.cache
def _module(device_id: int, coord: str, sort: str, index: str) -> dict:
    """The compiled kernels for one device and storage types (compiled on first use,
    then cached)."""
    import cupy

    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=cuda_source(coord, sort, index),
                                options=NVRTC_OPTIONS + include_options())
        return {name: module.get_function(name) for name in _KERNEL_NAMES}


def _cupy_kernels(coord: str, sort: str, index: str) -> dict:
    import cupy

    return _module(cupy.cuda.Device().id, coord, sort, index)


def _launch(m: int, block: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for ``m`` items of a grid-stride loop."""
    return (max(1, min(-(-m // block), _MAX_GRID)),), (block,)


def _cell_grid(per, ll, lo, hi):
    """Cells per axis, open-axis origins and inverse cell sides (as ``fof_kernels._grid``).

    ``lo`` / ``hi`` are the smallest / largest coordinates per axis (used on
    open axes only). Python floats are IEEE doubles, so this reproduces the
    numba arithmetic exactly.
    """
    dims = [1, 1, 1]
    origin = [0.0, 0.0, 0.0]
    inv = [0.0, 0.0, 0.0]
    side_min = ll * (1.0 + _SIDE_MARGIN)
    for a in range(3):
        L = float(per[a])
        if L > 0.0:
            nf = math.floor(L / side_min)
            n = 1
            if nf > 1:
                n = int(min(nf, _MAX_CELLS_PER_AXIS))
            while n > 1 and L / n < side_min:
                n -= 1
            inv[a] = n / L
        else:
            half_lo = 0.5 * float(lo[a])
            half_extent = 0.5 * float(hi[a]) - half_lo
            half_side = 0.5 * side_min
            nf = math.floor(half_extent / half_side) + 1
            n = 1
            if nf > 1:
                if nf > _MAX_CELLS_PER_AXIS:
                    n = _MAX_CELLS_PER_AXIS
                    half_side = half_extent / (n - 1)
                else:
                    n = int(nf)
            origin[a] = half_lo
            inv[a] = 1.0 / half_side
        dims[a] = n
    return dims, origin, inv


def _fine_cells(per, inv, ll, dims) -> list[int]:
    """Fine cells per coarse cell along each axis: the CPU's sub-division (sides at most
    ``ll / sqrt(3)``), halved on the largest axis while the combined keys would reach
    :data:`_MAX_KEY` (any sub-division gives the same partition: every unit is proven by
    its bounding box)."""
    ks = [int(k) for k in _sub_cells(np.asarray(per, dtype=np.float64),
                                     np.asarray(inv, dtype=np.float64), ll)]
    ncoarse = dims[0] * dims[1] * dims[2]
    while ncoarse * ks[0] * ks[1] * ks[2] >= _MAX_KEY and max(ks) > 1:
        a = ks.index(max(ks))
        ks[a] = (ks[a] + 1) // 2
    return ks


def _mark(events, name):
    if events is not None:
        events(name)


def fof_pipeline(xp, kernels, pos, per, ll: float, kmin: int, counts: bool, events=None):
    """The GPU pipeline on checked arguments and C-contiguous float32 or float64 ``(m, 3)``
    positions (``m >= 1``), read in their dtype.

    ``xp`` is the array module (CuPy) and ``kernels(coord, sort, index)`` returns the
    launchable kernels of :data:`CUDA_SOURCE` for those types (``name -> f(grid, block,
    args)``); ``events``, when given, is called with a stage name after each stage.
    Returns ``(root, friends)`` (``friends`` None unless ``counts``).
    """
    m = pos.shape[0]
    small = m < INT32_ROWS
    index = "int" if small else "long long"
    itype = np.int32 if small else np.int64
    coord = "float" if pos.dtype == np.float32 else "double"
    i64, f64 = np.int64, np.float64
    mm = i64(m)
    L0, L1, L2 = (f64(x) for x in per)
    inf = float("inf")
    h0, h1, h2 = (f64(0.5 * float(x) if float(x) > 0.0 else inf) for x in per)
    ll2 = f64(ll * ll)
    geometry = (L0, L1, L2, h0, h1, h2, ll2)

    # 1. one pass over the input: non-finite values, coordinates to wrap
    flags = xp.zeros(1, dtype=np.int32)
    kernels(coord, coord, index)["fof_check"](*_launch(m, _BLOCK), (pos, mm, L0, L1, L2, flags))
    found = int(host(flags)[0])
    if found & 1:
        raise ParameterError("pos contains non-finite coordinates")
    sort = "float" if coord == "float" and not found & 2 else "double"
    stype = np.float32 if sort == "float" else np.float64
    k = kernels(coord, sort, index)
    open_axes = [a for a in range(3) if not per[a] > 0.0]
    lo = [0.0, 0.0, 0.0]
    hi = [0.0, 0.0, 0.0]
    if open_axes:
        ext = host(xp.stack([pos.min(axis=0), pos.max(axis=0)]))
        for a in open_axes:
            lo[a] = float(ext[0, a])
            hi[a] = float(ext[1, a])
    dims, origin, inv = _cell_grid(per, ll, lo, hi)
    ks = [1, 1, 1] if counts else _fine_cells(per, inv, ll, dims)
    _mark(events, "check")

    # 2. keys, sort, sorted coordinates, runs of equal keys (cells)
    keys = xp.empty(m, dtype=np.int64)
    k["fof_cell_keys"](*_launch(m, _BLOCK), (
        pos, mm, L0, L1, L2, f64(origin[0]), f64(origin[1]), f64(origin[2]),
        f64(inv[0]), f64(inv[1]), f64(inv[2]), i64(dims[0]), i64(dims[1]), i64(dims[2]),
        i64(ks[0]), i64(ks[1]), i64(ks[2]), keys))
    _mark(events, "keys")
    perm = xp.argsort(keys)
    _mark(events, "sort")
    skeys = keys[perm]
    del keys
    sx, sy, sz = (xp.empty(m, dtype=stype) for _ in range(3))
    k["fof_gather"](*_launch(m, _BLOCK), (pos, perm, mm, L0, L1, L2, sx, sy, sz))
    new = xp.empty(m, dtype=np.bool_)
    new[0] = True
    xp.not_equal(skeys[1:], skeys[:-1], out=new[1:])
    starts = xp.flatnonzero(new)
    nrun = int(starts.size)
    run_start = xp.empty(nrun + 1, dtype=itype)
    run_start[:nrun] = starts
    run_start[nrun] = m
    run_keys = skeys[starts]
    del skeys, starts
    _mark(events, "cells")

    # the buffers go to the path in a dict it empties, so that each is freed when done
    bufs = {"sx": sx, "sy": sy, "sz": sz, "perm": perm, "run_keys": run_keys,
            "run_start": run_start}
    del sx, sy, sz, perm, run_keys, run_start
    if counts:
        pcell = xp.cumsum(new, dtype=itype)
        pcell -= 1
        del new
        bufs["pcell"] = pcell
        del pcell
        return _count_path(xp, k, bufs, m, dims, per, geometry, kmin, itype, events)
    del new
    return _dense_path(xp, k, bufs, m, dims, per, geometry, ks, itype, events), None


def _count_path(xp, k, bufs, m, dims, per, geometry, kmin, itype, events):
    """Friend counts and links by pair tests (step 3 of the module docstring)."""
    sx, sy, sz, pcell, perm = (bufs.pop(n) for n in ("sx", "sy", "sz", "pcell", "perm"))
    cell_keys, cell_start = bufs.pop("run_keys"), bufs.pop("run_start")
    i64, i32 = np.int64, np.int32
    mm = i64(m)
    friends_s = xp.zeros(m, dtype=np.int32)
    parent = xp.arange(m, dtype=itype)
    per_flags = [i32(1 if float(x) > 0.0 else 0) for x in per]
    head = (sx, sy, sz, pcell, cell_keys, cell_start, i64(cell_keys.size), mm,
            i64(dims[0]), i64(dims[1]), i64(dims[2]), *per_flags, *geometry)
    tail = (i32(min(kmin, 2**31 - 1)), friends_s, parent)
    for mode in ((_COUNT_AND_LINK,) if kmin <= 1 else (_COUNT_ONLY, _LINK_CORES)):
        k["fof_pairs"](*_launch(m, _PAIR_BLOCK), head + (i32(mode),) + tail)
    del head
    _mark(events, "pairs")
    del sx, sy, sz, pcell, cell_keys, cell_start
    minidx = xp.full(m, m, dtype=itype)
    k["fof_roots"](*_launch(m, _BLOCK), (parent, perm, mm, minidx))
    root = xp.empty(m, dtype=np.int64)
    friends = xp.empty(m, dtype=np.int32)
    k["fof_scatter"](*_launch(m, _BLOCK), (parent, perm, minidx, friends_s, mm, root, friends))
    _mark(events, "labels")
    return root, friends


def _dense_path(xp, k, bufs, m, dims, per, geometry, ks, itype, events):
    """Labels by dense-cell linking (step 4 of the module docstring)."""
    sx, sy, sz, perm = (bufs.pop(n) for n in ("sx", "sy", "sz", "perm"))
    fine_keys, fine_start = bufs.pop("run_keys"), bufs.pop("run_start")
    i64, i32 = np.int64, np.int32
    nfine = int(fine_keys.size)
    K = i64(ks[0] * ks[1] * ks[2])
    coords = (sx, sy, sz)
    n_units = xp.empty(nfine, dtype=itype)
    n_boxes = xp.empty(nfine, dtype=itype)
    new_cell = xp.empty(nfine, dtype=itype)
    k["fof_fine_count"](*_launch(nfine, _BLOCK), (
        fine_keys, fine_start, i64(nfine), K, *coords, *geometry, n_units, n_boxes, new_cell))
    unit_end = xp.cumsum(n_units, dtype=itype)
    del n_units
    box_end = xp.cumsum(n_boxes, dtype=itype)
    del n_boxes
    cell_end = xp.cumsum(new_cell, dtype=itype)
    del new_cell
    nunits, nboxes, ncell = (int(v) for v in host(xp.stack([unit_end[-1], box_end[-1],
                                                             cell_end[-1]])))
    unit_start = xp.empty(nunits + 1, dtype=itype)
    unit_box = xp.empty(nunits, dtype=itype)
    unit_cell = xp.empty(nunits, dtype=itype)
    boxes = xp.empty(6 * max(nboxes, 1), dtype=np.float64)
    cell_keys = xp.empty(ncell, dtype=np.int64)
    cell_unit = xp.empty(ncell + 1, dtype=itype)
    k["fof_fine_units"](*_launch(nfine, _BLOCK), (
        fine_keys, fine_start, i64(nfine), K, unit_end, box_end, cell_end, *coords,
        unit_start, unit_box, unit_cell, boxes, cell_keys, cell_unit))
    del fine_keys, fine_start, unit_end, box_end, cell_end
    unit_start[nunits] = m
    cell_unit[ncell] = nunits
    _mark(events, "units")

    parent = xp.arange(nunits, dtype=itype)
    units = (unit_start, unit_box, unit_cell, boxes)
    k["fof_link_inner"](*_launch(nunits, _PAIR_BLOCK), (
        *units, cell_unit, i64(nunits), *coords, *geometry, parent))
    cell_one = xp.empty(ncell, dtype=np.uint8)
    k["fof_cell_sets"](*_launch(ncell, _BLOCK), (cell_unit, i64(ncell), parent, cell_one))
    per_flags = [i32(1 if float(x) > 0.0 else 0) for x in per]
    k["fof_link_outer"](*_launch(nunits, _PAIR_BLOCK), (
        *units, cell_keys, cell_unit, cell_one, i64(ncell), i64(nunits),
        i64(dims[0]), i64(dims[1]), i64(dims[2]), *per_flags, *coords, *geometry, parent))
    _mark(events, "link")
    del units, unit_box, unit_cell, boxes, cell_keys, cell_unit, cell_one, coords, sx, sy, sz

    minidx = xp.full(nunits, m, dtype=itype)
    k["fof_unit_min"](*_launch(nunits, _BLOCK), (unit_start, perm, i64(nunits), parent, minidx))
    root = xp.empty(m, dtype=np.int64)
    k["fof_unit_labels"](*_launch(nunits, _BLOCK), (
        unit_start, perm, i64(nunits), parent, minidx, root))
    _mark(events, "labels")
    return root


def fof_local_gpu(pos, periods, linking_length: float, min_friends: int = 1,
                  count_friends: bool = True, *, events=None):
    """Friends-of-friends groups of one domain's particles, on the current GPU.

    The GPU twin of :func:`cosmo_dask.halos.fof_kernels.fof_local`: same
    arguments, checks and results element for element (see there and the module
    docstring for the method and its cost).

    Parameters
    ----------
    pos : cupy.ndarray or numpy.ndarray
        Particle positions, shape ``(m, 3)``, float32 or float64 (read in that
        dtype; other dtypes are converted to float64); NumPy input is copied to
        the GPU.
    periods : array_like
        Three per-axis periods (``0`` = open axis), as for ``fof_local``.
    linking_length : float
        Friends are at distance ``<= linking_length`` (float64).
    min_friends : int, optional
        ``k > 1``: only pairs whose members both have at least ``k`` friends link.
    count_friends : bool, optional
        Whether to return friend counts (default True). With ``False`` and
        ``min_friends == 1`` dense cells are linked as units (much faster on
        clustered data) and ``friends`` is ``None``.
    events : callable, optional
        Called with a stage name after each stage (for profiling, e.g. to record
        CUDA events); not called for empty input.

    Returns
    -------
    root : cupy.ndarray
        int64, shape ``(m,)``: the smallest index of each particle's group.
    friends : cupy.ndarray or None
        int32, shape ``(m,)``: friends of each particle; ``None`` when
        ``count_friends`` is False and ``min_friends == 1``.

    Raises
    ------
    ParameterError
        As ``fof_local``: wrong shapes, non-finite values, a negative period,
        ``linking_length <= 0`` or ``min_friends < 1``.
    """
    import cupy

    return fof_local_with(cupy, _cupy_kernels, pos, periods, linking_length, min_friends,
                          count_friends, events)


def fof_local_with(xp, kernels, pos, periods, linking_length, min_friends=1,
                   count_friends=True, events=None):
    """:func:`fof_local_gpu` with the array module and kernels given (see
    :func:`fof_pipeline`; the tests run the CUDA source on the host through this)."""
    pos = xp.asarray(pos)
    per, ll, kmin = check_arguments(pos.shape, periods, linking_length, min_friends)
    counts = bool(count_friends) or kmin > 1
    if pos.shape[0] == 0:
        return (xp.empty(0, dtype=np.int64), xp.empty(0, dtype=np.int32) if counts else None)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = xp.ascontiguousarray(pos)  # kept in its dtype: no float64 copy of the input
    return fof_pipeline(xp, kernels, pos, per, ll, kmin, counts, events)


def group_rows(xp, kernels, root, cls, ids, crossing, min_members: int) -> np.ndarray:
    """:func:`group_rows_gpu` with the array module and kernels given (see
    :func:`fof_pipeline`)."""
    n = int(root.size)
    index = "int" if n < INT32_ROWS else "long long"
    itype = np.int32 if index == "int" else np.int64
    root = xp.ascontiguousarray(root, dtype=itype)
    count = xp.zeros(n, dtype=np.int32)
    min_id = xp.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    kernels("float", "float", index)["group_reduce"](*_launch(n, _BLOCK), (
        root, xp.ascontiguousarray(ids, dtype=np.int64), np.int64(n), count, min_id))
    keep = (count >= min_members) | ((count > 0) & xp.asarray(crossing, dtype=bool))
    sel = xp.flatnonzero(keep)
    return host(xp.stack([xp.asarray(cls, dtype=np.int64)[sel], count[sel].astype(np.int64),
                          min_id[sel]], axis=1))


def group_rows_gpu(root, cls, ids, crossing, min_members: int) -> np.ndarray:
    """Rows ``(class, count, smallest id)`` of one domain's local groups that have at least
    ``min_members`` members here or cross a domain face (int64, on the host), without
    sorting the particles: the GPU twin of :func:`cosmo_dask.halos.fof_kernels.group_rows`
    (see there for the arguments, here CuPy arrays; the same rows in the same order), the
    counts and smallest ids reduced with atomics.
    """
    import cupy

    return group_rows(cupy, _cupy_kernels, root, cls, ids, crossing, min_members)
