"""SCF (Hernquist & Ostriker 1992) basis kernels on the GPU (CuPy + CUDA C).

Same contract, basis, normalisation and stable recurrences as
:mod:`cosmo_dask.expansion.scf_kernels` (see there for the formulas); the
arithmetic is in the working precision (float32 or float64), coefficient sums
are accumulated in float64.

Coefficient sums (:func:`scf_coefficient_sums_gpu`): one thread per particle
(grid-stride loop, every warp runs the same number of iterations). A thread
computes all ``(nmax+1)(lmax+1)(lmax+2)/2`` basis terms of its particle; each
term (cos and sin part and their squares) is summed over the warp with
``__shfl_down_sync`` and lane 0 adds it to a float64 block accumulator in
shared memory (``4 (nmax+1)(lmax+1)(lmax+2)/2`` doubles, 9.9 kB for 10, 6);
blocks write their partial sums and one ``cupy.sum`` over blocks finishes.
When the accumulator would exceed 40 kB (large orders) lane 0 adds straight
to one float64 global array with ``atomicAdd`` instead. Per particle: the
basis costs ``O(nmax lmax^2)`` flops, the reduction 5 shuffles per value per
warp.

Evaluation (:func:`scf_evaluate_gpu`): one thread per particle, the compact
coefficients (``m <= l`` only) and ``K_nl`` staged in shared memory per block
(broadcast reads; global memory beyond 48 kB), the Gegenbauer recurrence run
once per ``(l, n)`` and all ``m`` of that ``l`` consumed from it. Kernels are
compiled per (nmax, lmax, dtype, quantity) with the orders as compile-time
constants; the loops over ``n`` are unrolled, those over ``l`` (and ``m`` in
the coefficient kernel) are not (it compiles some 20 times faster than fully
unrolled, benchmarks/RESULTS.md, "Expansions"; per-thread arrays then live in
L1-cached local memory).

Speed and float32 accuracy on the GPU: ``benchmarks/RESULTS.md``, "Expansions". The fit
dominates: every term is warp-reduced per 32 particles (1232 shuffle reductions for
10, 6).
"""

from __future__ import annotations

import functools

import numpy as np

from .. import cuda
from .scf_kernels import anl_tilde, knl

__all__ = ["scf_coefficient_sums_gpu", "scf_evaluate_gpu"]

_SHARED_LIMIT = 40 * 1024


def _real(dtype) -> str:
    return "double" if np.dtype(dtype) == np.float64 else "float"


@functools.lru_cache(maxsize=64)
def _kernel(kind: str, nmax: int, lmax: int, real: str, flag: int, device_id: int):
    """``scf_coeff`` (``kind="coeff"``, ``flag``: coefficients in shared memory) or
    ``scf_eval`` (``flag % 4``: what, ``flag < 4``: coefficients in shared memory) of
    ``scf.cu`` on the current device (``device_id``)."""
    defines = {"NMAX": nmax, "LMAX": lmax, "REAL": real}
    if kind == "coeff":
        defines.update(SCF_COEFF=1, USE_SHARED=flag)
        return cuda.module("scf", defines).get_function("scf_coeff")
    defines.update(SCF_EVAL=1, WHAT=flag % 4, COEF_SHARED=int(flag < 4))
    return cuda.module("scf", defines).get_function("scf_eval")


@functools.lru_cache(maxsize=64)
def _tri_index(nmax: int, lmax: int):
    """(n, l, m) of the compact terms, in kernel order t = n * NL2 + l (l+1)/2 + m
    (host arrays, read-only: built once per order pair)."""
    n_i, l_i, m_i = [], [], []
    for n in range(nmax + 1):
        for ell in range(lmax + 1):
            for m in range(ell + 1):
                n_i.append(n)
                l_i.append(ell)
                m_i.append(m)
    out = np.array(n_i), np.array(l_i), np.array(m_i)
    for a in out:
        a.flags.writeable = False
    return out


@functools.lru_cache(maxsize=64)
def _coeff_constants(nmax: int, lmax: int, dtype: str, device_id: int):
    """``A~_nl`` (raveled, ``dtype``) and the compact-term indexes (n, l, m) on device
    ``device_id``: uploaded once per (orders, dtype, device), not at every call (never
    written to)."""
    import cupy

    anl = cupy.asarray(anl_tilde(nmax, lmax), dtype=np.dtype(dtype)).ravel()
    return (anl, *(cupy.asarray(a) for a in _tri_index(nmax, lmax)))


@functools.lru_cache(maxsize=16)
def _sm_count(device_id: int) -> int:
    """Streaming multiprocessors of device ``device_id`` (queried once: reading
    ``Device.attributes`` asks the driver for every attribute)."""
    import cupy

    return int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])


def _grid(n: int) -> int:
    import cupy

    sms = _sm_count(cupy.cuda.runtime.getDevice())
    return int(max(1, min(-(-n // 256), 8 * sms)))


def scf_coefficient_sums_gpu(pos, mass, nmax: int, lmax: int, r_s: float):
    """GPU version of :func:`~cosmo_dask.expansion.scf_kernels.scf_coefficient_sums`.

    ``pos`` (N, 3) and ``mass`` (N,) CuPy arrays (cast to pos's dtype); returns
    the same packed float64 vector, as a CuPy array. Cost: one kernel launch
    (``min(N/256, 8 x SMs)`` blocks of 256 threads), one sum over blocks.
    """
    import cupy

    dtype = np.dtype(pos.dtype)
    pos = cupy.ascontiguousarray(pos)
    mass = cupy.ascontiguousarray(mass, dtype=dtype)
    n = int(pos.shape[0])
    nl2 = (lmax + 1) * (lmax + 2) // 2
    nterm = (nmax + 1) * nl2
    acc_bytes = 4 * nterm * 8
    use_shared = int(acc_bytes <= _SHARED_LIMIT)
    anl, ni, li, mi = _coeff_constants(nmax, lmax, dtype.str, cupy.cuda.runtime.getDevice())
    blocks = _grid(max(n, 1))
    anl_bytes = anl.size * dtype.itemsize
    if use_shared:
        out = cupy.empty((blocks, 4 * nterm), dtype=np.float64)
        shmem = acc_bytes + anl_bytes
    else:
        out = cupy.zeros((4 * nterm,), dtype=np.float64)
        shmem = anl_bytes
    if n:
        k = _kernel("coeff", nmax, lmax, _real(dtype), use_shared,
                    cupy.cuda.runtime.getDevice())
        k((blocks,), (256,), (pos, mass, np.int64(n), dtype.type(1.0 / r_s), anl, out),
          shared_mem=int(shmem))
        compact = out.sum(axis=0) if use_shared else out
    else:
        compact = cupy.zeros((4 * nterm,), dtype=np.float64)
    full = cupy.zeros((4, nmax + 1, lmax + 1, lmax + 1), dtype=np.float64)
    full[:, ni, li, mi] = compact.reshape(4, nterm)
    tail = cupy.empty(2, dtype=np.float64)
    tail[0] = mass.sum(dtype=np.float64)
    tail[1] = n
    return cupy.concatenate([full.ravel(), tail])


def scf_evaluate_gpu(pos, S, T, r_s: float, GM: float, what: str):
    """GPU version of :func:`~cosmo_dask.expansion.scf_kernels.scf_evaluate` (CuPy in/out).

    One thread per particle, blocks of 128; coefficients (``m <= l`` only, in
    pos's dtype) and ``K_nl`` in shared memory, or read from global memory
    (through the read-only cache) when they exceed 48 kB (large orders).
    """
    import cupy

    dtype = np.dtype(pos.dtype)
    pos = cupy.ascontiguousarray(pos)
    nmax, lmax = S.shape[0] - 1, S.shape[1] - 1
    ni, li, mi = _tri_index(nmax, lmax)
    host = np.concatenate([np.asarray(S)[ni, li, mi], np.asarray(T)[ni, li, mi],
                           knl(nmax, lmax).ravel()])
    shmem = host.size * dtype.itemsize
    in_global = shmem > 48 * 1024
    if in_global:
        shmem = 0
    coef = cupy.asarray(host, dtype=dtype)
    code = {"potential": 0, "acceleration": 1, "density": 2}[what]
    scale = {0: GM / r_s, 1: -GM / (r_s * r_s), 2: GM / r_s**3}[code]
    n = int(pos.shape[0])
    out = cupy.empty((n, 3) if code == 1 else (n,), dtype=dtype)
    if n:
        k = _kernel("eval", nmax, lmax, _real(dtype), code + 4 * in_global,
                    cupy.cuda.runtime.getDevice())
        k((-(-n // 128),), (128,), (pos, np.int64(n), dtype.type(1.0 / r_s), coef,
                                    dtype.type(scale), out), shared_mem=int(shmem))
    return out
