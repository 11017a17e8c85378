"""Single-domain friends-of-friends on the GPU (CuPy + CUDA C).

Same contract as :func:`cosmo_dask.halos.fof_kernels.fof_local`, bit for bit:
friends when the float64 distance is ``<= linking_length`` (minimum image on
axes of period ``L > 0``), ``friends[i]`` counts the other particles within the
linking length, ``root[i]`` is the smallest input index of ``i``'s group, and
with ``min_friends = k > 1`` only pairs whose two members both have at least
``k`` friends link.

Method (the binned "virtual edge list" of HACC's PISTON halo finder, with a
lock-free union-find instead of PISTON's iterated min-label propagation):

1. Positions are read in their dtype (float32 or float64) and, in float64,
   wrapped into ``[0, L)`` on periodic axes. Cells have side at least the
   linking length: ``n = max(1, floor(L / ll))`` cells of side ``L / n`` on a
   periodic axis, cells of side ``ll`` from the smallest coordinate on an open
   axis (the grid is the CPU kernel's, computed the same way). Each particle
   gets the int64 cell id ``(cx * ny + cy) * nz + cz``.
2. The particles are sorted by cell id (``cupy.argsort``). Occupied cells are
   the runs of equal ids: their sorted ids, particle start offsets and, for
   every particle, the index of its occupied cell come from a flag / cumsum.
   Then the wrapped coordinates are gathered in sorted order (structure of
   arrays): float32 when the input is float32 with nothing to wrap (it converts
   to float64 exactly in the distance test), else float64.
3. One thread per (sorted) particle ``i`` walks the distinct neighbour cells
   (27, fewer when a periodic axis has fewer than three cells or at the edges of
   an open axis). The up to three cells along the last axis are one run of
   consecutive ids unless they wrap, so nine (or fewer) runs are located by a
   galloping binary search in the sorted occupied-cell ids, started from the
   particle's own cell (searches for the same ``cx`` are short, the first for
   ``cx +- 1`` is long, the ``cy +- 1`` ones after it short again). A run of
   occupied cells is one contiguous range of sorted particles. Every friend is
   counted (so each thread owns its count: no atomics); friends ``j > i`` are
   merged in a union-find forest without an edge list: both roots are found
   (path halving), and the larger root is hooked under the smaller with
   ``atomicCAS(parent[r], r, other)``, retrying from the value the failed CAS
   returns. ``parent[x] <= x`` always holds, so the forest cannot form a cycle
   and every root is the smallest sorted index of its tree. With
   ``min_friends > 1`` a first launch only counts, a second links core pairs.
4. Every particle's root is found (path halving), the smallest input index of
   each tree is taken with ``atomicMin``, and roots and counts are scattered
   back to input order.

Exactness: the kernels are compiled with ``--fmad=false`` so the distance test
``d*d + e*e + f*f <= ll*ll`` and the wrapping ``x - L*floor(x/L)`` round exactly
as the (unfused) numba code does; the test is symmetric in ``i`` and ``j``.

Performance: for ``m`` particles the work is O(m log(occupied cells)) searches
plus one distance test per particle pair in neighbouring cells (each pair is
tested twice, once from each side, which buys atomic-free friend counts).
Measured on one H200 (CuPy 14.2, :func:`benchmark_gpu`, 256**3 = 16.7M
particles, ll = 0.2 mean spacing, median of 5, device-resident float64 input):
uniform 9.3 ms end to end (1.8e9 particles/s; pair kernel 3.2 ms, argsort 1.6,
occupied cells 1.7, roots and scatter 2.3); clustered (half the particles in
halos with ~1e4-overdensity cores, 13 friends per particle on average) 38 ms
(4.4e8 particles/s), of which the pair kernel is 31 ms: distance tests and
union finds in the dense cells dominate. ``min_friends = 5`` adds a second pair
pass (40 ms). Next steps if that is too slow: one warp per dense cell with the
neighbour particles staged in shared memory, sub-cells of side ``ll / sqrt(3)``
whose members are all friends (one union per sub-cell instead of one per pair),
half-shell pairs with atomic friend counts, a 32-bit union-find forest.

Memory: cell offsets and per-particle cell indices are int32 below 2^31
particles, the permutation and the union-find forest int64. For float32 input
the pair pass holds about 48 bytes per particle besides the input; the memory
figures of whole FOF runs are in ``benchmarks/RESULTS.md``.

Limits: ``friends`` is int32 as on the CPU.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from ..errors import ParameterError
from .fof_kernels import _MAX_CELLS_PER_AXIS, _SIDE_MARGIN, check_arguments

__all__ = ["benchmark_gpu", "class_rows_gpu", "fof_local_gpu"]

_BLOCK = 256
_PAIR_BLOCK = 128
_MAX_GRID = 1 << 24

# Pass modes of fof_pairs (as in fof_kernels._pair_pass).
_COUNT_AND_LINK = 0
_COUNT_ONLY = 1
_LINK_CORES = 2

_CUDA_SOURCE = r"""
typedef long long i64;
typedef unsigned long long u64;

// x taken into [0, L); values at or beyond the ends included (as fof_kernels._wrap).
__device__ __forceinline__ double wrap_period(double x, double L)
{
    if (x < 0.0 || x >= L) {
        x = x - L * floor(x / L);
        if (x >= L || x < 0.0) {
            x = 0.0;
        }
    }
    return x;
}

__device__ __forceinline__ i64 cell_coord(double x, double L, double origin, double inv, i64 n)
{
    double t = (L > 0.0) ? wrap_period(x, L) * inv : (0.5 * x - origin) * inv;
    if (!(t < (double)n)) {
        return n - 1;
    }
    if (t < 0.0) {
        return 0;
    }
    return (i64)t;
}

extern "C" __global__ void fof_cell_ids(
    const coord_t* __restrict__ pos, const i64 m,
    const double L0, const double L1, const double L2,
    const double o0, const double o1, const double o2,
    const double inv0, const double inv1, const double inv2,
    const i64 n0, const i64 n1, const i64 n2,
    i64* __restrict__ ids)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += stride) {
        const i64 c0 = cell_coord(pos[3 * i], L0, o0, inv0, n0);
        const i64 c1 = cell_coord(pos[3 * i + 1], L1, o1, inv1, n1);
        const i64 c2 = cell_coord(pos[3 * i + 2], L2, o2, inv2, n2);
        ids[i] = (c0 * n1 + c1) * n2 + c2;
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

// Root of x's tree with path halving. parent[y] <= y always, and a node that is no
// longer a root never becomes one again, so a stale read is still an ancestor and
// the halving stores (plain 64-bit stores, never to a root) are benign races.
__device__ __forceinline__ i64 find_root(i64* parent, i64 x)
{
    volatile i64* vp = parent;
    while (true) {
        const i64 p = vp[x];
        if (p == x) {
            return x;
        }
        const i64 g = vp[p];
        if (g == p) {
            return p;
        }
        vp[x] = g;
        x = g;
    }
}

// Merge the trees of u (an ancestor of the calling particle, updated) and j.
__device__ __forceinline__ void unite(i64* parent, i64& u, const i64 j)
{
    u = find_root(parent, u);
    i64 v = find_root(parent, j);
    while (u != v) {
        if (u < v) {
            const u64 old = atomicCAS((u64*)(parent + v), (u64)v, (u64)u);
            if (old == (u64)v) {
                return;
            }
            v = find_root(parent, (i64)old);
        } else {
            const u64 old = atomicCAS((u64*)(parent + u), (u64)u, (u64)v);
            if (old == (u64)u) {
                u = v;
                return;
            }
            u = find_root(parent, (i64)old);
        }
    }
}

// One thread per sorted particle k. mode 0: count friends and link friend pairs;
// 1: count only; 2: link pairs whose members both have friends >= kmin.
extern "C" __global__ void fof_pairs(
    const sort_t* __restrict__ sx, const sort_t* __restrict__ sy,
    const sort_t* __restrict__ sz, const cell_t* __restrict__ pcell,
    const i64* __restrict__ cell_keys, const cell_t* __restrict__ cell_start,
    const i64 nocc, const i64 m, const i64 nx, const i64 ny, const i64 nz,
    const int per0, const int per1, const int per2,
    const double L0, const double L1, const double L2,
    const double h0, const double h1, const double h2, const double ll2,
    const int mode, const int kmin, int* friends, i64* parent)
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
        i64 u = k;
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
                        double d = xi - (double)sx[j];
                        if (d > h0) {
                            d -= L0;
                        } else if (d < -h0) {
                            d += L0;
                        }
                        const double d2 = d * d;
                        if (d2 > ll2) {
                            continue;
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
                        const double e2 = e * e;
                        const double s = d2 + e2;
                        const double f2 = f * f;
                        if (!(s + f2 <= ll2)) {
                            continue;
                        }
                        if (count) {
                            ++cnt;
                        }
                        if (link && j > k) {
                            unite(parent, u, j);
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

// Root of every sorted particle, and the smallest input index of every tree.
extern "C" __global__ void fof_roots(
    i64* parent, const i64* __restrict__ perm, const i64 m,
    i64* __restrict__ root_sorted, u64* __restrict__ minidx)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < m; k += stride) {
        const i64 r = find_root(parent, k);
        root_sorted[k] = r;
        atomicMin(minidx + r, (u64)perm[k]);
    }
}

// Back to input order.
extern "C" __global__ void fof_scatter(
    const i64* __restrict__ root_sorted, const i64* __restrict__ perm,
    const u64* __restrict__ minidx, const int* __restrict__ friends_sorted, const i64 m,
    i64* __restrict__ root, int* __restrict__ friends)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < m; k += stride) {
        const i64 p = perm[k];
        root[p] = (i64)minidx[root_sorted[k]];
        friends[p] = friends_sorted[k];
    }
}

// One thread per sorted row k: the smallest id and any crossing row of each run
// (run[k] is the run of row k; order maps sorted rows to input rows).
extern "C" __global__ void run_reduce(
    const i64* __restrict__ order, const i64* __restrict__ ids,
    const bool* __restrict__ crossing, const cell_t* __restrict__ run, const i64 m,
    long long* __restrict__ min_id, int* __restrict__ cross)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < m; k += stride) {
        const i64 r = order[k];
        const i64 j = run[k];
        atomicMin(min_id + j, (long long)ids[r]);
        if (crossing[r]) {
            cross[j] = 1;  // every writer stores 1: a benign race
        }
    }
}
"""

_KERNEL_NAMES = ("fof_cell_ids", "fof_gather", "fof_pairs", "fof_roots", "fof_scatter",
                 "run_reduce")
_NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")


@functools.cache
def _kernels(device_id: int, coord: str = "double", sort: str = "double",
             cell: str = "long long") -> dict:
    """The compiled kernels for one device and storage types (compiled on first use,
    then cached): ``coord`` the input coordinates, ``sort`` the sorted copies ("float"
    or "double"; arithmetic is double either way), ``cell`` the per-particle cell
    indices and cell offsets ("int" or "long long")."""
    import cupy

    types = f"typedef {coord} coord_t;\ntypedef {sort} sort_t;\ntypedef {cell} cell_t;\n"
    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=types + _CUDA_SOURCE, options=_NVRTC_OPTIONS)
        return {name: module.get_function(name) for name in _KERNEL_NAMES}


def _grid(m: int, block: int) -> tuple[int]:
    return (max(1, min(-(-m // block), _MAX_GRID)),)


def _cell_grid(per, ll, lo, hi):
    """Cells per axis, open-axis origins and inverse cell sides (as ``fof_kernels._cell_ids``).

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


class _StageTimer:
    """CUDA events at stage boundaries on the current stream."""

    def __init__(self, cupy):
        self._cupy = cupy
        self.marks = []

    def mark(self, name):
        ev = self._cupy.cuda.Event()
        ev.record()
        self.marks.append((name, ev))

    def stages_ms(self):
        self.marks[-1][1].synchronize()
        out = {}
        for (_, e0), (name, e1) in zip(self.marks[:-1], self.marks[1:], strict=True):
            out[name] = out.get(name, 0.0) + self._cupy.cuda.get_elapsed_time(e0, e1)
        return out


def _fof_impl(cupy, pos, per, ll, kmin, timer=None):
    """The GPU pipeline on validated, finite, C-contiguous float32 or float64 ``(m, 3)``
    positions, read in their dtype. Sorted copies are float32 when the input is float32
    with every periodic coordinate inside ``[0, L)`` (nothing to wrap), else float64;
    cell indices are int32 below 2^31 particles. Buffers are freed as soon as done
    with: the pair pass holds about 48 bytes per particle (float32 input)."""
    m = pos.shape[0]
    inside = all(not float(per[a]) > 0.0
                 or not bool(((pos[:, a] < 0) | (pos[:, a] >= float(per[a]))).any())
                 for a in range(3))
    small = m < 2**31 - 1
    coord = "float" if pos.dtype == np.float32 else "double"
    sort = "float" if coord == "float" and inside else "double"
    k = _kernels(cupy.cuda.Device().id, coord, sort, "int" if small else "long long")
    i64, f64, i32 = np.int64, np.float64, np.int32
    ctype = cupy.int32 if small else cupy.int64
    stype = cupy.float32 if sort == "float" else cupy.float64
    mm = i64(m)
    grid = _grid(m, _BLOCK)

    # 1. cell ids
    open_axes = [a for a in range(3) if not per[a] > 0.0]
    lo = [0.0, 0.0, 0.0]
    hi = [0.0, 0.0, 0.0]
    if open_axes:
        pmin = cupy.asnumpy(pos.min(axis=0))
        pmax = cupy.asnumpy(pos.max(axis=0))
        for a in open_axes:
            lo[a] = float(pmin[a])
            hi[a] = float(pmax[a])
    dims, origin, inv = _cell_grid(per, ll, lo, hi)
    L0, L1, L2 = (f64(x) for x in per)
    ids = cupy.empty(m, dtype=cupy.int64)
    k["fof_cell_ids"](grid, (_BLOCK,), (
        pos, mm, L0, L1, L2, f64(origin[0]), f64(origin[1]), f64(origin[2]),
        f64(inv[0]), f64(inv[1]), f64(inv[2]), i64(dims[0]), i64(dims[1]), i64(dims[2]), ids))
    if timer is not None:
        timer.mark("cell_ids")

    # 2. sort by cell, occupied cells, then the wrapped coordinates in sorted order
    perm = cupy.argsort(ids).astype(cupy.int64, copy=False)
    if timer is not None:
        timer.mark("sort")
    skeys = ids[perm]
    del ids
    newcell = cupy.empty(m, dtype=cupy.bool_)
    newcell[0] = True
    cupy.not_equal(skeys[1:], skeys[:-1], out=newcell[1:])
    nocc = int(cupy.count_nonzero(newcell))
    cell_start = cupy.empty(nocc + 1, dtype=ctype)
    cell_start[:nocc] = cupy.flatnonzero(newcell)
    cell_start[nocc] = m
    cell_keys = skeys[cell_start[:nocc]]
    del skeys
    pcell = cupy.cumsum(newcell, dtype=ctype)
    pcell -= 1
    del newcell
    sx = cupy.empty(m, dtype=stype)
    sy = cupy.empty(m, dtype=stype)
    sz = cupy.empty(m, dtype=stype)
    k["fof_gather"](grid, (_BLOCK,), (pos, perm, mm, L0, L1, L2, sx, sy, sz))
    if timer is not None:
        timer.mark("cells")

    # 3. friend counts and union-find links
    friends_s = cupy.zeros(m, dtype=cupy.int32)
    parent = cupy.arange(m, dtype=cupy.int64)
    inf = float("inf")
    h = [0.5 * float(x) if float(x) > 0.0 else inf for x in per]
    per_flags = [i32(1 if float(x) > 0.0 else 0) for x in per]
    pair_grid = _grid(m, _PAIR_BLOCK)

    head = (sx, sy, sz, pcell, cell_keys, cell_start, i64(nocc), mm,
            i64(dims[0]), i64(dims[1]), i64(dims[2]), per_flags[0], per_flags[1], per_flags[2],
            L0, L1, L2, f64(h[0]), f64(h[1]), f64(h[2]), f64(ll * ll))
    tail = (i32(min(kmin, 2**31 - 1)), friends_s, parent)
    modes = (_COUNT_AND_LINK,) if kmin <= 1 else (_COUNT_ONLY, _LINK_CORES)
    for mode in modes:
        k["fof_pairs"](pair_grid, (_PAIR_BLOCK,), head + (i32(mode),) + tail)
    del head
    if timer is not None:
        timer.mark("pairs")
    del sx, sy, sz, pcell, cell_keys, cell_start

    # 4. roots, smallest input index per tree, back to input order
    root_s = cupy.empty(m, dtype=cupy.int64)
    minidx = cupy.full(m, m, dtype=cupy.uint64)
    k["fof_roots"](grid, (_BLOCK,), (parent, perm, mm, root_s, minidx))
    del parent
    root = cupy.empty(m, dtype=cupy.int64)
    friends = cupy.empty(m, dtype=cupy.int32)
    k["fof_scatter"](grid, (_BLOCK,), (root_s, perm, minidx, friends_s, mm, root, friends))
    if timer is not None:
        timer.mark("finish")
    return root, friends


def fof_local_gpu(pos, periods, linking_length: float, min_friends: int = 1):
    """Friends-of-friends groups of one domain's particles, on the current GPU.

    The GPU twin of :func:`cosmo_dask.halos.fof_kernels.fof_local`: same
    arguments, checks and results element for element (see there and the module
    docstring for the method and its cost). Positions may be CuPy or NumPy
    (copied to the GPU), float32 or float64 (read in that dtype); ``root`` and
    ``friends`` are returned as CuPy arrays.
    """
    return _run(pos, periods, linking_length, min_friends)


def _run(pos, periods, linking_length, min_friends, timer=None):
    import cupy

    if timer is not None:
        timer.mark("start")
    pos = cupy.asarray(pos)
    per, ll, kmin = check_arguments(pos.shape, periods, linking_length, min_friends)
    m = pos.shape[0]
    if m == 0:
        return cupy.empty(0, dtype=cupy.int64), cupy.empty(0, dtype=cupy.int32)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(cupy.float64)
    pos = cupy.ascontiguousarray(pos)  # kept in its dtype: no float64 copy of the input
    if not bool(cupy.isfinite(pos).all()):
        raise ParameterError("pos contains non-finite coordinates")
    if timer is not None:
        timer.mark("validate")
    return _fof_impl(cupy, pos, per, ll, kmin, timer)


def class_rows_gpu(cls, ids, crossing, min_members: int) -> np.ndarray:
    """The GPU twin of :func:`cosmo_dask.halos.fof_kernels.class_rows` (CuPy arrays in,
    the small host table out): one argsort by class, run boundaries from a flag /
    cumsum, smallest ids and crossings by atomics (one thread per row)."""
    import cupy

    cls = cupy.ascontiguousarray(cls, dtype=cupy.int64)
    m = cls.size
    small = m < 2**31 - 1
    order = cupy.argsort(cls)
    c = cls[order]
    first = cupy.empty(m, dtype=cupy.bool_)
    first[0] = True
    cupy.not_equal(c[1:], c[:-1], out=first[1:])
    starts = cupy.flatnonzero(first)
    keys = c[starts]
    del c
    run = cupy.cumsum(first, dtype=cupy.int32 if small else cupy.int64)
    run -= 1
    del first
    counts = cupy.diff(cupy.concatenate([starts, cupy.asarray([m])]))
    del starts
    min_id = cupy.full(keys.size, np.iinfo(np.int64).max, dtype=cupy.int64)
    cross = cupy.zeros(keys.size, dtype=cupy.int32)
    k = _kernels(cupy.cuda.Device().id, cell="int" if small else "long long")
    k["run_reduce"](_grid(m, _BLOCK), (_BLOCK,), (
        order, cupy.ascontiguousarray(ids, dtype=cupy.int64),
        cupy.ascontiguousarray(crossing, dtype=cupy.bool_), run, np.int64(m), min_id, cross))
    keep = (counts >= min_members) | (cross != 0)
    return cupy.stack([keys[keep], counts[keep], min_id[keep]], axis=1).get()


def _benchmark_positions(m, clustered, seed, halo_fraction=0.5):
    """Positions in a periodic box of side ``m**(1/3)`` (mean spacing 1), as NumPy float64.

    ``clustered``: ``halo_fraction`` of the particles sit in Gaussian halos with
    a power-law size function (``dN/dn ~ n**-2`` for ``20 <= n <= 2e5``
    members) and ``sigma = 0.05 n**(1/3)`` (central overdensity ~500); a
    fifth of each halo's particles form a core with ``sigma / 5`` (overdensity
    ~1e4). The rest are uniform.
    """
    rng = np.random.default_rng(seed)
    box = float(m) ** (1.0 / 3.0)
    if not clustered:
        return rng.random((m, 3)) * box, box
    n_halo_parts = int(halo_fraction * m)
    nmin, nmax = 20.0, 2e5
    batches = []
    total = 0
    while total < n_halo_parts:
        u = rng.random(4096)
        # inverse CDF of p(n) ~ n**-2 on [nmin, nmax]
        n = (1.0 / (1.0 / nmin - u * (1.0 / nmin - 1.0 / nmax))).astype(np.int64)
        batches.append(n)
        total += int(n.sum())
    sizes = np.concatenate(batches)
    csum = np.cumsum(sizes)
    last = int(np.searchsorted(csum, n_halo_parts))
    sizes = sizes[: last + 1].copy()
    if sizes.size:
        sizes[-1] -= int(csum[last]) - n_halo_parts
    sizes = sizes[sizes > 0]
    owner = np.repeat(np.arange(sizes.size), sizes)
    centres = rng.random((sizes.size, 3)) * box
    sigma = 0.05 * sizes.astype(np.float64) ** (1.0 / 3.0)
    scale = sigma[owner] * np.where(rng.random(owner.size) < 0.2, 0.2, 1.0)
    halo = centres[owner] + rng.standard_normal((owner.size, 3)) * scale[:, None]
    pos = np.concatenate([halo, rng.random((m - owner.size, 3)) * box])
    return np.mod(pos, box), box


def benchmark_gpu(m: int = 256**3, clustered: bool = True, linking_fraction: float = 0.2,
                  min_friends: int = 1, repeats: int = 5, seed: int = 0) -> dict:
    """Time :func:`fof_local_gpu` on synthetic data with CUDA events.

    Parameters
    ----------
    m : int, optional
        Number of particles, in a periodic box of side ``m**(1/3)``.
    clustered : bool, optional
        Half the particles in Gaussian halos with dense cores (see
        ``_benchmark_positions``) if True, else uniform.
    linking_fraction : float, optional
        Linking length in units of the mean spacing.
    min_friends : int, optional
        Passed to :func:`fof_local_gpu`.
    repeats : int, optional
        Timed runs after one warm-up run; medians are reported.
    seed : int, optional
        Seed of the synthetic positions.

    Returns
    -------
    dict
        ``m``, ``clustered``, ``linking_length``, ``device``, ``seconds`` (median
        end-to-end GPU time from device-resident float64 positions to the
        returned arrays, host synchronisation gaps included), ``particles_per_s``,
        ``stages_ms`` (median per stage), ``runs_s`` (all timed runs),
        ``n_groups_ge2``, ``n_in_groups``, ``mean_friends`` and ``setup_s``
        (positions generation and copy, not timed above).
    """
    import cupy

    t0 = time.perf_counter()
    pos_np, box = _benchmark_positions(int(m), clustered, seed)
    pos = cupy.asarray(pos_np)
    del pos_np
    cupy.cuda.Device().synchronize()
    setup_s = time.perf_counter() - t0
    ll = float(linking_fraction)
    periods = (box, box, box)

    root, friends = _run(pos, periods, ll, min_friends)  # warm-up (compiles the kernels)
    cupy.cuda.Device().synchronize()
    runs = []
    stages = []
    for _ in range(int(repeats)):
        timer = _StageTimer(cupy)
        root, friends = _run(pos, periods, ll, min_friends, timer=timer)
        st = timer.stages_ms()
        stages.append(st)
        runs.append(sum(st.values()) / 1e3)
    seconds = float(np.median(runs))
    sizes = cupy.bincount(root)
    n_groups = int((sizes >= 2).sum())
    n_in = int(sizes[sizes >= 2].sum())
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return {
        "m": int(m),
        "clustered": bool(clustered),
        "linking_length": ll,
        "min_friends": int(min_friends),
        "device": name,
        "seconds": seconds,
        "particles_per_s": m / seconds,
        "stages_ms": {key: float(np.median([s.get(key, 0.0) for s in stages]))
                      for key in stages[0]},
        "runs_s": runs,
        "n_groups_ge2": n_groups,
        "n_in_groups": n_in,
        "mean_friends": float(friends.mean()),
        "setup_s": setup_s,
    }
