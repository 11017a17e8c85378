"""Tetrahedron-cube intersection volumes and tetrahedron deposits on the GPU (CuPy).

Same geometry as :mod:`cosmo_dask.density.tet_volume` (clip against the six
cube planes depth first with a 16-slot stack per thread, prism splits, the
same fast paths and the same operation order), written as CUDA C and compiled
with NVRTC (``--fmad=false``, so float64 results match the numba kernel to
rounding). The arithmetic type follows the input: float64 tetrahedra are
processed in double, and float32 input is converted to float64 first (as on
the CPU). A float-arithmetic variant exists (``arithmetic="float32"``) but is
not the default: measured on an H200 (2026-11-21) it deposited a z=0
Zel'dovich snapshot (64^3, 100 Mpc/h, onto 128^3) with a 28% total-mass error,
because thin, stretched tetrahedra lose their volume to cancellation in float
(6x volume ~ 1e-6 of the cube of the edge lengths). It was 2.2x faster. The
deposit grid is always float64, accumulated with ``atomicAdd``.

Kernels
-------
``tet_cube_pairs``
    One thread per (tetrahedron, cube) pair.
``deposit_thread``
    One thread per tetrahedron, looping over the cells of its bounding box.
``deposit_warp``
    ADECO's scheme: one warp per tetrahedron; the 32 lanes classify 32 cells
    of its bounding box at a time (bounding-box / face-plane fast paths,
    deposited at once); cells that need a clip are appended to a 64-entry
    queue in shared memory (warp ballot + popc, no atomics) and clipped 32 at
    a time by all lanes together, so clips run without divergence against
    fast paths.

:func:`deposit_tets_gpu` picks ``deposit_warp`` when the tetrahedra span many
cells on average and ``deposit_thread`` otherwise (``method="auto"``); see
``benchmarks/results/2026-11-21/`` for the measurements behind the rule.
Measured (one H200, 2026-11-21, 64^3-particle Zel'dovich snapshot at z=0 in
100 Mpc/h, 1.57M tetrahedra covering 94 cells of a periodic 128^3 grid each on
average, float64, CUDA events, median of 3): warp 1.88 s (8.3e5 tets/s),
thread 2.37 s (6.6e5 tets/s); the serial numba deposit took 76 s on that
host (2.1e4 tets/s); GPU and CPU grids agree to 1.4e-15 of the largest cell,
total mass to 2.4e-15. Most of the time is full clips: a stretched z=0
tetrahedron cuts most cells of its bounding box. Next steps: clip once per
x-slab and y-row and reuse the pieces (r3d-style voxelisation), keep the
16-slot clip stack in shared memory instead of local memory.
Deposit sums use atomics, so the order of additions (and the last bits of
each cell) may vary from run to run.
"""

from __future__ import annotations

import functools

import numpy as np

from ..backend import require_gpu
from ..errors import ParameterError
from .tet_volume import _as_cubes, _as_tets, check_grid

_NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")
_KERNEL_NAMES = ("tet_cube_pairs", "deposit_thread", "deposit_warp")
WARPS_PER_BLOCK = 4

_CUDA_SOURCE = r"""
#define STACK 16

__device__ __forceinline__ real det6(const real* s) {
    real ax = s[3] - s[0], ay = s[4] - s[1], az = s[5] - s[2];
    real bx = s[6] - s[0], by = s[7] - s[1], bz = s[8] - s[2];
    real cx = s[9] - s[0], cy = s[10] - s[1], cz = s[11] - s[2];
    return ax * (by * cz - bz * cy) - ay * (bx * cz - bz * cx) + az * (bx * cy - by * cx);
}

__device__ __forceinline__ void prism(const real* tmp, real* out) {
    // (a0 a1 a2 b0) (a1 a2 b0 b1) (a2 b0 b1 b2): consecutive windows of tmp[0..5]
    #pragma unroll
    for (int k = 0; k < 3; ++k)
        #pragma unroll
        for (int q = 0; q < 12; ++q) out[12 * k + q] = tmp[3 * k + q];
}

// volume of tetrahedron st[0..11] (cube-local) inside [0,h]^3
__device__ real clip_volume(real* st, int* lev, real h) {
    real vol = 0;
    int top = 1;
    lev[0] = 0;
    real cur[12], d[4], tmp[18];
    int in_[4], out_[4];
    while (top > 0) {
        --top;
        for (int q = 0; q < 12; ++q) cur[q] = st[12 * top + q];
        int level = lev[top];
        bool done = false;
        while (level < 6) {
            int ax = level >> 1, upper = level & 1;
            real plane = upper ? h : (real)0;
            int nin = 0, nout = 0;
            for (int v = 0; v < 4; ++v) {
                real dv = upper ? (h - cur[3 * v + ax]) : cur[3 * v + ax];
                d[v] = dv;
                if (dv > (real)0) in_[nin++] = v; else out_[nout++] = v;
            }
            if (nin == 0) { done = true; break; }
            if (nout == 0) { ++level; continue; }
            real* o = st + 12 * top;
            if (nin == 1) {
                int a = in_[0];
                for (int c = 0; c < 3; ++c) o[c] = cur[3 * a + c];
                for (int k = 0; k < 3; ++k) {
                    int b = out_[k];
                    real w = d[a] / (d[a] - d[b]);
                    for (int c = 0; c < 3; ++c)
                        o[3 * (k + 1) + c] = cur[3 * a + c] + w * (cur[3 * b + c] - cur[3 * a + c]);
                    o[3 * (k + 1) + ax] = plane;
                }
                lev[top] = level + 1;
                top += 1;
            } else if (nin == 2) {
                int a = in_[0], b = in_[1], c0 = out_[0], c1 = out_[1];
                real wa0 = d[a] / (d[a] - d[c0]);
                real wa1 = d[a] / (d[a] - d[c1]);
                real wb0 = d[b] / (d[b] - d[c0]);
                real wb1 = d[b] / (d[b] - d[c1]);
                for (int c = 0; c < 3; ++c) {
                    tmp[c] = cur[3 * a + c];
                    tmp[9 + c] = cur[3 * b + c];
                    tmp[3 + c] = cur[3 * a + c] + wa0 * (cur[3 * c0 + c] - cur[3 * a + c]);
                    tmp[6 + c] = cur[3 * a + c] + wa1 * (cur[3 * c1 + c] - cur[3 * a + c]);
                    tmp[12 + c] = cur[3 * b + c] + wb0 * (cur[3 * c0 + c] - cur[3 * b + c]);
                    tmp[15 + c] = cur[3 * b + c] + wb1 * (cur[3 * c1 + c] - cur[3 * b + c]);
                }
                tmp[3 + ax] = plane; tmp[6 + ax] = plane;
                tmp[12 + ax] = plane; tmp[15 + ax] = plane;
                prism(tmp, o);
                lev[top] = lev[top + 1] = lev[top + 2] = level + 1;
                top += 3;
            } else {
                int e = out_[0];
                for (int k = 0; k < 3; ++k) {
                    int a = in_[k];
                    real w = d[a] / (d[a] - d[e]);
                    for (int c = 0; c < 3; ++c) {
                        tmp[3 * k + c] = cur[3 * a + c];
                        tmp[3 * (k + 3) + c] =
                            cur[3 * a + c] + w * (cur[3 * e + c] - cur[3 * a + c]);
                    }
                    tmp[3 * (k + 3) + ax] = plane;
                }
                prism(tmp, o);
                lev[top] = lev[top + 1] = lev[top + 2] = level + 1;
                top += 3;
            }
            done = true;
            break;
        }
        if (done) continue;
        real v6 = det6(cur);
        vol += (v6 < 0 ? -v6 : v6) / (real)6;
    }
    return vol;
}

struct Tet {
    real v[12];
    real nrm[12];
    real off[4];
    real bmin[3], bmax[3];
    real vol;
};

__device__ void tet_setup(Tet& T) {
    const int F[4][3] = {{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1, 2}};
    for (int f = 0; f < 4; ++f) {
        int a = F[f][0], b = F[f][1], c = F[f][2];
        real ux = T.v[3*b] - T.v[3*a], uy = T.v[3*b+1] - T.v[3*a+1], uz = T.v[3*b+2] - T.v[3*a+2];
        real wx = T.v[3*c] - T.v[3*a], wy = T.v[3*c+1] - T.v[3*a+1], wz = T.v[3*c+2] - T.v[3*a+2];
        real nx = uy * wz - uz * wy, ny = uz * wx - ux * wz, nz = ux * wy - uy * wx;
        real o = -(nx * T.v[3*a] + ny * T.v[3*a+1] + nz * T.v[3*a+2]);
        real s = nx * T.v[3*f] + ny * T.v[3*f+1] + nz * T.v[3*f+2] + o;
        if (s < (real)0) { nx = -nx; ny = -ny; nz = -nz; o = -o; }
        T.nrm[3*f] = nx; T.nrm[3*f+1] = ny; T.nrm[3*f+2] = nz; T.off[f] = o;
    }
    real v6 = det6(T.v);
    T.vol = (v6 < 0 ? -v6 : v6) / (real)6;
    for (int c = 0; c < 3; ++c) {
        T.bmin[c] = fmin(fmin(T.v[c], T.v[3 + c]), fmin(T.v[6 + c], T.v[9 + c]));
        T.bmax[c] = fmax(fmax(T.v[c], T.v[3 + c]), fmax(T.v[6 + c], T.v[9 + c]));
    }
}

// fast paths: returns >= 0 when decided, -1 when a clip is needed
__device__ real fast_volume(const Tet& T, const real* lo, real h) {
    bool inside_box = true;
    for (int c = 0; c < 3; ++c) {
        if (T.bmax[c] <= lo[c] || T.bmin[c] >= lo[c] + h) return 0;
        if (T.bmin[c] < lo[c] || T.bmax[c] > lo[c] + h) inside_box = false;
    }
    if (inside_box) return T.vol;
    if (T.vol == (real)0) return 0;
    bool all_in = true;
    for (int f = 0; f < 4; ++f) {
        real base = T.nrm[3*f] * lo[0] + T.nrm[3*f+1] * lo[1] + T.nrm[3*f+2] * lo[2] + T.off[f];
        real pos = 0, neg = 0;
        for (int c = 0; c < 3; ++c) {
            real t = T.nrm[3*f + c] * h;
            if (t > (real)0) pos += t; else neg += t;
        }
        if (base + pos <= (real)0) return 0;
        if (base + neg < (real)0) all_in = false;
    }
    if (all_in) return h * h * h;
    return -1;
}

__device__ real slow_volume(const Tet& T, const real* lo, real h) {
    real st[12 * STACK];
    int lev[STACK];
    for (int k = 0; k < 4; ++k)
        for (int c = 0; c < 3; ++c) st[3 * k + c] = T.v[3 * k + c] - lo[c];
    return clip_volume(st, lev, h);
}

extern "C" __global__ void tet_cube_pairs(const real* tets, const double* los, const double* hs,
                                          long long nt, long long nc, real* out) {
    long long n = nt * nc;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < n;
         p += (long long)gridDim.x * blockDim.x) {
        long long t = p / nc, j = p - t * nc;
        Tet T;
        for (int q = 0; q < 12; ++q) T.v[q] = tets[12 * t + q];
        tet_setup(T);
        real lo[3] = {(real)los[3 * j], (real)los[3 * j + 1], (real)los[3 * j + 2]};
        real h = (real)hs[j];
        real w = fast_volume(T, lo, h);
        if (w < (real)0) w = slow_volume(T, lo, h);
        out[p] = w;
    }
}

__device__ __forceinline__ int wrapi(int i, int n) { int r = i % n; return r < 0 ? r + n : r; }

// load tet t in cell units; returns the number of bbox cells (0: nothing to do)
__device__ long long load_cell_units(const real* tets, long long t, const double* glo, double cs,
                                     int nx, int ny, int nz, int periodic, Tet& T,
                                     int* imin, int* ext) {
    for (int k = 0; k < 4; ++k)
        for (int c = 0; c < 3; ++c)
            T.v[3 * k + c] = (real)(((double)tets[12 * t + 3 * k + c] - glo[c]) / cs);
    tet_setup(T);
    int n3[3] = {nx, ny, nz};
    long long total = 1;
    for (int c = 0; c < 3; ++c) {
        int i0 = (int)floor((double)T.bmin[c]);
        int i1 = (int)floor((double)T.bmax[c]);
        if (i1 > i0 && (real)i1 == T.bmax[c]) --i1;
        if (!periodic) { i0 = max(i0, 0); i1 = min(i1, n3[c] - 1); }
        imin[c] = i0;
        ext[c] = i1 - i0 + 1;
        if (ext[c] <= 0) return 0;
        total *= ext[c];
    }
    return total;
}

__device__ void deposit_degenerate(const Tet& T, double m, int nx, int ny, int nz, int periodic,
                                   double* grid) {
    int n3[3] = {nx, ny, nz}, g[3];
    for (int c = 0; c < 3; ++c) {
        g[c] = (int)floor(0.25 * ((double)T.v[c] + T.v[3 + c] + T.v[6 + c] + T.v[9 + c]));
        if (periodic) g[c] = wrapi(g[c], n3[c]);
        else if (g[c] < 0 || g[c] >= n3[c]) return;
    }
    atomicAdd(grid + ((long long)g[0] * ny + g[1]) * nz + g[2], m);
}

__device__ __forceinline__ void cell_of(long long c, const int* imin, const int* ext,
                                        int nx, int ny, int nz, real* lo, long long* gidx) {
    int k = (int)(c % ext[2]);
    long long r = c / ext[2];
    int j = (int)(r % ext[1]);
    int i = (int)(r / ext[1]);
    i += imin[0]; j += imin[1]; k += imin[2];
    lo[0] = (real)i; lo[1] = (real)j; lo[2] = (real)k;
    *gidx = ((long long)wrapi(i, nx) * ny + wrapi(j, ny)) * nz + wrapi(k, nz);
}

extern "C" __global__ void deposit_thread(const real* tets, const double* mass, long long nt,
                                          const double* glo, double cs, int nx, int ny, int nz,
                                          int periodic, double* grid) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < nt;
         t += (long long)gridDim.x * blockDim.x) {
        Tet T;
        int imin[3], ext[3];
        long long ncell = load_cell_units(tets, t, glo, cs, nx, ny, nz, periodic, T, imin, ext);
        double m = mass[t];
        if (T.vol == (real)0) { deposit_degenerate(T, m, nx, ny, nz, periodic, grid); continue; }
        double inv = m / (double)T.vol;
        for (long long c = 0; c < ncell; ++c) {
            real lo[3];
            long long g;
            cell_of(c, imin, ext, nx, ny, nz, lo, &g);
            real w = fast_volume(T, lo, (real)1);
            if (w < (real)0) w = slow_volume(T, lo, (real)1);
            if (w != (real)0) atomicAdd(grid + g, inv * (double)w);
        }
    }
}

extern "C" __global__ void deposit_warp(const real* tets, const double* mass, long long nt,
                                        const double* glo, double cs, int nx, int ny, int nz,
                                        int periodic, double* grid) {
    __shared__ int queue[WARPS][64];
    const unsigned FULL = 0xffffffffu;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    long long gw = (long long)blockIdx.x * WARPS + w, nw = (long long)gridDim.x * WARPS;
    for (long long t = gw; t < nt; t += nw) {
        Tet T;
        int imin[3], ext[3];
        long long ncell = load_cell_units(tets, t, glo, cs, nx, ny, nz, periodic, T, imin, ext);
        double m = mass[t];
        if (T.vol == (real)0) {
            if (lane == 0) deposit_degenerate(T, m, nx, ny, nz, periodic, grid);
            continue;
        }
        double inv = m / (double)T.vol;
        int qn = 0;
        for (long long base = 0; base < ncell; base += 32) {
            long long c = base + lane;
            bool slow = false;
            if (c < ncell) {
                real lo[3];
                long long g;
                cell_of(c, imin, ext, nx, ny, nz, lo, &g);
                real v = fast_volume(T, lo, (real)1);
                if (v < (real)0) slow = true;
                else if (v != (real)0) atomicAdd(grid + g, inv * (double)v);
            }
            unsigned ballot = __ballot_sync(FULL, slow);
            if (slow) queue[w][qn + __popc(ballot & ((1u << lane) - 1u))] = (int)(c - 0);
            qn += __popc(ballot);
            __syncwarp();
            if (qn >= 32) {
                long long cq = queue[w][qn - 32 + lane];
                real lo[3];
                long long g;
                cell_of(cq, imin, ext, nx, ny, nz, lo, &g);
                real v = slow_volume(T, lo, (real)1);
                if (v != (real)0) atomicAdd(grid + g, inv * (double)v);
                qn -= 32;
                __syncwarp();
            }
        }
        if (lane < qn) {
            long long cq = queue[w][lane];
            real lo[3];
            long long g;
            cell_of(cq, imin, ext, nx, ny, nz, lo, &g);
            real v = slow_volume(T, lo, (real)1);
            if (v != (real)0) atomicAdd(grid + g, inv * (double)v);
        }
        __syncwarp();
    }
}
"""


@functools.cache
def _kernels(device_id: int, real: str) -> dict:
    """Compiled kernels for one device and arithmetic type ("double" or "float")."""
    import cupy

    head = f"typedef {real} real;\n#define WARPS {WARPS_PER_BLOCK}\n"
    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=head + _CUDA_SOURCE, options=_NVRTC_OPTIONS)
        return {name: module.get_function(name) for name in _KERNEL_NAMES}


def _prepare(tets, cp, arithmetic="float64"):
    """Contiguous tets and the kernel type. float32 input is upcast to float64 unless
    ``arithmetic="float32"`` is asked for explicitly (see the module docstring)."""
    t = _as_tets(tets, cp)
    if arithmetic == "float32":
        return cp.ascontiguousarray(t, dtype=cp.float32), "float"
    return cp.ascontiguousarray(t, dtype=cp.float64), "double"


def _blocks(n: int, threads: int, cp) -> int:
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    return int(max(1, min(-(-n // threads), sms * 32)))


def tet_cube_volume_gpu(tets, cube_lo, cube_size, *, arithmetic="float64"):
    """GPU version of :func:`cosmo_dask.density.tet_cube_volume` (CuPy in, CuPy out).

    One thread per (tetrahedron, cube) pair; float64 arithmetic and result
    (float32 input is upcast). ``arithmetic="float32"``: float kernel and
    float32 result (cube corners and sides rounded to float32), for
    well-shaped tetrahedra only.
    """
    cp = require_gpu("tet_cube_volume on CuPy arrays")
    t, real = _prepare(tets, cp, arithmetic)
    lo, h, single = _as_cubes(cube_lo, cube_size, cp)
    nt, nc = t.shape[0], lo.shape[0]
    out = cp.zeros((nt, nc), dtype=t.dtype)
    if nt and nc:
        k = _kernels(cp.cuda.Device().id, real)["tet_cube_pairs"]
        threads = 128
        k((_blocks(nt * nc, threads, cp),), (threads,),
          (t, lo, h, np.int64(nt), np.int64(nc), out))
    return out[:, 0] if single else out


def deposit_tets_gpu(tets, mass, grid_lo, cell_size, shape, *, periodic=False, out=None,
                     method="auto", arithmetic="float64"):
    """GPU version of :func:`cosmo_dask.density.deposit_tets` (CuPy arrays).

    Parameters
    ----------
    method : {"auto", "warp", "thread"}
        ``"warp"``: one warp per tetrahedron with the shared-memory queue of
        cut cells; ``"thread"``: one thread per tetrahedron. ``"auto"`` takes
        "warp" when the tetrahedra's bounding boxes cover 8 cells or more on
        average (estimated from the first 4096), else "thread". Measured only
        for ~94 cells per tetrahedron (warp 1.26x faster there).
    arithmetic : {"float64", "float32"}
        Kernel arithmetic; float32 input is upcast unless "float32" is given.

    Returns
    -------
    cupy.ndarray (nx, ny, nz) float64
    """
    cp = require_gpu("deposit_tets on CuPy arrays")
    t, real = _prepare(tets, cp, arithmetic)
    nt = t.shape[0]
    m = cp.ascontiguousarray(cp.broadcast_to(cp.asarray(mass, dtype=cp.float64), (nt,)))
    glo, cs, shp = check_grid(grid_lo, cell_size, shape)
    grid = cp.zeros(shp, dtype=cp.float64) if out is None else out
    if grid.shape != shp or grid.dtype != np.float64:
        raise ParameterError(f"out must be a float64 CuPy array of shape {shp}")
    if method not in ("auto", "warp", "thread"):
        raise ParameterError(f"method must be 'auto', 'warp' or 'thread', got {method!r}")
    if nt == 0:
        return grid
    if method == "auto":
        sample = t[:4096].astype(cp.float64)
        ext = cp.floor(sample.max(axis=1) / cs) - cp.floor(sample.min(axis=1) / cs) + 1
        method = "warp" if float(cp.prod(ext, axis=1).mean()) >= 8 else "thread"
    ks = _kernels(cp.cuda.Device().id, real)
    g = cp.asarray(glo)
    args = (t, m, np.int64(nt), g, np.float64(cs), np.int32(shp[0]), np.int32(shp[1]),
            np.int32(shp[2]), np.int32(bool(periodic)), grid)
    if method == "warp":
        threads = 32 * WARPS_PER_BLOCK
        ks["deposit_warp"]((_blocks(nt * 32, threads, cp),), (threads,), args)
    else:
        threads = 128
        ks["deposit_thread"]((_blocks(nt, threads, cp),), (threads,), args)
    return grid
