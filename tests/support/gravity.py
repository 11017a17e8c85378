"""Shared test helpers."""

from __future__ import annotations

import math

import numpy as np
import scipy.special as sp


# --------------------------------------------------------------------------- reference
def spline_KP(r, eps):
    """Gadget-2 cubic spline (support h = 2.8 eps): force factor K and potential factor P."""
    r = np.asarray(r, dtype=np.float64)
    h = 2.8 * eps
    with np.errstate(divide="ignore", invalid="ignore"):
        u = r / h
        k_in = np.where(u < 0.5, 10.666666666667 + u * u * (32.0 * u - 38.4),
                        21.333333333333 - 48.0 * u + 38.4 * u * u - 10.666666666667 * u ** 3
                        - 0.066666666667 / u ** 3) / h ** 3
        p_in = np.where(u < 0.5, 2.8 - u * u * (5.333333333333 + u * u * (6.4 * u - 9.6)),
                        3.2 - 0.066666666667 / u
                        - u * u * (10.666666666667 + u * (-16.0 + u * (9.6 - 2.133333333333 * u)))
                        ) / h
        K = np.where(r >= h, 1.0 / r ** 3, k_in)
        P = np.where(r >= h, 1.0 / r, p_in)
    return K, P


def reference(x, m, *, G=1.0, eps=0.0, kernel="plummer", box=None, rs=None, r_cut=None):
    """float64 NumPy all-pairs acceleration and potential, self pairs excluded."""
    x = np.asarray(x, dtype=np.float64)
    m = np.broadcast_to(np.asarray(m, dtype=np.float64), (x.shape[0],))
    d = x[:, None, :] - x[None, :, :]
    if box is not None:
        d -= box * np.round(d / box)
    r = np.sqrt((d ** 2).sum(-1))
    off = ~np.eye(len(x), dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kernel == "plummer":
            K = (r ** 2 + eps ** 2) ** -1.5
            P = (r ** 2 + eps ** 2) ** -0.5
        else:
            K, P = spline_KP(r, eps) if eps > 0 else (r ** -3.0, 1.0 / r)
        if rs is not None:
            xx = r / (2 * rs)
            K = K * (sp.erfc(xx) + 2 * xx / np.sqrt(np.pi) * np.exp(-xx * xx))
            P = P * sp.erfc(xx)
            off &= r < r_cut
    K = np.where(off, K, 0.0)
    P = np.where(off, P, 0.0)
    acc = -G * np.einsum("ij,ijk->ik", m[None, :] * K, d)
    pot = -G * (m[None, :] * P).sum(1)
    return acc, pot


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim == 2:
        return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    return np.abs(a - b) / np.abs(b)


# ----------------------------------------------------------------------------- reference
def direct_reference(pos, mass, G=1.0, eps=0.0, box=None):  # noqa: N803
    """float64 all-pairs Plummer-softened accelerations and potentials (self excluded)."""
    pos = np.asarray(pos, np.float64)
    mass = np.broadcast_to(np.asarray(mass, np.float64), pos.shape[:1])
    d = pos[:, None, :] - pos[None, :, :]
    if box is not None:
        d -= box * np.round(d / box)
    r2 = (d**2).sum(-1) + eps**2
    np.fill_diagonal(r2, np.inf)
    inv = 1.0 / np.sqrt(r2)
    acc = -G * np.einsum("ij,ijk->ik", mass[None, :] * inv**3, d)
    pot = -G * (mass[None, :] * inv).sum(1)
    return acc, pot


def direct_reference_at(x, m, idx, *, box=None, rs=None, r_cut=None):
    """float64 direct sum (minimum image and truncated kernel when asked) at rows idx."""
    from scipy.special import erfc

    d = x[idx, None, :] - x[None, :, :]
    if box is not None:
        d -= box * np.round(d / box)
    r = np.sqrt((d**2).sum(-1))
    self_pair = r == 0
    r[self_pair] = 1.0
    f = 1.0 / r**3
    p = 1.0 / r
    if rs is not None:
        u = r / (2 * rs)
        f = f * (erfc(u) + 2 * u / np.sqrt(np.pi) * np.exp(-u * u))
        p = p * erfc(u)
        f[r >= r_cut] = 0
        p[r >= r_cut] = 0
    f[self_pair] = 0
    p[self_pair] = 0
    acc = -(m[None, :, None] * d * f[..., None]).sum(1)
    return acc, -(m[None, :] * p).sum(1)


def spline_kp_float64(r, eps):
    """Gadget-2 spline: force factor K (a = -m K r_vec) and potential P (phi = -m P)."""
    h = 2.8 * eps
    k, p = 1.0 / r**3, 1.0 / r
    if eps > 0:
        u = r / h
        a, b = u < 0.5, (u >= 0.5) & (u < 1)
        k = np.where(a, (10.666666666667 + u * u * (32.0 * u - 38.4)) / h**3, k)
        k = np.where(b, (21.333333333333 - 48.0 * u + 38.4 * u * u - 10.666666666667 * u**3
                         - 0.066666666667 / u**3) / h**3, k)
        p = np.where(a, (2.8 - u * u * (5.333333333333 + u * u * (6.4 * u - 9.6))) / h, p)
        p = np.where(b, -(-3.2 + 0.066666666667 / u + u * u * (10.666666666667 + u * (
            -16.0 + u * (9.6 - 2.133333333333 * u)))) / h, p)
    return k, p


def direct_sums_at(pos, mass, idx, *, G=1.0, eps=0.0, kernel="plummer", box=None, rs=None,
            r_cut=None):
    """float64 direct sums on the targets idx (self-pairs excluded)."""
    erfc = np.frompyfunc(math.erfc, 1, 1)

    acc = np.zeros((len(idx), 3))
    pot = np.zeros(len(idx))
    for n_, i in enumerate(idx):
        d = pos[i] - pos
        if box is not None:
            d -= box * np.rint(d / box)
        r2 = (d * d).sum(1)
        keep = np.arange(len(pos)) != i
        if rs is not None:
            keep &= r2 < r_cut**2
        d, r2, m = d[keep], r2[keep], mass[keep]
        r = np.sqrt(r2)
        if kernel == "spline":
            k, p = spline_kp_float64(r, eps)
        else:
            k, p = (r2 + eps**2) ** -1.5, (r2 + eps**2) ** -0.5
        if rs is not None:
            x = r / (2 * rs)
            ec = erfc(x).astype(np.float64)
            k = k * (ec + 2 * x / math.sqrt(math.pi) * np.exp(-x * x))
            p = p * ec
        acc[n_] = -G * ((m * k)[:, None] * d).sum(0)
        pot[n_] = -G * (m * p).sum()
    return acc, pot
