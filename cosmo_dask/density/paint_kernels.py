"""Mass assignment of particles onto a periodic cubic mesh: CPU (numba) kernels.

Convention (shared with :mod:`~cosmo_dask.density.paint_kernels_gpu` and
:func:`~cosmo_dask.density.paint`): mesh cell ``i`` of ``n`` covers
``[i H, (i + 1) H)`` with ``H = L / n`` and its node (the point the assignment
kernel is centred on) is the cell centre ``(i + 1/2) H``. A particle at ``x``
has mesh coordinate ``u = x / H - 1/2 + shift`` (``shift`` in cells; the
interlaced second mesh uses ``shift = 1/2``) and gives node ``j`` the weight
``W_p(u - j)`` per axis, the product over the three axes (separable):

========  =====  ============================================================
scheme    order  one-dimensional weight ``W_p(s)``
========  =====  ============================================================
``ngp``   1      1 for ``-1/2 <= s < 1/2``
``cic``   2      ``1 - |s|`` for ``|s| < 1``
``tsc``   3      ``3/4 - s^2`` (``|s| < 1/2``), ``(3/2 - |s|)^2 / 2`` (``< 3/2``)
``pcs``   4      ``(4 - 6 s^2 + 3 |s|^3) / 6`` (``|s| < 1``), ``(2 - |s|)^3 / 6`` (``< 2``)
========  =====  ============================================================

``W_p`` is the ``p``-fold convolution of the top hat with itself, so its
Fourier transform is ``sinc(k H / 2)^p`` per axis (the window the power
spectrum divides out). Node indices are taken modulo ``n`` (periodic wrap), so
positions need not lie in ``[0, L)``. The weights of one particle sum to 1 up
to rounding, so mass is conserved to rounding (~1e-16 relative per particle in
float64).

Coordinates and weights are computed in float64 whatever the input dtype;
the products are added to the mesh in its dtype.

Slabs: the kernels write (and :mod:`cosmo_dask.gravity.pm_kernels` reads) one
slab of planes ``x_lo .. x_lo + nx - 1`` along axis 0, an ``(nx, n, n)`` array;
a particle's contributions to planes outside it are skipped (they belong to
the slabs :mod:`cosmo_dask.spatial.slabs` sends the particle to as well). The
whole mesh is the slab ``x_lo = 0, nx = n``.

Cost: ``p^3`` scattered additions per particle, O(N p^3) time, serial within a
task (dask parallelises over slabs), plus zeroing the slab. Non-finite
positions are skipped and counted (the caller raises).
"""

from __future__ import annotations

import numba
import numpy as np

from .parameters import SCHEMES


@numba.njit(cache=True, inline="always")
def into_period(u, fn):
    """Mesh coordinate ``u`` brought into ``[0, fn)`` (so ``int()`` cannot overflow)."""
    if u < 0.0 or u >= fn:
        u -= fn * np.floor(u / fn)
    return u


@numba.njit(cache=True, inline="always")
def assignment_weights(u, order, w):
    """Leftmost node index and the ``order`` weights of mesh coordinate ``u``."""
    if order == 1:
        i0 = int(np.floor(u + 0.5))
        w[0] = 1.0
    elif order == 2:
        i0 = int(np.floor(u))
        f = u - i0
        w[0] = 1.0 - f
        w[1] = f
    elif order == 3:
        ic = int(np.floor(u + 0.5))
        d = u - ic
        w[0] = 0.5 * (0.5 - d) * (0.5 - d)
        w[1] = 0.75 - d * d
        w[2] = 0.5 * (0.5 + d) * (0.5 + d)
        i0 = ic - 1
    else:
        ic = int(np.floor(u))
        f = u - ic
        g = 1.0 - f
        w[0] = g * g * g / 6.0
        w[1] = (4.0 - 6.0 * f * f + 3.0 * f * f * f) / 6.0
        w[2] = (4.0 - 6.0 * g * g + 3.0 * g * g * g) / 6.0
        w[3] = f * f * f / 6.0
        i0 = ic - 1
    return i0


@numba.njit(cache=True, nogil=True)
def paint_chunk(pos, mass, mass_scalar, n, box_size, order, shift, mesh, x_lo, nx):
    """Add the particles' masses onto the slab ``mesh`` (flat, ``nx n^2``, C order) in place.

    Parameters
    ----------
    pos : (m, 3) float32/float64
    mass : (m,) float array, or a length-0 array to use ``mass_scalar`` for all
    mass_scalar : float
    n : int
    box_size : float
    order : int
        1 (NGP), 2 (CIC), 3 (TSC) or 4 (PCS).
    shift : float
        Added to the mesh coordinate, in cells.
    mesh : (nx n^2,) array, float32 or float64
        The planes ``x_lo .. x_lo + nx - 1`` of the mesh (all of it: 0, n).
    x_lo, nx : int
        The slab's first plane and its number of planes (``x_lo + nx <= n``).

    Returns
    -------
    int
        Number of particles skipped because a coordinate was not finite.
    """
    inv_h = n / box_size
    off = shift - 0.5
    fn = float(n)
    wx = np.empty(4, dtype=np.float64)
    wy = np.empty(4, dtype=np.float64)
    wz = np.empty(4, dtype=np.float64)
    use_array = mass.shape[0] > 0
    bad = 0
    nn = np.int64(n)
    for p in range(pos.shape[0]):
        ux = np.float64(pos[p, 0]) * inv_h + off
        uy = np.float64(pos[p, 1]) * inv_h + off
        uz = np.float64(pos[p, 2]) * inv_h + off
        if not (np.isfinite(ux) and np.isfinite(uy) and np.isfinite(uz)):
            bad += 1
            continue
        ix = assignment_weights(into_period(ux, fn), order, wx)
        iy = assignment_weights(into_period(uy, fn), order, wy)
        iz = assignment_weights(into_period(uz, fn), order, wz)
        m = np.float64(mass[p]) if use_array else mass_scalar
        for a in range(order):
            lx = np.int64(ix + a) % nn - x_lo
            if lx < 0 or lx >= nx:
                continue
            jx = lx * nn
            ma = m * wx[a]
            for b in range(order):
                jxy = (jx + np.int64(iy + b) % nn) * nn
                mab = ma * wy[b]
                for c in range(order):
                    mesh[jxy + np.int64(iz + c) % nn] += mab * wz[c]
    return bad


def paint_numpy(pos, mass, n: int, box_size: float, scheme: str, shift: float = 0.0,
                dtype=np.float64, planes: tuple[int, int] | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
    """Paint one chunk on the CPU onto planes ``planes = (lo, hi)`` (default all).

    ``mass`` is an (m,) array or a float (every particle's mass). ``out``, a
    C-contiguous ``(hi - lo, n, n)`` array of ``dtype``, is added into (and
    returned); default a fresh zeroed one. Raises ``ValueError`` if a position
    is not finite.
    """
    lo, hi = (0, n) if planes is None else (int(planes[0]), int(planes[1]))
    pos = np.ascontiguousarray(pos)
    mesh = np.zeros((hi - lo, n, n), dtype=dtype) if out is None else out
    if np.isscalar(mass) or np.ndim(mass) == 0:
        marr, mscalar = np.empty(0, dtype=mesh.dtype), float(mass)
    else:
        marr, mscalar = np.ascontiguousarray(mass), 0.0
    if pos.shape[0]:
        bad = paint_chunk(pos, marr, mscalar, int(n), float(box_size), SCHEMES[scheme],
                          float(shift), mesh.reshape(-1), lo, hi - lo)
        if bad:
            raise ValueError(f"paint: {bad} particle position(s) are not finite")
    return mesh
