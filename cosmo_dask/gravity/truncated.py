"""The truncated (short-range) TreePM force kernel and its 512-node Taylor table.

With the Gaussian force split of TreePM the short-range pair force and
potential are the Newtonian ones multiplied by

``T(x) = erfc(x) + (2 x / sqrt(pi)) exp(-x**2)``  (force factor) and
``erfc(x)``                                       (potential factor),

with ``x = r / (2 rs)`` (dimensionless; ``r`` and the split scale ``rs`` in
one length unit). ``T`` falls from 1 at ``x = 0`` to ``4.2e-4`` at ``x = 3``.

Table (PhotoNs-GPU style)
------------------------
``TABLE_NODES = 512`` nodes ``x_n = n * h`` with ``h = 3 / 511`` on ``[0, 3]``
hold the Taylor coefficients ``T^(k)(x_n) / k!`` for ``k = 0..4``. A value is
evaluated at ``level`` L (0..4) around the nearest node::

    T_L(x) = sum_{k<=L} c_k(n) d**k,   n = rint(x / h),  d = x - x_n,  |d| <= h/2

by Horner's rule. The derivatives are analytic:
``T'(x) = -(4/sqrt(pi)) x^2 e^{-x^2}``, ``T'' = -(8/sqrt(pi)) (x - x^3) e^{-x^2}``,
``T''' = -(8/sqrt(pi)) (1 - 5x^2 + 2x^4) e^{-x^2}``,
``T'''' = -(8/sqrt(pi)) (-12x + 18x^3 - 4x^5) e^{-x^2}``.
Beyond ``x = 3`` every evaluator falls back to the exact formula (the table
is never extrapolated).

Measured maximum relative error ``|T_L - T| / T`` over a dense grid on
``[0, 3]`` (2**20 + 1 points; :func:`table_relative_errors` recomputes it),
float64 evaluation: L0 1.7e-2, L1 1.3e-4, L2 6.3e-7, L3 2.0e-9, L4 4.5e-12.
The error is largest near ``x = 3`` where ``T`` is small and its logarithmic
derivatives are large. Float32 evaluation: L0 1.7e-2, L1 1.3e-4, L2 1.3e-6,
L3 and L4 8.1e-7 -- a floor set by float32 itself (``x T'/T ~ 18`` at
``x = 3``, so rounding ``x`` alone costs ~1e-6); the L2 <= 1e-5 and
L4 <= 1e-7 acceptance is met in float64.

Three evaluators share one table:

* NumPy/CuPy arrays: :func:`T_table` (and :func:`T_exact`, :func:`erfc`);
* numba: :func:`T_table_nb` / :func:`T_exact_nb` (``inline="always"``),
  callable from any ``@njit`` kernel;
* CUDA: the header ``cosmo_dask/cuda/truncated.cuh`` (:data:`CUDA_SOURCE`), included
  by kernel sources.

Fit (float32 GPU tree kernels)
------------------------------
A table read per pair is a scattered memory load; the tree's float32 CUDA
kernels instead evaluate both factors from one exponential and one polynomial:
with the scaled complementary error function ``E(x) = exp(x^2) erfc(x)``
(smooth, 1 at ``x = 0`` to 0.179 at ``x = 3``)::

    erfc(x) = exp(-x^2) E(x),   T(x) = exp(-x^2) (E(x) + 2x/sqrt(pi)),

``E`` being the degree-12 Chebyshev interpolant of ``E`` on ``[0, 3]``
(:data:`ERFCX_FIT`, power basis in ``u = x - 3/2``, Horner's rule;
:func:`erfcx_fit_coefficients` recomputes it) and ``exp(-x^2)`` one
``exp2f``. Measured maximum relative error on ``[0, 3]`` against float64 SciPy
at the same float32 abscissae (:func:`fit_relative_errors`): interpolant alone
in float64 2.0e-7; float32 evaluation 1.0e-6 for ``T`` and 1.1e-6 for
``erfc`` -- the float32 floor of ``exp(-x^2)`` near ``x = 3``, where the exact
float32 ``erfcf``/``expf`` have the same floor. Beyond ``x = 3`` (``r_cut >
6 rs``, possible only through the tree functions themselves) the kernels take the
exact functions. The float64 kernels always use the exact functions.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..core.backend import array_module
from ..core.errors import ParameterError
from ..cuda import define_lines, header_text

__all__ = [
    "TABLE_NODES", "TABLE_XMAX", "TABLE_LEVELS", "TABLE_STRIDE", "CUDA_SOURCE",
    "T_exact", "erfc", "T_derivatives", "make_table", "get_table", "T_table",
    "T_exact_nb", "T_table_nb", "table_relative_errors", "check_level",
    "ERFCX_FIT", "ERFCX_FIT_CENTRE", "CUDA_FIT_SOURCE", "fit_defines", "erfcx_fit_coefficients",
    "T_fit", "fit_relative_errors",
]

TABLE_NODES = 512
TABLE_XMAX = 3.0
TABLE_LEVELS = 5          # coefficients c_0..c_4 per node
TABLE_STRIDE = 5          # row length of the flattened table
TABLE_H = TABLE_XMAX / (TABLE_NODES - 1)
TABLE_INV_H = (TABLE_NODES - 1) / TABLE_XMAX

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def check_level(level: int) -> int:
    """Validate a Taylor level (0..4), raising ParameterError otherwise."""
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) \
            or not 0 <= int(level) <= 4:
        raise ParameterError(f"table level must be an integer 0..4, got {level!r}")
    return int(level)


# --------------------------------------------------------------------------- exact
@numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)
def _erfc_ufunc(x):
    return math.erfc(x)


def erfc(x):
    """Complementary error function of a NumPy or CuPy array (dimensionless)."""
    if array_module(x) is not np:
        import cupyx.scipy.special as cps

        return cps.erfc(x)
    x = np.asarray(x, dtype=np.result_type(x, np.float32))
    return _erfc_ufunc(x)


def T_exact(x):
    """Exact force factor ``T(x) = erfc(x) + 2x/sqrt(pi) exp(-x^2)`` (dimensionless)."""
    xp = array_module(x)
    if xp is np:
        x = np.asarray(x, dtype=np.result_type(x, np.float32))
    return erfc(x) + x.dtype.type(_TWO_OVER_SQRT_PI) * x * xp.exp(-x * x)


def T_derivatives(x: np.ndarray) -> np.ndarray:
    """``T^(k)(x)`` for ``k = 0..4`` in float64, shape ``x.shape + (5,)``."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-x * x)
    c = _TWO_OVER_SQRT_PI
    x2 = x * x
    d0 = _erfc_ufunc(x) + c * x * e
    d1 = -2.0 * c * x2 * e
    d2 = -4.0 * c * (x - x * x2) * e
    d3 = -4.0 * c * (1.0 - 5.0 * x2 + 2.0 * x2 * x2) * e
    d4 = -4.0 * c * (-12.0 * x + 18.0 * x * x2 - 4.0 * x * x2 * x2) * e
    return np.stack([d0, d1, d2, d3, d4], axis=-1)


# --------------------------------------------------------------------------- table
def make_table(dtype=np.float64) -> np.ndarray:
    """The Taylor table, shape ``(TABLE_NODES, 5)``: row n holds ``T^(k)(x_n) / k!``."""
    xn = np.arange(TABLE_NODES, dtype=np.float64) * TABLE_H
    d = T_derivatives(xn)
    fact = np.array([1.0, 1.0, 2.0, 6.0, 24.0])
    return np.ascontiguousarray(d / fact, dtype=np.dtype(dtype))


_TABLES: dict = {}


def get_table(dtype=np.float64, xp=np):
    """Cached table in ``dtype`` as a NumPy (``xp=numpy``) or CuPy (``xp=cupy``) array."""
    dt = np.dtype(dtype)
    key = (dt.name, xp.__name__)
    if xp.__name__ == "cupy":
        key = key + (xp.cuda.runtime.getDevice(),)
    if key not in _TABLES:
        _TABLES[key] = xp.asarray(make_table(dt))
    return _TABLES[key]


def T_table(x, level: int = 4):
    """``T`` from the table at Taylor ``level`` (NumPy or CuPy array, its dtype).

    Values with ``x > 3`` (outside the table) take the exact formula.
    """
    level = check_level(level)
    xp = array_module(x)
    if xp is np:
        x = np.asarray(x, dtype=np.result_type(x, np.float32))
    dt = x.dtype
    tab = get_table(dt, xp)
    n = xp.clip(xp.rint(x * dt.type(TABLE_INV_H)), 0, TABLE_NODES - 1).astype(np.int64)
    d = x - n.astype(dt) * dt.type(TABLE_H)
    out = tab[n, level]
    for k in range(level - 1, -1, -1):
        out = tab[n, k] + d * out
    outside = x > dt.type(TABLE_XMAX)
    if bool(outside.any()):
        out = xp.where(outside, T_exact(x), out)
    return out


# --------------------------------------------------------------------------- numba
@numba.njit(inline="always", cache=True)
def T_exact_nb(x):
    """Exact ``T(x)`` for a numba scalar (computed in float64, returned as float64)."""
    xd = np.float64(x)
    return math.erfc(xd) + 1.1283791670955126 * xd * math.exp(-xd * xd)


@numba.njit(inline="always", cache=True)
def T_table_nb(x, table, level):
    """``T(x)`` from ``table`` (shape (512, 5), float32 or float64) at Taylor ``level``.

    The offset from the node and the Horner sum are computed in float64 (the
    table's dtype sets only the stored precision); ``level < 0`` means exact
    and ``x > 3`` takes the exact value. Returns float64.
    """
    xd = np.float64(x)
    if level < 0 or xd > 3.0:
        return T_exact_nb(xd)
    n = int(xd * 170.33333333333334 + 0.5)   # (TABLE_NODES - 1) / TABLE_XMAX, x >= 0
    if n > 511:
        n = 511
    d = xd - n * 0.005870841487279843        # TABLE_H = 3 / 511
    out = np.float64(table[n, level])
    for k in range(level - 1, -1, -1):
        out = np.float64(table[n, k]) + d * out
    return out


# --------------------------------------------------------------------------- CUDA
#: CUDA device functions ``cd_trunc_T<real, level>(x, tab)`` and ``cd_erfc(x)``: the text of
#: the shared header ``cosmo_dask/cuda/truncated.cuh`` (``#include "truncated.cuh"``)
CUDA_SOURCE = header_text("truncated.cuh")


# --------------------------------------------------------------------------- fit
#: centre of the fit's variable ``u = x - ERFCX_FIT_CENTRE``
ERFCX_FIT_CENTRE = 1.5
#: power-basis coefficients c_0..c_12 of the degree-12 Chebyshev interpolant of
#: ``exp(x^2) erfc(x)`` on [0, 3] in ``u = x - 3/2`` (``erfcx_fit_coefficients(12)``)
ERFCX_FIT = (
    0.3215854164543179, -0.1636224776031933, 0.07615091944198059, -0.03293635023122758,
    0.013378830981391698, -0.0051268821418424294, 0.0018809115683151433,
    -0.000690205934777551, 0.0002310615508880705, -5.275619060109169e-05,
    1.7396390890180034e-05, -1.3321340444057051e-05, 3.818659950843648e-06,
)
_LOG2E = 1.4426950408889634


def erfcx_fit_coefficients(degree: int = len(ERFCX_FIT) - 1) -> np.ndarray:
    """Power-basis coefficients (in ``u = x - 3/2``) of the Chebyshev interpolant of
    ``exp(x^2) erfc(x)`` on ``[0, 3]`` of the given degree (float64; needs SciPy)."""
    from numpy.polynomial import chebyshev, polynomial
    from scipy.special import erfcx

    ch = chebyshev.Chebyshev.interpolate(erfcx, int(degree), domain=[0.0, TABLE_XMAX])
    return ch.convert(kind=polynomial.Polynomial, domain=[0.0, TABLE_XMAX],
                      window=[-ERFCX_FIT_CENTRE, TABLE_XMAX - ERFCX_FIT_CENTRE]).coef


def T_fit(x):
    """``(T(x), erfc(x))`` from :data:`ERFCX_FIT` and one ``exp2`` in the dtype of ``x``
    (NumPy; the arithmetic of the float32 CUDA ``cd_trunc_fit`` up to its fused
    multiply-adds), for ``0 <= x <= 3``. Dimensionless."""
    x = np.asarray(x)
    x = x.astype(np.result_type(x, np.float32), copy=False)
    ft = x.dtype.type
    u = x - ft(ERFCX_FIT_CENTRE)
    e_fit = np.full_like(x, ft(ERFCX_FIT[-1]))
    for c in ERFCX_FIT[-2::-1]:
        e_fit = ft(c) + u * e_fit
    e = np.exp2(-(x * x) * ft(_LOG2E))
    return e * (e_fit + ft(_TWO_OVER_SQRT_PI) * x), e * e_fit


def fit_relative_errors(n_samples: int = 2**20 + 1, dtype=np.float32) -> dict[str, float]:
    """Maximum relative errors of :func:`T_fit` on ``[0, 3]`` against float64 SciPy at
    the same (rounded) abscissae: ``{"T": ..., "erfc": ...}``."""
    from scipy.special import erfc as erfc64

    x = np.linspace(0.0, TABLE_XMAX, int(n_samples)).astype(dtype)
    x64 = x.astype(np.float64)
    t, ec = T_fit(x)
    ref_ec = erfc64(x64)
    ref_t = ref_ec + _TWO_OVER_SQRT_PI * x64 * np.exp(-x64 * x64)
    return {"T": float(np.max(np.abs(t.astype(np.float64) - ref_t) / ref_t)),
            "erfc": float(np.max(np.abs(ec.astype(np.float64) - ref_ec) / ref_ec))}


def fit_defines() -> dict[str, str]:
    """The float32 coefficients of :data:`ERFCX_FIT` as the defines ``CD_ERFCX_FIT_k``
    (``c_k`` of ``u^k``, ``k = 0..12``) that ``cosmo_dask/cuda/truncated_fit.cuh`` reads:
    the only CUDA text generated from numbers."""
    return {f"CD_ERFCX_FIT_{k}": f"{float(np.float32(c)):.9e}f" for k, c in enumerate(ERFCX_FIT)}


#: CUDA device functions ``cd_trunc_fit(x, T&, erfc&, exp(-x^2)&)`` (float: the fit;
#: double: exact): the header ``truncated_fit.cuh`` after its :func:`fit_defines`
CUDA_FIT_SOURCE = define_lines(fit_defines()) + header_text("truncated_fit.cuh")


# --------------------------------------------------------------------------- errors
def table_relative_errors(n_samples: int = 2**20 + 1, dtype=np.float64,
                          xmax: float = TABLE_XMAX) -> dict[int, float]:
    """Maximum relative error ``max |T_L(x) - T(x)| / T(x)`` on ``[0, xmax]`` per level.

    Parameters
    ----------
    n_samples : int
        Points of the uniform grid on ``[0, xmax]`` (both ends included).
    dtype : numpy dtype
        Evaluation dtype of the table (the reference is always float64 exact).
    xmax : float
        Upper end of the grid (dimensionless ``x = r / 2 rs``); at most 3.

    Returns
    -------
    dict
        ``{level: max relative error}`` for levels 0..4.
    """
    if not 0 < xmax <= TABLE_XMAX:
        raise ParameterError(f"xmax must be in (0, 3], got {xmax!r}")
    x64 = np.linspace(0.0, xmax, int(n_samples))
    ref = T_derivatives(x64)[:, 0]
    x = x64.astype(dtype)
    # the reference at the *evaluated* abscissa: float32 x differs from x64 by rounding
    ref = T_derivatives(x.astype(np.float64))[:, 0] if np.dtype(dtype) != np.float64 else ref
    return {lv: float(np.max(np.abs(T_table(x, lv).astype(np.float64) - ref) / ref))
            for lv in range(5)}
