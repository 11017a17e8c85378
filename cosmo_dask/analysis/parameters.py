"""The analyses' parameters, declared once: the Legendre multipoles, the line of sight
and the interlacing default of the power spectrum, the separation and ``mu`` bins of the
correlation function, the bispectrum's ``|k|`` bins, triangle configurations and
symmetry factors, with their checks. ``power_spectrum``, ``correlation_function`` and
``bispectrum`` check them here, once, before any graph is built; ``cosmo-dask power``,
``cosmo-dask xi`` and ``cosmo-dask bispectrum`` take their choices from here. The mesh
parameters (``n_mesh``, ``scheme``, ``box_size``, ``split_every``) are the mesh path's,
:mod:`cosmo_dask.density.parameters`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.checks import LOS_AXES, check_los
from ..core.errors import ParameterError

__all__ = ["BISPECTRUM_FORMAT", "CLI_K_BINS_DEFAULT", "POLES", "POLES_DEFAULT", "LOS_AXES",
           "INTERLACE_DEFAULT", "XI_BINS_DEFAULT", "XI_LOS_DEFAULT", "check_bispectrum_bins",
           "check_configurations", "check_los_poles", "check_mu_bins", "check_r_bins",
           "closed_triangles", "symmetry_factor"]

#: the Legendre multipoles ``power_spectrum`` computes (l > 0 needs a line of sight)
POLES = (0, 2, 4)
#: the multipoles computed by default: the monopole
POLES_DEFAULT = (0,)
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
    ``los`` an axis (0, 1, 2 or 'x', 'y', 'z') or a non-zero 3-vector
    (:func:`~cosmo_dask.core.checks.check_los`), required for l > 0. :data:`LOS_AXES` is
    :data:`cosmo_dask.core.checks.LOS_AXES`."""
    poles = tuple(int(p) for p in np.atleast_1d(poles)) if poles is not None else POLES_DEFAULT
    if not poles or any(p not in POLES for p in poles) or len(set(poles)) != len(poles):
        raise ParameterError(f"{what}: poles must be distinct values of "
                             f"{', '.join(map(str, POLES))}, got {poles!r}")
    if los is None:
        if any(p > 0 for p in poles):
            raise ParameterError(f"{what}: multipoles l > 0 need a line of sight: "
                                 "pass los= (an axis 0/1/2 or 'x'/'y'/'z', or a vector)")
        return None, poles
    return check_los(los, what), poles


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


# --------------------------------------------------------------------------- bispectrum
#: the ``format`` attribute of a bispectrum product store (``cosmo-dask bispectrum``)
BISPECTRUM_FORMAT = "cosmo_dask.bispectrum"
#: ``cosmo-dask bispectrum``'s default bins: this many of width ``2 pi / L`` from ``pi / L``
CLI_K_BINS_DEFAULT = 8


def symmetry_factor(i: int, j: int, k: int) -> int:
    """``s_B`` of the bin triple ``(i, j, k)``: 6 when all three bins are equal, 2 when
    two are, 1 otherwise (the permutations of a triangle that stay in the same bins)."""
    distinct = len({int(i), int(j), int(k)})
    return {1: 6, 2: 2, 3: 1}[distinct]


def _modes_in_shells(edges: np.ndarray, n: int, kf: float) -> np.ndarray:
    """Modes ``k != 0`` of an ``n^3`` mesh (full k space) with ``lo <= |k| < hi`` for each
    bin; integer arithmetic on ``|n|^2`` with ``kf = 2 pi / L``, at most ``(n + 1)^2``
    (nx, ny) columns per bin (no mesh-sized array). Used to refuse empty bins."""
    half = n // 2
    top = int(min(half, np.floor(edges[-1] / kf) + 1))
    v = np.arange(-top, top + 1, dtype=np.float64)
    s = (v[:, None] ** 2 + v[None, :] ** 2).ravel()

    def below(bound):  # per (nx, ny): #{nz : nx^2 + ny^2 + nz^2 < bound^2}, |nz| <= top
        a = (bound / kf) ** 2 - s
        r = np.where(a > 0, np.ceil(np.sqrt(np.maximum(a, 0.0))) - 1, -1.0)
        return (2 * np.minimum(r, top) + 1).clip(0).sum()

    counts = np.array([below(hi) - below(lo) for lo, hi in zip(edges[:-1], edges[1:], strict=True)])
    counts[0] -= 1 if edges[0] <= 0 else 0  # k = 0 is never a mode of a bin
    return counts


def check_bispectrum_bins(k_bins: Any, n: int, box: float,
                          what: str = "bispectrum") -> np.ndarray:
    """The bispectrum's ``|k|`` bin edges (float64, 1 / box length units), else a one-line
    ParameterError before any work.

    ``k_bins`` is an int ``m`` (``m`` bins of width ``k_f = 2 pi / L`` centred on ``k_f,
    2 k_f, ..., m k_f``) or increasing edges. Refused: non-finite, negative or unsorted
    edges, fewer than two, a last edge past the mesh's Nyquist wavenumber ``pi n / L``
    (the triangles' modes would alias), and bins holding no mode of the mesh.
    """
    kf = 2 * np.pi / box
    k_ny = np.pi * n / box
    if isinstance(k_bins, (int, np.integer)) and not isinstance(k_bins, bool):
        if k_bins < 1:
            raise ParameterError(f"{what}: k_bins must be >= 1 bins or edges, got {k_bins}")
        edges = kf * (np.arange(int(k_bins) + 1) + 0.5)
    else:
        try:
            edges = np.asarray(k_bins, dtype=np.float64)
        except (TypeError, ValueError):
            raise ParameterError(f"{what}: k_bins must be a number of bins or increasing "
                                 f"edges, got {k_bins!r}") from None
        if edges.ndim != 1 or edges.size < 2 or not np.all(np.isfinite(edges)) or \
                edges[0] < 0:
            raise ParameterError(f"{what}: k_bins must be at least 2 finite non-negative "
                                 f"edges, got {k_bins!r}")
        if np.any(np.diff(edges) <= 0):
            raise ParameterError(f"{what}: k_bins edges must be strictly increasing (sorted, "
                                 f"no repeats), got {edges.tolist()}")
    if edges[-1] > k_ny * (1 + 1e-12):
        raise ParameterError(
            f"{what}: the last k bin edge {edges[-1]:.6g} is past the Nyquist wavenumber "
            f"{k_ny:.6g} of the {n}^3 mesh in a box of {box:g}; use edges up to it "
            f"(a number of bins: at most {(n - 1) // 2} of width 2 pi / box)")
    counts = _modes_in_shells(edges, n, kf)
    empty = np.flatnonzero(counts <= 0)
    if empty.size:
        i = int(empty[0])
        raise ParameterError(
            f"{what}: k bin {i} [{edges[i]:.6g}, {edges[i + 1]:.6g}) holds no mode of the "
            f"{n}^3 mesh (modes lie at multiples of 2 pi / box = {kf:.6g}); widen or drop it")
    return edges


def closed_triangles(edges: np.ndarray) -> np.ndarray:
    """All bin triples ``i <= j <= k`` whose bin centres close a triangle,
    ``c_k <= c_i + c_j`` (``(m, 3)`` int64, ordered by ``i``, then ``j``, then ``k``)."""
    c = 0.5 * (edges[1:] + edges[:-1])
    nb = c.size
    out = [(i, j, k) for i in range(nb) for j in range(i, nb) for k in range(j, nb)
           if c[k] <= (c[i] + c[j]) * (1 + 1e-12)]
    return np.asarray(out, dtype=np.int64).reshape(-1, 3)


def check_configurations(configurations: Any, n_bins: int,
                         what: str = "bispectrum") -> np.ndarray:
    """Chosen bin triples ``(m, 3)`` (each sorted, ``0 <= i <= j <= k < n_bins``), else a
    ParameterError; None gives :func:`closed_triangles`' set (checked by the caller)."""
    try:
        tri = np.asarray(configurations)
    except (TypeError, ValueError):
        tri = np.empty(0)
    if tri.ndim == 1 and tri.size == 3:
        tri = tri[None, :]
    if tri.ndim != 2 or tri.shape[1] != 3 or tri.shape[0] < 1 or tri.dtype.kind not in "iu":
        raise ParameterError(f"{what}: configurations must be integer bin triples (m, 3), "
                             f"got {configurations!r}")
    if tri.min() < 0 or tri.max() >= n_bins:
        raise ParameterError(f"{what}: configurations hold bin indices 0 to {n_bins - 1} "
                             f"(the k bins), got {tri.min()} to {tri.max()}")
    return np.sort(tri.astype(np.int64), axis=1)
