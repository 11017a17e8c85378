"""The analyses' parameters, declared once: the Legendre multipoles, the line of sight
and the interlacing default of the power spectrum, the separation and ``mu`` bins of the
correlation function, with their checks. ``power_spectrum`` and
``correlation_function`` check them here, once, before any graph is built;
``cosmo-dask power`` and ``cosmo-dask xi`` take their choices from here. The mesh
parameters (``n_mesh``, ``scheme``, ``box_size``, ``split_every``) are the mesh path's,
:mod:`cosmo_dask.density.parameters`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ParameterError

__all__ = ["POLES", "POLES_DEFAULT", "LOS_AXES", "INTERLACE_DEFAULT", "check_los_poles",
           "check_r_bins", "check_mu_bins", "XI_BINS_DEFAULT", "XI_LOS_DEFAULT"]

#: the Legendre multipoles ``power_spectrum`` computes (l > 0 needs a line of sight)
POLES = (0, 2, 4)
#: the multipoles computed by default: the monopole
POLES_DEFAULT = (0,)
#: line-of-sight axes by name (or index 0, 1, 2)
LOS_AXES = {"x": 0, "y": 1, "z": 2}
#: particles: paint a second mesh shifted by half a cell (``cosmo-dask power
#: --no-interlace`` turns it off)
INTERLACE_DEFAULT = True
#: ``cosmo-dask xi``: equal separation bins from ``--r-min`` to ``--r-max``
XI_BINS_DEFAULT = 20
#: ``cosmo-dask xi --mu-bins``: the line of sight when ``--los`` is not given (the
#: multipoles default to all of :data:`POLES`)
XI_LOS_DEFAULT = "z"


def check_los_poles(los: Any, poles: Any, what: str = "power_spectrum"
                    ) -> tuple[np.ndarray | None, tuple[int, ...]]:
    """(the unit line-of-sight vector or None, the multipoles as a tuple), else a
    ParameterError naming ``what``: ``poles`` distinct values out of :data:`POLES`,
    ``los`` an axis (0, 1, 2 or 'x', 'y', 'z') or a non-zero 3-vector, required for
    l > 0."""
    poles = tuple(int(p) for p in np.atleast_1d(poles)) if poles is not None else POLES_DEFAULT
    if not poles or any(p not in POLES for p in poles) or len(set(poles)) != len(poles):
        raise ParameterError(f"{what}: poles must be distinct values of "
                             f"{', '.join(map(str, POLES))}, got {poles!r}")
    if los is None:
        if any(p > 0 for p in poles):
            raise ParameterError(f"{what}: multipoles l > 0 need a line of sight: "
                                 "pass los= (an axis 0/1/2 or 'x'/'y'/'z', or a vector)")
        return None, poles
    if isinstance(los, str):
        if los.lower() not in LOS_AXES:
            raise ParameterError(f"{what}: los must be 'x', 'y', 'z', an axis "
                                 f"index or a 3-vector, got {los!r}")
        los = LOS_AXES[los.lower()]
    if isinstance(los, (int, np.integer)) and not isinstance(los, bool):
        if not 0 <= los <= 2:
            raise ParameterError(f"{what}: los axis must be 0, 1 or 2, got {los}")
        v = np.zeros(3)
        v[int(los)] = 1.0
        return v, poles
    v = np.asarray(los, dtype=np.float64)
    norm = float(np.linalg.norm(v)) if v.shape == (3,) else 0.0
    if v.shape != (3,) or not np.all(np.isfinite(v)) or norm == 0:
        raise ParameterError(f"{what}: los must be an axis or a non-zero 3-vector, "
                             f"got {los!r}")
    return v / norm, poles


def check_r_bins(r_bins: Any, box_size: float, what: str = "correlation_function"
                 ) -> np.ndarray:
    """The separation bin edges (float64, length units), else a ParameterError naming
    ``what``: at least two finite increasing edges, the first ``>= 0``, the last
    (``r_max``) at most half the periodic box (so that the nearest image is the only one
    within ``r_max``)."""
    try:
        edges = np.asarray(r_bins, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError(f"{what}: r_bins must be increasing separation edges, got "
                             f"{r_bins!r}") from None
    if edges.ndim != 1 or edges.size < 2:
        raise ParameterError(f"{what}: r_bins must hold at least 2 edges (1 bin), got "
                             f"{edges.size if edges.ndim == 1 else edges.shape}")
    if not np.all(np.isfinite(edges)) or edges[0] < 0 or np.any(np.diff(edges) <= 0):
        raise ParameterError(f"{what}: r_bins must be finite, >= 0 and strictly "
                             f"increasing (no empty bins), got {edges.tolist()}")
    if edges[-1] > 0.5 * box_size:
        raise ParameterError(f"{what}: r_max = {edges[-1]:g} is above half the box "
                             f"({0.5 * box_size:g}); use r_max <= box_size / 2")
    return edges


def check_mu_bins(mu_bins: Any, what: str = "correlation_function") -> np.ndarray:
    """The ``mu`` bin edges (float64 in ``[0, 1]``, ``mu`` the cosine of a pair's angle
    to the line of sight, both signs folded), from a number of equal bins or edges, else
    a ParameterError naming ``what``."""
    if isinstance(mu_bins, (int, np.integer)) and not isinstance(mu_bins, bool):
        if mu_bins < 1:
            raise ParameterError(f"{what}: mu_bins must be >= 1 (a number of bins on "
                                 f"[0, 1]) or edges, got {mu_bins}")
        return np.linspace(0.0, 1.0, int(mu_bins) + 1)
    try:
        edges = np.asarray(mu_bins, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError(f"{what}: mu_bins must be a number of bins or edges in "
                             f"[0, 1], got {mu_bins!r}") from None
    if edges.ndim != 1 or edges.size < 2 or not np.all(np.isfinite(edges)) \
            or np.any(np.diff(edges) <= 0) or edges[0] < 0 or edges[-1] > 1:
        raise ParameterError(f"{what}: mu_bins must be strictly increasing edges in "
                             f"[0, 1] (at least 2), got {np.ravel(edges).tolist()}")
    return edges
