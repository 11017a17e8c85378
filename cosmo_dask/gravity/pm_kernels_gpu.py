"""Periodic PM gravity on the GPU: CUDA kernels (``cuda/pm.cu``) on mesh slabs.

Same conventions, Green's function and interpolation as
:mod:`cosmo_dask.gravity.pm_kernels` (see there); this module only swaps the
implementation: one CUDA thread per k-space slab element for the Green's
function and the gradient (from the same per-axis float64 factors), one thread
per mesh point for the 4-point difference of a real potential slab, one thread
per particle for the CIC interpolation of a real slab (weights and sums in
float64, meshes read in their dtype, up to four slabs at once). The FFTs are
cuFFT's, through :mod:`cosmo_dask.spatial.fft`. Results agree with the CPU
kernels to rounding (~1e-14 relative in float64).
"""

from __future__ import annotations

import numpy as np

from .. import cuda
from .pm_kernels import check_add_to, green_axes, green_derivative

__all__ = ["green_kslab_gpu", "cic_interpolate_gpu", "fd4_gradient_gpu"]

_THREADS = 256
# CUDA's limit on a launch's blocks along y and z (the kernels loop over the rest)
_MAX_GRID_YZ = 65535


def _module(real_t: str, pos_t: str, mesh_t: str):
    """``pm.cu`` for the k-space slab, position and mesh dtypes (current device)."""
    return cuda.module("pm", {"REAL_T": cuda.C_TYPE[real_t], "POS_T": cuda.C_TYPE[pos_t],
                              "MESH_T": cuda.C_TYPE[mesh_t]})


def green_kslab_gpu(fk, kx, ky, kz, *, cell: float, rs: float, scale: float,
                    axis: int | None = None, kind: str = "fd4"):
    """:func:`cosmo_dask.gravity.pm_kernels.green_kslab` on a CuPy k-space slab (the GPU
    kernel of the contract :data:`cosmo_dask.gravity.dispatch.green_kslab`): a new array
    ``fk * scale gx gy gz / k^2`` (0 at ``k = 0``), times ``-i D_axis(k)`` with
    ``axis``, complex64 or complex128, from the same float64 per-axis factors
    (:func:`~cosmo_dask.gravity.pm_kernels.green_axes`,
    :func:`~cosmo_dask.gravity.pm_kernels.green_derivative`)."""
    import cupy

    k2x, k2y, k2z, gx, gy, gz = green_axes(kx, ky, kz, cell, rs)
    code, d = green_derivative(kx, ky, kz, cell, axis, kind)
    fk = cupy.ascontiguousarray(fk)
    out = cupy.empty_like(fk)
    real_t = "float32" if fk.dtype == np.complex64 else "float64"
    mod = _module(real_t, "float64", "float64")
    kern = mod.get_function("green")
    args = [cupy.ascontiguousarray(cupy.asarray(a, dtype=np.float64))
            for a in (k2x, k2y, k2z, gx, gy, gz, d)]
    total = fk.size
    if total:
        n0, n1, nk = fk.shape
        kern(((total + _THREADS - 1) // _THREADS,), (_THREADS,),
             (fk, out, np.int64(n0), np.int64(n1), np.int64(nk), *args, np.int32(code),
              np.float64(scale)))
    return out


def cic_interpolate_gpu(pos, meshes, box_size: float, shift: float = 0.0, x_lo: int = 0,
                        add_to=None):
    """CIC interpolation at CuPy ``pos`` (m, 3) of CuPy mesh slabs: (m, c) float64 (the
    GPU kernel of the contract :data:`cosmo_dask.gravity.dispatch.cic_interpolate`).

    ``meshes``: up to four ``(nx, n, n)`` slabs of one dtype (or one ``(c, nx, n, n)``
    array) holding planes ``x_lo .. x_lo + nx - 1`` (default: whole meshes). With
    ``add_to`` (a C-contiguous ``(m, c)`` float64 CuPy array) each particle's sums are
    added to its values in place (``add_to + sums``, the sums taken from zero first) and
    ``add_to`` is returned.
    """
    import cupy

    pos = cupy.asarray(pos)
    if pos.dtype not in (np.float32, np.float64):
        pos = pos.astype(np.float64)
    pos = cupy.ascontiguousarray(pos)
    slabs = [cupy.ascontiguousarray(m) for m in meshes]
    if not 1 <= len(slabs) <= 4:
        raise ValueError(f"cic_interpolate_gpu: 1 to 4 meshes, got {len(slabs)}")
    c, nx, n = len(slabs), slabs[0].shape[0], slabs[0].shape[1]
    m = pos.shape[0]
    out = check_add_to(add_to, m, c)
    if out is None:
        out = cupy.empty((m, c), dtype=np.float64)
    if m:
        mod = _module("float64", pos.dtype.name, slabs[0].dtype.name)
        kern = mod.get_function("interp")
        ptrs = slabs + [slabs[0]] * (4 - c)
        kern(((m + _THREADS - 1) // _THREADS,), (_THREADS,),
             (pos, *ptrs, np.int64(m), np.int64(n), np.int32(c), np.float64(n / box_size),
              np.float64(shift - 0.5), np.int64(x_lo), np.int64(nx),
              np.int32(add_to is not None), out))
    return out


def fd4_gradient_gpu(phi, lo, hi, *, axis: int, cell: float):
    """:func:`cosmo_dask.gravity.pm_kernels.fd4_gradient` on CuPy slabs (the GPU kernel of
    the contract :data:`cosmo_dask.gravity.dispatch.fd4_gradient`): one thread per mesh
    point, the same float64 arithmetic, a new slab of ``phi``'s dtype."""
    import cupy

    phi, lo, hi = (cupy.ascontiguousarray(a) for a in (phi, lo, hi))
    out = cupy.empty_like(phi)
    if phi.size:
        nx, ny, nz = phi.shape
        kern = _module("float64", "float64", phi.dtype.name).get_function("fd4")
        threads = min(_THREADS, 32 * ((nz + 31) // 32))  # a row's points; planes, rows: grid
        grid = ((nz + threads - 1) // threads, min(ny, _MAX_GRID_YZ), min(nx, _MAX_GRID_YZ))
        kern(grid, (threads,),
             (phi, lo.astype(phi.dtype, copy=False), hi.astype(phi.dtype, copy=False),
              np.int64(nx), np.int64(ny), np.int64(nz), np.int32(axis),
              np.float64(-1.0 / (12.0 * cell)),
              out))
    return out
