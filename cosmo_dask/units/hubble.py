"""The Hubble rate of the background, and the one conversion it gives: a peculiar velocity
to the comoving length it moves a particle along the line of sight in redshift space.

* ``E(a) = H(a)/H0 = sqrt(Omega_m a^-3 + Omega_k a^-2 + Omega_L)`` with
  ``Omega_k = 1 - Omega_m - Omega_L`` (radiation neglected), the one expression of it:
  :meth:`cosmo_dask.models.cosmology.Cosmology.E` calls :func:`hubble_e`;
* ``H(a) = 100 h E(a)`` km/s/Mpc, i.e. ``100 E(a)`` km/s per Mpc/h;
* a snapshot's velocities are peculiar, ``v = a dx/dt`` (physical km/s for the
  generators and the Gadget/SWIFT imports, which multiply Gadget's ``v / sqrt(a)``
  back by ``sqrt(a)``), so the redshift-space position is ``s = x + v_los / (a H(a))``
  in comoving length; :func:`velocity_to_comoving_length` gives ``1 / (a H(a))`` in the
  snapshot's own length and velocity units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.errors import ParameterError

__all__ = ["hubble_e", "velocity_to_comoving_length"]


def hubble_e(a, omega_m: float, omega_l: float | None = None):
    """Dimensionless Hubble rate ``E(a) = H(a)/H0``.

    Parameters
    ----------
    a : float or array_like
        Scale factor(s), > 0.
    omega_m, omega_l : float
        Matter and cosmological-constant densities today; ``omega_l`` None: ``1 - omega_m``
        (flat). The curvature ``1 - omega_m - omega_l`` enters as ``a^-2``.

    Returns
    -------
    numpy.ndarray
        ``E(a)`` (dimensionless), float64, of ``a``'s shape.
    """
    a = np.asarray(a, dtype=np.float64)
    if omega_l is None:
        omega_l = 1.0 - omega_m
    omega_k = 1.0 - omega_m - omega_l
    return np.sqrt(omega_m / a**3 + omega_k / a**2 + omega_l)


def velocity_to_comoving_length(units: Mapping[str, str] | None, scale_factor: float | None,
                                cosmology: Mapping[str, Any] | None, *, what: str) -> float:
    """``1 / (a H(a))``: the comoving length (in ``units["length"]``) per peculiar velocity
    (in ``units["velocity"]``), so that a particle of velocity ``v`` along the line of
    sight appears ``v / (a H(a))`` farther along it in redshift space.

    Parameters
    ----------
    units : mapping
        The snapshot's ``{length, velocity, ...}`` unit strings (:mod:`cosmo_dask.units`),
        physical ones (``"Mpc/h"``, ``"kpc/h"``, ``"Mpc"``; ``"km/s (peculiar)"``).
    scale_factor : float
        The snapshot's scale factor a, > 0.
    cosmology : mapping
        The snapshot's ``cosmology`` attribute: ``Omega_m`` (required), ``Omega_L``
        (default ``1 - Omega_m``), ``h`` (needed only for lengths without ``/h``).
    what : str
        Start of the error messages (the caller's name).

    Returns
    -------
    float
        ``1 / (a H(a))`` in ``units["length"] / units["velocity"]``.

    Raises
    ------
    ParameterError
        Naming what is missing or unusable: no scale factor, no cosmology or no
        ``Omega_m``, no units, label units (``"N-body velocity"``), or an ``h`` needed
        and absent.
    """
    from . import factor, parse

    if scale_factor is None:
        raise ParameterError(f"{what}: the snapshot has no scale_factor; a/H(a) needs it")
    a = float(scale_factor)
    if not (math.isfinite(a) and a > 0):
        raise ParameterError(f"{what}: scale_factor must be > 0, got {scale_factor!r}")
    if not cosmology or cosmology.get("Omega_m") is None:
        raise ParameterError(f"{what}: the snapshot has no cosmology (Omega_m); H(a) needs it")
    omega_m = float(cosmology["Omega_m"])
    omega_l = cosmology.get("Omega_L")
    omega_l = None if omega_l is None else float(omega_l)
    e = float(hubble_e(a, omega_m, omega_l))
    if not (math.isfinite(e) and e > 0):
        raise ParameterError(f"{what}: E(a) = H(a)/H0 is {e} for a = {a} and the snapshot's "
                             f"cosmology {dict(cosmology)}; expected a positive number")
    units = dict(units or {})
    missing = [q for q in ("length", "velocity") if q not in units]
    if missing:
        raise ParameterError(f"{what}: the snapshot states no {' and no '.join(missing)} "
                             "unit; give units={'length': 'Mpc/h', 'velocity': 'km/s', ...}")
    h = cosmology.get("h")
    try:
        labels = [f"{q} {units[q]!r}" for q in ("length", "velocity")
                  if not parse(units[q], q).physical]
        if labels:
            raise ParameterError(f"needs physical length and velocity units, not "
                                 f"{' and '.join(labels)}")
        to_kms = factor(units["velocity"], "km/s", "velocity")
        from_mpc_h = factor("Mpc/h", units["length"], "length",
                            h=None if h is None else float(h))
    except ParameterError as exc:
        raise ParameterError(f"{what}: {exc}") from None
    # v [km/s] / (a 100 E(a) [km/s per Mpc/h]) = comoving Mpc/h
    return to_kms / (a * 100.0 * e) * from_mpc_h
