"""Tests of the isolated models and the perturbed lattice (cosmo_dask.models)."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest
from scipy import integrate, interpolate, stats

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.models import ferrers, hernquist, perturbed_lattice, plummer
from cosmo_dask.models.blocks import GEN_BLOCK
from cosmo_dask.store.validation import wrap_into_box

N_DYN = 200_000  # particles for the dynamical tests
N_CHUNK = 2 * GEN_BLOCK + 4_321  # spans three generation blocks, the last one partial

MODELS = {
    "plummer": (plummer, (N_CHUNK,), {}),
    "hernquist": (hernquist, (N_CHUNK,), {}),
    "ferrers": (ferrers, (N_CHUNK,), {"axes": (2.0, 1.0, 0.5), "index": 2}),
    "perturbed_lattice": (perturbed_lattice, (52,), {"box_size": 3.0}),  # 140608 particles
}


def _compute(snap):
    arrays = {k: v for k, v in (("pos", snap.pos), ("vel", snap.vel)) if v is not None}
    return dict(zip(arrays, dask.compute(*arrays.values(), scheduler="threads"), strict=True))


@pytest.fixture(scope="module")
def plummer_sample():
    snap = plummer(N_DYN, scale=1.5, mass=2.0, G=0.7, seed=11)
    return snap, _compute(snap)


@pytest.fixture(scope="module")
def hernquist_sample():
    snap = hernquist(N_DYN, scale=2.0, mass=3.0, G=1.3, seed=5)
    return snap, _compute(snap)


# --------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("model", list(MODELS))
def test_chunking_independent_and_seeded(model):
    func, args, kwargs = MODELS[model]
    small = func(*args, **kwargs, seed=3, chunks=1000)
    large = func(*args, **kwargs, seed=3, chunks=2**20)
    other = func(*args, **kwargs, seed=4, chunks=2**20)
    assert small.pos.chunks == ((1000,) * (small.n_particles // 1000)
                                + (small.n_particles % 1000,), (3,))
    assert len(large.pos.chunks[0]) == 1
    assert small.pos.name.startswith(model.split("_")[-1] + "-pos-")
    a, b, c = _compute(small), _compute(large), _compute(other)
    assert set(a) == set(b) == ({"pos", "vel"} if model in ("plummer", "hernquist") else {"pos"})
    for key in a:
        assert a[key].dtype == np.float64
        np.testing.assert_array_equal(a[key], b[key])  # bitwise
        assert not np.any(a[key] == c[key])  # another seed: every value differs
    again = _compute(func(*args, **kwargs, seed=3, chunks=7777))
    for key in a:
        np.testing.assert_array_equal(a[key], again[key])
    np.testing.assert_array_equal(small.ids.compute(), np.arange(small.n_particles))


def test_generation_is_lazy():
    t0 = time.perf_counter()
    snap = plummer(10**9, chunks=2**22)  # 24 GB of positions if it were built
    assert time.perf_counter() - t0 < 5.0
    assert snap.pos.shape == (10**9, 3) and snap.vel.shape == (10**9, 3)
    assert snap.pos.numblocks == (239, 1)
    first = snap.pos.blocks[0].compute()
    assert first.shape == (2**22, 3)


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_precision(precision):
    snap = hernquist(5000, precision=precision, chunks=2000)
    out = _compute(snap)
    assert snap.pos.dtype == np.dtype(precision) and out["vel"].dtype == np.dtype(precision)
    ref = _compute(hernquist(5000, precision="float64"))
    np.testing.assert_allclose(out["pos"], ref["pos"].astype(precision), rtol=0, atol=0)


# --------------------------------------------------------------------------- metadata
def test_isolated_metadata():
    snap = plummer(1000, mass=4.0, G=2.5)
    assert snap.box_size is None and snap.n_particles == 1000
    assert snap.particle_mass == pytest.approx(4.0 / 1000, rel=1e-15)
    assert snap.mass is None and snap.G == 2.5
    assert snap.units == {"length": "N-body length", "velocity": "N-body velocity",
                          "mass": "N-body mass"}
    assert snap.ids.dtype == np.int64
    fer = ferrers(1000, mass=2.0)
    assert fer.vel is None and fer.particle_mass == pytest.approx(2.0 / 1000, rel=1e-15)
    assert fer.box_size is None


# --------------------------------------------------------------------------- Plummer
def test_plummer_virial_profile_and_speeds(plummer_sample):
    snap, out = plummer_sample
    a, mass, G = 1.5, 2.0, 0.7
    pos, vel = out["pos"], out["vel"]
    m = snap.particle_mass
    r = np.linalg.norm(pos, axis=1)
    # radius CDF: M(<r)/M = r^3 / (r^2 + a^2)^(3/2)
    assert stats.kstest(r, lambda x: x**3 / (x * x + a * a) ** 1.5).pvalue > 1e-3
    # virial ratio against the analytic potential energy
    ke = 0.5 * m * np.sum(vel * vel, axis=1)
    w = -3.0 * np.pi * G * mass**2 / (32.0 * a)
    ratio = 2.0 * ke.sum() / abs(w)
    sigma = 2.0 * ke.std(ddof=1) * np.sqrt(ke.size) / abs(w)
    assert abs(ratio - 1.0) < 4.0 * sigma
    assert sigma < 0.01  # the check above has teeth
    # speed fraction q = v / v_esc: q^2 ~ Beta(3/2, 9/2)
    v_esc = np.sqrt(2.0 * G * mass / np.sqrt(r * r + a * a))
    q2 = np.sum(vel * vel, axis=1) / v_esc**2
    assert stats.kstest(q2, stats.beta(1.5, 4.5).cdf).pvalue > 1e-3
    # isotropy: <v_r^2> = <v^2>/3 and centred
    vr = np.sum(pos * vel, axis=1) / r
    assert abs(np.mean(vr**2) / np.mean(np.sum(vel**2, axis=1)) - 1 / 3) < 0.005
    assert np.all(np.abs(np.median(pos, axis=0)) < 0.02)


# --------------------------------------------------------------------------- Hernquist
def _hernquist_sigma_r2(r_eval, a, mass, G):  # noqa: N803
    """Isotropic Jeans solution by quadrature: (1/rho) int_r^inf rho G M(r')/r'^2 dr'."""

    def rho(x):
        return mass * a / (2.0 * np.pi * x * (x + a) ** 3)

    def integrand(x):
        return rho(x) * G * mass / (x + a) ** 2  # M(<x)/x^2 = M/(x+a)^2

    out = []
    for r in r_eval:
        val = integrate.quad(integrand, r, 100 * r, epsrel=1e-10, limit=200)[0]
        val += integrate.quad(integrand, 100 * r, np.inf, epsrel=1e-10, limit=200)[0]
        out.append(val / rho(r))
    return np.array(out)


def test_hernquist_virial_and_profile(hernquist_sample):
    snap, out = hernquist_sample
    a, mass, G = 2.0, 3.0, 1.3
    pos, vel = out["pos"], out["vel"]
    r = np.linalg.norm(pos, axis=1)
    assert stats.kstest(r, lambda x: x**2 / (x + a) ** 2).pvalue > 1e-3
    ke = 0.5 * snap.particle_mass * np.sum(vel * vel, axis=1)
    w = -G * mass**2 / (6.0 * a)
    ratio = 2.0 * ke.sum() / abs(w)
    sigma = 2.0 * ke.std(ddof=1) * np.sqrt(ke.size) / abs(w)
    assert abs(ratio - 1.0) < 4.0 * sigma
    assert sigma < 0.01
    # bound: no particle above the local escape speed
    assert np.all(np.sum(vel * vel, axis=1) < 2.0 * G * mass / (r + a))


def test_hernquist_radial_dispersion_matches_jeans(hernquist_sample):
    _, out = hernquist_sample
    a, mass, G = 2.0, 3.0, 1.3
    pos, vel = out["pos"], out["vel"]
    r = np.linalg.norm(pos, axis=1)
    vr = np.sum(pos * vel, axis=1) / r
    grid = np.logspace(np.log10(0.01 * a), np.log10(50 * a), 80)
    s2 = _hernquist_sigma_r2(grid, a, mass, G)
    jeans = interpolate.interp1d(np.log(grid), np.log(s2), kind="cubic")
    edges = a * np.array([0.03, 0.2, 0.5, 1.0, 2.0, 5.0, 20.0])
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (r >= lo) & (r < hi)
        d = vr[sel] ** 2 - np.exp(jeans(np.log(r[sel])))
        z = d.mean() / (d.std(ddof=1) / np.sqrt(sel.sum()))
        assert sel.sum() > 1000
        assert abs(z) < 4.0, (lo, hi, z)
        # a 10 % error in the dispersion would be far outside the sampling error here
        assert d.std(ddof=1) / np.sqrt(sel.sum()) < 0.03 * np.mean(vr[sel] ** 2)


# --------------------------------------------------------------------------- Ferrers
@pytest.mark.parametrize("index", [0, 1, 3])
def test_ferrers_distribution(index):
    axes = (3.0, 1.2, 0.4)
    n = 100_000
    pos = ferrers(n, axes=axes, index=index, seed=9).pos.compute()
    m2 = np.sum((pos / np.array(axes)) ** 2, axis=1)
    assert np.all(m2 < 1.0)
    assert stats.kstest(m2, stats.beta(1.5, index + 1.0).cdf).pvalue > 1e-3
    for axis, c in enumerate(axes):
        x2 = pos[:, axis] ** 2
        expect = c * c / (2 * index + 5)
        err = x2.std(ddof=1) / np.sqrt(n)
        assert abs(x2.mean() - expect) < 4 * err
        assert err < 0.01 * expect
    np.testing.assert_allclose(pos.mean(axis=0), 0.0, atol=4 * max(axes) / np.sqrt(n))


# --------------------------------------------------------------------------- lattice
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_perturbed_lattice(precision):
    n_side, box, amp = 40, 7.3, 0.8
    snap = perturbed_lattice(n_side, box_size=box, amplitude=amp, seed=2, precision=precision,
                             chunks=30_000)
    assert snap.box_size == box and snap.lagrangian_shape == (n_side,) * 3
    assert snap.vel is None and snap.particle_mass == pytest.approx(1.0 / n_side**3)
    assert snap.units["length"] == "box units"
    pos = snap.pos.compute()
    ids = snap.ids.compute()
    assert pos.dtype == np.dtype(precision)
    assert np.all(pos >= 0) and np.all(pos < pos.dtype.type(box))
    assert np.all(pos.astype(np.float64) < box)
    i, j, k = ids // n_side**2, (ids // n_side) % n_side, ids % n_side
    site = (np.stack([i, j, k], axis=1) + 0.5) * (box / n_side)
    d = pos.astype(np.float64) - site
    d -= box * np.round(d / box)
    cells = d / (box / n_side)
    tol = 1e-9 if precision == "float64" else 1e-4
    assert np.abs(cells).max() <= amp + tol
    # offsets are uniform on [-amp, amp] per axis
    assert stats.kstest(cells[:, 0], stats.uniform(-amp, 2 * amp).cdf).pvalue > 1e-3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wrap_never_reaches_box_edge(dtype):
    box = 1.1
    x = np.array([-1e-9, -1e-17, -3e-8, box - 1e-9, box, 2 * box - 1e-12, 0.5, -0.25])
    out = wrap_into_box(x, box, np.dtype(dtype))
    assert out.dtype == dtype
    assert np.all(out >= 0) and np.all(out < dtype(box)) and np.all(out.astype(float) < box)
    # periodic distance to the true position stays at rounding level
    d = out.astype(np.float64) - x
    d -= box * np.round(d / box)
    assert np.abs(d).max() < 4 * np.finfo(dtype).eps * box


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: plummer(0), "n"),
        (lambda: plummer(10.5), "n"),
        (lambda: plummer(True), "n"),
        (lambda: plummer(10, scale=0.0), "scale"),
        (lambda: hernquist(10, mass=-1.0), "mass"),
        (lambda: hernquist(10, G=float("nan")), "G"),
        (lambda: plummer(10, seed=-1), "seed"),
        (lambda: plummer(10, chunks=0), "chunks"),
        (lambda: plummer(10, precision="float16"), "precision"),
        (lambda: ferrers(10, axes=(1.0, 2.0)), "axes"),
        (lambda: ferrers(10, axes=(1.0, -2.0, 1.0)), "axes"),
        (lambda: ferrers(10, index=1.5), "index"),
        (lambda: ferrers(10, index=-1), "index"),
        (lambda: perturbed_lattice(8.5, box_size=1.0), "n_side"),
        (lambda: perturbed_lattice(8, box_size=0.0), "box_size"),
        (lambda: perturbed_lattice(8, box_size=1.0, amplitude=-0.1), "amplitude"),
    ],
)
def test_parameter_errors(call, name):
    with pytest.raises(ParameterError, match=name):
        call()


def test_integral_float_sizes_accepted():
    assert plummer(2e3).n_particles == 2000
    assert perturbed_lattice(4.0, box_size=1.0).n_particles == 64
