"""Synthetic hosts with embedded satellites for the subhalo finder's tests and benchmark:
Plummer spheres in equilibrium (isotropic velocities from the Plummer distribution
function, Aarseth, Henon & Wielen 1974), G = 1, every particle of mass 1."""

from __future__ import annotations

import numpy as np


def _directions(rng, n):
    v = rng.normal(size=(n, 3))
    return v / np.linalg.norm(v, axis=1)[:, None]


def plummer_sphere(rng, n, a=1.0, *, G=1.0, m=1.0, rmax=10.0):  # noqa: N803
    """``(pos, vel)`` of ``n`` particles of mass ``m`` in a Plummer sphere of scale ``a``
    (total mass ``n m``), radii below ``rmax`` scale radii, isotropic velocities drawn from
    the sphere's distribution function (so it is in equilibrium, virial ratio 1)."""
    r = np.empty(0)
    while r.size < n:
        u = rng.uniform(0.0, 1.0, 2 * n)
        x = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
        r = np.r_[r, x[x < rmax]]
    r = r[:n] * a
    q = np.empty(0)  # v / v_esc, density q^2 (1 - q^2)^3.5 (maximum < 0.1)
    while q.size < n:
        x, y = rng.uniform(0.0, 1.0, 4 * n), rng.uniform(0.0, 0.1, 4 * n)
        q = np.r_[q, x[y < x * x * (1.0 - x * x) ** 3.5]]
    v_esc = np.sqrt(2.0 * G * n * m / np.sqrt(r * r + a * a))
    pos = r[:, None] * _directions(rng, n)
    vel = (q[:n] * v_esc)[:, None] * _directions(rng, n)
    return pos, vel


def host_with_satellites(rng, n_host, sat_sizes, *, a_host=1.0, box=40.0, G=1.0,  # noqa: N803
                         r_range=(0.4, 2.0), host_rmax=5.0):
    """A Plummer host of ``n_host`` particles at the centre of a periodic box with a
    Plummer satellite of each size in ``sat_sizes`` at a random distance in ``r_range``
    host scale radii, with the host's circular velocity there in a random direction as
    its bulk velocity; satellite scale radii ``0.04 a_host (n / 100)^(1/3)`` (equal mean
    density within their scale radius), truncated at 10 of them.

    Returns ``(pos, vel, ids, truth)``: ``truth`` a dict of per-satellite arrays
    ``n``, ``centre`` (box coordinates), ``velocity``, ``a`` (scale radius) and
    ``first`` (its particles are ids ``first .. first + n - 1``); the host's are ids
    ``0 .. n_host - 1``."""
    pos, vel = plummer_sphere(rng, n_host, a_host, G=G, rmax=host_rmax)
    parts_p, parts_v = [pos], [vel]
    truth = {k: [] for k in ("n", "centre", "velocity", "a", "first")}
    first = n_host
    for n in sat_sizes:
        n = int(n)
        a_s = 0.04 * a_host * (n / 100.0) ** (1.0 / 3.0)
        d = rng.uniform(*r_range) * a_host
        c = d * _directions(rng, 1)[0]
        m_in = n_host * d**3 / (d * d + a_host**2) ** 1.5
        v_bulk = np.sqrt(G * m_in / d) * _directions(rng, 1)[0]
        p, v = plummer_sphere(rng, n, a_s, G=G)
        parts_p.append(p + c)
        parts_v.append(v + v_bulk)
        for k, x in zip(truth, (n, c + 0.5 * box, v_bulk, a_s, first), strict=True):
            truth[k].append(x)
        first += n
    pos = np.concatenate(parts_p) + 0.5 * box
    vel = np.concatenate(parts_v)
    ids = np.arange(len(pos), dtype=np.int64)
    return pos, vel, ids, {k: np.asarray(v) for k, v in truth.items()}


def power_law_sizes(rng, n_sats, n_min, n_max, slope=-1.9):
    """``n_sats`` satellite sizes (particles) drawn from ``dN/dn ~ n^slope`` in
    ``[n_min, n_max]`` (cumulative slope ``slope + 1``)."""
    k = slope + 1.0
    u = rng.uniform(0.0, 1.0, n_sats)
    return np.floor((n_min**k + u * (n_max**k - n_min**k)) ** (1.0 / k)).astype(int)


def match_satellites(catalog, labels, ids, truth):
    """For each true satellite, the catalog row (not central) holding most of its
    particles among its bound members (-1: none holds half of them), and that row's
    bound count from the satellite."""
    lab = np.asarray(labels)
    central = np.asarray(catalog["is_central"].values, bool)
    rows, got = [], []
    for n, first in zip(truth["n"], truth["first"], strict=True):
        sel = (ids >= first) & (ids < first + n)
        sub = lab[sel]
        sub = sub[sub >= 0]
        sub = sub[~central[sub]] if sub.size else sub
        if sub.size == 0:
            rows.append(-1)
            got.append(0)
            continue
        best = np.bincount(sub).argmax()
        k = int((sub == best).sum())
        rows.append(int(best) if k >= 0.5 * n else -1)
        got.append(k)
    return np.asarray(rows), np.asarray(got)
