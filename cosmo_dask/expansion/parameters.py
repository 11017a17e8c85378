"""The expansions' parameters, declared once: SCF's and MEX's orders, scale radius,
softening and centres, with their defaults, limits and checks. ``SCF`` and ``MEX`` check
them here, once, when constructed; the graph code and the kernels assume valid values.
``cosmo-dask expand`` takes its choices and defaults from here."""

from __future__ import annotations

import numbers
from typing import Any

from ..core.errors import ParameterError

__all__ = ["METHODS", "NMAX_DEFAULT", "LMAX_DEFAULT", "NMAX_LIMIT", "LMAX_LIMIT",
           "SCALE_RADIUS_DEFAULT", "SOFTENING_DEFAULT", "CENTERS", "CENTER_DEFAULT",
           "PRECISION_DEFAULT", "check_order", "check_center_name"]

#: the expansions of ``cosmo-dask expand --method``
METHODS = ("scf", "mex")
#: SCF's radial and (SCF's and MEX's) angular orders by default
NMAX_DEFAULT = 10
LMAX_DEFAULT = 6
#: the largest orders: they keep SCF's coefficients (2 (nmax+1) (lmax+1)^2 float64, 1.1 MB
#: at nmax=64, lmax=32) and MEX's 2 (lmax+1)^2 cumulative sums per particle bounded
NMAX_LIMIT = 64
LMAX_LIMIT = 32
#: SCF's basis scale radius and MEX's softening length (length units)
SCALE_RADIUS_DEFAULT = 1.0
SOFTENING_DEFAULT = 0.0
#: the centres found from the particles (or a point (x, y, z)): centre of mass, the
#: potential minimum of a low-order SCF fit
CENTERS = ("com", "potential_min")
CENTER_DEFAULT = "com"
#: the working precision by default (``backend.resolve_precision`` checks it)
PRECISION_DEFAULT = "float64"


def check_order(value: Any, name: str, limit: int, what: str, why: str = "") -> int:
    """An integer order in ``[0, limit]``, else a ParameterError ``"<what>: <name> must
    ..."`` (followed by ``why``, the reason for the limit)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParameterError(f"{what}: {name} must be an integer, got {value!r}")
    if not 0 <= int(value) <= limit:
        raise ParameterError(f"{what}: {name} must be between 0 and {limit}, got {value}{why}")
    return int(value)


def check_center_name(center: Any, what: str, point: str) -> Any:
    """A centre given by name must be one of :data:`CENTERS` (a point or a finder passes
    through; its values are checked where it is used), else a ParameterError."""
    if isinstance(center, str) and center not in CENTERS:
        raise ParameterError(f"{what}: center must be {', '.join(map(repr, CENTERS))} or "
                             f"{point}, got {center!r}")
    return center
