"""Equations of motion, kick/drift factors and the kick-drift-kick step.

Comoving coordinates ``x`` (the snapshot's length unit, Mpc/h), cosmic time
``t`` in units of length / velocity ((Mpc/h) / (km/s)), so that
``H0 = 100 (km/s) / (Mpc/h)`` (converted to the snapshot's units). The
internal momentum per unit mass is ``p = a^2 dx/dt``; the snapshot's
velocities are peculiar velocities ``v = a dx/dt`` (km/s), so ``p = a v``
(:func:`to_momentum`, :func:`to_velocity`). The equations of motion are::

    dx/dt = p / a^2
    dp/dt = g / a,     g = -grad_x phi_N,   lap_x phi_N = 4 pi G (rho_c(x) - mean rho_c)

with ``rho_c`` the comoving mass density (mass per comoving volume: the
particles' masses in the box) and ``g`` exactly what the periodic PM/TreePM
code returns for the comoving positions and masses (the mean density is
removed by the periodic solver). This is ``x'' + 2 H x' = g / a^3``, whose
divergence gives the linear growth equation
``delta'' + 2 H delta' = 4 pi G rho_phys delta``
(``rho_phys = rho_c / a^3``).

KDK step from ``a_0`` to ``a_1`` with midpoint ``a_h``::

    p(a_h) = p(a_0) + K(a_0 -> a_h; a_0) g(x(a_0))
    x(a_1) = x(a_0) + Dr(a_0 -> a_1; a_h) p(a_h)          (wrapped into the box)
    p(a_1) = p(a_h) + K(a_h -> a_1; a_1) g(x(a_1))

Factors (``E = H / H0``, ``D`` the linear growth factor, ``D(1) = 1``):

* ``"fastpm"`` (Feng et al. 2016, FastPM; default for PM): with
  ``g_p(a) = a^3 H D'(a) = a^2 H f D`` (the momentum of a particle moving on
  the linear solution, per unit displacement ``psi`` at ``D = 1``) and
  ``dg_p/dt = (3/2) Omega_m H0^2 D / a`` (the growth equation),
  ``Dr(a_0 -> a_1; a_r) = (D(a_1) - D(a_0)) / g_p(a_r)`` and
  ``K(a_0 -> a_1; a_r) = (g_p(a_1) - g_p(a_0)) / ((3/2) Omega_m H0^2 D(a_r))``
  (the ``1/a`` of ``dp/dt = g / a`` cancels). In linear theory
  ``g = (3/2) Omega_m H0^2 D psi`` and ``p = g_p psi`` hold at every ``a``, so
  each kick and drift is exact: the Zel'dovich growth is reproduced for any
  number of steps.
* ``"standard"`` (default for TreePM): the exact integrals of the equations of
  motion over the step with ``g`` and ``p`` held fixed,
  ``Dr = int_{a_0}^{a_1} da / (a^3 H)``, ``K = int_{a_0}^{a_1} da / (a^2 H)``
  (numerical quadrature), the usual cosmological leapfrog (Quinn et al. 1997).

Both are second order in the step and time-symmetric.
"""

from __future__ import annotations

from dataclasses import dataclass

import dask.array as da
from dask.base import tokenize
from scipy import integrate

from ..models.cosmology import Cosmology
from .dispatch import drift_block, kick_block
from .parameters import FACTORS_DEFAULT, check_factors


def to_momentum(vel, a: float):
    """Internal momentum ``p = a^2 dx/dt = a v`` from peculiar velocities ``v = a dx/dt``."""
    return vel * a


def to_velocity(mom, a: float):
    """Peculiar velocity ``v = a dx/dt = p / a`` from the internal momentum."""
    return mom * (1.0 / a)


@dataclass(frozen=True)
class Factors:
    """Kick and drift factors of one cosmology in the snapshot's units.

    ``h0`` is ``H0`` in velocity / length units of the snapshot (100 for
    km/s and Mpc/h); ``kind`` is ``"fastpm"`` or ``"standard"``.
    """

    cosmology: Cosmology
    h0: float
    kind: str = FACTORS_DEFAULT

    def __post_init__(self):
        check_factors(self.kind)

    def hubble(self, a: float) -> float:
        return self.h0 * float(self.cosmology.E(a))

    def growth(self, a: float) -> float:
        return float(self.cosmology.growth_factor(a))

    def g_p(self, a: float) -> float:
        """``a^3 H dD/da = a^2 H f D``: momentum per unit linear displacement."""
        return a * a * self.hubble(a) * float(self.cosmology.growth_rate(a)) * self.growth(a)

    def g_f(self, a: float) -> float:
        """``(3/2) Omega_m H0^2 D``: linear ``g`` per unit displacement (``a dg_p/dt``)."""
        return 1.5 * self.cosmology.Omega_m * self.h0 * self.h0 * self.growth(a)

    def drift(self, a0: float, a1: float, a_r: float) -> float:
        """Factor of ``p(a_r)`` in ``x(a_1) - x(a_0)``."""
        if self.kind == "fastpm":
            return (self.growth(a1) - self.growth(a0)) / self.g_p(a_r)
        return _integral(lambda a: 1.0 / (a**3 * self.hubble(a)), a0, a1)

    def kick(self, a0: float, a1: float, a_r: float) -> float:
        """Factor of ``g(x(a_r))`` in ``p(a_1) - p(a_0)``."""
        if self.kind == "fastpm":
            return (self.g_p(a1) - self.g_p(a0)) / self.g_f(a_r)
        return _integral(lambda a: 1.0 / (a**2 * self.hubble(a)), a0, a1)


def _integral(fn, a0: float, a1: float) -> float:
    if a0 == a1:
        return 0.0
    value, _ = integrate.quad(fn, a0, a1, epsabs=0.0, epsrel=1e-12, limit=200)
    return float(value)


# ----------------------------------------------------------------------------- array updates
def _kick(mom, acc, factor):
    return kick_block(mom, acc, factor)


def _drift(pos, mom, factor, box, dtype):
    return drift_block(pos, mom, factor, box, dtype)


def kick(mom: da.Array, acc: da.Array, factor: float) -> da.Array:
    """``p + factor g`` (elementwise, chunked like ``p``; tasks ``sim-kick-<token>``)."""
    return da.map_blocks(_kick, mom, acc, float(factor), dtype=mom.dtype,
                         meta=mom._meta, name=f"sim-kick-{tokenize(mom, acc, factor)}")


def drift(pos: da.Array, mom: da.Array, factor: float, box_size: float) -> da.Array:
    """``x + factor p`` wrapped into ``[0, box_size)`` (computed in float64, cast back)."""
    return da.map_blocks(_drift, pos, mom, float(factor), float(box_size), pos.dtype,
                         dtype=pos.dtype, meta=pos._meta,
                         name=f"sim-drift-{tokenize(pos, mom, factor, box_size)}")

