"""Shared test helpers."""

from __future__ import annotations

import numpy as np


def brute_potentials(pos, mass, starts, eps=0.0, box=None, G=1.0):
    """Plain numpy double sum per segment (minimum image if ``box``), blocked rows."""
    pot = np.zeros(len(pos))
    for s in range(len(starts) - 1):
        a, b = starts[s], starts[s + 1]
        p, m = pos[a:b], mass[a:b]
        for r0 in range(0, b - a, 512):
            d = p[None, :, :] - p[r0:r0 + 512, None, :]
            if box is not None:
                d -= box * np.round(d / box)
            s2 = (d * d).sum(-1) + eps * eps
            with np.errstate(divide="ignore"):
                inv = np.where(s2 > 0, 1.0 / np.sqrt(s2), 0.0)
            rows = np.arange(r0, min(r0 + 512, b - a))
            inv[rows - r0, rows] = 0.0
            pot[a + r0:a + r0 + len(rows)] = -G * (inv * m[None, :]).sum(1)
    return pot


def _iso(rng, n):
    v = rng.normal(size=(n, 3))
    return v / np.linalg.norm(v, axis=1)[:, None]


def plummer(rng, n, a=1.0, rmax=10.0):
    """``n`` positions of a Plummer sphere of scale ``a``, truncated at ``rmax``."""
    u = rng.uniform(0.0, 1.0, 4 * n)
    r = a / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    return r[r < rmax][:n, None] * _iso(rng, n)


def nfw(rng, n, rs=1.0, c=8.0):
    """``n`` positions of an NFW halo of scale radius ``rs`` truncated at ``c rs``."""
    x = np.linspace(0.0, c, 4001)
    mx = np.log1p(x) - x / (1.0 + x)
    r = rs * np.interp(rng.uniform(0.0, mx[-1], n), mx, x)
    return r[:, None] * _iso(rng, n)


def model_halo(rng, kind, n, clump=None):
    """A Plummer or NFW halo, optionally with an offset clump of 5-20 % of the particles."""
    p = plummer(rng, n) if kind == "plummer" else nfw(rng, n)
    if clump or (clump is None and rng.uniform() < 0.6):
        k = int(rng.uniform(0.05, 0.2) * n)
        off = _iso(rng, 1)[0] * rng.uniform(2.0, 5.0)
        sub = plummer(rng, k, a=0.3) if kind == "plummer" else nfw(rng, k, rs=0.3, c=5.0)
        p[:k] = off + sub
    return p[rng.permutation(n)] * rng.uniform(0.5, 2.0)


def mbp_case(rng):
    """Halos above the size where octree bounds prune (Plummer / NFW, clumps, a cored
    Plummer whose centre is flat), small ones, an empty one (segment 5); in a periodic box,
    two of them straddling faces (1 and 3), one spread over the whole box (6, no pruning
    there): ``(box, unwrapped positions, wrapped positions, masses, starts, sizes)``."""
    box = 60.0
    halos = [model_halo(rng, "plummer", 5000, clump=True) + 30.0,
             model_halo(rng, "nfw", 7000, clump=False) + np.array([0.3, 59.8, 30.0]),
             model_halo(rng, "nfw", 3500, clump=True) + 15.0,
             plummer(rng, 9000, a=2.0) + np.array([59.9, 0.1, 59.9]),
             rng.normal(size=(40, 3)) + 45.0,
             np.empty((0, 3)),
             rng.uniform(0.0, box, size=(3200, 3)),
             rng.normal(size=(1, 3)) + 5.0]
    sizes = [len(h) for h in halos]
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    unwrapped = np.concatenate(halos)
    pos = np.mod(unwrapped, box)
    mass = rng.uniform(0.5, 1.5, len(pos))
    return box, unwrapped, pos, mass, starts, sizes


def _gpu_case(rng):
    sizes = [1, 0, 2, 129, 1000, 3, 4000, 128, 257]
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    box = 30.0
    pos = np.concatenate([rng.normal(size=(k, 3)) * 0.7 + rng.uniform(0, box, 3)
                          for k in sizes if k])
    return pos, rng.uniform(0.5, 2.0, starts[-1]), starts, box
