"""Multipole-expansion (MEX) kernels on the GPU (CuPy + CUDA C).

Same contract, conventions and storage layout as
:mod:`cosmo_dask.expansion.mex_kernels` (read that docstring for the solid
harmonics, their recurrences and gradients, and the softening), with CuPy
arrays in and out.

``terms_scan_gpu``: one thread per (radius-sorted) particle computes its
``(lmax+1)^2`` regular solid harmonics in float64 registers (``lmax`` is a
compile-time constant: one module per ``lmax`` and storage type, compiled on
first use) and writes the inner terms ``m T`` and outer terms ``m T f_l(r)`` in
term-major (K, n) float64 arrays (coalesced stores); ``cupy.cumsum`` along the
particle axis gives the forward sums, and on the reversed view the reverse
sums; both are stored transposed as ``(n + 1, K)`` arrays of the output dtype.

``evaluate_gpu``: one thread per field point reads its inner row ``Q[iq]`` and
outer row ``P[ip]`` and accumulates potential and gradient over (l, m) exactly
as the numba kernel (float64 arithmetic, result in the storage dtype).

Cost: O(n (lmax+1)^2) arithmetic; memory traffic about ``6 K`` doubles per
particle for the fit (terms, scans, transposes) and ``2 K`` reads per point for
the evaluation. Timings: ``python -m benchmarks expansion
--methods mex`` (``benchmarks/RESULTS.md``, "Expansions").
"""

from __future__ import annotations

import functools

import numpy as np

from .. import cuda

__all__ = ["evaluate_gpu", "forces_local_gpu", "terms_scan_gpu"]

_BLOCK = 128
_MAX_GRID = 65535 * 8


@functools.cache
def _kernels(device_id: int, lmax: int, real: str) -> dict:
    """Compiled kernels for one device, ``lmax`` and storage type ("float"/"double")."""
    import cupy

    with cupy.cuda.Device(device_id):
        module = cuda.module("mex", {"REAL": real, "LMAX": int(lmax)})
        return {name: module.get_function(name) for name in ("mex_terms", "mex_eval")}


def _real(dtype) -> str:
    return "float" if np.dtype(dtype) == np.float32 else "double"


def _grid(n: int) -> tuple[int]:
    return (max(1, min(-(-n // _BLOCK), _MAX_GRID)),)


def terms_scan_gpu(pos, mass, lmax: int, eps2: float, dtype=None):
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


def evaluate_gpu(pos, Q, P, iq, ip, lmax: int, eps2: float):
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


def forces_local_gpu(pos, mass, lmax: int, eps2: float = 0.0, timer=None):
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
    Q, P = terms_scan_gpu(ps, ms, lmax, eps2)
    mark("terms_scan")
    n = pos.shape[0]
    iq = cupy.arange(n, dtype=cupy.int64)
    acc_s, phi_s = evaluate_gpu(ps, Q, P, iq, iq + 1, lmax, eps2)
    mark("evaluate")
    acc = cupy.empty_like(acc_s)
    phi = cupy.empty_like(phi_s)
    acc[order] = acc_s
    phi[order] = phi_s
    mark("scatter")
    return acc, phi
