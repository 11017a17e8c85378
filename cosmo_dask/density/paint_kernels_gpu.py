"""Mass assignment onto a periodic cubic mesh on the GPU (CUDA kernel ``cuda/paint.cu``).

Same convention and weights as :mod:`cosmo_dask.density.paint_kernels` (see
there): node ``j`` at ``(j + 1/2) H``, mesh coordinate ``u = x / H - 1/2 + shift``,
separable weights of order 1-4, indices modulo ``n``. One thread per particle
computes its ``3 p`` weights in float64 and adds its ``p^3`` contributions with
``atomicAdd`` (float32 or float64 mesh; double atomics need compute capability
>= 6.0). Non-finite positions are skipped and counted in a device counter.
Like the CPU kernel it writes one slab of planes ``x_lo .. x_lo + nx - 1``
(``(nx, n, n)``; the whole mesh is ``x_lo = 0, nx = n``), skipping the other
planes' contributions.

Cost: O(N p^3) atomic additions; the atomics collide only when many particles
share a cell (clustered input), which serialises those additions. Summation
order is not deterministic, so GPU meshes agree with the CPU kernel to
rounding (~1e-15 relative per cell in float64), not bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import cuda
from .parameters import SCHEMES


@functools.lru_cache(maxsize=64)
def _kernel(order: int, pos_t: str, mass_t: str, mesh_t: str, device_id: int):
    """The ``paint`` kernel of ``paint.cu`` for the scheme order and the position, mass and
    mesh dtypes, on the current device (``device_id``)."""
    c = cuda.C_TYPE
    return cuda.module("paint", {"ORDER": order, "POS_T": c[pos_t], "MASS_T": c[mass_t],
                                 "MESH_T": c[mesh_t]}).get_function("paint")


def paint_gpu(pos, mass, n: int, box_size: float, scheme: str, shift: float = 0.0,
               dtype=np.float64, planes: tuple[int, int] | None = None, out=None):
    """Paint one CuPy chunk onto planes ``planes = (lo, hi)`` (default all) of a CuPy mesh.

    ``mass`` is an (m,) array (any module) or a float. ``out``, a C-contiguous
    ``(hi - lo, n, n)`` CuPy array of ``dtype``, is added into (and returned);
    default a fresh zeroed one. Raises ``ValueError`` if a position is not finite.
    """
    import cupy

    lo, hi = (0, n) if planes is None else (int(planes[0]), int(planes[1]))
    dtype = np.dtype(dtype if out is None else out.dtype)
    pos = cupy.asarray(pos)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = cupy.ascontiguousarray(pos)
    m = pos.shape[0]
    mesh = cupy.zeros((hi - lo, n, n), dtype=dtype) if out is None else out
    if np.isscalar(mass) or np.ndim(mass) == 0:
        marr, mscalar, use = cupy.empty(1, dtype=np.float64), float(mass), 0
    else:
        marr = cupy.asarray(mass)
        if marr.dtype not in (np.float32, np.float64):
            marr = marr.astype(np.float64)
        marr, mscalar, use = cupy.ascontiguousarray(marr), 0.0, 1
    bad = cupy.zeros(1, dtype=np.uint64)
    if m:
        kern = _kernel(SCHEMES[scheme], pos.dtype.name, marr.dtype.name, dtype.name,
                       cupy.cuda.runtime.getDevice())
        threads = 256
        blocks = (m + threads - 1) // threads
        kern((blocks,), (threads,),
             (pos, marr, np.int32(use), np.float64(mscalar), np.int64(m), np.int64(n),
              np.float64(n / box_size), np.float64(shift - 0.5), mesh, bad, np.int64(lo),
              np.int64(hi - lo)))
        nbad = int(bad.get()[0])
        if nbad:
            raise ValueError(f"paint: {nbad} particle position(s) are not finite")
    return mesh
