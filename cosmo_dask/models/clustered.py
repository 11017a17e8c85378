"""A strongly clustered periodic box: Plummer halos with a power-law mass spectrum.

Until cosmo_dask evolves its own universes, this is the synthetic stand-in for
an evolved snapshot: most particles sit in dense, well separated Plummer
spheres (so friends-of-friends finds a real halo population, from a few tens
to tens of thousands of members), the rest are spread uniformly. Some halos
straddle the box faces (positions are wrapped periodically).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..core.backend import resolve_precision
from ..core.checks import check_positive, check_positive_int, check_seed
from ..core.errors import ParameterError
from ..store.validation import wrap_into_box
from .blocks import (
    TAGS,
    block_rng,
    generate,
    isotropic_directions,
    uniform_open,
)
from .cosmology import Cosmology
from .isolated import _PLUMMER_ENVELOPE, _plummer_speed_density, _rejection_sample
from .parameters import N_HALOS_DEFAULT, SEED_DEFAULT
from .zeldovich_ics import G_COSMO, RHO_CRIT_1E10, ZELDOVICH_UNITS

#: Plummer profiles are truncated at this many scale radii
_TRUNCATION = 10.0
#: mean density inside one scale radius, in units of the box's mean density
_CORE_OVERDENSITY = 2000.0
#: generation block index of the halo table (never a particle block)
_TABLE_BLOCK = 2**40


def halo_table(n: int, *, n_halos: int, halo_fraction: float, slope: float, min_members: int,
               box_size: float, particle_mass: float, seed: int) -> dict[str, np.ndarray]:
    """Members, centres, scale radii and bulk velocities of every halo (small: n_halos rows).

    Member counts follow ``dN/dn ~ n^slope`` above ``min_members``, rescaled so that
    they add up to ``halo_fraction * n``; halo ``h`` owns the particles
    ``[first[h], first[h+1])``.
    """
    rng = block_rng(seed, _TABLE_BLOCK, TAGS["blobs"])
    u = uniform_open(rng, n_halos)
    g = slope + 1.0  # inverse-CDF draw of a Pareto tail n >= min_members
    weights = min_members * u ** (1.0 / g)
    counts = np.maximum(np.floor(weights / weights.sum() * halo_fraction * n), 2).astype(np.int64)
    excess = int(counts.sum()) - n  # > 0 only for tiny n, where the floor of 2 adds up
    while excess > 0:
        big = int(np.argmax(counts))
        cut = min(excess, int(counts[big]) - 2)
        counts[big] -= cut
        excess -= cut
    counts = np.sort(counts)[::-1]
    first = np.concatenate([[0], np.cumsum(counts)])
    mean_density = n / box_size**3
    # the mass within one scale radius (2^-3/2 of the total) at _CORE_OVERDENSITY x mean
    scale = (counts * 2.0**-1.5 / (4.0 / 3.0 * math.pi * _CORE_OVERDENSITY * mean_density)
             ) ** (1.0 / 3.0)
    return {
        "first": first,
        "centre": rng.uniform(0.0, box_size, size=(n_halos, 3)),
        "scale": scale,
        "mass": counts * particle_mass,
        "bulk": rng.normal(0.0, 300.0, size=(n_halos, 3)),  # km/s
    }


def _blobs_block(rng, first, size, *, table, box_size, G, dtype):  # noqa: N803
    idx = np.arange(first, first + size)
    halo = np.searchsorted(table["first"], idx, side="right") - 1
    inside = halo < len(table["scale"])
    h = halo[inside]
    m = inside.sum()
    a, mass = table["scale"][h], table["mass"][h]
    x_max = _TRUNCATION**3 / (_TRUNCATION**2 + 1.0) ** 1.5  # M(<r_trunc) / M
    x = uniform_open(rng, m) * x_max
    r = a / np.sqrt(x ** (-2.0 / 3.0) - 1.0)
    q = _rejection_sample(rng, _plummer_speed_density, np.full(m, _PLUMMER_ENVELOPE))
    v_esc = np.sqrt(2.0 * G * mass / np.sqrt(r * r + a * a))
    pos = rng.uniform(0.0, box_size, size=(size, 3))  # the uniform background
    vel = np.zeros((size, 3))
    pos[inside] = table["centre"][h] + r[:, None] * isotropic_directions(rng, m)
    vel[inside] = table["bulk"][h] + (q * v_esc)[:, None] * isotropic_directions(rng, m)
    return wrap_into_box(pos, box_size, dtype), vel.astype(dtype)


def halo_blobs(n: int, *, box_size: float, n_halos: int = N_HALOS_DEFAULT,
               halo_fraction: float = 0.7,
               slope: float = -1.9, min_members: int = 30, redshift: float = 0.0,
               cosmology: Cosmology | Mapping[str, Any] | None = None, seed: int = SEED_DEFAULT,
               precision=None, chunks: int | None = None):
    """A periodic box of Plummer halos with a power-law mass spectrum plus a uniform background.

    ``halo_fraction * n`` particles belong to ``n_halos`` Plummer spheres (truncated
    at 10 scale radii) whose member counts follow ``dN/dn ~ n^slope``; each halo's
    scale radius makes its mean density inside one scale radius 2000 times the
    box's mean density, so friends-of-friends with b = 0.2 recovers most halos
    with at least a few tens of members. Velocities: a random bulk velocity per
    halo (300 km/s rms per axis) plus isotropic Plummer equilibrium velocities
    (in ``G = 43.00917``, Mpc/h, km/s, 1e10 Msun/h); background particles are at rest.
    Centres are uniform in the box, so some halos straddle its faces.

    This is a synthetic clustered set for analyses and benchmarks, not a
    cosmological simulation: the halos are not placed on a cosmic web.

    Parameters
    ----------
    n : int
        Number of particles, >= n_halos * 2.
    box_size : float
        Periodic box side in Mpc/h, > 0.
    n_halos : int
        Number of halos, >= 1.
    halo_fraction : float
        Fraction of the particles in halos, in (0, 1].
    slope : float
        Power-law slope of the member-count distribution, < -1.
    min_members : int
        Lower end of the member-count distribution before normalisation.
    redshift : float
        Recorded redshift (the particles do not depend on it).
    cosmology : Cosmology or dict, optional
        Sets ``particle_mass = Omega_m * rho_crit * box^3 / n`` and the stored cosmology.
    seed : int
        Non-negative seed; the realisation does not depend on ``chunks``.
    precision : {"float32", "float64"}, optional
        Dtype of pos/vel (default: dask config ``cosmo_dask.precision``).
    chunks : int, optional
        Particles per dask chunk.

    Returns
    -------
    Snapshot
        ``pos`` in Mpc/h in ``[0, box_size)``, ``vel`` in km/s, ``ids = arange(n)``,
        ``particle_mass`` in 1e10 Msun/h, ``G = 43.00917``.
    """
    from ..store.snapshot import Snapshot

    n = check_positive_int(n, "n")
    box_size = check_positive(box_size, "box_size")
    n_halos = check_positive_int(n_halos, "n_halos")
    min_members = check_positive_int(min_members, "min_members", minimum=2)
    if not 0.0 < float(halo_fraction) <= 1.0:
        raise ParameterError(f"halo_fraction must be in (0, 1], got {halo_fraction!r}")
    if not float(slope) < -1.0:
        raise ParameterError(f"slope must be < -1 (a normalisable power law), got {slope!r}")
    if n < 2 * n_halos:
        raise ParameterError(f"n = {n} particles cannot fill n_halos = {n_halos} halos of >= 2 "
                             "members; lower n_halos or raise n")
    if not (math.isfinite(float(redshift)) and float(redshift) > -1):
        raise ParameterError(f"redshift must be a finite number > -1, got {redshift!r}")
    cosmo = Cosmology.coerce(cosmology)
    seed = check_seed(seed)
    dtype = resolve_precision(precision)
    particle_mass = cosmo.Omega_m * RHO_CRIT_1E10 * box_size**3 / n
    table = halo_table(n, n_halos=n_halos, halo_fraction=float(halo_fraction),
                       slope=float(slope), min_members=min_members, box_size=box_size,
                       particle_mass=particle_mass, seed=seed)
    token = tokenize("blobs", n, box_size, n_halos, halo_fraction, slope, min_members, seed,
                     dtype.name, chunks)
    arrays = generate("blobs", token, _blobs_block, n=n, seed=seed, chunks=chunks,
                      outputs=[("pos", (3,), dtype), ("vel", (3,), dtype)],
                      table=table, box_size=box_size, G=G_COSMO, dtype=dtype)
    ids = da.arange(n, chunks=arrays["pos"].chunks[0], dtype=np.int64)
    return Snapshot.from_arrays(
        arrays["pos"], arrays["vel"], ids, None, box_size=box_size, particle_mass=particle_mass,
        scale_factor=1.0 / (1.0 + float(redshift)), cosmology=cosmo.as_dict(),
        units=dict(ZELDOVICH_UNITS), G=G_COSMO,
    )
