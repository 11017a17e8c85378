"""SCF on the GPU: CuPy kernels against the (reference-checked) CPU kernels."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# the float64 CUDA kernels against the numba kernels: tests/test_kernel_contracts_expansion.py


def test_gpu_float32_error_and_dask_path(rng):
    import cupy
    import dask.array as da

    from cosmo_dask.expansion import SCF
    from cosmo_dask.models import hernquist

    x = hernquist(200_000, seed=4).pos.compute()
    m = np.full(len(x), 1.0 / len(x))
    f64 = SCF(10, 6, center=(0, 0, 0)).fit(x, m)
    a64 = f64.accelerations(x).compute()
    for prec, med, p99 in (("float64", 1e-13, 1e-12), ("float32", 2e-5, 2e-4)):
        dt = np.dtype(prec)
        gx = da.from_array(cupy.asarray(x, dtype=dt), chunks=(50_000, 3), asarray=False)
        gm = da.from_array(cupy.asarray(m, dtype=dt), chunks=50_000, asarray=False)
        g = SCF(10, 6, center=(0, 0, 0), precision=prec).fit(gx, gm)
        acc = g.accelerations(gx)
        assert type(acc._meta).__module__.startswith("cupy")
        a = cupy.asnumpy(acc.compute()).astype(np.float64)
        assert a.dtype == np.float64 and np.all(np.isfinite(a))
        err = np.linalg.norm(a - a64, axis=1) / np.linalg.norm(a64, axis=1)
        q = np.percentile(err, [50, 90, 99, 100])
        print(prec, "GPU force error vs CPU float64: median, p90, p99, max", q)
        assert np.median(err) < med and np.percentile(err, 99) < p99
        tol = 1e-12 if prec == "float64" else 1e-5
        assert _rel(g.coefficients.values, f64.coefficients.values) < tol
        pot = cupy.asnumpy(g.potential(gx).compute())
        np.testing.assert_allclose(pot, f64.potential(x).compute(), rtol=10 * tol)


def test_gpu_potential_min_center(rng):
    import cupy
    import dask.array as da

    from cosmo_dask.expansion.scf import potential_min_center
    from cosmo_dask.models import hernquist

    host = hernquist(20_000, seed=1).pos.compute() + np.array([3.0, -2.0, 1.0])
    sat = rng.normal(size=(4000, 3)) * 0.3 + np.array([40.0, 0.0, 0.0])
    x = np.concatenate([host, sat])
    m = np.full(len(x), 1.0 / len(x))
    pos = da.from_array(cupy.asarray(x), chunks=(6000, 3), asarray=False)
    mass = da.from_array(cupy.asarray(m), chunks=6000, asarray=False)
    c = potential_min_center(pos, mass, 1.0)
    assert np.linalg.norm(c - [3, -2, 1]) < 0.1
