"""Ewald-summed periodic gravity: the float64 NumPy reference of the PM and TreePM tests.

Periodic cube of side ``L`` (volume ``V = L^3``) with a uniform neutralising
background (the mean density is subtracted, as a periodic FFT solver does by
zeroing the ``k = 0`` mode). With the Ewald splitting parameter ``alpha`` the
pair kernel is

``psi(r) = sum_n erfc(alpha |r + n L|) / |r + n L|
         + (4 pi / V) sum_{k != 0} exp(-k^2 / (4 alpha^2)) cos(k . r) / k^2
         - pi / (alpha^2 V)``

(``k = 2 pi m / L``, ``m`` integer vectors), whose cell average is zero, and the
acceleration and specific potential of target ``i`` are

``a_i = G sum_j m_j grad psi(x_i - x_j)``,  ``phi_i = -G sum_j m_j psi(x_i - x_j)``.

The ``j = i`` term is the particle's interaction with its own periodic images
and the background: its real-space ``n = 0`` term is dropped and replaced by
``-2 alpha / sqrt(pi)`` (the regular limit of ``psi(r) - 1/r``), so for one
particle alone ``phi = 2.8372974794806 G m / L`` (the simple-cubic Madelung
constant) and ``a = 0``. ``psi`` does not depend on ``alpha``; the truncation of
both sums is chosen from ``tol`` (absolute, in units of the terms' scales).

Cost: real space O(M N n_images) erfc evaluations (M targets, N sources);
reciprocal space ``O(N K^3 / 2)`` complex multiply-adds as one matrix product
per source chunk (``K = 2 n_k + 1`` wave numbers per axis), then O(M K^3).
N = 2^21 sources and 300 targets take about a minute on 2 cores at ``tol=1e-10``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erfc

#: lim_{r->0} (psi(r) - 1/r) = -MADELUNG_SC / L for the unit simple cubic lattice
MADELUNG_SC = 2.8372974794806


def _solve_tail(tol: float, f) -> float:
    """Smallest x > 0 (bisection) with ``f(x) <= tol`` for a decreasing ``f``."""
    lo, hi = 0.0, 1.0
    while f(hi) > tol:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if f(mid) <= tol else (mid, hi)
    return hi


def ewald_parameters(box_size: float, *, tol: float = 1e-12, real_cut: float | None = None):
    """``(alpha, real_cut, n_k)``: splitting parameter, real-space radius, max |m| per axis.

    ``real_cut`` defaults to ``L / 2`` (minimum image only); ``alpha`` makes
    ``erfc(alpha real_cut) = tol`` and ``n_k`` makes ``exp(-(pi n_k / (alpha L))^2) <= tol``.
    """
    L = float(box_size)
    real_cut = 0.5 * L if real_cut is None else float(real_cut)
    alpha = _solve_tail(tol, lambda x: math.erfc(x)) / real_cut
    n_k = int(math.ceil(alpha * L / math.pi * math.sqrt(math.log(1.0 / tol))))
    return alpha, real_cut, n_k


def _real_space(x_t, idx_t, pos, mass, L, alpha, real_cut, block=1 << 21):
    """Real-space sums for targets ``x_t`` (indices ``idx_t`` in ``pos``, -1: not a source)."""
    m_t = x_t.shape[0]
    n = pos.shape[0]
    acc = np.zeros((m_t, 3))
    pot = np.zeros(m_t)
    n_img = max(0, int(math.ceil(real_cut / L + 0.5)) - 1)
    shifts = np.array([(a, b, c) for a in range(-n_img, n_img + 1)
                       for b in range(-n_img, n_img + 1)
                       for c in range(-n_img, n_img + 1)], dtype=np.float64) * L
    two_a_sqpi = 2.0 * alpha / math.sqrt(math.pi)
    tb = max(1, min(m_t, block // max(1, n)))
    cs = max(1, min(n, block // tb))
    for t0 in range(0, m_t, tb):
        xt = x_t[t0:t0 + tb]
        it = idx_t[t0:t0 + tb]
        for s0 in range(0, n, cs):
            xs = pos[s0:s0 + cs]
            ms = mass[s0:s0 + cs]
            d0 = xt[:, None, :] - xs[None, :, :]
            d0 -= L * np.rint(d0 / L)
            self_pair = it[:, None] == np.arange(s0, s0 + xs.shape[0])[None, :]
            for s in shifts:
                d = d0 + s
                r2 = np.einsum("ijk,ijk->ij", d, d)
                use = r2 < real_cut * real_cut
                if not s.any():
                    use &= ~self_pair
                if not use.any():
                    continue
                r = np.sqrt(np.where(use, r2, 1.0))
                ar = alpha * r
                ec = erfc(ar)
                w = np.where(use, ms[None, :], 0.0)
                fac = w * (ec + two_a_sqpi * r * np.exp(-ar * ar)) / (r * r * r)
                acc[t0:t0 + tb] -= np.einsum("ij,ijk->ik", fac, d)
                pot[t0:t0 + tb] -= (w * ec / r).sum(axis=1)
    return acc, pot


def _structure_factor(pos, mass, L, n_k, chunk=4096):
    """``S(m) = sum_j m_j exp(-i k_m . x_j)`` for ``m`` in ``[-n_k, n_k]^2 x [0, n_k]``."""
    big_k = 2 * n_k + 1
    full = np.arange(-n_k, n_k + 1)
    half = np.arange(0, n_k + 1)
    s = np.zeros((big_k, big_k * (n_k + 1)), dtype=np.complex128)
    two_pi_l = 2.0 * math.pi / L
    for c0 in range(0, pos.shape[0], chunk):
        x = pos[c0:c0 + chunk]
        ex = np.exp(-1j * two_pi_l * np.outer(x[:, 0], full))
        ey = np.exp(-1j * two_pi_l * np.outer(x[:, 1], full))
        ez = np.exp(-1j * two_pi_l * np.outer(x[:, 2], half))
        b = (mass[c0:c0 + chunk, None, None] * ey[:, :, None] * ez[:, None, :])
        s += ex.T @ b.reshape(x.shape[0], -1)
    return s.reshape(big_k, big_k, n_k + 1)


def _reciprocal(x_t, pos, mass, L, alpha, n_k):
    s = _structure_factor(pos, mass, L, n_k)
    full = np.arange(-n_k, n_k + 1)
    half = np.arange(0, n_k + 1)
    mx, my, mz = np.meshgrid(full, full, half, indexing="ij")
    m2 = mx * mx + my * my + mz * mz
    keep = (m2 > 0) & (m2 <= n_k * n_k)
    # the half space mz >= 0 stands for the whole: mz > 0 counts twice, the mz = 0 plane once
    weight = np.where(mz > 0, 2.0, 1.0)[keep]
    kvec = (2.0 * math.pi / L) * np.stack([mx[keep], my[keep], mz[keep]], axis=1)
    k2 = (kvec * kvec).sum(axis=1)
    coef = weight * np.exp(-k2 / (4.0 * alpha * alpha)) / k2 * (4.0 * math.pi / L**3)
    sk = s[keep]
    acc = np.zeros((x_t.shape[0], 3))
    pot = np.zeros(x_t.shape[0])
    for t0 in range(0, x_t.shape[0], 256):
        e = np.exp(1j * (x_t[t0:t0 + 256] @ kvec.T)) * sk[None, :]
        acc[t0:t0 + 256] = -(e.imag * coef[None, :]) @ kvec
        pot[t0:t0 + 256] = (e.real * coef[None, :]).sum(axis=1)
    return acc, pot


def ewald(pos, mass, box_size, *, G=1.0, targets=None, tol=1e-12, real_cut=None, alpha=None,
          n_k=None):
    """Periodic accelerations and potentials by Ewald summation (float64).

    Parameters
    ----------
    pos : (N, 3) array
        Source positions (any real values; they are used modulo ``box_size``).
    mass : (N,) array or float
    box_size : float
    G : float
    targets : int array, optional
        Indices into ``pos`` of the particles to evaluate (default: all). Every
        source acts on every target; the self pair is the own-image term.
    tol : float
        Truncation tolerance of both sums (see :func:`ewald_parameters`).
    real_cut, alpha, n_k : optional
        Override the real-space radius, the splitting parameter and the largest
        integer wave vector component (defaults from ``tol``).

    Returns
    -------
    acc : (M, 3) float64
    pot : (M,) float64
    """
    pos = np.asarray(pos, dtype=np.float64)
    n = pos.shape[0]
    mass = np.broadcast_to(np.asarray(mass, dtype=np.float64), (n,)).copy()
    L = float(box_size)
    a0, rc, nk0 = ewald_parameters(L, tol=tol, real_cut=real_cut)
    alpha = a0 if alpha is None else float(alpha)
    n_k = nk0 if n_k is None else int(n_k)
    idx = np.arange(n) if targets is None else np.asarray(targets, dtype=np.int64)
    x_t = pos[idx]
    acc_r, pot_r = _real_space(x_t, idx, pos, mass, L, alpha, rc)
    acc_k, pot_k = _reciprocal(x_t, pos, mass, L, alpha, n_k)
    acc = G * (acc_r + acc_k)
    pot = G * (pot_r - pot_k + mass.sum() * math.pi / (alpha * alpha * L**3)
               + mass[idx] * 2.0 * alpha / math.sqrt(math.pi))
    return acc, pot


def ewald_long_range(pos, mass, box_size, *, rs, G=1.0, targets=None, tol=1e-12):
    """The long-range (reciprocal) part of the Gaussian split with scale ``rs``.

    ``a_i = -G (4 pi / V) sum_j m_j sum_{k != 0} exp(-k^2 rs^2) k sin(k . r_ij) / k^2``
    and ``phi_i = -G (4 pi / V) sum_j m_j sum_{k != 0} exp(-k^2 rs^2) cos(k . r_ij) / k^2``
    (``alpha = 1 / (2 rs)``): what a perfect PM solver with the split
    ``exp(-k^2 rs^2)`` and a zeroed ``k = 0`` mode gives, self pair included.
    """
    pos = np.asarray(pos, dtype=np.float64)
    n = pos.shape[0]
    mass = np.broadcast_to(np.asarray(mass, dtype=np.float64), (n,)).copy()
    L = float(box_size)
    alpha = 0.5 / rs
    n_k = int(math.ceil(alpha * L / math.pi * math.sqrt(math.log(1.0 / tol))))
    idx = np.arange(n) if targets is None else np.asarray(targets, dtype=np.int64)
    acc_k, pot_k = _reciprocal(pos[idx], pos, mass, L, alpha, n_k)
    return G * acc_k, -G * pot_k
