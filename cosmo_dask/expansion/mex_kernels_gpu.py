"""Multipole-expansion (MEX) kernels on the GPU (CuPy + CUDA C).

Same contract, conventions and storage layout as
:mod:`cosmo_dask.expansion.mex_kernels` (read that docstring for the solid
harmonics, their recurrences and gradients, and the softening), with CuPy
arrays in and out.

``terms_scan``: one thread per (radius-sorted) particle computes its
``(lmax+1)^2`` regular solid harmonics in float64 registers (``lmax`` is a
compile-time constant: one module per ``lmax`` and storage type, compiled on
first use) and writes the inner terms ``m T`` and outer terms ``m T f_l(r)`` in
term-major (K, n) float64 arrays (coalesced stores); ``cupy.cumsum`` along the
particle axis gives the forward sums, and on the reversed view the reverse
sums; both are stored transposed as ``(n + 1, K)`` arrays of the output dtype.

``evaluate``: one thread per field point reads its inner row ``Q[iq]`` and
outer row ``P[ip]`` and accumulates potential and gradient over (l, m) exactly
as the numba kernel (float64 arithmetic, result in the storage dtype).

Cost: O(n (lmax+1)^2) arithmetic; memory traffic about ``6 K`` doubles per
particle for the fit (terms, scans, transposes) and ``2 K`` reads per point for
the evaluation. Timings are in ``benchmarks/bench_mex_part.py``.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["evaluate", "forces_local", "terms_scan"]

_CUDA_SOURCE = r"""
#define K ((LMAX + 1) * (LMAX + 1))

__device__ __forceinline__ void solid(double x, double y, double z, double* T) {
    const double r2 = x * x + y * y + z * z;
    T[0] = 1.0;
    double re = 1.0, im = 0.0;
#pragma unroll
    for (int m = 1; m <= LMAX; ++m) {
        const double f = (m == 1) ? 1.0 : sqrt((2.0 * m - 1.0) / (2.0 * m));
        const double nre = (re * x - im * y) * f;
        im = (re * y + im * x) * f;
        re = nre;
        const int k = m * m + 2 * m - 1;
        T[k] = re;
        T[k + 1] = im;
    }
#pragma unroll
    for (int m = 0; m < LMAX; ++m) {
#pragma unroll
        for (int l = m; l < LMAX; ++l) {
            const double d = 1.0 / sqrt((l + 1.0 - m) * (l + 1.0 + m));
            const double a = (2.0 * l + 1.0) * z * d;
            const double b = sqrt((l + m) * (l - m + 0.0)) * r2 * d;
            if (m == 0) {
                const double t0 = (l > 0) ? T[(l - 1) * (l - 1)] : 0.0;
                T[(l + 1) * (l + 1)] = a * T[l * l] - b * t0;
            } else {
                const int k1 = l * l + 2 * m - 1;
                const int k2 = (l + 1) * (l + 1) + 2 * m - 1;
                if (l > m) {
                    const int k0 = (l - 1) * (l - 1) + 2 * m - 1;
                    T[k2] = a * T[k1] - b * T[k0];
                    T[k2 + 1] = a * T[k1 + 1] - b * T[k0 + 1];
                } else {
                    T[k2] = a * T[k1];
                    T[k2 + 1] = a * T[k1 + 1];
                }
            }
        }
    }
}

extern "C" __global__ void mex_terms(const real_t* __restrict__ pos,
                                     const real_t* __restrict__ mass, long long n,
                                     double eps2, double* __restrict__ reg,
                                     double* __restrict__ irr) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const double x = (double)pos[3 * i], y = (double)pos[3 * i + 1],
                     z = (double)pos[3 * i + 2];
        const double mi = (double)mass[i];
        double T[K];
        solid(x, y, z, T);
        const double s = x * x + y * y + z * z + eps2;
        const bool ok = s > 0.0;
        double f = ok ? mi / sqrt(s) : 0.0;
        const double inv_s = ok ? 1.0 / s : 0.0;
#pragma unroll
        for (int l = 0; l <= LMAX; ++l) {
#pragma unroll
            for (int k = l * l; k < (l + 1) * (l + 1); ++k) {
                reg[k * n + i] = mi * T[k];
                irr[k * n + i] = f * T[k];
            }
            f *= inv_s;
        }
    }
}

extern "C" __global__ void mex_eval(const real_t* __restrict__ pos,
                                    const real_t* __restrict__ Q,
                                    const real_t* __restrict__ P,
                                    const long long* __restrict__ iq,
                                    const long long* __restrict__ ip, long long n,
                                    double eps2, real_t* __restrict__ acc_out,
                                    real_t* __restrict__ phi_out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const double x = (double)pos[3 * i], y = (double)pos[3 * i + 1],
                     z = (double)pos[3 * i + 2];
        double T[K];
        solid(x, y, z, T);
        const double s = x * x + y * y + z * z + eps2;
        const bool inner = s > 0.0;
        double f = inner ? 1.0 / sqrt(s) : 0.0;
        const double inv_s = inner ? 1.0 / s : 0.0;
        const real_t* q = Q + iq[i] * (long long)K;
        const real_t* p = P + ip[i] * (long long)K;
        double phi = 0.0, gx = 0.0, gy = 0.0, gz = 0.0, radial = 0.0;
#pragma unroll
        for (int l = 0; l <= LMAX; ++l) {
#pragma unroll
            for (int m = 0; m <= l; ++m) {
                double qr, qi, pr, pi, tr, ti;
                if (m == 0) {
                    const int k = l * l;
                    qr = (double)q[k]; qi = 0.0; pr = (double)p[k]; pi = 0.0;
                    tr = T[k]; ti = 0.0;
                } else {
                    const int k = l * l + 2 * m - 1;
                    qr = (double)q[k]; qi = (double)q[k + 1];
                    pr = (double)p[k]; pi = (double)p[k + 1];
                    tr = T[k]; ti = T[k + 1];
                }
                const double qt = qr * tr + qi * ti;
                phi += qt * f + pr * tr + pi * ti;
                radial -= (2.0 * l + 1.0) * f * inv_s * qt;
                if (l == 0) continue;
                const double wr = qr * f + pr;
                const double wi = -(qi * f + pi);
                if (m < l) {
                    const double c = sqrt((l + m) * (l - m + 0.0));
                    double dr, di;
                    if (m == 0) {
                        dr = c * T[(l - 1) * (l - 1)]; di = 0.0;
                    } else {
                        const int kk = (l - 1) * (l - 1) + 2 * m - 1;
                        dr = c * T[kk]; di = c * T[kk + 1];
                    }
                    gz += wr * dr - wi * di;
                }
                double apr = 0.0, api = 0.0;
                if (m + 1 <= l - 1) {
                    const double c = -sqrt((m == 0 ? 1.0 : 2.0) * 0.5 * (l - m) * (l - m - 1.0));
                    const int kk = (l - 1) * (l - 1) + 2 * (m + 1) - 1;
                    apr = c * T[kk]; api = c * T[kk + 1];
                }
                double amr, ami;
                if (m == 0) {
                    amr = apr; ami = -api;
                } else {
                    const double c = sqrt(2.0 * (l + m) * (l + m - 1.0) / (m == 1 ? 1.0 : 2.0));
                    if (m == 1) {
                        amr = c * T[(l - 1) * (l - 1)]; ami = 0.0;
                    } else {
                        const int kk = (l - 1) * (l - 1) + 2 * (m - 1) - 1;
                        amr = c * T[kk]; ami = c * T[kk + 1];
                    }
                }
                gx += 0.5 * (wr * (apr + amr) - wi * (api + ami));
                gy += 0.5 * (wr * (api - ami) + wi * (apr - amr));
            }
            f *= inv_s;
        }
        acc_out[3 * i] = (real_t)(gx + radial * x);
        acc_out[3 * i + 1] = (real_t)(gy + radial * y);
        acc_out[3 * i + 2] = (real_t)(gz + radial * z);
        phi_out[i] = (real_t)(-phi);
    }
}
"""

_BLOCK = 128
_MAX_GRID = 65535 * 8


@functools.cache
def _kernels(device_id: int, lmax: int, real: str) -> dict:
    """Compiled kernels for one device, ``lmax`` and storage type ("float"/"double")."""
    import cupy

    head = f"typedef {real} real_t;\n#define LMAX {int(lmax)}\n"
    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=head + _CUDA_SOURCE, options=("-std=c++17",))
        return {name: module.get_function(name) for name in ("mex_terms", "mex_eval")}


def _real(dtype) -> str:
    return "float" if np.dtype(dtype) == np.float32 else "double"


def _grid(n: int) -> tuple[int]:
    return (max(1, min(-(-n // _BLOCK), _MAX_GRID)),)


def terms_scan(pos, mass, lmax: int, eps2: float, dtype=None):
    """GPU version of :func:`cosmo_dask.expansion.mex_kernels.terms_scan` (CuPy arrays).

    Returns ``Q, P`` of shape ``(n + 1, (lmax+1)**2)`` in ``dtype`` (default
    ``pos.dtype``); the scans run in float64 (``cupy.cumsum``).
    """
    import cupy

    dtype = np.dtype(pos.dtype if dtype is None else dtype)
    pos = cupy.ascontiguousarray(pos, dtype=dtype)
    mass = cupy.ascontiguousarray(mass, dtype=dtype)
    n = int(pos.shape[0])
    K = (lmax + 1) ** 2
    Q = cupy.empty((n + 1, K), dtype)
    P = cupy.empty((n + 1, K), dtype)
    Q[0] = 0
    P[n] = 0
    if n == 0:
        return Q, P
    reg = cupy.empty((K, n), cupy.float64)
    irr = cupy.empty((K, n), cupy.float64)
    k = _kernels(cupy.cuda.runtime.getDevice(), int(lmax), _real(dtype))
    k["mex_terms"](_grid(n), (_BLOCK,), (pos, mass, np.int64(n), np.float64(eps2), reg, irr))
    Q[1:] = cupy.cumsum(reg, axis=1).T
    del reg
    P[:n] = cupy.cumsum(irr[:, ::-1], axis=1)[:, ::-1].T
    return Q, P


def evaluate(pos, Q, P, iq, ip, lmax: int, eps2: float):
    """GPU version of :func:`cosmo_dask.expansion.mex_kernels.evaluate` (CuPy arrays)."""
    import cupy

    dtype = np.dtype(Q.dtype)
    pos = cupy.ascontiguousarray(pos, dtype=dtype)
    n = int(pos.shape[0])
    acc = cupy.empty((n, 3), dtype)
    phi = cupy.empty(n, dtype)
    if n == 0:
        return acc, phi
    k = _kernels(cupy.cuda.runtime.getDevice(), int(lmax), _real(dtype))
    k["mex_eval"](_grid(n), (_BLOCK,),
                  (pos, cupy.ascontiguousarray(Q), cupy.ascontiguousarray(P),
                   cupy.ascontiguousarray(iq, dtype=cupy.int64),
                   cupy.ascontiguousarray(ip, dtype=cupy.int64), np.int64(n),
                   np.float64(eps2), acc, phi))
    return acc, phi


def forces_local(pos, mass, lmax: int, eps2: float = 0.0, timer=None):
    """Single-device MEX: sort by radius, sums, forces at the particles (input order).

    ``pos`` (n, 3) and ``mass`` (n,) CuPy arrays about the centre, G = 1; the
    units are the caller's (no scaling). ``timer(name)`` is called at stage
    boundaries (for CUDA-event timings). Returns ``acc (n, 3), phi (n,)``.
    """
    import cupy

    mark = timer or (lambda name: None)
    r2 = (pos.astype(cupy.float64) ** 2).sum(axis=1)
    order = cupy.argsort(r2)
    ps = pos[order]
    ms = mass[order]
    mark("sort")
    Q, P = terms_scan(ps, ms, lmax, eps2)
    mark("terms_scan")
    n = pos.shape[0]
    iq = cupy.arange(n, dtype=cupy.int64)
    acc_s, phi_s = evaluate(ps, Q, P, iq, iq + 1, lmax, eps2)
    mark("evaluate")
    acc = cupy.empty_like(acc_s)
    phi = cupy.empty_like(phi_s)
    acc[order] = acc_s
    phi[order] = phi_s
    mark("scatter")
    return acc, phi
