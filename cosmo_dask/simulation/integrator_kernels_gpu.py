"""The integrator's per-chunk updates on CuPy chunks (CUDA kernels ``cuda/integrator.cu``):
the GPU twins of :mod:`cosmo_dask.simulation.integrator_kernels`, one pass each instead of
CuPy's chain of elementwise operations and float64 temporaries (timings:
``benchmarks/RESULTS.md``), the same values bit for bit.

CuPy is imported inside the functions, so this module imports without it.
"""

from __future__ import annotations

import numpy as np

from .. import cuda
from .integrator_kernels import drift_block, kick_block

__all__ = ["drift_block_gpu", "kick_block_gpu"]

_THREADS = 256


def _module(pos_t: str, mom_t: str, kick_t: str):
    c = cuda.C_TYPE
    return cuda.module("integrator", {"POS_T": c[pos_t], "MOM_T": c[mom_t], "KICK_T": c[kick_t]},
                       cuda.NO_FMAD)


def _grid(n: int) -> tuple:
    return (min((n + _THREADS - 1) // _THREADS, 1 << 20),)


def drift_block_gpu(pos, mom, factor: float, box: float, dtype):
    """:func:`~cosmo_dask.simulation.integrator_kernels.drift_block` on CuPy chunks
    (``cuda/integrator.cu`` ``drift``) when positions and momenta are float32 or float64
    and ``dtype`` is the positions'; otherwise CuPy's operations, as on the CPU."""
    import cupy

    dtype = np.dtype(dtype)
    if (pos.dtype.name not in cuda.C_TYPE or mom.dtype.name not in cuda.C_TYPE
            or dtype != pos.dtype or pos.shape != mom.shape):
        return drift_block(pos, mom, factor, box, dtype)
    pos = cupy.ascontiguousarray(pos)
    mom = cupy.ascontiguousarray(mom)
    out = cupy.empty(pos.shape, dtype=dtype)
    n = int(pos.size)
    if n:
        hi = float(np.nextafter(dtype.type(box), dtype.type(0)))
        kern = _module(pos.dtype.name, mom.dtype.name, "float64").get_function("drift")
        kern(_grid(n), (_THREADS,), (pos, mom, np.int64(n), np.float64(factor),
                                     np.float64(box), np.float64(hi), out))
    return out


def kick_block_gpu(mom, acc, factor: float):
    """:func:`~cosmo_dask.simulation.integrator_kernels.kick_block` on CuPy chunks
    (``cuda/integrator.cu`` ``kick``) when the momenta and accelerations share a float
    dtype; otherwise CuPy's operations, as on the CPU."""
    import cupy

    if mom.dtype != acc.dtype or mom.dtype.name not in cuda.C_TYPE or mom.shape != acc.shape:
        return kick_block(mom, acc, factor)
    mom = cupy.ascontiguousarray(mom)
    acc = cupy.ascontiguousarray(acc)
    out = cupy.empty_like(mom)
    n = int(mom.size)
    if n:
        kern = _module("float64", "float64", mom.dtype.name).get_function("kick")
        kern(_grid(n), (_THREADS,), (mom, acc, np.int64(n), np.float64(factor), out))
    return out
