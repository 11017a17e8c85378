"""Softened pair factors for numba kernels: the one CPU implementation of each.

Convention (as :mod:`cosmo_dask.gravity.p2p_kernels`): ``a_i = -G sum_j m_j K (x_i -
x_j)``, ``phi_i = -G sum_j m_j P``, the factors here per unit mass (``K`` in
1/length^3, ``P`` in 1/length):

* Plummer: ``K = (r^2 + eps^2)^{-3/2}``, ``P = (r^2 + eps^2)^{-1/2}``;
* Gadget-2 cubic spline of support ``h`` (``h = 2.8 eps``, Springel 2005): Newtonian
  for ``r >= h``, inside ``u = r / h < 1`` the polynomials of :func:`spline_kp_inside`.

All are ``@njit(inline="always")``, so a kernel calling them compiles the same
arithmetic as if it were written in place. The CUDA twins are
``cosmo_dask/cuda/softening.cuh`` (``cd_inv_kp``, ``cd_spline_kp``).
"""

from __future__ import annotations

import math

import numba

__all__ = ["inverse_kp", "plummer_kp", "spline_kp", "spline_kp_inside"]


@numba.njit(cache=True, error_model="numpy", inline="always")
def inverse_kp(inv):
    """``(K, P) = (inv^3, inv)`` from ``inv = 1 / sqrt(s2)`` in the dtype of ``inv``:
    Plummer with ``s2 = r^2 + eps^2``, Newtonian with ``s2 = r^2``."""
    return inv * inv * inv, inv


@numba.njit(cache=True, error_model="numpy", inline="always")
def plummer_kp(r2, eps2):
    """Plummer ``(K, P)`` at squared separation ``r2`` and squared softening ``eps2``
    (``r2 + eps2 > 0``; float64 math)."""
    return inverse_kp(1.0 / math.sqrt(r2 + eps2))


@numba.njit(cache=True, error_model="numpy", inline="always")
def spline_kp_inside(u, hinv):
    """Gadget-2 spline ``(K, P)`` inside the support: ``u = r / h`` in ``[0, 1)``,
    ``hinv = 1 / h`` (1/length; float64 math)."""
    h3 = hinv * hinv * hinv
    if u < 0.5:
        k = h3 * (10.666666666667 + u * u * (32.0 * u - 38.4))
        p = hinv * (2.8 - u * u * (5.333333333333 + u * u * (6.4 * u - 9.6)))
    else:
        k = h3 * (21.333333333333 - 48.0 * u + 38.4 * u * u - 10.666666666667 * u * u * u
                  - 0.066666666667 / (u * u * u))
        p = -hinv * (-3.2 + 0.066666666667 / u
                     + u * u * (10.666666666667 + u * (-16.0 + u * (9.6 - 2.133333333333 * u))))
    return k, p


@numba.njit(cache=True, error_model="numpy", inline="always")
def spline_kp(r, h):
    """Gadget-2 spline ``(K, P)`` at separation ``r > 0`` for support ``h > 0`` (length
    units; float64 math): Newtonian for ``r >= h``."""
    if r >= h:
        return inverse_kp(1.0 / r)
    hinv = 1.0 / h
    return spline_kp_inside(r * hinv, hinv)
