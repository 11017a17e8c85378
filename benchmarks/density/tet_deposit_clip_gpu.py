"""The per-cell clip deposits of tetrahedra on the GPU, kept for comparison with the
lattice deposit of :mod:`cosmo_dask.density.tet_volume_gpu` (``python -m benchmarks tet-deposit
--methods warp thread``; not part of the package).

Same geometry as :mod:`cosmo_dask.density.tet_volume`'s clip (against the six cube
planes depth first with a 16-slot stack per thread, prism splits, the same fast paths
and operation order; the device functions of ``cosmo_dask/cuda/tet_clip.cuh``, shared
with the package's ``tet_cube_pairs``), compiled with NVRTC ``--fmad=false`` so float64
results match the numba kernel to rounding. ``deposit_thread``: one thread per
tetrahedron. ``deposit_warp``: ADECO's scheme (one warp per tetrahedron, lanes classify
32 cells at a time, cut cells queued in shared memory and clipped 32 at a time). float32
input is upcast to float64 unless ``arithmetic="float32"`` (float clip: 28% mass error
at z=0, determinant cancellation). Deposit sums use atomics, so the order of additions
(and the last bits of each cell) may vary from run to run. Measured: ~60-90x slower
than the lattice deposit (``benchmarks/RESULTS.md``, tetrahedron deposit on the GPU).
"""

from __future__ import annotations

import functools

import numpy as np

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.cuda import include_options
from cosmo_dask.density.tet_volume import check_grid

WARPS_PER_BLOCK = 4
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")

CUDA_SOURCE = r"""
#include "tet_clip.cuh"

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


def kernel_source(real: str) -> str:
    """The CUDA source of both kernels for arithmetic type ``real`` ("double" or "float")."""
    return f"typedef {real} real;\n#define WARPS {WARPS_PER_BLOCK}\n" + CUDA_SOURCE


@functools.cache
def _kernels(device_id: int, real: str) -> dict:
    import cupy

    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=kernel_source(real), options=NVRTC_OPTIONS + include_options())
        return {name: module.get_function(name) for name in ("deposit_thread", "deposit_warp")}


def deposit_tets_clip_gpu(tets, mass, grid_lo, cell_size, shape, *, periodic=False, out=None,
                          method="warp", arithmetic="float64"):
    """Deposit tetrahedra ``(n, 4, 3)`` (CuPy, length units) of masses ``mass`` onto the
    grid of :func:`cosmo_dask.density.deposit_tets` with the per-cell clip, one warp
    (``method="warp"``) or one thread (``"thread"``) per tetrahedron. Returns the float64
    CuPy grid (``out`` when given, added to)."""
    import cupy as cp

    if method not in ("warp", "thread"):
        raise ParameterError(f"method must be 'warp' or 'thread', got {method!r}")
    if arithmetic not in ("float64", "float32"):
        raise ParameterError(f"arithmetic must be 'float64' or 'float32', got {arithmetic!r}")
    real = "float" if arithmetic == "float32" else "double"
    t = cp.ascontiguousarray(cp.asarray(tets), dtype=cp.float32 if real == "float" else cp.float64)
    nt = t.shape[0]
    glo, cs, shp = check_grid(grid_lo, cell_size, shape)
    grid = cp.zeros(shp, dtype=cp.float64) if out is None else out
    if nt == 0:
        return grid
    m = cp.ascontiguousarray(cp.broadcast_to(cp.asarray(mass, dtype=cp.float64), (nt,)))
    dev = cp.cuda.Device().id
    sms = int(cp.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"])
    ks = _kernels(dev, real)
    args = (t, m, np.int64(nt), cp.asarray(glo), np.float64(cs), np.int32(shp[0]),
            np.int32(shp[1]), np.int32(shp[2]), np.int32(bool(periodic)), grid)
    if method == "warp":
        threads = 32 * WARPS_PER_BLOCK
        items = nt * 32
    else:
        threads = 128
        items = nt
    blocks = int(max(1, min(-(-items // threads), sms * 32)))
    ks[f"deposit_{method}"]((blocks,), (threads,), args)
    return grid
