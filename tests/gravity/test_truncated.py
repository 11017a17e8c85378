"""The truncated TreePM kernel T(x) and its 512-node Taylor table."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import scipy.special as sp

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.cuda import OPTIONS
from cosmo_dask.gravity import truncated as tr


def T_ref(x):
    x = np.asarray(x, dtype=np.float64)
    return sp.erfc(x) + 2.0 * x / np.sqrt(np.pi) * np.exp(-x * x)


X = np.linspace(0.0, 3.0, 2**18 + 1)


def test_exact_values_vs_scipy():
    assert np.max(np.abs(tr.erfc(X) - sp.erfc(X)) / sp.erfc(X)) < 1e-14
    assert np.max(np.abs(tr.T_exact(X) - T_ref(X)) / T_ref(X)) < 1e-14
    assert tr.T_exact(np.float64(0.0)) == pytest.approx(1.0, abs=1e-15)
    # T(3) = erfc(3) + 6/sqrt(pi) e^-9, about 4.2e-4
    assert tr.T_exact(np.array([3.0]))[0] == pytest.approx(
        2.209049699858544e-05 + 6 / np.sqrt(np.pi) * np.exp(-9.0), rel=1e-13)
    x32 = X.astype(np.float32)
    assert tr.T_exact(x32).dtype == np.float32
    assert np.max(np.abs(tr.T_exact(x32) - T_ref(x32)) / T_ref(x32)) < 2e-6


def test_derivatives_vs_finite_differences():
    x = np.linspace(0.05, 2.95, 59)
    d = tr.T_derivatives(x)
    h = 1e-3
    # central differences of the previous derivative (independent of the formulas' algebra)
    for k in range(1, 5):
        num = (tr.T_derivatives(x + h)[:, k - 1] - tr.T_derivatives(x - h)[:, k - 1]) / (2 * h)
        scale = np.max(np.abs(d[:, k]))
        assert np.max(np.abs(num - d[:, k])) < 1e-5 * scale
    fd = (T_ref(x + h) - T_ref(x - h)) / (2 * h)
    assert np.max(np.abs(fd - d[:, 1])) < 1e-6


def test_table_layout():
    tab = tr.make_table()
    assert tab.shape == (512, 5)
    xn = np.arange(512) * 3.0 / 511
    assert np.allclose(tab[:, 0], T_ref(xn), rtol=1e-14, atol=0)
    assert tab[0, 0] == pytest.approx(1.0)


def test_table_levels_float64():
    """Max relative error on [0, 3], measured on 2**18 + 1 points against scipy."""
    ref = T_ref(X)
    err = [float(np.max(np.abs(tr.T_table(X, lv) - ref) / ref)) for lv in range(5)]
    # measured: L0 1.7e-2, L1 1.3e-4, L2 6.3e-7, L3 2.0e-9, L4 4.5e-12
    assert err[0] < 2e-2
    assert err[1] < 2e-4
    assert err[2] <= 1e-5          # acceptance: T[2] <= 1e-5
    assert err[3] < 1e-8
    assert err[4] <= 1e-7          # acceptance: T[4] <= 1e-7
    assert err[4] < 1e-11
    assert all(a > b for a, b in zip(err[:-1], err[1:], strict=True))
    # the module's reporting function agrees with this measurement
    rep = tr.table_relative_errors(n_samples=2**18 + 1)
    assert np.allclose([rep[lv] for lv in range(5)], err, rtol=0.05)


def test_table_levels_float32():
    """Float32 evaluation: limited by float32 rounding near x = 3 (condition number ~18)."""
    x32 = X.astype(np.float32)
    ref = T_ref(x32.astype(np.float64))
    err = [float(np.max(np.abs(tr.T_table(x32, lv).astype(np.float64) - ref) / ref))
           for lv in range(5)]
    assert err[0] < 2e-2 and err[1] < 2e-4
    assert max(err[2:]) < 2e-6


def test_outside_table_is_exact():
    x = np.array([3.0001, 3.5, 5.0])
    assert np.allclose(tr.T_table(x, 2), T_ref(x), rtol=1e-14)


@numba.njit(cache=False)
def _eval_nb(xs, table, level):
    out = np.empty(xs.size)
    for i in range(xs.size):
        out[i] = tr.T_table_nb(xs[i], table, level)
    return out


def test_numba_evaluator():
    x = np.linspace(0.0, 3.2, 4001)
    ref = T_ref(x)
    tab = tr.make_table()
    for lv in range(5):
        got = _eval_nb(x, tab, lv)
        assert np.allclose(got, tr.T_table(x, lv), rtol=1e-14, atol=0)
    assert np.max(np.abs(_eval_nb(x, tab, -1) - ref) / ref) < 1e-14
    tab32 = tr.make_table(np.float32)
    got = _eval_nb(x.astype(np.float32), tab32, 4)
    assert np.max(np.abs(got - T_ref(x.astype(np.float32))) / ref) < 1e-6


def test_cuda_source_mentions_entry_points():
    src = tr.CUDA_SOURCE
    assert "cd_trunc_T" in src and "cd_erfc" in src and "3.0 / 511.0" in src


def test_fit_coefficients_are_the_chebyshev_interpolant():
    """ERFCX_FIT is what erfcx_fit_coefficients() computes (degree 12), and the interpolant
    itself (float64) is within 2.5e-7 relative of SciPy's erfcx on [0, 3]."""
    c = tr.erfcx_fit_coefficients(12)
    np.testing.assert_allclose(c, tr.ERFCX_FIT, rtol=1e-12, atol=1e-18)
    x = np.linspace(0.0, 3.0, 2**16 + 1)
    fit = np.polynomial.polynomial.polyval(x - tr.ERFCX_FIT_CENTRE, c)
    assert np.max(np.abs(fit / sp.erfcx(x) - 1.0)) < 2.5e-7   # measured 2.0e-7


def test_fit_float32_against_float64_scipy():
    """T and erfc from the fit in float32 against float64 SciPy at the same float32
    abscissae: measured max relative error 1.08e-6 (T) and 1.09e-6 (erfc), the float32
    floor of exp(-x^2) near x = 3, the same as the exact float32 functions'."""
    err = tr.fit_relative_errors(2**20 + 1, np.float32)
    assert err["T"] < 1.5e-6 and err["erfc"] < 1.5e-6
    # the exact float32 functions have the same floor (so the fit costs no accuracy)
    x32 = X.astype(np.float32)
    x64 = x32.astype(np.float64)
    exact = np.max(np.abs(tr.T_exact(x32).astype(np.float64) - T_ref(x64)) / T_ref(x64))
    assert exact > 0.3 * err["T"]
    # float64 evaluation: the interpolant's own error (2e-7 of erfcx) remains
    err64 = tr.fit_relative_errors(2**18 + 1, np.float64)
    assert err64["T"] < 1e-7 and err64["erfc"] < 2.5e-7
    t, ec = tr.T_fit(np.float32(0.0))
    assert t == pytest.approx(1.0, abs=1e-6) and ec == pytest.approx(1.0, abs=1e-6)


def test_cuda_fit_source_carries_the_coefficients():
    src = tr.CUDA_FIT_SOURCE
    assert "cd_trunc_fit" in src and "exp2f" in src
    for c in tr.ERFCX_FIT:
        assert f"{float(np.float32(c)):.9e}f" in src


@pytest.mark.gpu
def test_cuda_fit_against_float64_scipy():
    """cd_trunc_fit compiled with NVRTC, float32 and float64, on 2^20 + 1 points of [0, 3]
    and a few beyond (exact branch), against float64 SciPy."""
    cupy = pytest.importorskip("cupy")
    src = tr.CUDA_FIT_SOURCE + r"""
    template <typename R> __device__ void run(const R* x, R* t, R* ec, R* e, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) cd_trunc_fit(x[i], t[i], ec[i], e[i]);
    }
    extern "C" __global__ void fit32(const float* x, float* t, float* ec, float* e, int n) {
        run<float>(x, t, ec, e, n);
    }
    extern "C" __global__ void fit64(const double* x, double* t, double* ec, double* e,
                                     int n) {
        run<double>(x, t, ec, e, n);
    }
    """
    mod = cupy.RawModule(code=src, options=OPTIONS)
    for dtype, name, bound in ((np.float32, "fit32", 2e-6), (np.float64, "fit64", 1e-13)):
        x = np.concatenate([np.linspace(0.0, 3.0, 2**20 + 1), [3.001, 3.5, 4.5]]).astype(dtype)
        xd = cupy.asarray(x)
        t, ec, e = (cupy.empty_like(xd) for _ in range(3))
        n = x.size
        mod.get_function(name)(((n + 255) // 256,), (256,), (xd, t, ec, e, np.int32(n)))
        x64 = x.astype(np.float64)
        for got, ref in ((t, T_ref(x64)), (ec, sp.erfc(x64)), (e, np.exp(-x64 * x64))):
            rel = np.abs(cupy.asnumpy(got).astype(np.float64) / ref - 1.0)
            print(f"{name}: max relative error {rel.max():.3e}")
            assert rel.max() < bound


@pytest.mark.parametrize("bad", [-1, 5, 2.5, "2", None, True])
def test_bad_level(bad):
    with pytest.raises(ParameterError, match="level"):
        tr.T_table(X[:10], bad)
