"""Gravity references for the tests: float64 direct sums (one function, every softening,
periodic and truncated case) and the Gadget-2 spline factors."""

from __future__ import annotations

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


def reference(x, m, *, G=1.0, eps=0.0, kernel="plummer", box=None, rs=None, r_cut=None,
              targets=None):
    """float64 NumPy direct sums: the acceleration and potential of every particle (or of
    the rows ``targets``) from all particles, self pairs excluded; Plummer or Gadget-2
    spline softening, the minimum image in a periodic ``box``, the truncated TreePM
    kernel (split ``rs``, cut at ``r_cut``) when ``rs`` is given. Evaluated in blocks of
    targets, so that a block's pair arrays stay near 2^22 pairs."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    m = np.broadcast_to(np.asarray(m, dtype=np.float64), (n,))
    rows = np.arange(n) if targets is None else np.asarray(targets)
    acc = np.empty((rows.size, 3))
    pot = np.empty(rows.size)
    step = max(1, 2**22 // max(n, 1))
    for b in range(0, rows.size, step):
        i = rows[b:b + step]
        d = x[i, None, :] - x[None, :, :]
        if box is not None:
            d -= box * np.round(d / box)
        r = np.sqrt((d ** 2).sum(-1))
        off = i[:, None] != np.arange(n)[None, :]
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
        acc[b:b + step] = -G * np.einsum("ij,ijk->ik", m[None, :] * K, d)
        pot[b:b + step] = -G * (m[None, :] * P).sum(1)
    return acc, pot


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim == 2:
        return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    return np.abs(a - b) / np.abs(b)
