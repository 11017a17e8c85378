"""Particle-particle (P2P) gravity kernels on the CPU (numba).

:func:`p2p_block` sums the pull of a block of source particles on a block of
target particles, following the team conventions (``notes/gravity_conventions``)::

    a_i   = -G sum_j m_j K(r_ij) (x_i - x_j),      phi_i = -G sum_j m_j P(r_ij)

* ``plummer``: ``K = (r^2 + eps^2)^{-3/2}``, ``P = (r^2 + eps^2)^{-1/2}``;
* ``spline``: the Gadget-2 cubic spline of support ``h = 2.8 eps`` (``eps``
  the Plummer-equivalent softening; Newtonian for ``r >= h``);
* truncated (``rs`` given): ``K`` and ``P`` times ``T(r / 2rs)`` and
  ``erfc(r / 2rs)`` (exact, or ``T`` from the 512-node table at a Taylor
  level, :mod:`cosmo_dask.gravity.truncated`), zero for ``r >= r_cut``;
* periodic (``box_size`` given): minimum-image separations.

Self pairs: ``exclude="index"`` (targets and sources are the same rows, pair
``j == i`` skipped), ``"zero"`` (pairs at zero separation skipped) or
``"none"``. Singular pairs (zero separation with zero softening) always
contribute nothing.

Precision: positions are first taken relative to a block centre in float64
(minimum image when periodic), then cast to ``precision``; the pair
arithmetic runs in that dtype and each target's sum is accumulated in
float64 (the float32 error is therefore the pair arithmetic's, ~1e-6
relative, not the summation's).

Units: positions, softening, ``rs``, ``r_cut`` and ``box_size`` in one
length unit; masses in one mass unit; ``G`` in length^3 / (mass time^2);
accelerations in length / time^2, potentials in length^2 / time^2.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..core.checks import check_finite, check_positive
from ..core.errors import ParameterError
from .parameters import KERNELS, default_r_cut
from .softening_kernels import inverse_kp, spline_kp_inside
from .truncated import T_exact_nb, T_table_nb, check_level, get_table

__all__ = ["p2p_block", "check_kernel_params", "relative_positions", "SPLINE_SUPPORT"]

SPLINE_SUPPORT = 2.8   # h = 2.8 eps for the Gadget-2 spline
_EXCLUDE = {"none": 0, "index": 1, "zero": 2}


def check_kernel_params(*, G=1.0, softening=0.0, softening_kernel="plummer",
                        box_size=None, rs=None, r_cut=None, table_level=None) -> dict:
    """Validate the kernel parameters; return them normalised (floats, ints, None).

    Raises
    ------
    ParameterError
        Naming the parameter: ``G`` not finite, ``softening < 0``, an unknown
        ``softening_kernel``, ``box_size <= 0``, ``rs <= 0``, ``r_cut <= 0``,
        ``r_cut`` or ``table_level`` without ``rs``, ``table_level`` not 0..4.
    """
    G = check_finite(G, "G")
    softening = check_positive(softening, "softening (length units)", allow_zero=True)
    if softening_kernel not in KERNELS:
        raise ParameterError(
            f"softening_kernel must be one of {KERNELS}, got {softening_kernel!r}")
    if box_size is not None:
        box_size = check_positive(box_size, "box_size (or None)")
    if rs is None:
        if r_cut is not None or table_level is not None:
            raise ParameterError("r_cut and table_level need the split scale rs (truncated kernel)")
    else:
        rs = check_positive(rs, "rs")
        r_cut = default_r_cut(rs) if r_cut is None else check_positive(r_cut, "r_cut")
        if table_level is not None:
            table_level = check_level(table_level)
    return dict(G=G, softening=softening, softening_kernel=softening_kernel,
                box_size=box_size, rs=rs, r_cut=r_cut, table_level=table_level)


def relative_positions(pos: np.ndarray, centre: np.ndarray, box_size: float | None,
                       dtype) -> np.ndarray:
    """``pos - centre`` in float64 (wrapped to ``[-L/2, L/2)`` when periodic), cast to dtype."""
    rel = np.asarray(pos, dtype=np.float64) - np.asarray(centre, dtype=np.float64)
    if box_size is not None:
        rel -= box_size * np.floor(rel / box_size + 0.5)
    return np.ascontiguousarray(rel, dtype=dtype)


def _params(dtype, kp: dict) -> np.ndarray:
    eps = kp["softening"]
    h = SPLINE_SUPPORT * eps
    box = kp["box_size"] or 0.0
    rs = kp["rs"]
    par = np.array([
        eps * eps,                                  # 0 eps^2
        h,                                          # 1 spline support
        box,                                        # 2
        1.0 / box if box else 0.0,                  # 3
        0.5 / rs if rs else 0.0,                    # 4 1 / (2 rs)
        kp["r_cut"] ** 2 if rs else 0.0,            # 5 r_cut^2
        1.0,                                        # 6
        1.0 / h if h > 0 else 0.0,                  # 7
    ], dtype=np.float64)
    return par.astype(dtype)


@numba.njit(nogil=True, parallel=True, cache=True)
def _p2p_kernel(t, s, m, par, table, kernel, periodic, trunc, level, exclude, want_pot,
                acc, pot):
    nt = t.shape[0]
    ns = s.shape[0]
    eps2 = par[0]
    h = par[1]
    box = par[2]
    inv_box = par[3]
    inv_2rs = par[4]
    rcut2 = par[5]
    one = par[6]
    hinv = par[7]
    for i in numba.prange(nt):
        xi = t[i, 0]
        yi = t[i, 1]
        zi = t[i, 2]
        ax = 0.0
        ay = 0.0
        az = 0.0
        ph = 0.0
        for j in range(ns):
            if exclude == 1 and j == i:
                continue
            dx = xi - s[j, 0]
            dy = yi - s[j, 1]
            dz = zi - s[j, 2]
            if periodic:
                dx -= box * np.rint(dx * inv_box)
                dy -= box * np.rint(dy * inv_box)
                dz -= box * np.rint(dz * inv_box)
            r2 = dx * dx + dy * dy + dz * dz
            if exclude == 2 and r2 == 0:
                continue
            if trunc > 0 and r2 >= rcut2:
                continue
            if kernel == 0:
                s2 = r2 + eps2
                if s2 == 0:
                    continue
                k, p = inverse_kp(one / np.sqrt(s2))
            else:
                r = np.sqrt(r2)
                if r >= h:
                    if r2 == 0:
                        continue
                    k, p = inverse_kp(one / r)
                else:
                    k, p = spline_kp_inside(np.float64(r * hinv), np.float64(hinv))
            if trunc > 0:
                x = np.sqrt(r2) * inv_2rs
                if trunc == 1:
                    k = k * T_exact_nb(x)
                else:
                    k = k * T_table_nb(x, table, level)
                if want_pot:
                    p = p * math.erfc(np.float64(x))
            mj = m[j]
            mk = mj * k
            ax -= mk * dx
            ay -= mk * dy
            az -= mk * dz
            if want_pot:
                ph -= mj * p
        acc[i, 0] = ax
        acc[i, 1] = ay
        acc[i, 2] = az
        pot[i] = ph


def check_p2p_inputs(xp, tpos, spos, smass, exclude: str, centre):
    """The checked inputs of a P2P call on array module ``xp`` (NumPy or CuPy).

    Returns ``(tpos, spos, mass, centre)``: positions as ``xp`` arrays of shape
    ``(n, 3)``, ``mass`` a float (one mass for every source) or an ``xp``
    array of shape ``(ns,)``, and ``centre`` (default: the centre of the
    targets' bounding box, float64; None when there are no targets).
    Raises :class:`ParameterError` on a bad shape or ``exclude`` rule.
    """
    if exclude not in _EXCLUDE:
        raise ParameterError(f"exclude must be one of {tuple(_EXCLUDE)}, got {exclude!r}")
    tpos = xp.asarray(tpos)
    spos = xp.asarray(spos)
    if tpos.ndim != 2 or tpos.shape[1] != 3 or spos.ndim != 2 or spos.shape[1] != 3:
        raise ParameterError(f"positions must have shape (n, 3), got {tpos.shape} and "
                             f"{spos.shape}")
    nt, ns = int(tpos.shape[0]), int(spos.shape[0])
    if exclude == "index" and nt != ns:
        raise ParameterError("exclude='index' needs the same target and source rows")
    if np.ndim(smass) == 0:
        mass = float(smass)
    else:
        mass = xp.asarray(smass)
        if mass.shape != (ns,):
            raise ParameterError(f"mass must have shape ({ns},), got {mass.shape}")
    if centre is None and nt:
        t64 = tpos.astype(xp.float64, copy=False)
        centre = 0.5 * (t64.min(axis=0) + t64.max(axis=0))
    return tpos, spos, mass, centre


def p2p_block(tpos, spos, smass, *, G: float = 1.0, softening: float = 0.0,
              softening_kernel: str = "plummer", precision="float64", potential: bool = True,
              box_size: float | None = None, rs: float | None = None,
              r_cut: float | None = None, table_level: int | None = None,
              exclude: str = "none", centre=None):
    """Accelerations (and potentials) of targets due to sources, on the CPU.

    Parameters
    ----------
    tpos : numpy.ndarray
        Target positions, shape ``(nt, 3)`` (length units).
    spos : numpy.ndarray
        Source positions, shape ``(ns, 3)`` (length units).
    smass : numpy.ndarray or float
        Source masses, shape ``(ns,)``, or one mass for all (mass units).
    G : float
        Gravitational constant (length^3 / (mass time^2)).
    softening : float
        ``eps >= 0`` (length units); Plummer length or the spline's
        Plummer-equivalent length (support ``2.8 eps``).
    softening_kernel : {"plummer", "spline"}
    precision : {"float32", "float64"}
        Pair arithmetic dtype and output dtype.
    potential : bool
        Also return the specific potential.
    box_size : float, optional
        Periodic box side (length units): minimum-image separations.
    rs : float, optional
        TreePM split scale (length units): truncated kernel ``T(r/2rs)``.
    r_cut : float, optional
        Cutoff radius of the truncated kernel (default ``4.5 rs``).
    table_level : int, optional
        Taylor level 0..4 of the tabulated ``T`` (None = exact ``erfc``).
        The potential factor ``erfc`` is always exact.
    exclude : {"none", "index", "zero"}
        Self-pair rule: ``"index"`` when targets and sources are the same
        rows (``nt == ns``), ``"zero"`` to skip zero separations.
    centre : array_like, optional
        Reference point (length units) for the relative positions; default
        the centre of the targets' bounding box.

    Returns
    -------
    acc : numpy.ndarray
        ``(nt, 3)`` accelerations (length / time^2), dtype ``precision``.
    pot : numpy.ndarray or None
        ``(nt,)`` potentials (length^2 / time^2), or None.
    """
    from ..core.backend import resolve_precision

    kp = check_kernel_params(G=G, softening=softening, softening_kernel=softening_kernel,
                             box_size=box_size, rs=rs, r_cut=r_cut, table_level=table_level)
    dtype = resolve_precision(precision)
    tpos, spos, mass, centre = check_p2p_inputs(np, tpos, spos, smass, exclude, centre)
    nt, ns = tpos.shape[0], spos.shape[0]
    if isinstance(mass, float):
        m = np.full(ns, mass, dtype=dtype)
    else:
        m = np.ascontiguousarray(mass, dtype=dtype)
    acc = np.zeros((nt, 3), dtype=dtype)
    pot = np.zeros(nt, dtype=dtype)
    if nt == 0 or ns == 0:
        return acc, (pot if potential else None)
    t = relative_positions(tpos, centre, kp["box_size"], dtype)
    s = relative_positions(spos, centre, kp["box_size"], dtype)
    trunc = 0 if kp["rs"] is None else (1 if kp["table_level"] is None else 2)
    level = -1 if kp["table_level"] is None else kp["table_level"]
    _p2p_kernel(t, s, m, _params(dtype, kp), get_table(dtype), int(softening_kernel == "spline"),
                kp["box_size"] is not None, trunc, level, _EXCLUDE[exclude], bool(potential),
                acc, pot)
    acc *= dtype.type(kp["G"])
    if not potential:
        return acc, None
    pot *= dtype.type(kp["G"])
    return acc, pot
