"""Tests of the Zel'dovich generator and its cosmology (cosmo_dask.models)."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from scipy import integrate

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.models import Cosmology, zeldovich
from cosmo_dask.models.lpt_fields import ics_slab_count

PLANCK = {"Omega_m": 0.3111, "Omega_b": 0.0490, "Omega_L": 0.6889, "h": 0.6766,
          "sigma8": 0.8102, "n_s": 0.9665}
OTHER = {"Omega_m": 0.25, "Omega_b": 0.04, "h": 0.72, "sigma8": 0.75, "n_s": 1.0,
         "T_cmb": 2.725}


# --------------------------------------------------------------------------- references
def growth_ode(cosmo_dict, a_eval):
    """D(a)/D(1) and f(a) from the linear growth ODE in ln a (flat LCDM), by solve_ivp."""
    om = cosmo_dict["Omega_m"]
    ol = 1.0 - om

    def rhs(x, y):
        a = np.exp(x)
        e2 = om / a**3 + ol
        dlne = -1.5 * om / a**3 / e2
        om_a = om / a**3 / e2
        return [y[1], -(2.0 + dlne) * y[1] + 1.5 * om_a * y[0]]

    a0 = 1e-4  # matter era: growing mode D = a
    a_all, inverse = np.unique(np.append(np.asarray(a_eval, dtype=float), 1.0),
                               return_inverse=True)
    sol = integrate.solve_ivp(rhs, (np.log(a0), np.log(a_all[-1])), [a0, a0], method="DOP853",
                              t_eval=np.log(a_all), rtol=1e-12, atol=1e-18)
    d, dp = sol.y[0][inverse], sol.y[1][inverse]
    return d[:-1] / d[-1], dp[:-1] / d[:-1]


def eh98_nowiggle_reference(k_h, om, ob, h, t_cmb):
    """EH98 eqs. 26-31 written with k in 1/Mpc and omega_m = Omega_m h^2."""
    k = np.asarray(k_h, dtype=float) * h  # 1/Mpc
    w_m, w_b = om * h * h, ob * h * h
    theta2 = (t_cmb / 2.7) ** 2
    sound = 44.5 * np.log(9.83 / w_m) / np.sqrt(1.0 + 10.0 * w_b**0.75)
    ratio = ob / om
    alpha = 1.0 - 0.328 * np.log(431.0 * w_m) * ratio + 0.38 * np.log(22.3 * w_m) * ratio**2
    shape = alpha + (1.0 - alpha) / (1.0 + (0.43 * k * sound) ** 4)
    q = k * theta2 / (w_m * shape)  # = (k/h) theta^2 / Gamma_eff
    big_l = np.log(2.0 * np.exp(1.0) + 1.8 * q)
    big_c = 14.2 + 731.0 / (1.0 + 62.5 * q)
    return big_l / (big_l + big_c * q**2)


def sigma_r_quad(cosmo, radius):
    """sigma(R) at a=1 by adaptive quadrature of the package's normalised P(k)."""

    def integrand(lnk):
        k = np.exp(lnk)
        x = k * radius
        if x > 0.1:
            w = 3.0 * (np.sin(x) - x * np.cos(x)) / x**3
        else:  # Taylor series: the closed form cancels at small x
            w = 1.0 - x**2 / 10.0 + x**4 / 280.0 - x**6 / 15120.0
        return k**3 * float(cosmo.power_spectrum(k)) * w * w / (2.0 * np.pi**2)

    edges = np.log(np.logspace(-7, 3, 101))
    total = sum(integrate.quad(integrand, lo, hi, epsrel=1e-10, epsabs=1e-14, limit=400)[0]
                for lo, hi in zip(edges[:-1], edges[1:], strict=True))
    return np.sqrt(total)


def _lattice(ids, n_side, box):
    i, j, k = ids // n_side**2, (ids // n_side) % n_side, ids % n_side
    return (np.stack([i, j, k], axis=1) + 0.5) * (box / n_side)


def _displacements(pos, ids, n_side, box):
    d = pos.astype(np.float64) - _lattice(ids, n_side, box)
    return d - box * np.round(d / box)


# --------------------------------------------------------------------------- fixture
N_SIDE, BOX, Z = 64, 300.0, 1.0


@pytest.fixture(scope="module")
def zel():
    snap = zeldovich(N_SIDE, box_size=BOX, redshift=Z, seed=7, chunks=50_000)
    pos, vel, ids = dask.compute(snap.pos, snap.vel, snap.ids)
    return snap, pos, vel, ids


# --------------------------------------------------------------------------- (a) power
def _power_deviations(psi, ids, expected_fn, scale=1.0):
    n = N_SIDE
    mesh = np.empty((n**3, 3))
    mesh[ids] = psi
    power = np.zeros((n, n, n))
    for axis in range(3):
        power += np.abs(np.fft.fftn(mesh[:, axis].reshape(n, n, n))) ** 2
    v_cell = (BOX / n) ** 3
    power *= v_cell**2 / BOX**3 / scale
    m = np.fft.fftfreq(n, d=1.0 / n)
    nmag = np.sqrt(m[:, None, None] ** 2 + m[None, :, None] ** 2 + m[None, None, :] ** 2)
    kmag = 2.0 * np.pi / BOX * nmag
    sel = (nmag >= 1) & (nmag < n // 4)
    ratio = power[sel] / expected_fn(kmag[sel])
    shell = np.floor(nmag[sel]).astype(int)
    devs = []
    for s in np.unique(shell):
        r = ratio[shell == s]
        devs.append((r.mean() - 1.0) * np.sqrt(r.size / 2))  # size/2 independent modes
    overall = (ratio.mean() - 1.0) * np.sqrt(ratio.size / 2)
    return np.array(devs), overall


def test_displacement_power_matches_input(zel):
    snap, pos, _, ids = zel
    cosmo = Cosmology.coerce(snap.cosmology)
    d_z = growth_ode(snap.cosmology, [1.0 / (1.0 + Z)])[0][0]
    psi = _displacements(pos, ids, N_SIDE, BOX)

    def expected(k):
        return cosmo.power_spectrum(k) * d_z**2 / k**2

    devs, overall = _power_deviations(psi, ids, expected)
    assert len(devs) == N_SIDE // 4 - 1
    assert np.abs(devs).max() < 4.0, devs
    assert abs(overall) < 4.0, overall
    assert abs(devs.mean()) * np.sqrt(devs.size) < 4.0
    # the same statistics reject a 10 % error in the field amplitude
    _, off = _power_deviations(psi, ids, expected, scale=1.1**2)
    assert abs(off) > 8.0


def test_mean_and_nyquist_modes_are_zero(zel):
    _, pos, _, ids = zel
    psi = _displacements(pos, ids, N_SIDE, BOX)
    assert np.abs(psi.mean(axis=0)).max() < 1e-10 * np.abs(psi).max()
    f = np.fft.fftn(psi[:, 0].reshape(N_SIDE, N_SIDE, N_SIDE))
    ny = N_SIDE // 2
    assert np.abs(f[ny]).max() < 1e-8 * np.abs(f).max()
    assert np.abs(f[:, :, ny]).max() < 1e-8 * np.abs(f).max()
    assert 0.3 < np.std(psi) < 0.2 * BOX  # a real signal, well within minimum image


# --------------------------------------------------------------------------- (b) velocities
def test_velocities_are_aHf_psi(zel):
    snap, pos, vel, ids = zel
    a = 1.0 / (1.0 + Z)
    om = snap.cosmology["Omega_m"]
    f_a = growth_ode(snap.cosmology, [a])[1][0]
    hubble = 100.0 * np.sqrt(om / a**3 + 1.0 - om)  # km/s per Mpc/h
    psi = _displacements(pos, ids, N_SIDE, BOX)
    expect = a * hubble * f_a * psi
    np.testing.assert_allclose(vel, expect, rtol=1e-7, atol=1e-9 * np.abs(expect).max())


def test_metadata_and_coordinates(zel):
    snap, pos, _, ids = zel
    assert snap.box_size == BOX and snap.lagrangian_shape == (N_SIDE,) * 3
    assert snap.scale_factor == pytest.approx(0.5, rel=1e-15)
    assert snap.redshift == pytest.approx(Z, rel=1e-12)
    assert snap.cosmology == pytest.approx(PLANCK, rel=1e-12)
    assert set(snap.cosmology) == set(PLANCK)
    assert snap.units == {"length": "Mpc/h", "velocity": "km/s (peculiar)",
                          "mass": "1e10 Msun/h"}
    # rho_crit = 3 H0^2 / (8 pi G), G from the IAU solar mass parameter (independent of
    # astropy): GM_sun [m^3/s^2] / (m per Mpc) / (m^2/s^2 per (km/s)^2) * 1e10
    g_mpc = 1.3271244e20 / 3.0856775814913673e22 / 1e6 * 1e10
    rho_crit = 3 * 100.0**2 / (8 * np.pi * g_mpc)
    assert snap.particle_mass == pytest.approx(0.3111 * rho_crit * (BOX / N_SIDE) ** 3,
                                               rel=1e-12)
    assert snap.G == pytest.approx(g_mpc, rel=1e-9)
    assert snap.mass is None
    np.testing.assert_array_equal(ids, np.arange(N_SIDE**3))
    assert np.all(pos >= 0) and np.all(pos < BOX)
    # slab by slab: noise per slab, the distributed FFTs, one particle task per slab; no
    # task builds the whole mesh
    graph = dict(snap.pos.__dask_graph__())
    keys = [k for k in graph if isinstance(k, tuple)]
    kinds = {k[0].rsplit("-", 1)[0] for k in keys}
    assert {"zeldovich-noise", "zeldovich-delta", "zeldovich-psi1", "fft-r2c", "fft-c2r",
            "zeldovich-particles", "zeldovich-pos"} <= kinds
    assert not any("mesh" in str(k) for k in graph)
    slabs = [k for k in keys if k[0].startswith("zeldovich-noise-")]
    assert len(slabs) == ics_slab_count(N_SIDE) >= 1
    assert len([k for k in keys if k[0].startswith("zeldovich-particles-")]) == len(slabs)


def test_chunking_independent_and_seeded():
    kw = {"box_size": 50.0, "redshift": 3.0, "cosmology": OTHER}
    a = zeldovich(24, **kw, seed=1, chunks=1000)
    b = zeldovich(24, **kw, seed=1, chunks=2**20)
    c = zeldovich(24, **kw, seed=2, chunks=2**20)
    assert a.pos.chunks[0][:2] == (1000, 1000) and b.pos.numblocks == (1, 1)
    ra, rb, rc = (dask.compute(s.pos, s.vel) for s in (a, b, c))
    for x, y, z in zip(ra, rb, rc, strict=True):
        np.testing.assert_array_equal(x, y)
        assert np.mean(x == z) < 1e-3


def test_float32_positions_inside_box():
    snap = zeldovich(32, box_size=20.0, redshift=0.0, seed=3, precision="float32")
    pos, vel = dask.compute(snap.pos, snap.vel)
    assert pos.dtype == np.float32 and vel.dtype == np.float32
    assert np.all(pos >= 0) and np.all(pos < np.float32(20.0)) and np.all(pos < 20.0)
    ref = zeldovich(32, box_size=20.0, redshift=0.0, seed=3, precision="float64")
    np.testing.assert_allclose(vel, ref.vel.compute(), rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------- (c) sigma8
@pytest.mark.parametrize("params", [None, OTHER])
def test_sigma8_normalisation(params):
    cosmo = Cosmology.coerce(params)
    target = 0.8102 if params is None else params["sigma8"]
    assert sigma_r_quad(cosmo, 8.0) == pytest.approx(target, rel=1e-6)


# --------------------------------------------------------------------------- (d) EH98
@pytest.mark.parametrize("params", [PLANCK, OTHER])
def test_eh98_nowiggle_transfer(params):
    cosmo = Cosmology.coerce(params)
    t_cmb = params.get("T_cmb", 2.7255)
    assert abs(cosmo.transfer_eh98_nowiggle(1e-6) - 1.0) < 1e-5
    k = np.array([1e-3, 0.01, 0.05, 0.1, 0.3, 1.0, 10.0])
    ref = eh98_nowiggle_reference(k, params["Omega_m"], params["Omega_b"], params["h"], t_cmb)
    np.testing.assert_allclose(cosmo.transfer_eh98_nowiggle(k), ref, rtol=1e-12)
    assert np.all(np.diff(ref) < 0) and ref[-1] < 1e-3
    # P(k) = A k^n_s T^2: ratios at fixed k are independent of the amplitude
    pk = cosmo.power_spectrum(k)
    np.testing.assert_allclose(pk / pk[0], (k / k[0]) ** params["n_s"] * (ref / ref[0]) ** 2,
                               rtol=1e-12)


# --------------------------------------------------------------------------- (e) growth
@pytest.mark.parametrize("params", [PLANCK, OTHER])
def test_growth_factor_and_rate(params):
    cosmo = Cosmology.coerce(params)
    a = np.array([0.01, 0.1, 0.25, 0.5, 0.8, 1.0, 1.5])
    d_ref, f_ref = growth_ode({"Omega_m": params["Omega_m"]}, a)
    np.testing.assert_allclose(cosmo.growth_factor(a), d_ref, rtol=1e-5)
    np.testing.assert_allclose(cosmo.growth_rate(a), f_ref, rtol=1e-5)
    assert cosmo.growth_factor(1.0) == pytest.approx(1.0, rel=1e-14)
    om = params["Omega_m"]
    np.testing.assert_allclose(cosmo.H(a), 100 * params["h"] * np.sqrt(om / a**3 + 1 - om))


# --------------------------------------------------------------------------- (f) distributed
def test_distributed_matches_local():
    distributed = pytest.importorskip("distributed")
    snap = zeldovich(16, box_size=40.0, redshift=2.0, seed=5, chunks=1000)
    local = dask.compute(snap.pos, snap.vel, snap.ids, scheduler="sync")
    with distributed.Client(n_workers=2, threads_per_worker=1, processes=False,
                            dashboard_address=None) as client:
        remote = client.compute([snap.pos, snap.vel, snap.ids], sync=True)
    for x, y in zip(local, remote, strict=True):
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n_side": 0}, "n_side"),
        ({"n_side": 8.5}, "n_side"),
        ({"box_size": -1.0}, "box_size"),
        ({"redshift": -1.0}, "redshift"),
        ({"redshift": float("inf")}, "redshift"),
        ({"seed": -3}, "seed"),
        ({"cosmology": {"Omega_m": 0.3, "w0": -1}}, "w0"),
        ({"cosmology": {"Omega_m": 0.3, "Omega_L": 0.6}}, "Omega_L"),
        ({"cosmology": {"Omega_m": -0.3}}, "Omega_m"),
        ({"cosmology": {"Omega_b": 0.5}}, "Omega_b"),
        ({"cosmology": {"h": 0}}, "h"),
        ({"cosmology": {"sigma8": "0.8"}}, "sigma8"),
        ({"cosmology": [0.3]}, "cosmology"),
    ],
)
def test_parameter_errors(kwargs, name):
    args = {"n_side": 8, "box_size": 10.0, "redshift": 0.0} | kwargs
    with pytest.raises(ParameterError, match=name):
        zeldovich(args.pop("n_side"), **args)


def test_cosmology_dict_defaults():
    c = Cosmology.coerce({"Omega_m": 0.25})
    assert c.Omega_L == 0.75 and c.h == 0.6766
    assert c.as_dict()["Omega_L"] == 0.75 and "T_cmb" not in c.as_dict()
    assert Cosmology.coerce(c) is c and Cosmology() == Cosmology.coerce(None)


# -------------------- on the GPU (formerly tests/test_gpu.py)
# CuPy-backed snapshots and a LocalCUDACluster (run on an H100/H200 host).


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_zeldovich_on_gpu_matches_cpu(cupy):
    pytest.importorskip("scipy")
    from cosmo_dask.models import zeldovich

    snap = zeldovich(32, box_size=64.0, redshift=2.0, seed=9, chunks=5000)
    cpu = snap.pos.compute()
    gpu = snap.to_device("gpu").pos.compute()
    assert isinstance(gpu, cupy.ndarray)
    np.testing.assert_array_equal(gpu.get(), cpu)
