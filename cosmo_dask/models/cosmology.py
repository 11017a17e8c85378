"""Background cosmology and linear power spectrum for the Zel'dovich generator.

Flat LambdaCDM (matter + cosmological constant; radiation is neglected):

* ``E(a) = H(a)/H0 = sqrt(Omega_m a^-3 + Omega_L)``, ``H(a) = 100 h E(a)`` km/s/Mpc;
* linear growth factor from the integral solution (Heath 1977)
  ``D(a) ∝ E(a) ∫_0^a da' / (a' E(a'))^3``, normalised to ``D(1) = 1``, and the
  growth rate ``f(a) = dln D / dln a`` from the derivative of that integral;
* the Eisenstein & Hu (1998, ApJ 496, 605; eqs. 26-31) *no-wiggle* transfer
  function and ``P(k) = A k^n_s T(k)^2``, with ``A`` set by the requested
  ``sigma8`` (rms linear overdensity today in top-hat spheres of 8 Mpc/h,
  integrated numerically).

Wavenumbers are in h/Mpc, lengths in Mpc/h and ``P(k)`` in (Mpc/h)^3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np
from scipy import integrate

from ..core.checks import check_finite
from ..core.errors import ParameterError
from ..units.hubble import hubble_e

#: keys of the ``cosmology`` attribute written on snapshots
SNAPSHOT_KEYS = ("Omega_m", "Omega_b", "Omega_L", "h", "sigma8", "n_s")
#: what a theory curve (linear P(k), sigma(M), mass-function fits) needs
THEORY_KEYS = ("Omega_m", "Omega_b", "h", "sigma8", "n_s")
#: tolerance on |Omega_m + Omega_L - 1| (the model is flat)
FLATNESS_TOL = 1e-4


def tophat_window(x: np.ndarray) -> np.ndarray:
    """Fourier transform of a normalised spherical top-hat, ``3 (sin x - x cos x) / x^3``."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    small = x < 0.1  # Taylor series where the closed form loses digits to cancellation
    xs2 = x[small] ** 2
    out[small] = 1.0 - xs2 / 10.0 + xs2**2 / 280.0 - xs2**3 / 15120.0
    xl = x[~small]
    out[~small] = 3.0 * (np.sin(xl) - xl * np.cos(xl)) / xl**3
    return out


@dataclass(frozen=True)
class Cosmology:
    """Flat LambdaCDM parameters (Planck 2018-like defaults).

    Parameters
    ----------
    Omega_m : float
        Total matter density today (CDM + baryons), > 0.
    Omega_b : float
        Baryon density today, 0 <= Omega_b < Omega_m.
    Omega_L : float, optional
        Cosmological-constant density; default ``1 - Omega_m``. Must satisfy
        ``|Omega_m + Omega_L - 1| <= 1e-4`` (flat).
    h : float
        ``H0 / (100 km/s/Mpc)``, > 0.
    sigma8 : float
        Linear rms overdensity today in spheres of 8 Mpc/h, > 0.
    n_s : float
        Primordial spectral index.
    T_cmb : float
        CMB temperature today in K, > 0 (enters the EH98 transfer function).
    """

    Omega_m: float = 0.3111
    Omega_b: float = 0.0490
    Omega_L: float | None = None
    h: float = 0.6766
    sigma8: float = 0.8102
    n_s: float = 0.9665
    T_cmb: float = 2.7255

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "Omega_L" and value is None:
                value = 1.0 - check_finite(self.Omega_m, "cosmology: Omega_m")
            object.__setattr__(self, f.name, check_finite(value, f"cosmology: {f.name}"))
        if self.Omega_m <= 0:
            raise ParameterError(f"cosmology: Omega_m must be > 0, got {self.Omega_m}")
        if not 0 <= self.Omega_b < self.Omega_m:
            raise ParameterError(
                f"cosmology: Omega_b must be in [0, Omega_m) = [0, {self.Omega_m}), "
                f"got {self.Omega_b}"
            )
        if abs(self.Omega_m + self.Omega_L - 1.0) > FLATNESS_TOL:
            raise ParameterError(
                f"cosmology: Omega_L must equal 1 - Omega_m = {1 - self.Omega_m:.6g} "
                f"(flat LambdaCDM, tolerance {FLATNESS_TOL}), got {self.Omega_L}"
            )
        for name in ("h", "sigma8", "T_cmb"):
            if getattr(self, name) <= 0:
                raise ParameterError(f"cosmology: {name} must be > 0, got {getattr(self, name)}")

    # ---------------------------------------------------------------- construction
    @classmethod
    def coerce(cls, cosmology: Cosmology | Mapping[str, Any] | None) -> Cosmology:
        """A Cosmology from None (defaults), a Cosmology or a dict of its fields."""
        if cosmology is None:
            return cls()
        if isinstance(cosmology, Cosmology):
            return cosmology
        if not isinstance(cosmology, Mapping):
            raise ParameterError(
                f"cosmology must be a Cosmology, a dict or None, got {type(cosmology).__name__}"
            )
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(map(str, cosmology)) - set(allowed))
        if unknown:
            raise ParameterError(
                f"cosmology: unknown key(s) {unknown}; valid keys are {allowed}"
            )
        return cls(**dict(cosmology))

    @classmethod
    def for_theory(cls, cosmology: Mapping[str, Any] | None,
                   overrides: Mapping[str, Any] | None = None) -> tuple[Cosmology | None, list]:
        """``(Cosmology, [])`` from a snapshot's ``cosmology`` dict with ``overrides``
        (e.g. the CLI's ``--sigma8``) on top, or ``(None, missing)`` naming the
        parameters a theory curve needs and neither gives (a Gadget header has no
        ``sigma8`` or ``n_s``). ``Omega_L`` may be missing (flat: ``1 - Omega_m``)."""
        merged = {k: v for k, v in dict(cosmology or {}).items() if v is not None}
        merged.update({k: v for k, v in dict(overrides or {}).items() if v is not None})
        missing = [k for k in THEORY_KEYS if k not in merged]
        if missing:
            return None, missing
        return cls.coerce(merged), []

    def as_dict(self) -> dict[str, float]:
        """The six parameters stored on snapshots (``T_cmb`` is left out)."""
        return {k: float(getattr(self, k)) for k in SNAPSHOT_KEYS}

    # ---------------------------------------------------------------- background
    @property
    def Omega_k(self) -> float:  # noqa: N802 (physics symbol)
        """Curvature density ``1 - Omega_m - Omega_L`` (zero within the flatness tolerance)."""
        return 1.0 - self.Omega_m - self.Omega_L

    def E(self, a):  # noqa: N802 (physics symbol)
        """Dimensionless Hubble rate ``H(a)/H0`` (:func:`cosmo_dask.units.hubble.hubble_e`,
        the one expression of it)."""
        return hubble_e(a, self.Omega_m, self.Omega_L)

    def H(self, a):  # noqa: N802 (physics symbol)
        """Hubble rate in km/s/Mpc, ``100 h E(a)``."""
        return 100.0 * self.h * self.E(a)

    def _growth_integral(self, a: float) -> float:
        """``∫_0^a da' / (a' E(a'))^3`` (the integrand vanishes like a'^(3/2) at 0)."""

        def integrand(x):
            # 1/(x E)^3 = x^(3/2) / (Omega_m + Omega_k x + Omega_L x^3)^(3/2)
            return x**1.5 / (self.Omega_m + self.Omega_k * x + self.Omega_L * x**3) ** 1.5

        value, _ = integrate.quad(integrand, 0.0, a, epsabs=0.0, epsrel=1e-12, limit=200)
        return value

    def _growth_unnormalised(self, a: float) -> float:
        return 2.5 * self.Omega_m * float(self.E(a)) * self._growth_integral(a)

    @cached_property
    def _growth_today(self) -> float:
        return self._growth_unnormalised(1.0)

    def growth_factor(self, a):
        """Linear growth factor ``D(a)``, normalised to ``D(1) = 1``."""
        a = np.asarray(a, dtype=np.float64)
        if np.any(a <= 0):
            raise ParameterError("growth_factor: scale factor a must be > 0")
        out = np.vectorize(self._growth_unnormalised, otypes=[np.float64])(a)
        return out / self._growth_today

    def growth_rate(self, a):
        """Linear growth rate ``f(a) = dln D / dln a``.

        From ``D ∝ E I`` with ``I = ∫_0^a da'/(a'E)^3``:
        ``f = dln E/dln a + 1 / (a^2 E^3 I)``.
        """
        a = np.asarray(a, dtype=np.float64)
        if np.any(a <= 0):
            raise ParameterError("growth_rate: scale factor a must be > 0")

        def one(x: float) -> float:
            e = float(self.E(x))
            dlne = -(3.0 * self.Omega_m / x**3 + 2.0 * self.Omega_k / x**2) / (2.0 * e * e)
            return dlne + 1.0 / (x * x * e**3 * self._growth_integral(x))

        return np.vectorize(one, otypes=[np.float64])(a)

    def Omega_m_of_a(self, a):  # noqa: N802 (physics symbol)
        """Matter density parameter at scale factor ``a``, ``Omega_m a^-3 / E(a)^2``."""
        a = np.asarray(a, dtype=np.float64)
        return self.Omega_m / a**3 / self.E(a) ** 2

    def growth_factor_2lpt(self, a):
        """Second-order (2LPT) growth factor ``D2(a) ~= -3/7 D(a)^2 Omega_m(a)^(-1/143)``.

        The fit of Bouchet et al. (1995, A&A 296, 575) to the solution of
        ``D2'' + (2 + dln E/dln a) D2' - 3/2 Omega_m(a) D2 = -3/2 Omega_m(a) D^2``
        (primes: d/dln a) with the growing mode ``D2 = -3/7 D^2`` of matter domination;
        ``D`` is :meth:`growth_factor` (``D(1) = 1``). Negative by convention: the
        second-order displacement is ``D2 psi2`` with ``psi2 = grad phi2``.
        Exact in Einstein-de Sitter; in flat LambdaCDM with Omega_m = 0.25-0.31 it is
        within 2e-4 (relative) of the ODE solution for every a <= 1.
        """
        return -3.0 / 7.0 * self.growth_factor(a) ** 2 * self.Omega_m_of_a(a) ** (-1.0 / 143.0)

    def growth_rate_2lpt(self, a):
        """Second-order growth rate ``f2 = dln D2/dln a ~= 2 Omega_m(a)^(6/11)``
        (Bouchet et al. 1995; exactly 2 in Einstein-de Sitter; in flat LambdaCDM with
        Omega_m = 0.25-0.31 within 0.4 % of the ODE solution for every a <= 1)."""
        return 2.0 * self.Omega_m_of_a(a) ** (6.0 / 11.0)

    # ---------------------------------------------------------------- power spectrum
    def transfer_eh98_nowiggle(self, k):
        """Eisenstein & Hu (1998) no-wiggle transfer function ``T0(k)``; k in h/Mpc."""
        k = np.asarray(k, dtype=np.float64)
        theta = self.T_cmb / 2.7
        om_h2 = self.Omega_m * self.h**2
        ob_h2 = self.Omega_b * self.h**2
        fb = self.Omega_b / self.Omega_m
        # sound horizon fit (eq. 26), in Mpc
        s = 44.5 * np.log(9.83 / om_h2) / np.sqrt(1.0 + 10.0 * ob_h2**0.75)
        alpha = 1.0 - 0.328 * np.log(431.0 * om_h2) * fb + 0.38 * np.log(22.3 * om_h2) * fb**2
        k_mpc = k * self.h  # 1/Mpc
        gamma_eff = self.Omega_m * self.h * (alpha + (1.0 - alpha) / (1.0 + (0.43 * k_mpc * s)**4))
        q = k * theta**2 / gamma_eff
        l0 = np.log(2.0 * np.e + 1.8 * q)
        c0 = 14.2 + 731.0 / (1.0 + 62.5 * q)
        return l0 / (l0 + c0 * q * q)

    def _unnormalised_power(self, k):
        k = np.asarray(k, dtype=np.float64)
        return k**self.n_s * self.transfer_eh98_nowiggle(k) ** 2

    @staticmethod
    def _sigma2_integral(power, radius: float) -> float:
        """``1/(2 pi^2) ∫ k^3 P(k) W(kR)^2 dln k`` on a fine log grid (Simpson)."""
        lnk = np.linspace(np.log(1e-6), np.log(1e3 / radius * 8.0), 20001)
        k = np.exp(lnk)
        integrand = k**3 * power(k) * tophat_window(k * radius) ** 2
        return float(integrate.simpson(integrand, x=lnk)) / (2.0 * np.pi**2)

    @cached_property
    def _amplitude(self) -> float:
        return self.sigma8**2 / self._sigma2_integral(self._unnormalised_power, 8.0)

    def power_spectrum(self, k, a: float = 1.0):
        """Linear matter power spectrum ``P(k, a) = A k^n_s T(k)^2 D(a)^2`` in (Mpc/h)^3.

        ``A`` normalises ``sigma(8 Mpc/h, a=1)`` to ``sigma8``; k in h/Mpc.
        """
        growth = 1.0 if a == 1.0 else float(self.growth_factor(a))
        return self._amplitude * self._unnormalised_power(k) * growth**2

    def sigma(self, radius: float, a: float = 1.0) -> float:
        """Linear rms overdensity in top-hat spheres of ``radius`` Mpc/h."""
        return math.sqrt(self._sigma2_integral(lambda k: self.power_spectrum(k, a), radius))
