"""SCF expansion: an independent scipy reference, gala, Hernquist, chunking, edge cases."""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
import pytest

from cosmo_dask import ParameterError, Snapshot
from cosmo_dask.expansion import SCF, fit_series
from cosmo_dask.expansion.scf import potential_min_center
from cosmo_dask.models import hernquist
from tests.support.expansion import _cloud, _rel, ref_coefficients, ref_fields


# ------------------------------------------------------------------ reference agreement
def test_coefficients_and_fields_match_scipy_reference(rng):
    x, m = _cloud(rng)
    nmax, lmax, rs = 6, 4, 0.8
    scf = SCF(nmax, lmax, scale_radius=rs, center=(0, 0, 0)).fit(x, m, G=2.0)
    S, T = ref_coefficients(x, m, nmax, lmax, rs)
    assert _rel(scf.S, S) < 1e-12
    assert _rel(scf.T, T) < 1e-12
    y = rng.normal(size=(300, 3)) * 1.5
    pot, acc, dens = ref_fields(y, S, T, rs, 2.0 * m.sum())
    _, _, dens_m = ref_fields(y, S, T, rs, m.sum())
    a = scf.accelerations(y).compute()
    # per-point relative error of the vector, and of the scalars
    err = np.linalg.norm(a - acc, axis=1) / np.linalg.norm(acc, axis=1)
    assert err.max() < 1e-10
    assert np.max(np.abs(scf.potential(y).compute() / pot - 1)) < 1e-10
    assert _rel(scf.density(y).compute(), dens_m) < 1e-10


def test_matches_gala(rng):
    pytest.importorskip("gala")
    from gala.potential.scf import SCFPotential, compute_coeffs_discrete

    x, m = _cloud(rng, 3000)
    nmax, lmax, rs = 8, 5, 1.3
    scf = SCF(nmax, lmax, scale_radius=rs, center=(0, 0, 0)).fit(x, m)
    S, T = compute_coeffs_discrete(x, m / m.sum(), nmax, lmax, rs)
    assert _rel(scf.S, S) < 1e-10 and _rel(scf.T, T) < 1e-10
    pot = SCFPotential(m=m.sum(), r_s=rs, Snlm=S, Tnlm=T, units=None)
    y = rng.normal(size=(400, 3)) * 2.0
    ag = -np.asarray(getattr(g := pot.gradient(y.T), "value", g)).T
    a = scf.accelerations(y).compute()
    assert np.max(np.linalg.norm(a - ag, axis=1) / np.linalg.norm(ag, axis=1)) < 1e-8
    e = pot.energy(y.T)
    assert np.max(np.abs(scf.potential(y).compute() / np.asarray(getattr(e, "value", e)) - 1)) \
        < 1e-8
    d = np.asarray(getattr(d := pot.density(y.T), "value", d))
    assert _rel(scf.density(y).compute(), d) < 1e-8


def test_variance_matches_per_particle_sums(rng):
    x, m = _cloud(rng, 1500)
    nmax, lmax, rs = 3, 2, 1.0
    scf = SCF(nmax, lmax, scale_radius=rs, center=(0, 0, 0)).fit(x, m)
    # per-particle terms from the reference, one particle at a time
    terms = np.stack([np.stack(ref_coefficients(x[k:k + 1], np.array([1.0]), nmax, lmax, rs))
                      * m[k] / m.sum() for k in range(len(x))])
    var = (terms**2).sum(axis=0) - terms.sum(axis=0) ** 2 / len(x)
    assert _rel(scf.variance.values[..., 0], var[0]) < 1e-10
    assert _rel(scf.variance.values[..., 1], var[1]) < 1e-10
    # truncation zeroes exactly the terms below k sigma
    k = 2.0
    tr = scf.truncate(k)
    small = np.abs(scf.coefficients.values) < k * np.sqrt(scf.variance.values)
    assert small.any() and (~small).any()
    assert np.all(tr.coefficients.values[small] == 0)
    np.testing.assert_array_equal(tr.coefficients.values[~small], scf.coefficients.values[~small])
    assert scf.coefficients.values[small].any()  # the original is untouched
    cut = SCF(nmax, lmax, scale_radius=rs, center=(0, 0, 0), noise_cut=k).fit(x, m)
    np.testing.assert_array_equal(cut.coefficients.values, tr.coefficients.values)


# ------------------------------------------------------------------ Hernquist
def test_hernquist_force_accuracy():
    """N = 1e5 Hernquist (a = 1, M = 1), nmax=10, lmax=0 about the true centre.

    Measured (seed 0): median relative force error 1.06e-3, 90th percentile 6.7e-3. The
    floor is the sampling noise of S_000 (sigma = 0.707 / sqrt(N) = 2.2e-3; seeds 0-4 give
    medians 1.1e-3 .. 6.3e-3).
    """
    snap = hernquist(100_000, seed=0, chunks=25_000)
    scf = SCF(10, 0, center=(0, 0, 0)).fit(snap)
    a = scf.accelerations(snap).compute()
    x = snap.pos.compute()
    r = np.linalg.norm(x, axis=1)
    exact = -x / (r * (r + 1) ** 2)[:, None]
    err = np.linalg.norm(a - exact, axis=1) / np.linalg.norm(exact, axis=1)
    assert np.median(err) <= 5e-3
    assert np.percentile(err, 90) <= 1e-2
    assert abs(scf.S[0, 0, 0] - 1) < 4 * 0.707 / math.sqrt(1e5)


def test_potential_min_center_ignores_satellite(rng):
    host = hernquist(20_000, seed=1).pos.compute() + np.array([3.0, -2.0, 1.0])
    sat = rng.normal(size=(4000, 3)) * 0.3 + np.array([40.0, 0.0, 0.0])
    x = np.concatenate([host, sat])
    m = np.full(len(x), 1.0 / len(x))
    pos = da.from_array(x, chunks=(5000, 3))
    mass = da.from_array(m, chunks=5000)
    c = potential_min_center(pos, mass, 1.0)
    com = (x * m[:, None]).sum(0) / m.sum()
    assert np.linalg.norm(com - [3, -2, 1]) > 3
    assert np.linalg.norm(c - [3, -2, 1]) < 0.1
    scf = SCF(4, 2, center="potential_min").fit(pos, mass)
    assert np.linalg.norm(scf.center_ - [3, -2, 1]) < 0.1


# ------------------------------------------------------------------ chunking / workers
def _fit_eval(x, m, chunks, y):
    pos = da.from_array(x, chunks=(chunks, 3))
    mass = da.from_array(m, chunks=chunks)
    scf = SCF(6, 4, scale_radius=1.0, split_every=3).fit(pos, mass)
    return scf, scf.accelerations(da.from_array(y, chunks=(chunks // 2, 3))).compute()


def test_chunk_and_worker_invariance(rng, client):
    x, m = _cloud(rng, 16_000)
    y = x[::7]
    ref, a1 = _fit_eval(x, m, 16_000, y)
    for chunks in (4_000, 1_000):
        with __import__("dask").config.set(scheduler="sync"):
            scf, a = _fit_eval(x, m, chunks, y)
        assert _rel(scf.coefficients.values, ref.coefficients.values) < 1e-12
        assert _rel(a, a1) < 1e-12
    # two distributed workers (the client fixture is active: dask uses it by default)
    scf, a = _fit_eval(x, m, 1_000, y)
    assert _rel(scf.coefficients.values, ref.coefficients.values) < 1e-12
    assert _rel(a, a1) < 1e-12
    np.testing.assert_allclose(scf.center_, ref.center_, rtol=1e-12)


def test_outputs_are_aligned_dask_arrays(rng):
    x, m = _cloud(rng, 3000)
    snap = Snapshot.from_arrays(x, mass=m, chunks=700)
    scf = SCF(4, 3).fit(snap)
    acc = scf.accelerations(snap)
    assert isinstance(acc, da.Array) and acc.chunks[0] == snap.pos.chunks[0]
    assert scf.potential(x).shape == (3000,) and scf.density(snap).chunks[0] == snap.pos.chunks[0]
    # positions are in the frame of the fit input: a shifted fit gives the same field
    shift = np.array([10.0, -5.0, 2.0])
    scf2 = SCF(4, 3).fit(x + shift, m)
    assert _rel(scf2.accelerations(x[:50] + shift).compute(), acc[:50].compute()) < 1e-10


# ------------------------------------------------------------------ axis and origin
def test_z_axis_and_origin_are_regular(rng):
    x, m = _cloud(rng, 2000)
    scf = SCF(8, 6, scale_radius=0.7, center=(0, 0, 0)).fit(x, m)
    z = np.array([[0, 0, 0.0], [0, 0, 0.5], [0, 0, -0.5], [0, 0, 3.0], [0, 0, -1e-8]])
    a = scf.accelerations(z).compute()
    p = scf.potential(z).compute()
    d = scf.density(z[1:4]).compute()
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(p)) and np.all(np.isfinite(d))
    # continuity: points a hair off the axis give the same values
    eps = 1e-7
    near = z + np.array([eps, -eps, 0.0])
    np.testing.assert_allclose(a[1:4], scf.accelerations(near[1:4]).compute(), rtol=1e-5)
    np.testing.assert_allclose(p, scf.potential(near).compute(), rtol=1e-6)
    np.testing.assert_allclose(d, scf.density(near[1:4]).compute(), rtol=1e-5)
    # at r = 0 the cusp's monopole force has no limit: the value is the average of the
    # limits from +-x, +-y, +-z (the l = 1 part)
    h = 1e-9
    star = np.concatenate([np.eye(3), -np.eye(3)]) * h
    np.testing.assert_allclose(a[0], scf.accelerations(star).compute().mean(axis=0),
                               rtol=0, atol=1e-7 * np.linalg.norm(a[0]))
    # off-axis values equal the scipy reference (which divides by sin(theta))
    S, T = scf.S, scf.T
    _, acc_ref, _ = ref_fields(near[1:] + [1e-3, 0, 0], S, T, 0.7, m.sum())
    a2 = scf.accelerations(near[1:] + [1e-3, 0, 0]).compute()
    assert np.max(np.linalg.norm(a2 - acc_ref, axis=1) / np.linalg.norm(acc_ref, axis=1)) < 1e-9
    # density at the exact centre: the basis's 1/r cusp, infinite, never NaN
    assert not np.isnan(scf.density(z[:1]).compute()).any()
    # particles on the axis and at the origin in the fit itself
    xa = np.concatenate([x, z])
    scf2 = SCF(8, 6, scale_radius=0.7, center=(0, 0, 0)).fit(xa, np.ones(len(xa)))
    assert np.all(np.isfinite(scf2.coefficients.values))


# ------------------------------------------------------------------ float32
def test_float32_error(rng):
    snap = hernquist(20_000, seed=2)
    f64 = SCF(10, 6, center=(0, 0, 0)).fit(snap)
    f32 = SCF(10, 6, center=(0, 0, 0), precision="float32").fit(snap)
    a64 = f64.accelerations(snap).compute()
    a32 = f32.accelerations(snap).compute()
    assert a32.dtype == np.float32
    err = np.linalg.norm(a32 - a64, axis=1) / np.linalg.norm(a64, axis=1)
    assert np.median(err) < 1e-6 and np.percentile(err, 99) < 1e-5
    assert _rel(f32.coefficients.values, f64.coefficients.values) < 1e-5


# ------------------------------------------------------------------ storage and series
def test_zarr_roundtrip_and_series(tmp_path, rng):
    x, m = _cloud(rng, 2000)
    scf = SCF(5, 3, scale_radius=0.9).fit(x, m, G=3.0)
    path = scf.to_zarr(tmp_path / "scf.zarr")
    back = SCF.from_zarr(path)
    np.testing.assert_array_equal(back.coefficients.values, scf.coefficients.values)
    np.testing.assert_array_equal(back.variance.values, scf.variance.values)
    assert back.coefficients.attrs["G"] == 3.0 and back.scale_radius == 0.9
    np.testing.assert_array_equal(back.accelerations(x[:20]).compute(),
                                  scf.accelerations(x[:20]).compute())
    from cosmo_dask import SnapshotError

    with pytest.raises(SnapshotError, match="exists"):
        scf.to_zarr(path)
    scf.to_zarr(path, overwrite=True)
    # every chunk is recorded: a lost one is an error, not NaN coefficients
    from pathlib import Path

    next(f for f in (Path(path) / "variance" / "c").rglob("*") if f.is_file()).unlink()
    with pytest.raises(SnapshotError, match="array 'variance': chunk c/.* is missing"):
        SCF.from_zarr(path)

    paths = []
    for i, a in enumerate((0.5, 0.75, 1.0)):
        snap = Snapshot.from_arrays(x * (1 + 0.1 * i), mass=m, scale_factor=a, chunks=500)
        paths.append(snap.to_zarr(tmp_path / f"snap{i}.zarr"))
    series = fit_series(paths, 5, 3, scale_radius=0.9)
    assert series.dims == ("time", "n", "l", "m", "part")
    np.testing.assert_array_equal(series.time.values, [0.5, 0.75, 1.0])
    assert series.attrs["time_from"] == "scale_factor"
    one = SCF(5, 3, scale_radius=0.9).fit(x * 1.1, m)
    assert _rel(series.isel(time=1).values, one.coefficients.values) < 1e-12
    assert series.variance.shape == series.shape


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs, match", [
    (dict(nmax=-1), "nmax must be between 0 and 64"),
    (dict(nmax=65), "nmax must be between 0 and 64"),
    (dict(lmax=33), "lmax must be between 0 and 32"),
    (dict(nmax=2.5), "nmax must be an integer"),
    (dict(scale_radius=0.0), "scale_radius must be a positive"),
    (dict(scale_radius=-1.0), "scale_radius must be a positive"),
    (dict(scale_radius=float("nan")), "scale_radius must be a positive"),
    (dict(precision="float16"), "precision must be"),
    (dict(center="middle"), "center must be"),
    (dict(center=(1.0, 2.0)), "center must be 3 finite"),
    (dict(split_every=1), "split_every"),
    (dict(nmax=64, lmax=32, precision="float32"), "overflow float32"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        SCF(**kwargs)


def test_bad_input(rng):
    x, m = _cloud(rng, 100)
    with pytest.raises(ParameterError, match="need masses"):
        SCF(2, 2).fit(x)
    with pytest.raises(ParameterError, match="shape"):
        SCF(2, 2).fit(x[:, :2], m)
    with pytest.raises(ParameterError, match="positive and finite"):
        SCF(2, 2).fit(x, -m)
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ParameterError, match="non-finite"):
        SCF(2, 2).fit(bad, m)
    with pytest.raises(ParameterError, match="not fitted"):
        SCF(2, 2).accelerations(x)
    with pytest.raises(ParameterError, match=r"shape \(N, 3\)"):
        SCF(2, 2).fit(x, m).potential(x[:, :2])


# -------------------- on the GPU (formerly tests/test_scf_gpu.py)
# SCF on the GPU: CuPy kernels against the (reference-checked) CPU kernels.


# the float64 CUDA kernels against the numba kernels: tests/expansion/test_kernel_contracts.py


@pytest.mark.gpu
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


@pytest.mark.gpu
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
