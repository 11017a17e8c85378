// Friends-of-friends on the GPU (cosmo_dask.halos.fof_kernels_gpu). Defines
// (fof_kernels_gpu.cuda_defines): COORD_T (input coordinates), SORT_T (sorted copies),
// IDX_T (indices, offsets and the union-find forest: "int" or "long long").
typedef COORD_T coord_t;
typedef SORT_T sort_t;
typedef IDX_T idx_t;
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
