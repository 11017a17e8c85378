"""Halo mass functions: measured from a catalog, and fitting functions for comparison.

Measured
    :func:`mass_function` histograms halo masses in logarithmic bins and returns
    ``dn/dlnM = N / (V dlnM)`` with Poisson errors ``sqrt(N) / (V dlnM)``.

Theory
    Universal fits in the Jenkins et al. (2001) convention, where the
    multiplicity ``f(sigma) = (M / rho_m) dn / dln(1/sigma)`` gives

    ``dn/dlnM = f(sigma) (rho_m / M) |dln(1/sigma) / dlnM|``,

    with ``rho_m = Omega_m rho_crit`` the comoving mean matter density and
    ``sigma(M, z)`` the rms linear overdensity (EH98 no-wiggle spectrum of
    :class:`~cosmo_dask.models.cosmology.Cosmology`) in top-hat spheres holding
    mass ``M``, radius ``R = (3 M / (4 pi rho_m))^(1/3)``. The logarithmic slope
    of ``sigma`` is computed *analytically*, from the derivative of the top-hat
    window under the ``sigma^2`` integral (see :func:`dlnsigma_dlnM`).

    * Warren et al. (2006, ApJ 646, 881):
      ``f = A (sigma^-a + b) exp(-c / sigma^2)``.
    * Watson et al. (2013, MNRAS 433, 1230), FoF "universal" fit:
      ``f = A [(beta / sigma)^alpha + 1] exp(-gamma / sigma^2)``.

Units: the fits take masses in 1e10 Msun/h and give number densities in (Mpc/h)^-3
(``"h3 / Mpc3"``); measured mass functions are in the catalog's own units.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr
from scipy import integrate

from ..core.checks import check_positive
from ..core.errors import ParameterError
from ..models.cosmology import Cosmology, tophat_window
from ..models.zeldovich_ics import RHO_CRIT_1E10
from ..units import factor
from ..units.products import product_units
from .parameters import MASS_FUNCTION_MODELS

#: units of masses and lengths when neither the catalog nor the caller states them
MASS_UNITS = "1e10 Msun/h"
LENGTH_UNITS = "Mpc/h"
#: the units of the fitting functions (theory_mass_function, sigma_of_mass)
DENSITY_UNITS = "h3 / Mpc3"

#: Warren et al. (2006) parameters of ``f = A (sigma^-a + b) exp(-c / sigma^2)``
WARREN2006 = {"A": 0.7234, "a": 1.625, "b": 0.2538, "c": 1.1982}
#: Watson et al. (2013) FoF parameters of ``f = A [(beta/sigma)^alpha + 1] exp(-gamma/sigma^2)``
WATSON2013_FOF = {"A": 0.282, "alpha": 2.163, "beta": 1.406, "gamma": 1.210}

# sigma(R) quadrature: the same integral as Cosmology.sigma (1/(2 pi^2) ∫ k^3 P W^2 dln k
# from k = 1e-6 h/Mpc to k R = 8e3), on one log-k grid shared by all radii
_K_MIN = 1e-6  # h/Mpc
_X_MAX = 8e3  # largest k R needed (the window^2 has fallen to ~1e-15 of its peak)
_DLNK = 5e-3  # grid step in ln k (Simpson; sigma agrees with Cosmology.sigma to ~1e-8)
_BLOCK_ELEMENTS = 2**22  # radii x wavenumbers evaluated at once (bounds the memory use)


# --------------------------------------------------------------------------- measured
def _catalog_masses(masses: Any) -> np.ndarray:
    if isinstance(masses, xr.Dataset):
        if "mass" not in masses.variables:
            raise ParameterError(
                "mass_function: the halo catalog Dataset has no 'mass' variable "
                f"(variables: {sorted(map(str, masses.variables))})"
            )
        masses = masses["mass"].values
    elif isinstance(masses, xr.DataArray):
        masses = masses.values
    try:
        m = np.asarray(masses, dtype=np.float64).ravel()
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"mass_function: masses must be numeric, got {exc}") from None
    if not np.all(np.isfinite(m)):
        raise ParameterError("mass_function: masses must be finite (found NaN or inf)")
    if m.size and m.min() <= 0:
        raise ParameterError(
            f"mass_function: masses must be > 0, smallest is {m.min():g}"
        )
    return m


def _bin_edges(bins: Any, m: np.ndarray) -> np.ndarray:
    if isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        n = int(bins)
        if n < 1:
            raise ParameterError(f"mass_function: bins must be >= 1, got {n}")
        if m.size == 0:
            lo, hi = 1.0, 10.0  # no data range: one nominal decade, all counts zero
        else:
            lo, hi = float(m.min()), float(m.max())
            if lo == hi:  # a single mass: one decade centred on it
                lo, hi = lo / math.sqrt(10.0), hi * math.sqrt(10.0)
        edges = np.geomspace(lo, hi, n + 1)
        edges[0], edges[-1] = lo, hi  # exact, so the extreme halos are counted
        return edges
    if isinstance(bins, bool) or np.ndim(bins) != 1:
        raise ParameterError(
            "mass_function: bins must be an int >= 1 or a 1-D array of bin edges, "
            f"got {bins!r}"
        )
    try:
        edges = np.asarray(bins, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError(f"mass_function: bin edges must be numeric, got {bins!r}") from None
    if edges.size < 2:
        raise ParameterError(f"mass_function: need at least 2 bin edges, got {edges.size}")
    if not np.all(np.isfinite(edges)) or edges[0] <= 0:
        raise ParameterError("mass_function: bin edges must be finite and > 0 (1e10 Msun/h)")
    if np.any(np.diff(edges) <= 0):
        raise ParameterError("mass_function: bin edges must be strictly increasing")
    return edges


def mass_function(
    masses: Any,
    bins: int | Any,
    box_size: float | None,
    *,
    volume: float | None = None,
    mass_unit: str | None = None,
    length_unit: str | None = None,
) -> xr.Dataset:
    """Measured halo mass function ``dn/dlnM`` with Poisson errors.

    Parameters
    ----------
    masses : array-like or xarray.Dataset
        Halo masses (all > 0), or a halo catalog Dataset with a ``mass``
        variable (its ``mass_unit``, ``length_unit`` and ``box_size`` attributes
        are used).
    bins : int or array-like
        Number of bins, log-spaced from the smallest to the largest mass (both
        included), or the bin edges in the mass unit (> 0, strictly increasing;
        halos outside them are not counted, the count is in
        ``attrs["n_outside_bins"]``). With an int and no halos, one nominal
        decade 1..10 is binned; with a single distinct mass, the decade centred
        on it.
    box_size : float or None
        Side of the periodic box in the length unit; the volume is
        ``box_size**3``. May be None when ``volume`` is given, or when
        ``masses`` is a Dataset with a ``box_size`` attribute.
    volume : float, optional
        Survey volume in the length unit cubed; overrides ``box_size``.
    mass_unit, length_unit : str, optional
        Units of the masses and of the box (default: the catalog's, else
        1e10 Msun/h and Mpc/h). The result is in these units: the same halos in
        kpc/h give ``dn_dlnM`` in ``"h3 / kpc3"``, 1e-9 times the Mpc/h values.

    Returns
    -------
    xarray.Dataset
        Over dimension ``mass_bin``, with coordinates ``mass`` (geometric bin
        centre), ``mass_lo``, ``mass_hi`` (mass unit) and variables ``counts``
        (int64), ``dn_dlnM`` = counts / (V dlnM) and ``dn_dlnM_error`` =
        sqrt(counts) / (V dlnM), both per length unit cubed, where
        ``dlnM = ln(mass_hi / mass_lo)``. Every variable has a ``units``
        attribute; the dataset's attributes hold the volume, box size, halo
        totals and the units (``mass_unit``, ``length_unit``).

    Raises
    ------
    ParameterError
        For non-positive or non-finite masses, box size or volume, ``bins < 1``,
        bad edges, or a Dataset without a ``mass`` variable.
    """
    if isinstance(masses, xr.Dataset):
        if box_size is None and volume is None:
            box_size = masses.attrs.get("box_size")
        mass_unit = mass_unit or masses.attrs.get("mass_unit")
        length_unit = length_unit or masses.attrs.get("length_unit")
    mass_unit, length_unit = str(mass_unit or MASS_UNITS), str(length_unit or LENGTH_UNITS)
    pu = product_units({"length": length_unit, "mass": mass_unit})
    m = _catalog_masses(masses)
    if volume is not None:
        vol = check_positive(volume, "mass_function: volume")
        box = None if box_size is None else check_positive(box_size, "mass_function: box_size")
    elif box_size is None:
        raise ParameterError(f"mass_function: give box_size ({length_unit}) or volume "
                             f"({pu['volume']})")
    else:
        box = check_positive(box_size, "mass_function: box_size")
        vol = box**3
    edges = _bin_edges(bins, m)
    counts, _ = np.histogram(m, bins=edges)
    counts = counts.astype(np.int64)
    lo, hi = edges[:-1], edges[1:]
    dlnm = np.log(hi / lo)
    dn = counts / (vol * dlnm)
    err = np.sqrt(counts) / (vol * dlnm)
    mass_attrs = {"units": mass_unit}
    density = pu["number_density"]  # "h3 / Mpc3" for Mpc/h
    ds = xr.Dataset(
        {
            "counts": ("mass_bin", counts, {"long_name": "halos per bin", "units": "1"}),
            "dn_dlnM": (
                "mass_bin", dn, {"units": density, "long_name": "dn/dlnM"}
            ),
            "dn_dlnM_error": (
                "mass_bin",
                err,
                {"units": density, "long_name": "Poisson error sqrt(N)/(V dlnM)"},
            ),
        },
        coords={
            "mass": ("mass_bin", np.sqrt(lo * hi), {**mass_attrs, "long_name": "bin centre"}),
            "mass_lo": ("mass_bin", lo, {**mass_attrs, "long_name": "lower bin edge"}),
            "mass_hi": ("mass_bin", hi, {**mass_attrs, "long_name": "upper bin edge"}),
        },
        attrs={
            "volume": vol,
            "volume_units": pu["volume"],
            "box_size": box if box is not None else float("nan"),
            "box_size_units": length_unit,
            "mass_units": mass_unit,
            "mass_unit": mass_unit,
            "length_unit": length_unit,
            "n_halos": int(m.size),
            "n_outside_bins": int(m.size - counts.sum()),
        },
    )
    return ds


# --------------------------------------------------------------------------- sigma(M)
def _tophat_window_derivative(x: np.ndarray) -> np.ndarray:
    """``dW/dx`` of the top-hat window ``W = 3 (sin x - x cos x) / x^3``.

    ``W'(x) = 3 sin(x) / x^2 - 3 W(x) / x``; a Taylor series below x = 0.1.
    """
    out = np.empty_like(x)
    small = x < 0.1
    xs = x[small]
    xs2 = xs * xs
    out[small] = xs * (-1.0 / 5.0 + xs2 * (1.0 / 70.0 + xs2 * (-1.0 / 2520.0 + xs2 / 166320.0)))
    xl = x[~small]
    out[~small] = 3.0 * np.sin(xl) / xl**2 - 3.0 * tophat_window(xl) / xl
    return out


def _mean_density(cosmo: Cosmology) -> float:
    return cosmo.Omega_m * RHO_CRIT_1E10


def _positive_values(x: Any, caller: str, name: str, what: str | None = None,
                     unit: str = "") -> np.ndarray:
    """``x`` as a float64 array of finite values > 0, else one ``ParameterError``."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError(f"{caller}: {name} must be numeric, got {x!r}") from None
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ParameterError(f"{caller}: {what or name} must be finite and > 0{unit}")
    return a


def _check_masses(M: Any, caller: str) -> np.ndarray:  # noqa: N803 (physics symbol)
    return _positive_values(M, caller, "M", "masses", " (1e10 Msun/h)")


def _growth(cosmo: Cosmology, redshift: Any, caller: str) -> float:
    ok = isinstance(redshift, (int, float, np.integer, np.floating)) and not isinstance(
        redshift, bool
    )
    if not ok or not math.isfinite(float(redshift)) or float(redshift) <= -1.0:
        raise ParameterError(f"{caller}: redshift must be a finite number > -1, got {redshift!r}")
    z = float(redshift)
    return 1.0 if z == 0.0 else float(cosmo.growth_factor(1.0 / (1.0 + z)))


def _linear_power(cosmo: Cosmology, power_spectrum: Any, caller: str):
    """The z = 0 linear spectrum to integrate and its k range (h/Mpc).

    ``None``: the cosmology's EH98 no-wiggle spectrum on ``[_K_MIN, inf)``; otherwise
    whatever :func:`cosmo_dask.models.resolve_power_spectrum` accepts (a callable, a
    two-column table file, ``"camb"`` / ``"class"``); a table is integrated over the
    k range it covers (it never extrapolates).
    """
    if power_spectrum is None:
        return cosmo.power_spectrum, _K_MIN, math.inf
    from ..models.lpt import TabulatedPower, resolve_power_spectrum

    try:
        power = resolve_power_spectrum(power_spectrum, cosmo)
    except ParameterError as err:
        raise ParameterError(f"{caller}: {err}") from None
    if isinstance(power, TabulatedPower):
        return power, power.k_min, power.k_max
    return power, _K_MIN, math.inf


def _sigma_and_slope(m: np.ndarray, cosmo: Cosmology, growth: float, power_spectrum=None,
                     caller: str = "sigma_of_mass"):
    """``sigma(M)`` and ``dln sigma / dln M`` (flattened), by quadrature on a log-k grid."""
    power, k_lo, k_hi = _linear_power(cosmo, power_spectrum, caller)
    flat = m.ravel()
    if flat.size == 0:
        return flat.copy(), flat.copy()
    radius = np.cbrt(3.0 * flat / (4.0 * np.pi * _mean_density(cosmo)))
    order = np.argsort(radius)
    lnk_lo = math.log(k_lo)
    lnk_hi = min(math.log(_X_MAX / float(radius[order[0]])), math.log(k_hi))
    n_k = 2 * math.ceil((lnk_hi - lnk_lo) / (2.0 * _DLNK)) + 1  # odd: Simpson panels
    lnk = np.linspace(lnk_lo, lnk_hi, n_k)
    k = np.exp(lnk)
    k3p = k**3 * np.asarray(power(k), dtype=np.float64) / (2.0 * np.pi**2)  # today's spectrum
    sig2 = np.empty_like(radius)
    dsig2 = np.empty_like(radius)  # R dsigma^2/dR / 2 = ∫ k^3 P W W'(kR) kR dlnk / (2 pi^2)
    block = max(1, _BLOCK_ELEMENTS // n_k)
    for start in range(0, radius.size, block):
        idx = order[start : start + block]  # similar radii: the grid is cut at k = X_MAX / R
        n_use = min(n_k, int(np.searchsorted(lnk, math.log(_X_MAX / radius[idx[0]]))) + 2)
        n_use -= 1 - n_use % 2  # odd
        x = k[None, :n_use] * radius[idx, None]
        kp = k3p[:n_use]
        w = tophat_window(x)
        sig2[idx] = integrate.simpson(kp * w * w, x=lnk[:n_use], axis=-1)
        dsig2[idx] = integrate.simpson(
            kp * w * _tophat_window_derivative(x) * x, x=lnk[:n_use], axis=-1
        )
    sigma = np.sqrt(sig2) * growth
    # dln sigma/dln R = (R/(2 sigma^2)) dsigma^2/dR, and dln R/dln M = 1/3
    slope = dsig2 / sig2 / 3.0
    return sigma, slope


def sigma_of_mass(M: Any, cosmology: Any = None, redshift: float = 0.0,  # noqa: N803
                  power_spectrum: Any = None):
    """Linear rms overdensity in top-hat spheres enclosing mass ``M``.

    Parameters
    ----------
    M : float or array-like
        Mass in 1e10 Msun/h (> 0). The top-hat radius is
        ``R = (3 M / (4 pi rho_m))^(1/3)`` Mpc/h, with
        ``rho_m = Omega_m * RHO_CRIT_1E10`` (1e10 Msun/h per (Mpc/h)^3, comoving).
    cosmology : Cosmology, dict or None
        Cosmology (default Planck 2018-like), see :meth:`Cosmology.coerce`.
    redshift : float
        Redshift; ``sigma`` scales with the linear growth factor ``D(z)``.
    power_spectrum : None, callable, path, "camb" or "class"
        The linear ``P(k, z = 0)`` (k in h/Mpc, P in (Mpc/h)^3), as
        :func:`cosmo_dask.models.lpt_ics` takes it, so that a simulation's mass
        function is compared with the fit on its own initial spectrum. ``None``:
        the cosmology's EH98 no-wiggle spectrum normalised to ``sigma8``. A table is
        integrated over the k range it covers (no extrapolation).

    Returns
    -------
    numpy.ndarray or float
        ``sigma(M, z)`` (dimensionless), shaped like ``M``. With the default
        spectrum equal to ``cosmology.sigma(R)`` (same integral and k range), so
        ``sigma8`` is recovered at ``R = 8`` Mpc/h.
    """
    cosmo = Cosmology.coerce(cosmology)
    m = _check_masses(M, "sigma_of_mass")
    sigma, _ = _sigma_and_slope(m, cosmo, _growth(cosmo, redshift, "sigma_of_mass"),
                                power_spectrum, "sigma_of_mass")
    return sigma.reshape(m.shape)[()]


def dlnsigma_dlnM(M: Any, cosmology: Any = None,  # noqa: N802, N803 (physics symbols)
                  power_spectrum: Any = None):
    """Logarithmic slope ``dln sigma / dln M`` of the top-hat rms overdensity.

    Analytic: differentiating the window under the integral,

    ``dln sigma / dln M = (1/3) ∫ k^3 P W(kR) W'(kR) kR dlnk / ∫ k^3 P W(kR)^2 dlnk``,

    with ``W'(x) = 3 sin x / x^2 - 3 W(x) / x``, on the same quadrature grid as
    :func:`sigma_of_mass`. Independent of redshift (linear growth is scale-free).

    Parameters
    ----------
    M : float or array-like
        Mass in 1e10 Msun/h (> 0).
    cosmology : Cosmology, dict or None
        Cosmology, see :meth:`Cosmology.coerce`.
    power_spectrum : None, callable, path, "camb" or "class"
        The linear spectrum, as for :func:`sigma_of_mass`.

    Returns
    -------
    numpy.ndarray or float
        The slope (dimensionless, negative), shaped like ``M``.
    """
    cosmo = Cosmology.coerce(cosmology)
    m = _check_masses(M, "dlnsigma_dlnM")
    _, slope = _sigma_and_slope(m, cosmo, 1.0, power_spectrum, "dlnsigma_dlnM")
    return slope.reshape(m.shape)[()]


# --------------------------------------------------------------------------- fits
def _check_sigma(sigma: Any, caller: str) -> np.ndarray:
    return _positive_values(sigma, caller, "sigma")


def _multiplicity(formula):
    """A multiplicity function ``f(sigma)`` from ``formula`` (float64 array -> array):
    ``sigma`` checked once, the result shaped like it, the shared docstring sections."""

    @functools.wraps(formula)
    def f(sigma: Any):
        return formula(_check_sigma(sigma, formula.__name__))[()]

    f.__doc__ = formula.__doc__ + """
    Parameters
    ----------
    sigma : float or array-like
        rms linear overdensity (> 0, dimensionless).

    Returns
    -------
    numpy.ndarray or float
        ``f(sigma)`` (dimensionless), shaped like ``sigma``.
    """
    return f


@_multiplicity
def multiplicity_warren2006(s):
    """Warren et al. (2006) multiplicity function.

    ``f(sigma) = A (sigma^-a + b) exp(-c / sigma^2)`` with A = 0.7234,
    a = 1.625, b = 0.2538, c = 1.1982 (Jenkins et al. 2001 convention,
    ``f = (M / rho_m) dn / dln(1/sigma)``).
    """
    p = WARREN2006
    return p["A"] * (s ** -p["a"] + p["b"]) * np.exp(-p["c"] / s**2)


@_multiplicity
def multiplicity_watson2013_fof(s):
    """Watson et al. (2013) universal FoF multiplicity function.

    ``f(sigma) = A [(beta / sigma)^alpha + 1] exp(-gamma / sigma^2)`` with
    A = 0.282, alpha = 2.163, beta = 1.406, gamma = 1.210 (Jenkins et al. 2001
    convention, ``f = (M / rho_m) dn / dln(1/sigma)``).
    """
    p = WATSON2013_FOF
    return p["A"] * ((p["beta"] / s) ** p["alpha"] + 1.0) * np.exp(-p["gamma"] / s**2)


#: multiplicity functions by model name (:data:`~cosmo_dask.halos.parameters.MASS_FUNCTION_MODELS`)
MULTIPLICITY_FUNCTIONS: Mapping[str, Callable[[Any], Any]] = {
    "warren2006": multiplicity_warren2006,
    "watson2013_fof": multiplicity_watson2013_fof,
}


def theory_mass_function(
    M: Any,  # noqa: N803 (physics symbol)
    *,
    model: str = MASS_FUNCTION_MODELS[0],
    cosmology: Any = None,
    redshift: float = 0.0,
    power_spectrum: Any = None,
):
    """Fitting-function halo mass function ``dn/dlnM``.

    ``dn/dlnM = f(sigma) (rho_m / M) |dln(1/sigma) / dlnM|``, with the slope of
    ``sigma`` from the analytic derivative of the top-hat integral
    (:func:`dlnsigma_dlnM`).

    Parameters
    ----------
    M : float or array-like
        Halo mass in 1e10 Msun/h (> 0).
    model : {"warren2006", "watson2013_fof"}
        Multiplicity function, see :data:`MULTIPLICITY_FUNCTIONS`.
    cosmology : Cosmology, dict or None
        Cosmology, see :meth:`Cosmology.coerce`.
    redshift : float
        Redshift (comoving number densities).
    power_spectrum : None, callable, path, "camb" or "class"
        The linear ``P(k, z = 0)`` under ``sigma(M)``, as for :func:`sigma_of_mass`:
        pass a simulation's own initial spectrum to compare its halos with the fit.

    Returns
    -------
    numpy.ndarray or float
        ``dn/dlnM`` in (Mpc/h)^-3 (comoving), shaped like ``M``.
    """
    if model not in MASS_FUNCTION_MODELS:
        raise ParameterError(f"theory_mass_function: unknown model {model!r}; "
                             f"choose from {MASS_FUNCTION_MODELS}")
    cosmo = Cosmology.coerce(cosmology)
    m = _check_masses(M, "theory_mass_function")
    growth = _growth(cosmo, redshift, "theory_mass_function")
    sigma, slope = _sigma_and_slope(m, cosmo, growth, power_spectrum, "theory_mass_function")
    if sigma.size == 0:
        return sigma.reshape(m.shape)
    f = MULTIPLICITY_FUNCTIONS[model](sigma)
    dn = f * _mean_density(cosmo) / m.ravel() * np.abs(slope)
    return dn.reshape(m.shape)[()]


# --------------------------------------------------------------------------- plot
_FIT_LABELS = {"warren2006": "Warren et al. 2006", "watson2013_fof": "Watson et al. 2013 (FoF)"}


def plot_mass_function(
    ds: xr.Dataset,
    *,
    fits: tuple[str, ...] | list[str] = MASS_FUNCTION_MODELS,
    cosmology: Any = None,
    redshift: float = 0.0,
    ax: Any = None,
    path: str | os.PathLike | None = None,
):
    """Plot a measured mass function with Poisson errors and fitting functions.

    Parameters
    ----------
    ds : xarray.Dataset
        Output of :func:`mass_function`.
    fits : sequence of str
        Models of :func:`theory_mass_function` to overplot (may be empty).
    cosmology : Cosmology, dict or None
        Cosmology of the fits (None: the defaults of
        :class:`~cosmo_dask.models.cosmology.Cosmology`); its ``h`` converts
        between units with and without ``/h``. A snapshot's cosmology that lacks
        what the fits need (a Gadget header has no sigma8 or n_s) gives the
        measurement alone, with a warning naming the missing parameters.
    redshift : float
        Redshift of the fits.
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure otherwise (drawn with the Agg canvas,
        leaving pyplot's state alone, when saving without a display).
    path : str or path-like, optional
        Save the figure there as PNG.

    Returns
    -------
    matplotlib.axes.Axes
        Log-log axes of ``dn/dlnM`` against M, in the units of ``ds`` (the fits
        converted into them).
    """
    from ..plot.figure import new_axes
    from ..plot.mass_function import draw_mass_function

    missing = [v for v in ("dn_dlnM", "dn_dlnM_error", "mass", "mass_lo", "mass_hi")
               if v not in ds.variables]
    if missing:
        raise ParameterError(
            f"plot_mass_function: ds lacks {missing}; pass the output of mass_function"
        )
    for fit in fits:
        if fit not in MASS_FUNCTION_MODELS:
            raise ParameterError(f"plot_mass_function: unknown fit {fit!r}; "
                                 f"choose from {MASS_FUNCTION_MODELS}")
    ax = new_axes(ax, path)

    lo = np.asarray(ds["mass_lo"].values, dtype=np.float64)
    hi = np.asarray(ds["mass_hi"].values, dtype=np.float64)
    mass_unit = ds.attrs.get("mass_unit", ds["mass"].attrs.get("units", MASS_UNITS))
    length_unit = ds.attrs.get("length_unit", LENGTH_UNITS)
    cosmo, missing = (Cosmology.for_theory(cosmology) if isinstance(cosmology, Mapping)
                      else (Cosmology.coerce(cosmology), []))
    if fits and missing:  # e.g. a Gadget snapshot's cosmology: no sigma8, no n_s
        warnings.warn(f"plot_mass_function: the fits need {', '.join(missing)}, which the "
                      "cosmology does not give: plotting the measurement only", stacklevel=2)
        fits = ()
    curves = []
    if fits and lo.size:
        # the fits are in 1e10 Msun/h and (Mpc/h)^-3: drawn in the data's units
        to_fit_mass = factor(mass_unit, MASS_UNITS, "mass", h=cosmo.h)
        to_mpc = factor(length_unit, LENGTH_UNITS, "length", h=cosmo.h)
        m_grid = np.geomspace(lo.min(), hi.max(), 200)
        for fit in fits:
            dn_fit = theory_mass_function(m_grid * to_fit_mass, model=fit, cosmology=cosmo,
                                          redshift=redshift)
            curves.append((m_grid, dn_fit * to_mpc**3, _FIT_LABELS.get(fit, fit)))
    return draw_mass_function(ax, ds, curves, mass_unit=mass_unit,
                              density_unit=ds["dn_dlnM"].attrs.get("units", DENSITY_UNITS),
                              redshift=redshift, path=path)
