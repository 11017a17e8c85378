"""SCF (Hernquist & Ostriker 1992) basis kernels on the CPU (numba).

Basis and normalisation follow gala's ``gala.potential.scf`` so coefficients
are interchangeable with ``SCFPotential(m=M, r_s=r_s, Snlm=S, Tnlm=T)``. With
``s = r / r_s``, ``xi = (s - 1) / (s + 1)``, ``X = cos(theta)``:

* radial ``Phi_nl(s) = -sqrt(4 pi) s^l (1 + s)^-(2l+1) C_n^(2l+3/2)(xi)``
  (Gegenbauer polynomial ``C``), density partner
  ``rho_nl(s) = sqrt(4 pi) K_nl / (2 pi) s^(l-1) (1 + s)^-(2l+3) C_n^(2l+3/2)(xi)``
  with ``K_nl = n (n + 4l + 3) / 2 + (l + 1)(2l + 1)``;
* angular ``Ybar_lm(X) = sqrt((2l+1)/(4 pi) (l-m)!/(l+m)!) P_l^m(X)`` (with the
  Condon-Shortley phase, as GSL's ``legendre_sphPlm``), times ``cos(m phi)``
  (coefficients ``S``) or ``sin(m phi)`` (``T``);
* coefficients ``S_nlm = sum_k (m_k / M) (2 - delta_m0) Atil_nl Phi_nl(s_k)
  Ybar_lm(X_k) cos(m phi_k)`` (``T`` with ``sin``), ``M`` the total mass,
  ``Atil_nl = -2^(8l+6) / (4 pi K_nl) n! (n + 2l + 3/2) Gamma(2l + 3/2)^2 /
  Gamma(n + 4l + 3)`` (from log-gamma, so no overflow up to the limits);
* ``Phi(x) = G M / r_s sum S/T Phi_nl Ybar_lm cos/sin``,
  ``rho(x) = M / r_s^3 sum S/T rho_nl Ybar_lm cos/sin``.

Stability. Gegenbauer polynomials come from the three-term recurrence in ``n``
(stable for ``|xi| <= 1``); their derivative is ``2 alpha C_(n-1)^(alpha+1)``
from a second recurrence (no division by ``1 - xi^2``, which vanishes at
``r = 0`` and ``r -> inf``). Angular functions are computed as
``Qbar_lm = Ybar_lm / sin^m(theta)`` -- polynomials in ``X`` -- by the standard
normalised recurrence upward in ``l`` at fixed ``m`` (stable; no ``cot theta``).
Then ``Ybar = Qbar sin^m``, ``Ybar / sin(theta) = Qbar sin^(m-1)`` (m >= 1),
``dYbar/dtheta = sin^(m-1) (l X Qbar_lm - c_lm Qbar_(l-1)m)`` (m >= 1) and
``dYbar_l0/dtheta = sqrt(l (l+1)) Qbar_l1 sin(theta)``: nothing is divided by
``sin(theta)``, so the z axis is regular. ``Phi_nl / s`` (for the angular
force terms) is formed as ``s^(l-1) ...`` directly for ``l >= 1``, so ``r = 0``
is regular too (``theta = phi = 0`` there). At ``r = 0`` exactly the monopole
(``l = 0``) force of the cusped basis has no limit -- like the Hernquist force
``-G M / a^2`` it points to the centre from every side -- and is set to its
direction average, zero; the ``l = 1`` terms give a direction-independent
constant and ``l >= 2`` terms vanish, so the value at the origin is the
average of the limits from all directions. The density's ``l = 0`` terms diverge as ``1/s`` at
``r = 0`` (the Hernquist cusp): the density there is ``+-inf``.

Cost: per particle ``O((nmax + 1) (lmax + 1) (lmax + 2) / 2)`` multiply-adds
for the coefficient sums and about three times that for accelerations; the
kernels run in parallel over blocks of particles (``numba.prange``). Inputs
may be float32 or float64; they are converted to float64 per chunk (one
compiled kernel; the arithmetic is float64 either way) and outputs have the
input dtype.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

__all__ = ["anl_tilde", "knl", "pack_sums", "scf_coefficient_sums", "scf_evaluate", "unpack_sums"]

_SQRT4PI = math.sqrt(4.0 * math.pi)


def knl(nmax: int, lmax: int) -> np.ndarray:
    """``K_nl`` as float64 array (nmax+1, lmax+1)."""
    n = np.arange(nmax + 1)[:, None].astype(np.float64)
    ell = np.arange(lmax + 1)[None, :].astype(np.float64)
    return 0.5 * n * (n + 4 * ell + 3) + (ell + 1) * (2 * ell + 1)


def anl_tilde(nmax: int, lmax: int) -> np.ndarray:
    """gala's ``Atil_nl`` (negative), float64 (nmax+1, lmax+1), via log-gamma."""
    from scipy.special import gammaln

    n = np.arange(nmax + 1)[:, None].astype(np.float64)
    ell = np.arange(lmax + 1)[None, :].astype(np.float64)
    k = knl(nmax, lmax)
    log_a = ((8 * ell + 6) * math.log(2.0) - np.log(4 * math.pi * k) + gammaln(n + 1)
             + np.log(n + 2 * ell + 1.5) + 2 * gammaln(2 * ell + 1.5) - gammaln(n + 4 * ell + 3))
    return -np.exp(log_a)


# ----------------------------------------------------------------------------- helpers
@numba.njit(cache=True, nogil=True, inline="always")
def _angles(x, y, z):
    """r, cos(theta), sin(theta), cos(phi), sin(phi); theta = phi = 0 on axis / at 0."""
    rho2 = x * x + y * y
    r = math.sqrt(rho2 + z * z)
    rho = math.sqrt(rho2)
    if r > 0.0:
        ct = z / r
        st = rho / r
    else:
        ct = 1.0
        st = 0.0
    if rho > 0.0:
        cp = x / rho
        sp = y / rho
    else:
        cp = 1.0
        sp = 0.0
    return r, ct, st, cp, sp


@numba.njit(cache=True, nogil=True)
def _qbar(ct, lmax, q):
    """Fill q[l, m] = Ybar_lm(X) / sin^m(theta) (m <= l) by the stable l-recurrence."""
    q[0, 0] = 0.28209479177387814  # 1 / sqrt(4 pi)
    for m in range(lmax + 1):
        if m > 0:
            q[m, m] = -math.sqrt((2.0 * m + 1.0) / (2.0 * m)) * q[m - 1, m - 1]
        if m + 1 <= lmax:
            q[m + 1, m] = ct * math.sqrt(2.0 * m + 3.0) * q[m, m]
        for ell in range(m + 2, lmax + 1):
            a = math.sqrt((4.0 * ell * ell - 1.0) / (ell * ell - m * m))
            b = math.sqrt(((ell - 1.0) ** 2 - m * m) / (4.0 * (ell - 1.0) ** 2 - 1.0))
            q[ell, m] = a * (ct * q[ell - 1, m] - b * q[ell - 2, m])


@numba.njit(cache=True, nogil=True)
def _radial(s, nmax, lmax, phi, dphi, phis, deriv):
    """Phi_nl(s) into phi[n, l]; with deriv also dPhi_nl/ds and Phi_nl/s (l >= 1; 0 for l=0).

    ``phi`` etc. exclude nothing: they include the ``-sqrt(4 pi)`` factor. Callers pass
    ``deriv`` as ``np.bool_(...)``, not a literal, so that both share one compiled version.
    """
    u = 1.0 / (1.0 + s)
    xi = (s - 1.0) * u
    su2 = s * u * u
    base = u            # s^l u^(2l+1)
    sl1 = u * u * u     # s^(l-1) u^(2l+1), l >= 1
    for ell in range(lmax + 1):
        if ell > 0:
            base *= su2
            if ell > 1:
                sl1 *= su2
        alpha = 2.0 * ell + 1.5
        c1 = 0.0  # C_(n-1)^alpha
        c2 = 0.0  # C_(n-2)^alpha
        g1 = 0.0  # C_(n-2)^(alpha+1)
        g2 = 0.0  # C_(n-3)^(alpha+1)
        if ell == 0:
            dbase = -u * u
        else:
            dbase = sl1 * (ell - (2.0 * ell + 1.0) * s * u)
        for n in range(nmax + 1):
            if n == 0:
                c = 1.0
            elif n == 1:
                c = 2.0 * alpha * xi
            else:
                c = (2.0 * (n + alpha - 1.0) * xi * c1 - (n + 2.0 * alpha - 2.0) * c2) / n
            c2 = c1
            c1 = c
            dc = 0.0
            if deriv and n > 0:
                j = n - 1  # C_j^(alpha+1)
                if j == 0:
                    g = 1.0
                elif j == 1:
                    g = 2.0 * (alpha + 1.0) * xi
                else:
                    g = (2.0 * (j + alpha) * xi * g1 - (j + 2.0 * alpha) * g2) / j
                g2 = g1
                g1 = g
                dc = 2.0 * alpha * g
            phi[n, ell] = -_SQRT4PI * base * c
            if deriv:
                dphi[n, ell] = -_SQRT4PI * (dbase * c + base * 2.0 * u * u * dc)
                phis[n, ell] = -_SQRT4PI * sl1 * c if ell > 0 else 0.0


@numba.njit(cache=True, nogil=True)
def _cos_sin_m(cp, sp, lmax, cm, sm):
    cm[0] = 1.0
    sm[0] = 0.0
    for m in range(1, lmax + 1):
        cm[m] = cm[m - 1] * cp - sm[m - 1] * sp
        sm[m] = sm[m - 1] * cp + cm[m - 1] * sp


def _blocks(n: int, per: int = 1024, most: int | None = None) -> np.ndarray:
    nb = max(1, -(-n // per))
    if most is not None:
        nb = min(nb, most)
    return np.linspace(0, n, nb + 1).astype(np.int64)


# ----------------------------------------------------------------------------- coefficients
@numba.njit(cache=True, nogil=True)
def _coeff_block(b, pos, mass, nmax, lmax, inv_rs, anl, bounds, out):
    """The sums of block ``b`` (rows ``bounds[b] : bounds[b + 1]``) into ``out[b]``."""
    q = np.zeros((lmax + 1, lmax + 1))
    phi = np.zeros((nmax + 1, lmax + 1))
    dummy = np.zeros((1, 1))
    cm = np.zeros(lmax + 1)
    sm = np.zeros(lmax + 1)
    acc = out[b]
    for k in range(bounds[b], bounds[b + 1]):
        r, ct, st, cp, sp = _angles(float(pos[k, 0]), float(pos[k, 1]), float(pos[k, 2]))
        _qbar(ct, lmax, q)
        _radial(r * inv_rs, nmax, lmax, phi, dummy, dummy, np.bool_(False))
        _cos_sin_m(cp, sp, lmax, cm, sm)
        w = float(mass[k])
        for ell in range(lmax + 1):
            stm = 1.0
            for m in range(ell + 1):
                if m > 0:
                    stm *= st
                y = q[ell, m] * stm * w * (1.0 if m == 0 else 2.0)
                yc = y * cm[m]
                ys = y * sm[m]
                for n in range(nmax + 1):
                    t = anl[n, ell] * phi[n, ell]
                    a = t * yc
                    c = t * ys
                    acc[0, n, ell, m] += a
                    acc[1, n, ell, m] += c
                    acc[2, n, ell, m] += a * a
                    acc[3, n, ell, m] += c * c


# The parallel kernels call one block's function per prange iteration (an int64 index,
# so that it compiles once): numba's parfor passes then work on a call, not on the body.
@numba.njit(cache=True, nogil=True, parallel=True)
def _coeff_kernel(pos, mass, nmax, lmax, inv_rs, anl, bounds, out):
    for b in prange(bounds.shape[0] - 1):
        _coeff_block(np.int64(b), pos, mass, nmax, lmax, inv_rs, anl, bounds, out)


def scf_coefficient_sums(pos: np.ndarray, mass: np.ndarray, nmax: int, lmax: int,
                         r_s: float) -> np.ndarray:
    """Per-chunk SCF sums as one float64 vector (see :func:`pack_sums`).

    Contents: ``sum m_k s_k`` and ``sum m_k t_k`` (cos / sin coefficients
    before division by the total mass), their sums of squares, the chunk's
    mass sum and particle count.
    Particles are split into at most ``4 x threads`` blocks summed in parallel
    (numba ``prange``), one accumulator per block (``4 (nmax+1)(lmax+1)^2``
    float64 each); cost ``O(N nmax lmax^2)``.
    """
    pos = np.ascontiguousarray(pos, dtype=np.float64)
    mass = np.ascontiguousarray(mass, dtype=np.float64)
    bounds = _blocks(pos.shape[0], 1024, 4 * numba.get_num_threads())
    nb = bounds.shape[0] - 1
    out = np.zeros((nb, 4, nmax + 1, lmax + 1, lmax + 1))
    if pos.shape[0]:
        _coeff_kernel(pos, mass, nmax, lmax, 1.0 / r_s, anl_tilde(nmax, lmax), bounds, out)
    return pack_sums(out.sum(axis=0), float(mass.sum(dtype=np.float64)), pos.shape[0])


def pack_sums(sums4: np.ndarray, msum: float, count: int) -> np.ndarray:
    """Flatten (4, n, l, m) sums plus mass sum and count into one float64 vector."""
    return np.concatenate([np.asarray(sums4, dtype=np.float64).ravel(),
                           np.array([msum, float(count)])])


def unpack_sums(vec: np.ndarray, nmax: int, lmax: int):
    """Inverse of :func:`pack_sums`: (sums (4, n, l, m), mass sum, count)."""
    k = 4 * (nmax + 1) * (lmax + 1) ** 2
    return vec[:k].reshape(4, nmax + 1, lmax + 1, lmax + 1), float(vec[k]), float(vec[k + 1])


# ----------------------------------------------------------------------------- evaluation
@numba.njit(cache=True, nogil=True)
def _eval_block(b, pos, nmax, lmax, inv_rs, S, T, kn, what, bounds, out):
    """Block ``b`` of :func:`_eval_kernel` (rows ``bounds[b] : bounds[b + 1]``)."""
    q = np.zeros((lmax + 1, lmax + 1))
    phi = np.zeros((nmax + 1, lmax + 1))
    dphi = np.zeros((nmax + 1, lmax + 1))
    phis = np.zeros((nmax + 1, lmax + 1))
    cm = np.zeros(lmax + 1)
    sm = np.zeros(lmax + 1)
    for k in range(bounds[b], bounds[b + 1]):
        r, ct, st, cp, sp = _angles(float(pos[k, 0]), float(pos[k, 1]), float(pos[k, 2]))
        s = r * inv_rs
        _qbar(ct, lmax, q)
        _radial(s, nmax, lmax, phi, dphi, phis, np.bool_(True))
        _cos_sin_m(cp, sp, lmax, cm, sm)
        if what == 0:
            v = 0.0
            for ell in range(lmax + 1):
                stm = 1.0
                for m in range(ell + 1):
                    if m > 0:
                        stm *= st
                    y = q[ell, m] * stm
                    for n in range(nmax + 1):
                        v += phi[n, ell] * y * (S[n, ell, m] * cm[m] + T[n, ell, m] * sm[m])
            out[k, 0] = v
        elif what == 2:
            # rho_nl = -K_nl / (2 pi) * phis (l >= 1); l = 0: sqrt(4pi) K/(2pi) C u^3 / s
            v = 0.0
            v0 = 0.0
            u = 1.0 / (1.0 + s)
            for ell in range(lmax + 1):
                stm = 1.0
                for m in range(ell + 1):
                    if m > 0:
                        stm *= st
                    y = q[ell, m] * stm
                    for n in range(nmax + 1):
                        coef = y * (S[n, ell, m] * cm[m] + T[n, ell, m] * sm[m])
                        if ell == 0:
                            # phi_n0 = -sqrt(4pi) u C_n -> rho_n0 = K/(2pi) sqrt(4pi) C u^3/s
                            v0 += -kn[n, 0] / (2.0 * math.pi) * phi[n, 0] * u * u * coef
                        else:
                            # phis = -sqrt(4pi) s^(l-1) u^(2l+1) C; rho_nl = that * u^2 * -K/2pi
                            v += -kn[n, ell] / (2.0 * math.pi) * phis[n, ell] * u * u * coef
            if s > 0.0:
                out[k] = v + v0 / s
            elif v0 != 0.0:
                out[k] = v0 * math.inf
            else:
                out[k, 0] = v
        else:
            gr = 0.0
            gt = 0.0
            gp = 0.0
            for ell in range(lmax + 1):
                stm1 = 1.0  # sin^(m-1)
                for m in range(ell + 1):
                    if m > 1:
                        stm1 *= st
                    if m == 0:
                        y = q[ell, 0]
                        dy = math.sqrt(ell * (ell + 1.0)) * q[ell, 1] * st if ell > 0 else 0.0
                        yos = 0.0
                    else:
                        yos = q[ell, m] * stm1
                        y = yos * st
                        qlm1 = q[ell - 1, m] if ell > m else 0.0
                        c = math.sqrt((2.0 * ell + 1.0) * (ell - m) * (ell + m)
                                      / (2.0 * ell - 1.0))
                        dy = stm1 * (ell * ct * q[ell, m] - c * qlm1)
                    for n in range(nmax + 1):
                        sc = S[n, ell, m] * cm[m] + T[n, ell, m] * sm[m]
                        if ell > 0 or s > 0.0:  # monopole force at r = 0: see module doc
                            gr += dphi[n, ell] * y * sc
                        if ell > 0:
                            gt += phis[n, ell] * dy * sc
                            if m > 0:
                                gp += phis[n, ell] * yos * m * (T[n, ell, m] * cm[m]
                                                                - S[n, ell, m] * sm[m])
            out[k, 0] = st * cp * gr + ct * cp * gt - sp * gp
            out[k, 1] = st * sp * gr + ct * sp * gt + cp * gp
            out[k, 2] = ct * gr - st * gt


@numba.njit(cache=True, nogil=True, parallel=True)
def _eval_kernel(pos, nmax, lmax, inv_rs, S, T, kn, what, bounds, out):
    """what: 0 potential, 1 gradient in s units, 2 density; out (N, 3) (scalars in column 0)."""
    for b in prange(bounds.shape[0] - 1):
        _eval_block(np.int64(b), pos, nmax, lmax, inv_rs, S, T, kn, what, bounds, out)


def scf_evaluate(pos: np.ndarray, S: np.ndarray, T: np.ndarray, r_s: float, GM: float,
                 what: str) -> np.ndarray:
    """Potential, acceleration or density at ``pos`` (N, 3) from coefficients.

    ``S, T``: float64 (nmax+1, lmax+1, lmax+1) dimensionless coefficients;
    ``GM``: ``G M`` for potential/acceleration, ``M`` for density. Returns the
    input dtype, (N,) or (N, 3). Cost ``O(N nmax lmax^2)``, parallel over
    blocks of particles.
    """
    dtype = pos.dtype
    pos = np.ascontiguousarray(pos, dtype=np.float64)
    nmax, lmax = S.shape[0] - 1, S.shape[1] - 1
    code = {"potential": 0, "acceleration": 1, "density": 2}[what]
    n = pos.shape[0]
    out = np.zeros((n, 3), dtype=np.float64)
    if n:
        _eval_kernel(pos, nmax, lmax, 1.0 / r_s, np.ascontiguousarray(S, dtype=np.float64),
                     np.ascontiguousarray(T, dtype=np.float64), knl(nmax, lmax), code,
                     _blocks(n, 1024), out)
    if code != 1:
        out = out[:, 0]
    if code == 0:
        out *= GM / r_s
    elif code == 1:
        out *= -GM / (r_s * r_s)
    else:
        out *= GM / r_s**3
    return out.astype(dtype, copy=False)
