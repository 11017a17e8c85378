"""Isolated equilibrium models: Plummer and Hernquist spheres, Ferrers ellipsoids.

All are centred on the origin, in N-body units (the given ``G``, total ``mass``
and scale length), with equal-mass particles (``particle_mass = mass / n``, no
``mass`` array) and ``ids = arange(n)``. Radii come from the inverse of the
cumulative mass profile; velocities (Plummer, Hernquist) from the isotropic
distribution function by rejection sampling. Generation is lazy and chunk by
chunk (see :mod:`cosmo_dask.models.blocks`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import resolve_precision
from ..core.checks import check_positive, check_positive_int, check_seed
from ..core.errors import ParameterError
from .blocks import (
    generate,
    isotropic_directions,
    uniform_open,
)
from .parameters import (
    FERRERS_AXES_DEFAULT,
    FERRERS_INDEX_DEFAULT,
    MASS_DEFAULT,
    SCALE_DEFAULT,
    SEED_DEFAULT,
)

NBODY_UNITS = {"length": "N-body length", "velocity": "N-body velocity", "mass": "N-body mass"}


def _snapshot(arrays: dict, n: int, mass: float, G: float | None):  # noqa: N803
    from ..store.snapshot import Snapshot

    ids = da.arange(n, chunks=arrays["pos"].chunks[0], dtype=np.int64)
    return Snapshot.from_arrays(
        arrays["pos"], arrays.get("vel"), ids, None, box_size=None, particle_mass=mass / n,
        units=dict(NBODY_UNITS), G=G,
    )


# --------------------------------------------------------------------------- rejection sampling
def _rejection_sample(rng: np.random.Generator, density, envelope: np.ndarray,
                      args: tuple[np.ndarray, ...] = ()) -> np.ndarray:
    """One deviate ``u`` in [0, 1) per particle from a density known up to a factor.

    ``density(u, *args_i)`` is evaluated with per-particle ``args``; ``envelope``
    holds per-particle upper bounds of it. A candidate whose density exceeds its
    envelope is rejected and the envelope raised to 1.5 times that density, so a
    too-small bound cannot bias later draws of that particle. Several candidates
    per particle are drawn once few particles remain.
    """
    n = envelope.shape[0]
    env = envelope.astype(np.float64, copy=True)
    out = np.empty(n, dtype=np.float64)
    pending = np.arange(n)
    while pending.size:
        per = max(1, min(256, 4096 // pending.size))
        idx = np.repeat(pending, per)
        u = rng.random(idx.size)
        y = rng.random(idx.size) * env[idx]
        p = density(u, *(arg[idx] for arg in args))
        over = p > env[idx]
        if over.any():
            np.maximum.at(env, idx[over], 1.5 * p[over])
        over_rows = over.reshape(-1, per).any(axis=1)
        accepted = (y < p).reshape(-1, per)
        # first accepted candidate of each particle (candidates are grouped by particle);
        # a particle with a candidate above its envelope redraws with the raised envelope
        done = accepted.any(axis=1) & ~over_rows
        rows = np.flatnonzero(done)
        out[pending[rows]] = u.reshape(-1, per)[rows, accepted[rows].argmax(axis=1)]
        pending = pending[~done]
    return out


# --------------------------------------------------------------------------- Plummer
#: strict bound of q^2 (1 - q^2)^(7/2) on [0, 1] (maximum 0.0923 at q^2 = 2/9)
_PLUMMER_ENVELOPE = 0.1


def _plummer_speed_density(q: np.ndarray) -> np.ndarray:
    return q * q * (1.0 - q * q) ** 3.5


def _plummer_block(rng, first, size, *, scale, mass, G, dtype):  # noqa: N803
    x = uniform_open(rng, size)
    r = scale / np.sqrt(x ** (-2.0 / 3.0) - 1.0)
    pos = r[:, None] * isotropic_directions(rng, size)
    q = _rejection_sample(rng, _plummer_speed_density, np.full(size, _PLUMMER_ENVELOPE))
    v_esc = np.sqrt(2.0 * G * mass / np.sqrt(r * r + scale * scale))
    vel = (q * v_esc)[:, None] * isotropic_directions(rng, size)
    return pos.astype(dtype), vel.astype(dtype)


def plummer(n: int, *, scale: float = SCALE_DEFAULT, mass: float = MASS_DEFAULT,
            seed: int = SEED_DEFAULT, G: float = 1.0,  # noqa: N803
            precision=None, chunks: int | None = None):
    """Plummer sphere in isotropic equilibrium.

    Density ``rho(r) = 3 M / (4 pi a^3) (1 + r^2/a^2)^(-5/2)``, potential
    ``Phi = -G M / sqrt(r^2 + a^2)``, virial ``W = -3 pi G M^2 / (32 a)``.
    Radii invert the cumulative mass ``M(<r) = M r^3 / (r^2 + a^2)^(3/2)``;
    directions are isotropic. Speeds are ``q v_esc(r)`` with ``v_esc = sqrt(-2 Phi)``
    and ``q`` drawn by rejection sampling from the isotropic distribution
    function, whose speed fraction has density ``q^2 (1 - q^2)^(7/2)`` on [0, 1];
    velocity directions are isotropic. The profile is not truncated: a few
    particles lie far out (r ~ a N^(1/3) for the outermost of N).

    Parameters
    ----------
    n : int
        Number of particles, >= 1.
    scale : float
        Plummer radius ``a`` (N-body length), > 0.
    mass : float
        Total mass ``M`` (N-body mass), > 0; every particle has ``M / n``.
    seed : int
        Non-negative seed; the realisation does not depend on ``chunks``.
    G : float
        Gravitational constant in the N-body units, > 0.
    precision : {"float32", "float64"}, optional
        Dtype of pos/vel (default: dask config ``cosmo_dask.precision``);
        computed in float64 and cast.
    chunks : int, optional
        Particles per dask chunk (default: ``default_chunk_size()``).

    Returns
    -------
    Snapshot
        Isolated (``box_size=None``), ``pos`` and ``vel`` of shape (n, 3),
        ``ids = arange(n)`` (int64), ``particle_mass = mass / n``, ``G``, N-body units.
    """
    n = check_positive_int(n, "n")
    scale = check_positive(scale, "scale")
    mass = check_positive(mass, "mass")
    G = check_positive(G, "G")  # noqa: N806
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    token = tokenize("plummer", n, scale, mass, seed, G, dtype.name, chunks)
    arrays = generate("plummer", token, _plummer_block, n=n, seed=seed, chunks=chunks,
                      outputs=[("pos", (3,), dtype), ("vel", (3,), dtype)],
                      scale=scale, mass=mass, G=G, dtype=dtype)
    return _snapshot(arrays, n, mass, G)


# --------------------------------------------------------------------------- Hernquist
def _series_coefficients(terms: int = 14) -> np.ndarray:
    """Taylor coefficients in s = q^2 of g(q)/q (see :func:`_hernquist_bracket`)."""
    arcsin = [Fraction(math.comb(2 * j, j), 4**j * (2 * j + 1)) for j in range(terms)]
    sqrt1m = []
    for j in range(terms):  # (1 - s)^(1/2) = sum binom(1/2, j) (-s)^j
        c = Fraction(1)
        for i in range(j):
            c *= Fraction(1, 2) - i
        sqrt1m.append(c / math.factorial(j) * (-1) ** j)
    poly = (-3, -2, 24, -16)  # (1 - 2s)(8 s^2 - 8 s - 3)
    coef = [3 * c for c in arcsin]
    for i, p in enumerate(poly):
        for j in range(terms - i):
            coef[j + i] += p * sqrt1m[j]
    return np.array([float(c) for c in coef])


_SERIES = _series_coefficients()
_SERIES_BELOW = 0.02  # use the series for s < this (the closed form cancels to ~1e-16/s^2)


def _hernquist_bracket(s: np.ndarray) -> np.ndarray:
    """``g(q) = 3 asin q + q sqrt(1-q^2) (1-2q^2) (8q^4 - 8q^2 - 3)`` with ``s = q^2``.

    ``g ~ (128/5) q^5`` for small q; the closed form loses all digits there, so a
    Taylor series in s is used below ``_SERIES_BELOW``.
    """
    s = np.clip(s, 0.0, 1.0)
    q = np.sqrt(s)
    poly = (1.0 - 2.0 * s) * (8.0 * s * s - 8.0 * s - 3.0)
    out = 3.0 * np.arcsin(q) + q * np.sqrt(1.0 - s) * poly
    small = s < _SERIES_BELOW
    if small.any():
        ss = s[small]
        out[small] = np.sqrt(ss) * np.polynomial.polynomial.polyval(ss, _SERIES)
    return out


def _hernquist_speed_density(u: np.ndarray, psi: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Density of ``u = v/v_esc`` (up to a factor): ``u^2 f(E)`` at ``-E a/(GM) = psi (1-u^2)``.

    ``psi = a/(r+a)`` is the dimensionless potential and ``eps = 1 - psi = r/(r+a)``
    is passed separately so that ``1 - q^2 = eps + psi u^2`` keeps its digits at
    small radii, where f diverges like ``(1 - q^2)^(-5/2)``.
    """
    u2 = u * u
    s = psi * (1.0 - u2)
    one_minus_s = eps + psi * u2
    return u2 * _hernquist_bracket(s) / one_minus_s**2.5


#: log10(r/a) range of the envelope table; uniform_open() radii stay inside it
_TABLE_LOGR = (-9.0, 17.0)
_TABLE_STEP = 0.02
_ENVELOPE_MARGIN = 1.2


@lru_cache(maxsize=1)
def _hernquist_envelope_table() -> np.ndarray:
    """max_u of the speed density at log10(r/a) nodes (dense log-u grid, computed once)."""
    logr = np.arange(_TABLE_LOGR[0], _TABLE_LOGR[1] + _TABLE_STEP / 2, _TABLE_STEP)
    x = 10.0**logr
    psi, eps = 1.0 / (1.0 + x), x / (1.0 + x)
    u = np.concatenate([np.logspace(-7.0, -0.001, 2500), np.linspace(0.99, 1.0, 50)])
    table = np.empty(logr.size)
    for start in range(0, logr.size, 64):
        sl = slice(start, start + 64)
        dens = _hernquist_speed_density(u[None, :], psi[sl, None], eps[sl, None])
        table[sl] = dens.max(axis=1)
    return table


def _hernquist_envelope(r_over_a: np.ndarray) -> np.ndarray:
    """Upper bound of the speed density at each radius: neighbouring table maxima x margin."""
    table = _hernquist_envelope_table()
    pos = (np.log10(r_over_a) - _TABLE_LOGR[0]) / _TABLE_STEP
    lo = np.clip(np.floor(pos).astype(np.int64), 0, table.size - 1)
    hi = np.clip(lo + 1, 0, table.size - 1)
    env = np.maximum(table[lo], table[hi]) * _ENVELOPE_MARGIN
    # outside the table (not reached by uniform_open radii) fall back to the scaling laws
    below = pos < 0
    env[below] = table[0] * _ENVELOPE_MARGIN * (10.0 ** (pos[below] * _TABLE_STEP)) ** -1.5
    return env


def _hernquist_block(rng, first, size, *, scale, mass, G, dtype):  # noqa: N803
    x = uniform_open(rng, size)
    sx = np.sqrt(x)
    r_over_a = sx / (1.0 - sx)
    pos = (scale * r_over_a)[:, None] * isotropic_directions(rng, size)
    psi = 1.0 / (1.0 + r_over_a)
    eps = r_over_a / (1.0 + r_over_a)
    u = _rejection_sample(rng, _hernquist_speed_density, _hernquist_envelope(r_over_a),
                          (psi, eps))
    v_esc = np.sqrt(2.0 * G * mass / scale * psi)
    vel = (u * v_esc)[:, None] * isotropic_directions(rng, size)
    return pos.astype(dtype), vel.astype(dtype)


def hernquist(n: int, *, scale: float = SCALE_DEFAULT, mass: float = MASS_DEFAULT,
              seed: int = SEED_DEFAULT, G: float = 1.0,  # noqa: N803
              precision=None, chunks: int | None = None):
    """Hernquist (1990) sphere sampled from its isotropic distribution function.

    Density ``rho(r) = M a / (2 pi r (r + a)^3)``, potential ``Phi = -G M / (r + a)``,
    virial ``W = -G M^2 / (6 a)``. Radii invert ``M(<r) = M r^2 / (r + a)^2``;
    directions are isotropic. Velocities are drawn from the exact isotropic
    distribution function f(E) of Hernquist (1990, eq. 17) -- DF sampling, not
    a Gaussian with Jeans-equation moments: the speed fraction ``u = v/v_esc``
    is drawn by rejection sampling from ``u^2 f(Psi (1 - u^2))``, using an
    envelope tabulated once over radius (maximum of the two neighbouring table
    nodes times 1.2, raised automatically if ever exceeded). The divergence of
    f at ``r -> 0`` is handled by evaluating ``1 - q^2`` without cancellation;
    the closed form of f is replaced by its Taylor series at small binding energy.

    The profile is not truncated: ``rho ~ r^-4`` at large r, so the outermost
    of N particles typically lies near ``r ~ 2 a N`` (and can be much farther).

    Parameters
    ----------
    n : int
        Number of particles, >= 1.
    scale : float
        Scale radius ``a`` (N-body length), > 0.
    mass : float
        Total mass ``M`` (N-body mass), > 0; every particle has ``M / n``.
    seed : int
        Non-negative seed; the realisation does not depend on ``chunks``.
    G : float
        Gravitational constant in the N-body units, > 0.
    precision : {"float32", "float64"}, optional
        Dtype of pos/vel (default: dask config ``cosmo_dask.precision``).
    chunks : int, optional
        Particles per dask chunk (default: ``default_chunk_size()``).

    Returns
    -------
    Snapshot
        Isolated, ``pos`` and ``vel`` (n, 3), ``ids = arange(n)``,
        ``particle_mass = mass / n``, ``G``, N-body units.
    """
    n = check_positive_int(n, "n")
    scale = check_positive(scale, "scale")
    mass = check_positive(mass, "mass")
    G = check_positive(G, "G")  # noqa: N806
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    token = tokenize("hernquist", n, scale, mass, seed, G, dtype.name, chunks)
    arrays = generate("hernquist", token, _hernquist_block, n=n, seed=seed, chunks=chunks,
                      outputs=[("pos", (3,), dtype), ("vel", (3,), dtype)],
                      scale=scale, mass=mass, G=G, dtype=dtype)
    return _snapshot(arrays, n, mass, G)


# --------------------------------------------------------------------------- Ferrers
def _ferrers_block(rng, first, size, *, axes, index, dtype):
    m = np.sqrt(rng.beta(1.5, index + 1.0, size))
    pos = (m[:, None] * isotropic_directions(rng, size)) * np.asarray(axes)[None, :]
    return (pos.astype(dtype),)


def ferrers(n: int, *, axes=FERRERS_AXES_DEFAULT, index: int = FERRERS_INDEX_DEFAULT,
            mass: float = MASS_DEFAULT, seed: int = SEED_DEFAULT,
            precision=None, chunks: int | None = None):
    """Ferrers ellipsoid: positions only.

    Density ``rho ∝ (1 - m^2)^index`` for ``m^2 = x^2/a^2 + y^2/b^2 + z^2/c^2 < 1``
    and 0 outside. Sampled exactly: ``m^2 ~ Beta(3/2, index + 1)``, a uniform
    direction on the unit sphere, then each axis scaled by ``(a, b, c)``. Then
    ``<x^2> = a^2 / (2 index + 5)`` (likewise y, z). No velocities are generated
    (``vel`` is None: a Ferrers bar is not a self-consistent isolated equilibrium
    without a DF, which this generator does not provide) and ``G`` is None.

    Parameters
    ----------
    n : int
        Number of particles, >= 1.
    axes : sequence of 3 floats
        Semi-axes ``(a, b, c)`` along x, y, z (N-body length), each > 0.
    index : int
        Ferrers index, a non-negative integer (0: homogeneous ellipsoid).
    mass : float
        Total mass (N-body mass), > 0; every particle has ``mass / n``.
    seed : int
        Non-negative seed; the realisation does not depend on ``chunks``.
    precision : {"float32", "float64"}, optional
        Dtype of pos (default: dask config ``cosmo_dask.precision``).
    chunks : int, optional
        Particles per dask chunk (default: ``default_chunk_size()``).

    Returns
    -------
    Snapshot
        Isolated, ``pos`` (n, 3), no ``vel``, ``ids = arange(n)``,
        ``particle_mass = mass / n``, N-body units.
    """
    n = check_positive_int(n, "n")
    try:
        axes_t = tuple(axes)
    except TypeError:
        axes_t = ()
    if len(axes_t) != 3:
        raise ParameterError(f"axes must be 3 positive numbers (a, b, c), got {axes!r}")
    try:
        axes_t = tuple(check_positive(a, "axes") for a in axes_t)
    except ParameterError:
        raise ParameterError(f"axes must be 3 positive numbers (a, b, c), got {axes!r}") from None
    index = check_positive_int(index, "index", minimum=0)
    mass = check_positive(mass, "mass")
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    token = tokenize("ferrers", n, axes_t, index, mass, seed, dtype.name, chunks)
    arrays = generate("ferrers", token, _ferrers_block, n=n, seed=seed, chunks=chunks,
                      outputs=[("pos", (3,), dtype)], axes=axes_t, index=index, dtype=dtype)
    return _snapshot(arrays, n, mass, None)
