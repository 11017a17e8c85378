"""Shared test helpers."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import eval_gegenbauer, eval_legendre, gammaln, lpmv


# ----------------------------------------------------------------------------- references
def ranks(rel):
    """Position of each particle in the (radius, index) order."""
    r = np.sqrt((rel * rel).sum(axis=1))
    order = np.lexsort((np.arange(r.size), r))
    rank = np.empty(r.size, np.int64)
    rank[order] = np.arange(r.size)
    return rank


def shell_reference(rel, m, G=1.0):
    """lmax = 0: acceleration -G M(before i) x / r^3, potential -G [M_in / r + sum_out m / r]."""
    r = np.sqrt((rel * rel).sum(axis=1))
    order = np.lexsort((np.arange(r.size), r))
    ms, rs = m[order], r[order]
    m_in = np.cumsum(ms) - ms
    out = np.cumsum((ms / rs)[::-1])[::-1] - ms / rs
    acc = np.empty_like(rel)
    phi = np.empty(r.size)
    acc[order] = -G * m_in[:, None] * rel[order] / rs[:, None] ** 3
    phi[order] = -G * (m_in / rs + out)
    return acc, phi


def legendre_reference(x, src, m, inner, lmax, G=1.0, skip=None):
    """Truncated multipole field at points ``x`` from ``src`` as pair sums.

    1/|x - x'| ~ sum_l r_<^l / r_>^(l+1) P_l(u), u = cos(angle); ``inner[i, j]``
    says source j is inside point i (else outside); pairs where ``skip`` is
    True (self pairs) are left out. Gradient taken analytically with P_l'(u)
    from the recurrence P'_{l+1} = P'_{l-1} + (2l+1) P_l.
    """
    r = np.sqrt((x * x).sum(1))[:, None]
    rj = np.sqrt((src * src).sum(1))[None, :]
    xh = x / r
    sh = src / rj[0][:, None]
    u = np.clip(xh @ sh.T, -1.0, 1.0)
    skip = np.zeros(inner.shape, bool) if skip is None else skip
    outer = ~inner & ~skip
    inner = inner & ~skip
    Pl = [np.ones_like(u), u]
    dP = [np.zeros_like(u), np.ones_like(u)]
    for l in range(1, lmax):
        Pl.append(eval_legendre(l + 1, u))
        dP.append(dP[l - 1] + (2 * l + 1) * Pl[l])
    phi = np.zeros(x.shape[0])
    acc = np.zeros_like(x)
    for l in range(lmax + 1):
        gi = np.where(inner, rj**l / r ** (l + 1), 0.0)
        go = np.where(outer, r**l / rj ** (l + 1), 0.0)
        phi -= G * ((gi + go) * Pl[l]) @ m
        # inner: r_j^l [-(l+1) r^-(l+2) P xh + r^-(l+2) P' (sh - u xh)]
        # outer: r_j^-(l+1) r^(l-1) [l P xh + P' (sh - u xh)]
        ci = np.where(inner, rj**l / r ** (l + 2), 0.0)
        co = np.where(outer, r ** (l - 1) / rj ** (l + 1), 0.0) if l > 0 else 0.0 * ci
        radial = (ci * (-(l + 1)) * Pl[l] + co * l * Pl[l] - (ci + co) * dP[l] * u) @ m
        tang = ((ci + co) * dP[l] * m[None, :]) @ sh
        acc += G * (radial[:, None] * xh + tang)
    return acc, phi


def self_masks(rel):
    rank = ranks(rel)
    inner = rank[None, :] < rank[:, None]
    return inner


def rel_err(a, b):
    """Per-particle |a - b| / |b| (vectors) or |a - b| / |b| (scalars)."""
    if a.ndim == 2:
        return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    return np.abs(a - b) / np.abs(b)


def blob(rng, n):
    """Triaxial, off-centre-lumpy particles with a few on the z axis."""
    x = rng.normal(size=(n, 3)) * [1.0, 0.6, 0.3]
    x[: n // 10] += [0.8, 0.2, -0.3]
    x[-3:] = [[0, 0, 0.5], [0, 0, -0.7], [0, 0, 1.2]]
    m = rng.uniform(0.5, 1.5, n) / n
    return x, m


SQ4PI = math.sqrt(4 * math.pi)


# ------------------------------------------------------------------ independent reference
def _norm(ell, m):
    return math.sqrt((2 * ell + 1) / (4 * math.pi) * math.exp(gammaln(ell - m + 1)
                                                                - gammaln(ell + m + 1)))


def _knl(n, ell):
    return 0.5 * n * (n + 4 * ell + 3) + (ell + 1) * (2 * ell + 1)


def _atil(n, ell):
    k = _knl(n, ell)
    g = math.exp(gammaln(n + 1) + 2 * gammaln(2 * ell + 1.5) - gammaln(n + 4 * ell + 3))
    return -(2.0 ** (8 * ell + 6) / (4 * math.pi * k)) * g * (n + 2 * ell + 1.5)


def _sph(x):
    r = np.linalg.norm(x, axis=1)
    return r, x[:, 2] / r, np.arctan2(x[:, 1], x[:, 0])


def ref_coefficients(x, mass, nmax, lmax, rs):
    """Hernquist-Ostriker coefficients by direct sums with scipy.special (gala's normalisation)."""
    r, X, ph = _sph(x)
    s = r / rs
    w = mass / mass.sum()
    S = np.zeros((nmax + 1, lmax + 1, lmax + 1))
    T = np.zeros_like(S)
    for n in range(nmax + 1):
        for ell in range(lmax + 1):
            phi = -SQ4PI * s**ell / (1 + s) ** (2 * ell + 1) * eval_gegenbauer(
                n, 2 * ell + 1.5, (s - 1) / (s + 1))
            for m in range(ell + 1):
                y = _norm(ell, m) * lpmv(m, ell, X)
                t = w * (2 - (m == 0)) * _atil(n, ell) * phi * y
                S[n, ell, m] = np.sum(t * np.cos(m * ph))
                T[n, ell, m] = np.sum(t * np.sin(m * ph))
    return S, T


def ref_fields(x, S, T, rs, GM):
    """Potential, acceleration and density from the basis sums (spherical gradient, off-axis)."""
    r, X, ph = _sph(x)
    s = r / rs
    st = np.sqrt(1 - X**2)
    nmax, lmax = S.shape[0] - 1, S.shape[1] - 1
    pot = np.zeros(len(x))
    dens = np.zeros(len(x))
    gr = np.zeros(len(x))
    gt = np.zeros(len(x))
    gp = np.zeros(len(x))
    xi = (s - 1) / (s + 1)
    for n in range(nmax + 1):
        for ell in range(lmax + 1):
            a = 2 * ell + 1.5
            c = eval_gegenbauer(n, a, xi)
            dc = 2 * a * eval_gegenbauer(n - 1, a + 1, xi) if n > 0 else 0.0
            radial = -SQ4PI * s**ell / (1 + s) ** (2 * ell + 1)
            phi = radial * c
            dradial = -SQ4PI * (ell * s ** (ell - 1.0) / (1 + s) ** (2 * ell + 1)
                                - (2 * ell + 1) * s**ell / (1 + s) ** (2 * ell + 2))
            dphi = dradial * c + radial * dc * 2 / (1 + s) ** 2
            rho = SQ4PI * _knl(n, ell) / (2 * math.pi) * s**ell / (s * (1 + s) ** (2 * ell + 3)) * c
            for m in range(ell + 1):
                nlm = _norm(ell, m)
                p = lpmv(m, ell, X)
                pm1 = lpmv(m, ell - 1, X) if ell > 0 else 0.0
                y = nlm * p
                dy = nlm * (ell * X * p - (ell + m) * pm1) / st
                sc = S[n, ell, m] * np.cos(m * ph) + T[n, ell, m] * np.sin(m * ph)
                ds = m * (T[n, ell, m] * np.cos(m * ph) - S[n, ell, m] * np.sin(m * ph))
                pot += phi * y * sc
                dens += rho * y * sc
                gr += dphi * y * sc
                gt += phi / s * dy * sc
                gp += phi / s * y * ds / st
    cp, sp = np.cos(ph), np.sin(ph)
    g = np.stack([st * cp * gr + X * cp * gt - sp * gp,
                  st * sp * gr + X * sp * gt + cp * gp,
                  X * gr - st * gt], axis=1)
    return pot * GM / rs, -g * GM / rs**2, dens * GM / rs**3


def _cloud(rng, n=2000):
    x = rng.normal(size=(n, 3)) * np.array([1.0, 0.7, 0.5]) + np.array([0.2, -0.1, 0.05])
    x[: n // 4] *= 3.0  # an extended tail
    return x, rng.uniform(0.5, 1.5, n)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
