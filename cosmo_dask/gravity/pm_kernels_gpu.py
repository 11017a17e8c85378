"""Periodic PM gravity on the GPU: CuPy FFTs and RawKernels.

Same conventions, Green's function, gradient and interpolation as
:mod:`cosmo_dask.gravity.pm_kernels` (see there); this module only swaps the
implementation: ``cupy.fft`` (cuFFT) for the transforms, one CUDA thread per
rfft mesh element for the Green's function, one thread per particle for the
CIC interpolation (weights and sums in float64, meshes read in their dtype).
Results agree with the CPU kernels to FFT rounding (~1e-14 relative in
float64).
"""

from __future__ import annotations

import functools

import numpy as np

from .pm_kernels import long_range_meshes

__all__ = ["green_multiply_cupy", "long_range_meshes_cupy", "cic_interpolate_cupy"]

_SOURCE = r"""
// fk: the complex rfft mesh as interleaved (re, im) pairs of REAL_T (no complex header needed)
extern "C" __global__ void green(REAL_T* __restrict__ fk, const long long n,
                                 const double box_size, const double rs, const double scale)
{
    const long long nz = n / 2 + 1;
    const long long total = n * n * nz;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    const long long lz = t % nz;
    const long long j = (t / nz) % n;
    const long long i = t / (nz * n);
    if (t == 0) { fk[0] = (REAL_T)0; fk[1] = (REAL_T)0; return; }
    const double pi = 3.141592653589793;
    const long long mi = (i <= n / 2) ? i : i - n;
    const long long mj = (j <= n / 2) ? j : j - n;
    const double qx = pi * mi / n, qy = pi * mj / n, qz = pi * lz / n;
    const double kf = 2.0 * pi / box_size;
    const double k2 = kf * kf * (double)(mi * mi + mj * mj + lz * lz);
    double f;
    if (rs > 0.0) {
        const double sx = mi == 0 ? 1.0 : sin(qx) / qx;
        const double sy = mj == 0 ? 1.0 : sin(qy) / qy;
        const double sz = lz == 0 ? 1.0 : sin(qz) / qz;
        const double w = sx * sy * sz;
        f = scale * exp(-k2 * rs * rs) / (k2 * w * w * w * w);
    } else {
        f = scale / k2;
    }
    fk[2 * t] *= (REAL_T)f;
    fk[2 * t + 1] *= (REAL_T)f;
}

extern "C" __global__ void interp(const POS_T* __restrict__ pos, const MESH_T* __restrict__ mesh,
                                  const long long m, const long long n, const int c,
                                  const double inv_h, const double off,
                                  double* __restrict__ out)
{
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= m) return;
    const double fn = (double)n;
    long long i0[3];
    double w[3][2];
    for (int a = 0; a < 3; ++a) {
        double u = (double)pos[3 * p + a] * inv_h + off;
        if (u < 0.0 || u >= fn) u -= fn * floor(u / fn);
        long long i = (long long)floor(u);
        double f = u - (double)i;
        w[a][0] = 1.0 - f; w[a][1] = f;
        i0[a] = i;
    }
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    const long long n3 = n * n * n;
    for (int a = 0; a < 2; ++a) {
        long long jx = ((i0[0] + a + n) % n) * n;
        for (int b = 0; b < 2; ++b) {
            long long jxy = (jx + (i0[1] + b + n) % n) * n;
            double wab = w[0][a] * w[1][b];
            for (int cc = 0; cc < 2; ++cc) {
                long long g = jxy + (i0[2] + cc + n) % n;
                double wt = wab * w[2][cc];
                for (int q = 0; q < c; ++q) acc[q] += wt * (double)mesh[q * n3 + g];
            }
        }
    }
    for (int q = 0; q < c; ++q) out[p * c + q] = acc[q];
}
"""

_CTYPE = {"float32": "float", "float64": "double"}


@functools.lru_cache(maxsize=32)
def _module(real_t: str, pos_t: str, mesh_t: str, device_id: int):
    import cupy

    src = (f"#define REAL_T {_CTYPE[real_t]}\n#define POS_T {_CTYPE[pos_t]}\n"
           f"#define MESH_T {_CTYPE[mesh_t]}\n" + _SOURCE)
    return cupy.RawModule(code=src, options=("-std=c++14",))


def green_multiply_cupy(fk, n: int, box_size: float, rs: float, scale: float) -> None:
    """In-place Green's function on a CuPy rfft mesh (complex64 or complex128)."""
    import cupy

    if not fk.flags.c_contiguous:
        raise ValueError("green_multiply_cupy: the rfft mesh must be C-contiguous")
    real_t = "float32" if fk.dtype == np.complex64 else "float64"
    mod = _module(real_t, "float64", "float64", cupy.cuda.runtime.getDevice())
    kern = mod.get_function("green")
    total = fk.size
    threads = 256
    kern(((total + threads - 1) // threads,), (threads,),
         (fk, np.int64(n), np.float64(box_size), np.float64(rs), np.float64(scale)))


def _rfftn(x):
    import cupy

    return cupy.fft.rfftn(x)


def _irfftn(x, s):
    import cupy

    return cupy.fft.irfftn(x, s=s, axes=(0, 1, 2))


def long_range_meshes_cupy(mass_mesh, box_size: float, rs: float, G: float,
                           potential: bool = True):
    """:func:`cosmo_dask.gravity.pm_kernels.long_range_meshes` on the GPU (cuFFT)."""
    import cupy

    mass_mesh = cupy.ascontiguousarray(mass_mesh)
    return long_range_meshes(cupy, _rfftn, _irfftn, green_multiply_cupy, mass_mesh, box_size,
                             rs, G, potential)


def cic_interpolate_cupy(pos, meshes, box_size: float, shift: float = 0.0):
    """CIC interpolation of CuPy ``meshes`` (c, n, n, n) at ``pos`` (m, 3): (m, c) float64."""
    import cupy

    pos = cupy.asarray(pos)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = cupy.ascontiguousarray(pos)
    meshes = cupy.ascontiguousarray(meshes)
    c, n = meshes.shape[0], meshes.shape[1]
    m = pos.shape[0]
    out = cupy.empty((m, c), dtype=np.float64)
    if m:
        mod = _module("float64", pos.dtype.name, meshes.dtype.name,
                      cupy.cuda.runtime.getDevice())
        kern = mod.get_function("interp")
        threads = 256
        kern(((m + threads - 1) // threads,), (threads,),
             (pos, meshes, np.int64(m), np.int64(n), np.int32(c), np.float64(n / box_size),
              np.float64(shift - 0.5), out))
    return out
