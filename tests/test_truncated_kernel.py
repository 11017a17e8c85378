"""The truncated TreePM kernel T(x) and its 512-node Taylor table."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import scipy.special as sp

from cosmo_dask.errors import ParameterError
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


@pytest.mark.parametrize("bad", [-1, 5, 2.5, "2", None, True])
def test_bad_level(bad):
    with pytest.raises(ParameterError, match="level"):
        tr.T_table(X[:10], bad)
