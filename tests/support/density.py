"""Shared test helpers."""

from __future__ import annotations

import numpy as np


def kernel_1d(scheme, s):
    """The assignment kernels written from their textbook piecewise definitions."""
    a = np.abs(s)
    if scheme == "ngp":
        return ((s >= -0.5) & (s < 0.5)).astype(float)
    if scheme == "cic":
        return np.where(a < 1, 1 - a, 0.0)
    if scheme == "tsc":
        return np.where(a < 0.5, 0.75 - a**2, np.where(a < 1.5, 0.5 * (1.5 - a) ** 2, 0.0))
    return np.where(a < 1, (4 - 6 * a**2 + 3 * a**3) / 6,
                    np.where(a < 2, (2 - a) ** 3 / 6, 0.0))


def reference_paint(pos, mass, n, box, scheme, shift=0.0):
    """Direct NumPy reference: every particle against the 5^3 nodes around it, np.add.at."""
    mesh = np.zeros((n, n, n))
    u = pos / (box / n) - 0.5 + shift  # node j sits at (j + 1/2) H
    base = np.floor(u).astype(np.int64)
    offsets = np.arange(-2, 3)
    for ox in offsets:
        for oy in offsets:
            for oz in offsets:
                j = base + np.array([ox, oy, oz])
                w = np.prod([kernel_1d(scheme, u[:, a] - j[:, a]) for a in range(3)], axis=0)
                np.add.at(mesh, (j[:, 0] % n, j[:, 1] % n, j[:, 2] % n), mass * w)
    return mesh


def tet_volume(t):
    t = np.asarray(t, dtype=np.float64)
    return np.abs(np.linalg.det(t[..., 1:, :] - t[..., :1, :])) / 6.0


def corner_simplex_in_unit_cube(a):
    """Volume of {x, y, z >= 0, x + y + z <= a} inside [0, 1]^3 (Irwin-Hall CDF)."""
    from math import comb

    return sum((-1) ** k * comb(3, k) * max(a - k, 0.0) ** 3 for k in range(4)) / 6.0


def random_tets(rng, n, scale=1.0):
    return rng.normal(size=(n, 4, 3)) * scale


def tiled_tets(seed):
    """``(tets, cubes, h)``: random tetrahedra and cubes of side ``h`` tiling space
    around them (at a random offset)."""
    rng = np.random.default_rng(seed)
    tets = random_tets(rng, 25, scale=rng.uniform(0.3, 3.0))
    h = rng.uniform(0.05, 0.8)
    off = rng.uniform(0, h, 3)
    lo = np.floor((tets.min(axis=(0, 1)) - off) / h) * h + off - h
    hi = tets.max(axis=(0, 1)) + h
    axes = [np.arange(lo[d], hi[d], h) for d in range(3)]
    cubes = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    return tets, cubes, h
