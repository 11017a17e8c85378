"""The power spectrum's parameters, declared once: the Legendre multipoles, the line of
sight and the interlacing default, with their checks. ``power_spectrum`` checks them
here, once, before any graph is built; ``cosmo-dask power`` takes its choices from here.
The mesh parameters (``n_mesh``, ``scheme``, ``box_size``, ``split_every``) are the
mesh path's, :mod:`cosmo_dask.density.parameters`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.checks import LOS_AXES, check_los
from ..core.errors import ParameterError

__all__ = ["POLES", "POLES_DEFAULT", "LOS_AXES", "INTERLACE_DEFAULT", "check_los_poles"]

#: the Legendre multipoles ``power_spectrum`` computes (l > 0 needs a line of sight)
POLES = (0, 2, 4)
#: the multipoles computed by default: the monopole
POLES_DEFAULT = (0,)
#: particles: paint a second mesh shifted by half a cell (``cosmo-dask power
#: --no-interlace`` turns it off)
INTERLACE_DEFAULT = True


def check_los_poles(los: Any, poles: Any) -> tuple[np.ndarray | None, tuple[int, ...]]:
    """(the unit line-of-sight vector or None, the multipoles as a tuple), else a
    ParameterError: ``poles`` distinct values out of :data:`POLES`, ``los`` an axis (0, 1,
    2 or 'x', 'y', 'z') or a non-zero 3-vector (:func:`~cosmo_dask.core.checks.check_los`),
    required for l > 0. :data:`LOS_AXES` is :data:`cosmo_dask.core.checks.LOS_AXES`."""
    poles = tuple(int(p) for p in np.atleast_1d(poles)) if poles is not None else POLES_DEFAULT
    if not poles or any(p not in POLES for p in poles) or len(set(poles)) != len(poles):
        raise ParameterError(f"power_spectrum: poles must be distinct values of "
                             f"{', '.join(map(str, POLES))}, got {poles!r}")
    if los is None:
        if any(p > 0 for p in poles):
            raise ParameterError("power_spectrum: multipoles l > 0 need a line of sight: "
                                 "pass los= (an axis 0/1/2 or 'x'/'y'/'z', or a vector)")
        return None, poles
    return check_los(los, "power_spectrum"), poles
