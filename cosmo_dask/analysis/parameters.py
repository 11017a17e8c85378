"""The power spectrum's parameters, declared once: the Legendre multipoles, the line of
sight and the interlacing default, with their checks. ``power_spectrum`` checks them
here, once, before any graph is built; ``cosmo-dask power`` takes its choices from here.
The mesh parameters (``n_mesh``, ``scheme``, ``box_size``, ``split_every``) are the
mesh path's, :mod:`cosmo_dask.density.parameters`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ParameterError

__all__ = ["POLES", "POLES_DEFAULT", "LOS_AXES", "INTERLACE_DEFAULT", "check_los_poles"]

#: the Legendre multipoles ``power_spectrum`` computes (l > 0 needs a line of sight)
POLES = (0, 2, 4)
#: the multipoles computed by default: the monopole
POLES_DEFAULT = (0,)
#: line-of-sight axes by name (or index 0, 1, 2)
LOS_AXES = {"x": 0, "y": 1, "z": 2}
#: particles: paint a second mesh shifted by half a cell (``cosmo-dask power
#: --no-interlace`` turns it off)
INTERLACE_DEFAULT = True


def check_los_poles(los: Any, poles: Any) -> tuple[np.ndarray | None, tuple[int, ...]]:
    """(the unit line-of-sight vector or None, the multipoles as a tuple), else a
    ParameterError: ``poles`` distinct values out of :data:`POLES`, ``los`` an axis (0, 1,
    2 or 'x', 'y', 'z') or a non-zero 3-vector, required for l > 0."""
    poles = tuple(int(p) for p in np.atleast_1d(poles)) if poles is not None else POLES_DEFAULT
    if not poles or any(p not in POLES for p in poles) or len(set(poles)) != len(poles):
        raise ParameterError(f"power_spectrum: poles must be distinct values of "
                             f"{', '.join(map(str, POLES))}, got {poles!r}")
    if los is None:
        if any(p > 0 for p in poles):
            raise ParameterError("power_spectrum: multipoles l > 0 need a line of sight: "
                                 "pass los= (an axis 0/1/2 or 'x'/'y'/'z', or a vector)")
        return None, poles
    if isinstance(los, str):
        if los.lower() not in LOS_AXES:
            raise ParameterError(f"power_spectrum: los must be 'x', 'y', 'z', an axis "
                                 f"index or a 3-vector, got {los!r}")
        los = LOS_AXES[los.lower()]
    if isinstance(los, (int, np.integer)) and not isinstance(los, bool):
        if not 0 <= los <= 2:
            raise ParameterError(f"power_spectrum: los axis must be 0, 1 or 2, got {los}")
        v = np.zeros(3)
        v[int(los)] = 1.0
        return v, poles
    v = np.asarray(los, dtype=np.float64)
    norm = float(np.linalg.norm(v)) if v.shape == (3,) else 0.0
    if v.shape != (3,) or not np.all(np.isfinite(v)) or norm == 0:
        raise ParameterError(f"power_spectrum: los must be an axis or a non-zero 3-vector, "
                             f"got {los!r}")
    return v / norm, poles
