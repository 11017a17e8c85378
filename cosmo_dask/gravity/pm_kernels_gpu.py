"""Periodic PM gravity on the GPU: CuPy RawKernels on mesh slabs.

Same conventions, Green's function and interpolation as
:mod:`cosmo_dask.gravity.pm_kernels` (see there); this module only swaps the
implementation: one CUDA thread per k-space slab element for the Green's
function (from the same per-axis float64 factors), one thread per particle for
the CIC interpolation of a real slab (weights and sums in float64, meshes read
in their dtype, up to four slabs at once). The FFTs are cuFFT's, through
:mod:`cosmo_dask.spatial.fft`; the gradient is a CuPy product
(:func:`~cosmo_dask.gravity.pm_kernels.gradient_kslab`). Results agree with the
CPU kernels to rounding (~1e-14 relative in float64).
"""

from __future__ import annotations

import functools

import numpy as np

from ..cuda import include_options
from .pm_kernels import green_axes

__all__ = ["green_kslab_cupy", "cic_interpolate_cupy"]

_SOURCE = r"""
#include "periodic.cuh"
// fk, out: a complex k-space slab (n0, n1, nk) as interleaved (re, im) pairs of REAL_T
extern "C" __global__ void green(const REAL_T* __restrict__ fk, REAL_T* __restrict__ out,
                                 const long long n0, const long long n1, const long long nk,
                                 const double* __restrict__ k2x, const double* __restrict__ k2y,
                                 const double* __restrict__ k2z, const double* __restrict__ gx,
                                 const double* __restrict__ gy, const double* __restrict__ gz,
                                 const double scale)
{
    const long long total = n0 * n1 * nk;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    const long long lz = t % nk;
    const long long j = (t / nk) % n1;
    const long long i = t / (nk * n1);
    const double k2 = (k2x[i] + k2y[j]) + k2z[lz];
    double f = 0.0;
    if (k2 != 0.0) f = scale * (gx[i] * gy[j]) * gz[lz] / k2;
    out[2 * t] = (REAL_T)((double)fk[2 * t] * f);
    out[2 * t + 1] = (REAL_T)((double)fk[2 * t + 1] * f);
}

// c (<= 4) mesh slabs of planes x_lo .. x_lo + nx - 1, each (nx, n, n) C order
extern "C" __global__ void interp(const POS_T* __restrict__ pos,
                                  const MESH_T* __restrict__ m0, const MESH_T* __restrict__ m1,
                                  const MESH_T* __restrict__ m2, const MESH_T* __restrict__ m3,
                                  const long long m, const long long n, const int c,
                                  const double inv_h, const double off,
                                  const long long x_lo, const long long nx,
                                  double* __restrict__ out)
{
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= m) return;
    const MESH_T* meshes[4] = {m0, m1, m2, m3};
    const double fn = (double)n;
    long long i0[3];
    double w[3][2];
    for (int a = 0; a < 3; ++a) {
        double u = (double)pos[3 * p + a] * inv_h + off;
        u = cd_wrap_box(u, fn);
        long long i = (long long)floor(u);
        double f = u - (double)i;
        w[a][0] = 1.0 - f; w[a][1] = f;
        i0[a] = i;
    }
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    for (int a = 0; a < 2; ++a) {
        long long lx = (i0[0] + a + n) % n - x_lo;
        if (lx < 0 || lx >= nx) continue;
        long long jx = lx * n;
        for (int b = 0; b < 2; ++b) {
            long long jxy = (jx + (i0[1] + b + n) % n) * n;
            double wab = w[0][a] * w[1][b];
            for (int cc = 0; cc < 2; ++cc) {
                long long g = jxy + (i0[2] + cc + n) % n;
                double wt = wab * w[2][cc];
#pragma unroll
                for (int q = 0; q < 4; ++q) {  // constant indices: acc stays in registers
                    if (q < c) acc[q] += wt * (double)meshes[q][g];
                }
            }
        }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        if (q < c) out[p * c + q] = acc[q];
    }
}
"""

_CTYPE = {"float32": "float", "float64": "double"}
_THREADS = 256


@functools.lru_cache(maxsize=32)
def _module(real_t: str, pos_t: str, mesh_t: str, device_id: int):
    import cupy

    src = (f"#define REAL_T {_CTYPE[real_t]}\n#define POS_T {_CTYPE[pos_t]}\n"
           f"#define MESH_T {_CTYPE[mesh_t]}\n" + _SOURCE)
    return cupy.RawModule(code=src, options=("-std=c++14",) + include_options())


def green_kslab_cupy(fk, kx, ky, kz, *, cell: float, rs: float, scale: float):
    """:func:`cosmo_dask.gravity.pm_kernels.green_kslab` on a CuPy k-space slab (the GPU
    kernel of the contract :data:`cosmo_dask.gravity.dispatch.green_kslab`): a new array
    ``fk * scale gx gy gz / k^2`` (0 at ``k = 0``), complex64 or complex128, from the same
    float64 per-axis factors (:func:`~cosmo_dask.gravity.pm_kernels.green_axes`)."""
    import cupy

    k2x, k2y, k2z, gx, gy, gz = green_axes(kx, ky, kz, cell, rs)
    fk = cupy.ascontiguousarray(fk)
    out = cupy.empty_like(fk)
    real_t = "float32" if fk.dtype == np.complex64 else "float64"
    mod = _module(real_t, "float64", "float64", cupy.cuda.runtime.getDevice())
    kern = mod.get_function("green")
    args = [cupy.ascontiguousarray(cupy.asarray(a, dtype=np.float64))
            for a in (k2x, k2y, k2z, gx, gy, gz)]
    total = fk.size
    if total:
        n0, n1, nk = fk.shape
        kern(((total + _THREADS - 1) // _THREADS,), (_THREADS,),
             (fk, out, np.int64(n0), np.int64(n1), np.int64(nk), *args, np.float64(scale)))
    return out


def cic_interpolate_cupy(pos, meshes, box_size: float, shift: float = 0.0, x_lo: int = 0):
    """CIC interpolation at CuPy ``pos`` (m, 3) of CuPy mesh slabs: (m, c) float64 (the
    GPU kernel of the contract :data:`cosmo_dask.gravity.dispatch.cic_interpolate`).

    ``meshes``: up to four ``(nx, n, n)`` slabs of one dtype (or one ``(c, nx, n, n)``
    array) holding planes ``x_lo .. x_lo + nx - 1`` (default: whole meshes).
    """
    import cupy

    pos = cupy.asarray(pos)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = cupy.ascontiguousarray(pos)
    slabs = [cupy.ascontiguousarray(m) for m in meshes]
    if not 1 <= len(slabs) <= 4:
        raise ValueError(f"cic_interpolate_cupy: 1 to 4 meshes, got {len(slabs)}")
    c, nx, n = len(slabs), slabs[0].shape[0], slabs[0].shape[1]
    m = pos.shape[0]
    out = cupy.empty((m, c), dtype=np.float64)
    if m:
        mod = _module("float64", pos.dtype.name, slabs[0].dtype.name,
                      cupy.cuda.runtime.getDevice())
        kern = mod.get_function("interp")
        ptrs = slabs + [slabs[0]] * (4 - c)
        kern(((m + _THREADS - 1) // _THREADS,), (_THREADS,),
             (pos, *ptrs, np.int64(m), np.int64(n), np.int32(c), np.float64(n / box_size),
              np.float64(shift - 0.5), np.int64(x_lo), np.int64(nx), out))
    return out
