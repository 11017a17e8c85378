"""Multipole-expansion (MEX) kernels on the CPU (numba).

Conventions shared with :mod:`cosmo_dask.expansion.mex_kernels_gpu`.

Solid harmonics. For ``m >= 0`` the regular solid harmonic is the polynomial

    T_lm(x) = c_lm r^l P_l^m(cos theta) e^{i m phi},   c_lm^2 = (2 - d_m0) (l-m)! / (l+m)!

(``P_l^m`` without the Condon-Shortley phase), so that the addition theorem reads
``sum_{m=0..l} Re(conj(T_lm(x')) T_lm(x)) = r^l r'^l P_l(cos gamma)`` and

    1 / |x - x'| = sum_l sum_{m<=l} Re(conj(T_lm(x')) T_lm(x)) / r^(2l+1)    (r' < r).

``T`` is computed in Cartesian form, never through angles: the sectoral terms
``T_mm = T_{m-1,m-1} (x + i y) sqrt((2m-1)/(2m))`` (``T_11 = x + i y``) and, for
fixed ``m``, the upward recurrence

    T_{l+1,m} = [(2l+1) z T_lm - sqrt((l+m)(l-m)) r^2 T_{l-1,m}] / sqrt((l+1-m)(l+1+m)),

which is stable and has no ``1/sin(theta)`` or ``1/r``: the z axis and ``r = 0``
are ordinary points. Gradients come from the ladder relations
(``d+ = d/dx + i d/dy``, ``d- = d/dx - i d/dy``)

    dT_lm/dz = sqrt((l+m)(l-m)) T_{l-1,m}
    d+ T_lm  = -sqrt((2-d_m0)/2 (l-m)(l-m-1)) T_{l-1,m+1}
    d- T_lm  = sqrt(2 (l+m)(l+m-1) / (2-d_m1)) T_{l-1,m-1}    (m >= 1)
    d- T_l0  = conj(d+ T_l0).

Storage: the ``(lmax+1)^2`` real numbers of one particle are ``T_l0`` at
``l^2`` and ``Re, Im T_lm`` at ``l^2 + 2m - 1, l^2 + 2m`` for ``m >= 1``.

Softening ``eps``: the irregular harmonics ``T_lm / r^(2l+1)`` become
``T_lm / (r^2 + eps^2)^(l+1/2)`` (for sources and field points alike); the
regular ones are polynomials and stay. With ``eps = 0`` a source exactly at
``r = 0`` has no irregular term, and a field point at ``r = 0`` no inner term
(both would be infinite; a point at the centre has no inner mass but other
particles at exactly ``r = 0``).

Per-bucket pipeline (particles sorted by radius, positions and masses already
scaled to O(1) units by the caller):

``terms_scan``: ``Q[i] = sum_{j<i} m_j T(x_j)`` and ``P[i] = sum_{j>=i} m_j
T(x_j) f_l(r_j)`` for ``i = 0..n`` (rows ``n + 1``), accumulated in float64 and
stored in the output dtype. Cost O(n (lmax+1)^2).

``evaluate``: potential and acceleration at points whose inner sums are
``Q[iq]`` and outer sums ``P[ip]``:

    Phi = -sum_lm [Re(conj(Q_lm) T_lm) f_l(r) + Re(conj(P_lm) T_lm)],   acc = -grad Phi

(G and the unit scalings are applied by the caller). Cost O(n (lmax+1)^2).
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["evaluate", "forces_local", "n_terms", "terms_scan"]


def n_terms(lmax: int) -> int:
    """Real numbers per particle and per sum: ``(lmax + 1)**2``."""
    return (lmax + 1) ** 2


@numba.njit(cache=True, inline="always")
def _solid(x, y, z, lmax, T):
    """Regular normalised solid harmonics of (x, y, z) into ``T`` (float64, layout above)."""
    r2 = x * x + y * y + z * z
    T[0] = 1.0
    re = 1.0
    im = 0.0
    for m in range(1, lmax + 1):
        f = 1.0 if m == 1 else math.sqrt((2.0 * m - 1.0) / (2.0 * m))
        nre = (re * x - im * y) * f
        im = (re * y + im * x) * f
        re = nre
        k = m * m + 2 * m - 1
        T[k] = re
        T[k + 1] = im
    for m in range(0, lmax):
        for l in range(m, lmax):
            d = 1.0 / math.sqrt((l + 1.0 - m) * (l + 1.0 + m))
            a = (2.0 * l + 1.0) * z * d
            b = math.sqrt((l + m) * (l - m + 0.0)) * r2 * d
            if m == 0:
                t1 = T[l * l]
                t0 = T[(l - 1) * (l - 1)] if l > 0 else 0.0
                T[(l + 1) * (l + 1)] = a * t1 - b * t0
            else:
                k1 = l * l + 2 * m - 1
                k2 = (l + 1) * (l + 1) + 2 * m - 1
                if l > m:
                    k0 = (l - 1) * (l - 1) + 2 * m - 1
                    T[k2] = a * T[k1] - b * T[k0]
                    T[k2 + 1] = a * T[k1 + 1] - b * T[k0 + 1]
                else:
                    T[k2] = a * T[k1]
                    T[k2 + 1] = a * T[k1 + 1]


@numba.njit(nogil=True, cache=True)
def _terms_scan(pos, mass, lmax, eps2, Q, P):
    n = pos.shape[0]
    K = (lmax + 1) * (lmax + 1)
    T = np.empty(K, np.float64)
    acc = np.zeros(K, np.float64)
    for k in range(K):
        Q[0, k] = 0.0
    for i in range(n):
        x = np.float64(pos[i, 0])
        y = np.float64(pos[i, 1])
        z = np.float64(pos[i, 2])
        mi = np.float64(mass[i])
        _solid(x, y, z, lmax, T)
        for k in range(K):
            acc[k] += mi * T[k]
            Q[i + 1, k] = acc[k]
    for k in range(K):
        acc[k] = 0.0
        P[n, k] = 0.0
    for i in range(n - 1, -1, -1):
        x = np.float64(pos[i, 0])
        y = np.float64(pos[i, 1])
        z = np.float64(pos[i, 2])
        s = x * x + y * y + z * z + eps2
        if s > 0.0:
            _solid(x, y, z, lmax, T)
            f = np.float64(mass[i]) / math.sqrt(s)
            inv_s = 1.0 / s
            for l in range(lmax + 1):
                for k in range(l * l, (l + 1) * (l + 1)):
                    acc[k] += f * T[k]
                f *= inv_s
        for k in range(K):
            P[i, k] = acc[k]


def terms_scan(pos, mass, lmax: int, eps2: float, dtype=None):
    """Inner (``Q``) and outer (``P``) cumulative multipole sums of radius-sorted particles.

    Parameters
    ----------
    pos : ndarray (n, 3), sorted by radius, scaled units
    mass : ndarray (n,), scaled units
    lmax : int
    eps2 : float
        Softening squared (scaled units).
    dtype : output dtype (default ``pos.dtype``)

    Returns
    -------
    Q, P : ndarray (n + 1, (lmax+1)**2)
        ``Q[i] = sum_{j<i} m_j T(x_j)``, ``P[i] = sum_{j>=i} m_j T(x_j) f_l(r_j)``.
        Sums in float64, stored in ``dtype``. O(n (lmax+1)^2) time.
    """
    dtype = np.dtype(pos.dtype if dtype is None else dtype)
    K = n_terms(lmax)
    n = pos.shape[0]
    Q = np.empty((n + 1, K), dtype)
    P = np.empty((n + 1, K), dtype)
    _terms_scan(np.ascontiguousarray(pos), np.ascontiguousarray(mass), int(lmax),
                float(eps2), Q, P)
    return Q, P


@numba.njit(nogil=True, cache=True)
def _evaluate(pos, Q, P, iq, ip, lmax, eps2, acc_out, phi_out):
    n = pos.shape[0]
    K = (lmax + 1) * (lmax + 1)
    T = np.empty(K, np.float64)
    for i in range(n):
        x = np.float64(pos[i, 0])
        y = np.float64(pos[i, 1])
        z = np.float64(pos[i, 2])
        _solid(x, y, z, lmax, T)
        s = x * x + y * y + z * z + eps2
        qrow = iq[i]
        prow = ip[i]
        inner = s > 0.0
        f = 1.0 / math.sqrt(s) if inner else 0.0
        inv_s = 1.0 / s if inner else 0.0
        phi = 0.0
        gx = 0.0
        gy = 0.0
        gz = 0.0
        radial = 0.0  # sum of -(2l+1) f_l / s Re(conj Q T): coefficient of (x, y, z)
        for l in range(lmax + 1):
            for m in range(l + 1):
                if m == 0:
                    k = l * l
                    qr = np.float64(Q[qrow, k])
                    qi = 0.0
                    pr = np.float64(P[prow, k])
                    pi = 0.0
                    tr = T[k]
                    ti = 0.0
                else:
                    k = l * l + 2 * m - 1
                    qr = np.float64(Q[qrow, k])
                    qi = np.float64(Q[qrow, k + 1])
                    pr = np.float64(P[prow, k])
                    pi = np.float64(P[prow, k + 1])
                    tr = T[k]
                    ti = T[k + 1]
                qt = qr * tr + qi * ti
                phi += qt * f + pr * tr + pi * ti
                radial -= (2.0 * l + 1.0) * f * inv_s * qt
                if l == 0:
                    continue
                # weight W = conj(Q) f + conj(P)
                wr = qr * f + pr
                wi = -(qi * f + pi)
                # d/dz
                if m < l:
                    c = math.sqrt((l + m) * (l - m + 0.0))
                    if m == 0:
                        dr = c * T[(l - 1) * (l - 1)]
                        di = 0.0
                    else:
                        kk = (l - 1) * (l - 1) + 2 * m - 1
                        dr = c * T[kk]
                        di = c * T[kk + 1]
                    gz += wr * dr - wi * di
                # d+ T_lm
                if m + 1 <= l - 1:
                    c = -math.sqrt((2.0 - (m == 0)) * 0.5 * (l - m) * (l - m - 1.0))
                    kk = (l - 1) * (l - 1) + 2 * (m + 1) - 1
                    apr = c * T[kk]
                    api = c * T[kk + 1]
                else:
                    apr = 0.0
                    api = 0.0
                # d- T_lm
                if m == 0:
                    amr = apr
                    ami = -api
                else:
                    c = math.sqrt(2.0 * (l + m) * (l + m - 1.0) / (2.0 - (m == 1)))
                    if m == 1:
                        amr = c * T[(l - 1) * (l - 1)]
                        ami = 0.0
                    else:
                        kk = (l - 1) * (l - 1) + 2 * (m - 1) - 1
                        amr = c * T[kk]
                        ami = c * T[kk + 1]
                # W (d+ + d-) / 2 -> x ; Im(W (d+ - d-)) / 2 -> y
                sr = apr + amr
                si = api + ami
                gx += 0.5 * (wr * sr - wi * si)
                dr2 = apr - amr
                di2 = api - ami
                gy += 0.5 * (wr * di2 + wi * dr2)
            f *= inv_s
        acc_out[i, 0] = gx + radial * x
        acc_out[i, 1] = gy + radial * y
        acc_out[i, 2] = gz + radial * z
        phi_out[i] = -phi


def evaluate(pos, Q, P, iq, ip, lmax: int, eps2: float):
    """Acceleration and potential from the cumulative sums (scaled units, G = 1).

    Parameters
    ----------
    pos : ndarray (n, 3), field points (scaled units)
    Q, P : ndarray (rows, (lmax+1)**2) from :func:`terms_scan`
    iq, ip : int64 ndarray (n,)
        Row of ``Q`` holding each point's inner sums and of ``P`` its outer sums.
    lmax : int
    eps2 : float

    Returns
    -------
    acc : ndarray (n, 3), phi : ndarray (n,), in ``pos.dtype``; computed in float64.
    O(n (lmax+1)^2) time.
    """
    n = pos.shape[0]
    acc = np.empty((n, 3), pos.dtype)
    phi = np.empty(n, pos.dtype)
    _evaluate(np.ascontiguousarray(pos), Q, P, np.ascontiguousarray(iq, dtype=np.int64),
              np.ascontiguousarray(ip, dtype=np.int64), int(lmax), float(eps2), acc, phi)
    return acc, phi


def forces_local(pos, mass, lmax: int, eps2: float = 0.0):
    """Single-process MEX: sort by radius, sums, forces at the particles (input order).

    ``pos`` (n, 3) and ``mass`` (n,) about the centre, G = 1, the caller's units
    (no scaling); for benchmarks and checks. Returns ``acc (n, 3), phi (n,)``.
    """
    r2 = (np.asarray(pos, np.float64) ** 2).sum(axis=1)
    order = np.argsort(r2, kind="stable")
    ps = np.ascontiguousarray(pos[order])
    Q, P = terms_scan(ps, mass[order], lmax, eps2)
    iq = np.arange(pos.shape[0], dtype=np.int64)
    acc_s, phi_s = evaluate(ps, Q, P, iq, iq + 1, lmax, eps2)
    acc = np.empty_like(acc_s)
    phi = np.empty_like(phi_s)
    acc[order] = acc_s
    phi[order] = phi_s
    return acc, phi
