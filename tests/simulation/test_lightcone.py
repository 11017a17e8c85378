"""Lightcones recorded on the fly by ``simulation.run(lightcone=...)`` (issue 33 item 1).

One module-scoped run: 24^3 particles in a 50 Mpc/h box from z = 9 to 0 in 10 PM steps
(mesh 48), observer at the box centre, z_max = 0.05 (chi = 148 Mpc/h: the light cone
needs images up to three boxes away), with a P(k) output at z = 0.035.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate

from cosmo_dask.core.errors import ChecksumError, ParameterError
from cosmo_dask.models import zeldovich
from cosmo_dask.models.cosmology import Cosmology
from cosmo_dask.simulation import SimulationInterrupted, open_simulation, run
from cosmo_dask.simulation.integrator import Factors
from cosmo_dask.simulation.lightcone import (
    Distances,
    StepGeometry,
    cross_block,
    replica_shifts,
    step_geometry,
)
from cosmo_dask.simulation.schedule import midpoint

N_SIDE, BOX, Z_ICS, Z_MAX, Z_POWER = 24, 50.0, 9.0, 0.05, 0.035
C_KMS = 299792.458


def _ics(n_side=N_SIDE, box=BOX):
    return zeldovich(n_side, box_size=box, redshift=Z_ICS, seed=3, precision="float64",
                     chunks=n_side**3 // 4)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("lightcone") / "sim"
    ics = _ics()
    res = run(ics, z_final=0.0, n_steps=10, n_mesh=48, out=out, outputs=[Z_POWER],
              analyses=["power"], lightcone={"z_max": Z_MAX})
    lc = open_simulation(out).lightcone()
    data = {k: getattr(lc, k).compute() for k in ("pos", "vel", "ids", "redshift")}
    return res, lc, data, out


def _chi_reference(cosmology: dict, z):
    """chi(z) = c/H0 int_0^z dz' / E(z') by quadrature in z (independent of the run's table,
    which integrates in a): tabulated on 4001 points, linear in between (error < 1e-6)."""
    om, ol = cosmology["Omega_m"], cosmology["Omega_L"]
    grid = np.linspace(0.0, float(np.max(z)) * 1.0001 + 1e-9, 4001)
    e = lambda x: math.sqrt(om * (1 + x) ** 3 + (1 - om - ol) * (1 + x) ** 2 + ol)  # noqa: E731
    step = [integrate.quad(lambda x: 1 / e(x), a, b, epsabs=0, epsrel=1e-12)[0]
            for a, b in zip(grid[:-1], grid[1:], strict=True)]
    table = C_KMS / 100.0 * np.concatenate([[0.0], np.cumsum(step)])
    return np.interp(z, grid, table)


def test_count_inside_chi_matches_mean_density(sim):
    """Crossings inside chi(z) against nbar 4/3 pi chi^3 at z = 0.035 and 0.05 (chi = 104
    and 148 Mpc/h, 2 and 3 box sides: 5.2e5 and 1.5e6 expected): within 1 %. (At z = 0.02,
    chi = 60 Mpc/h, 9.8e4 expected, the ratio is 0.976: the clustering of a 50 Mpc/h box
    at z = 0 around the observer, not shot noise, dominates inside one box side.)
    Measured 1.0008 and 0.9981."""
    res, lc, data, _ = sim
    assert lc.z_max == Z_MAX and lc.observer == (BOX / 2,) * 3 and lc.box_size == BOX
    chi = np.sqrt((data["pos"] ** 2).sum(axis=1))
    nbar = N_SIDE**3 / BOX**3
    assert data["redshift"].max() <= Z_MAX and data["redshift"].min() >= 0.0
    for z in (0.035, 0.05):
        r = float(_chi_reference(res.parameters["cosmology"], z))
        expected = nbar * 4 / 3 * math.pi * r**3
        assert r > BOX / 2  # the sphere reaches beyond the box around the observer
        ratio = (chi <= r).sum() / expected
        print(f"z = {z}: chi = {r:.2f}, expected {expected:.4g}, ratio {ratio:.5f}")
        assert abs(ratio - 1) < 0.01, (z, ratio)


def test_distance_matches_chi_of_redshift_within_one_drift(sim):
    """Each crossing's |pos| against chi(redshift) (independent quadrature in z) within that
    particle's drift in its step, |Dr p| (p = a_cross v). A crossing snapped to the step's
    end would miss by up to chi(a0) - chi(a1) (here one step, z = 0.26 -> 0, 700 Mpc/h).
    Measured: max residual 1.1e-3 Mpc/h (the per-step table's interpolation), largest
    |Dr p| 2.4 Mpc/h, smallest per-particle margin 3.5e-3 Mpc/h."""
    res, _, data, _ = sim
    params = res.parameters
    chi = np.sqrt((data["pos"] ** 2).sum(axis=1))
    ref = _chi_reference(params["cosmology"], data["redshift"])
    fac = Factors(Cosmology.coerce(params["cosmology"]), params["h0"], params["factors"])
    sched = np.asarray(params["schedule"])
    a = 1 / (1 + data["redshift"])
    k = np.clip(np.searchsorted(sched, a) - 1, 0, len(sched) - 2)
    dr = np.array([fac.drift(sched[i], sched[i + 1],
                             midpoint(sched[i], sched[i + 1], params["steps"]))
                   for i in range(len(sched) - 1)])
    bound = dr[k] * a * np.sqrt((data["vel"] ** 2).sum(axis=1))
    print(f"max | |pos| - chi(z) | = {np.abs(chi - ref).max():.3g} Mpc/h, max |Dr p| = "
          f"{bound.max():.3g} Mpc/h, smallest per-particle margin "
          f"{(bound - np.abs(chi - ref)).min():.3g}")
    assert (np.abs(chi - ref) <= bound + 1e-6 * ref).all()
    # and far better than one step of light travel (the crossing is interpolated)
    light = np.abs(np.diff(_chi_reference(params["cosmology"], 1 / sched - 1)))
    assert np.abs(chi - ref).max() < 1e-3 * light[k].min()


def test_angular_power_against_limber(sim):
    """Count map of the shell 0.01 <= z < 0.05 (chi 30-148 Mpc/h, 1.5e6 crossings, nside
    256): anafast C_l (shot noise 4 pi / N subtracted, the pixel window divided out) against
    the Limber projection of the P(k) measured at z = 0.035 (shot noise subtracted,
    scaled by D(z)^2 / D(0.035)^2 across the shell), averaged in two bands, 20 <= l < 50
    and 50 <= l < 80 (k = 0.14-2.6 h/Mpc across the shell): within 10 %. Measured 1.021
    and 1.027; in bands of 10 the ratios scatter by +-15 % (1.11, 1.00, 0.84, 1.09, 1.02,
    0.94): the few modes of a 50 Mpc/h box, replicated, make the sample variance."""
    healpy = pytest.importorskip("healpy")
    res, lc, data, out = sim
    params = res.parameters
    z1, z2, nside = 0.01, 0.05, 256
    counts = lc.healpix_map(nside, z1, z2)
    sel = (data["redshift"] >= z1) & (data["redshift"] < z2)
    assert counts.sum() == sel.sum()
    delta = counts / counts.mean() - 1
    cl = healpy.anafast(delta, lmax=100) - 4 * math.pi / counts.sum()
    # pixel window: a disc of the pixel's area, 2 J1(x)/x (healpy.pixwin downloads its
    # table); at l < 80 and nside 256 it is 0.97-1, the disc form within 0.5 % of it
    from scipy.special import j1

    x = np.arange(1, cl.size) * 2 / math.sqrt(12 * nside**2)
    cl[1:] /= (2 * j1(x) / x) ** 2
    r1, r2 = (float(x) for x in _chi_reference(params["cosmology"], np.array([z1, z2])))
    ells = np.arange(20, 80)
    limber = _limber(params, out, r1, r2, lambda c, a: 3 * c**2 / (r2**3 - r1**3), ells)
    ratio = cl[20:80].reshape(-1, 30).mean(axis=1) / limber.reshape(-1, 30).mean(axis=1)
    print("C_l / Limber in l = 20-49, 50-79:", np.round(ratio, 3))
    assert np.all(np.abs(ratio - 1) < 0.10), ratio


def _limber(params, out, chi_lo, chi_hi, kernel, ells):
    """Limber C_l = int dchi kernel^2 / chi^2 P((l + 1/2) / chi) with the P(k) the run
    measured at Z_POWER (shot noise subtracted), scaled by D(z)^2 / D(Z_POWER)^2."""
    cosmo = Cosmology.coerce(params["cosmology"])
    pk = open_simulation(out).power(Z_POWER)
    k, p = pk.k.values, pk.power.values - float(pk.shot_noise)
    good = np.isfinite(p) & (p > 0)
    k, p = k[good], p[good]
    chis = np.linspace(chi_lo, chi_hi, 400)
    a = Distances(cosmo, 100.0, C_KMS, 0.5).a_of_chi(chis)
    growth = (cosmo.growth_factor(a) / cosmo.growth_factor(1 / (1 + Z_POWER))) ** 2
    w = kernel(chis, a)
    return np.array([np.trapezoid(w**2 / chis**2 * growth * np.exp(np.interp(
        np.log((ell + 0.5) / chis), np.log(k), np.log(p))), chis) for ell in ells])


def test_born_convergence_map(sim):
    """healpix_map(kind="kappa"), sources at z = 0.05, lenses 0 <= z < 0.05: the full-sky
    mean vanishes (the analytic mean removed; measured 2e-7 against an rms of 3.3e-4)
    and C_l^kappa (shot noise sum w_i^2 / 4 pi, 4 % of it, subtracted; pixel window
    divided out) against the Limber projection with the lensing kernel
    (3/2) Omega_m (H0/c)^2 chi (chi_s - chi) / chi_s (1 + z) over 20 <= l < 80: within
    10 % (measured 1.048; 1.08 and 0.96 in the bands 20-49 and 50-79)."""
    healpy = pytest.importorskip("healpy")
    from scipy.special import j1

    res, lc, data, out = sim
    params = res.parameters
    nside, z_s = 256, Z_MAX
    kappa = lc.healpix_map(nside, 0.0, z_s, kind="kappa")
    assert abs(kappa.mean()) < 0.01 * kappa.std()
    chi_s = float(_chi_reference(params["cosmology"], z_s))
    amp = 1.5 * params["cosmology"]["Omega_m"] * (100.0 / C_KMS) ** 2
    chi = np.sqrt((data["pos"] ** 2).sum(axis=1))
    sel = data["redshift"] < z_s
    w = amp * (chi_s - chi[sel]) * (1 + data["redshift"][sel]) / (
        chi_s * chi[sel] * N_SIDE**3 / BOX**3)
    cl = healpy.anafast(kappa, lmax=100) - (w**2).sum() / (4 * math.pi)
    x = np.arange(1, cl.size) * 2 / math.sqrt(12 * nside**2)
    cl[1:] /= (2 * j1(x) / x) ** 2
    ells = np.arange(20, 80)
    limber = _limber(params, out, 1e-3, chi_s,
                     lambda c, a: amp * c * (chi_s - c) / chi_s / a, ells)
    ratio = cl[20:80].mean() / limber.mean()
    print(f"C_l^kappa / Limber over l = 20-79: {ratio:.3f}")
    assert abs(ratio - 1) < 0.10
    with pytest.raises(ParameterError, match="kind must be"):
        lc.healpix_map(nside, 0.0, z_s, kind="shear")


# ----------------------------------------------------------------------------- the pieces
def test_crossing_of_one_particle_by_hand():
    """A particle moving radially outward crosses where |x| = chi(a) on the drift's path."""
    cosmo = Cosmology()
    fac = Factors(cosmo, 100.0, "fastpm")
    dist = Distances(cosmo, 100.0, C_KMS, 0.5)
    a0, a1 = 0.9, 0.95
    ah = midpoint(a0, a1, "loga")
    c0, c1 = float(dist.chi(a0)), float(dist.chi(a1))
    box, obs = 1000.0, np.zeros(3)
    dr = fac.drift(a0, a1, ah)
    # x0 at distance c1 + 0.3 (c0 - c1) along x, moving outward by 5 Mpc/h over the step
    x0 = np.array([[c1 + 0.3 * (c0 - c1), 1.0, 2.0]])
    p = np.array([[5.0 / dr, 0.0, 0.0]])
    a = np.linspace(a0, a1, 65)
    u = np.array([fac.drift(a0, x, ah) for x in a]) / dr
    geo = StepGeometry(dr, u, a, dist.chi(a), float(dist.chi(0.5)),
                       replica_shifts(obs, box, c1, c0, box), box, obs, box)
    pos, vel, ids, z = cross_block(x0, p, np.array([7]), geo)
    assert ids.tolist() == [7]
    # reference: brentq on the same path with the exact drift fraction and quadrature chi
    from scipy.optimize import brentq

    def f(x):
        frac = fac.drift(a0, x, ah) / dr
        return np.linalg.norm(x0[0] + frac * p[0] * dr) - integrate.quad(
            lambda y: C_KMS / 100 / (y * y * float(cosmo.E(y))), x, 1.0, epsrel=1e-12)[0]

    a_ref = brentq(f, a0, a1, xtol=1e-14)
    assert abs(1 / (1 + z[0]) - a_ref) < 1e-7
    np.testing.assert_allclose(vel[0], p[0] / a_ref, rtol=1e-6)


def test_crossing_at_a_step_boundary_is_counted_once():
    """float32 particles whose image ends a step within 2e-5 Mpc/h of the light cone,
    across the box's edge (the drift wraps them): every one is recorded exactly once over
    the two steps, the second starting from the first's wrapped, rounded positions. (The
    sign test on the unwrapped float64 end, before, missed 269 of 20000 and counted 262
    twice.)"""
    import dask.array as da

    from cosmo_dask.simulation.integrator import drift

    cosmo = Cosmology()
    fac = Factors(cosmo, 100.0, "fastpm")
    dist = Distances(cosmo, 100.0, C_KMS, 0.5)
    box, obs = 100.0, np.array([50.0, 50.0, 50.0])
    a = (0.9, 0.95, 0.99)
    c1 = float(dist.chi(a[1]))
    rng = np.random.default_rng(5)
    n = 20000
    v = rng.normal(size=(n, 3))
    v /= np.linalg.norm(v, axis=1)[:, None]
    end = obs + v * (c1 + rng.uniform(-2e-5, 2e-5, (n, 1)))  # near the cone at a[1]
    ah = midpoint(a[0], a[1], "loga")
    dr = fac.drift(a[0], a[1], ah)
    p = (v * 1.0 / dr).astype(np.float32)  # 1 Mpc/h outward over the first step
    x0 = np.mod(end - v * 1.0, box).astype(np.float32)
    ids = np.arange(n)
    seen = []
    for b0, b1 in zip(a[:-1], a[1:], strict=False):
        geo = step_geometry(fac, dist, b0, b1, midpoint(b0, b1, "loga"), float(dist.chi(0.5)),
                            obs, box)
        pos, _, got, _ = cross_block(x0, p, ids, geo)
        near = np.linalg.norm(pos - v[got] * c1, axis=1) < 0.5  # the image placed there
        seen.append(got[near])
        x0 = drift(da.from_array(x0), da.from_array(p), geo.dr, box).compute()
    counts = np.bincount(np.concatenate(seen), minlength=n)
    assert len(seen[0]) > n // 4 and len(seen[1]) > n // 4
    assert (counts == 1).all(), np.bincount(counts)


def test_replicas_cover_the_shell():
    """Every image cube meeting a shell is listed: points drawn on the shell fall in them."""
    rng = np.random.default_rng(1)
    obs, box = np.array([10.0, 40.0, 25.0]), 50.0
    shifts = {tuple(s) for s in replica_shifts(obs, box, 120.0, 160.0)}
    v = rng.normal(size=(20000, 3))
    pts = obs + v / np.linalg.norm(v, axis=1)[:, None] * rng.uniform(120, 160, (20000, 1))
    cells = {tuple(c) for c in np.floor(pts / box).astype(int)}
    assert cells <= shifts
    assert len(shifts) < 11**3


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("cone, match", [
    ({"z_max": 12.0}, "beyond the ICs' redshift"),
    ({"z_max": 1.0, "observer": (10.0, 60.0, 1.0)}, "outside the box"),
    ({"z_max": 1.0, "observer": (-1.0, 1.0, 1.0)}, "outside the box"),
    ({"z_max": 1.0, "where": 1}, "unknown key"),
    ({"z_max": "one"}, "z_max must be a finite number"),
    ({"z_max": 1.0, "observer": (1, 2)}, "three finite numbers"),
    ({"z_max": 0.0}, "above z_final"),
    ({}, "'z_max' is required"),
])
def test_bad_lightcone_is_one_line_and_writes_nothing(tmp_path, cone, match):
    out = tmp_path / "sim"
    with pytest.raises(ParameterError, match=match) as err:
        run(_ics(8, 20.0), n_steps=2, out=out, lightcone=cone)
    assert "\n" not in str(err.value)
    assert not out.exists() and not any(tmp_path.iterdir())


def test_no_lightcone_recorded_is_a_clear_error(tmp_path):
    out = tmp_path / "sim"
    run(_ics(8, 20.0), n_steps=1, out=out)
    with pytest.raises(ParameterError, match="recorded no lightcone"):
        open_simulation(out).lightcone()


# ----------------------------------------------------------------------------- resume, bytes
def test_resume_gives_the_same_lightcone_and_flipped_byte_refused(tmp_path):
    """16^3 in 160 Mpc/h, 12 steps uniform in a (the last two end at z = 0.081 and 0),
    z_max = 0.1, observer off centre: in memory straight vs checkpoint every 2 steps
    killed after step 11 and resumed from the step-10 checkpoint (the step-11 piece is
    recomputed): identical arrays, bit for bit. Then one flipped byte in a stored piece
    is a ChecksumError on reading."""
    ics = _ics(16, 160.0)
    cone = {"z_max": 0.1, "observer": (3.0, 5.0, 159.0)}
    kw = {"n_steps": 12, "steps": "a", "n_mesh": 32}
    ref = run(ics, **kw, lightcone=cone).lightcone
    out = tmp_path / "sim"
    with pytest.raises(SimulationInterrupted):
        run(ics, **kw, out=out, checkpoint_every=2, _stop_after=11, lightcone=cone)
    steps_before = [p["step"] for p in open_simulation(out).lightcone().attrs["pieces"]]
    assert steps_before == [11]
    res = run(ics, **kw, out=out, checkpoint_every=2, resume=True, lightcone=cone)
    got = open_simulation(out).lightcone()
    assert got.n_particles == ref.n_particles == res.lightcone.n_particles > 1000
    for name in ("pos", "vel", "ids", "redshift"):
        assert np.array_equal(getattr(got, name).compute(), getattr(ref, name).compute()), name
    with pytest.raises(ParameterError, match="lightcone"):  # another lightcone: not the run
        run(ics, **kw, out=out, checkpoint_every=2, resume=True, lightcone={"z_max": 0.2})
    piece = sorted((out / "lightcone").glob("step_*"))[-1]
    chunk = next(p for p in (piece / "pos").rglob("*") if p.is_file() and p.name != "zarr.json"
                 and p.parent.name != "pos")
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError):
        open_simulation(out).lightcone().pos.compute()


def test_repr_and_snapshot(sim):
    _, lc, data, _ = sim
    text = repr(lc)
    assert "Mpc/h" in text and "km/s" in text and f"{lc.n_particles} crossings" in text
    snap = lc.to_snapshot()
    assert snap.n_particles == lc.n_particles and snap.box_size is None
    np.testing.assert_array_equal(snap.field("redshift").compute(), data["redshift"])
    assert Path(lc.path).name == "sim"


@pytest.mark.gpu
def test_crossing_on_cupy_chunks_matches_numpy():
    """The crossing of a 16^3 step on CuPy chunks against the same NumPy chunks."""
    import cupy

    cosmo = Cosmology()
    fac = Factors(cosmo, 100.0, "fastpm")
    dist = Distances(cosmo, 100.0, C_KMS, 0.5)
    rng = np.random.default_rng(3)
    x0 = rng.uniform(0, 40.0, (4096, 3))
    p = rng.normal(scale=300.0, size=(4096, 3))
    ids = np.arange(4096)
    geo = step_geometry(fac, dist, 0.93, 0.97, midpoint(0.93, 0.97, "loga"),
                        float(dist.chi(0.9)), (20.0, 20.0, 20.0), 40.0)
    cpu = cross_block(x0, p, ids, geo)
    gpu = cross_block(cupy.asarray(x0), cupy.asarray(p), cupy.asarray(ids), geo)
    assert cpu[0].shape[0] > 100
    for c, g in zip(cpu, gpu, strict=True):
        np.testing.assert_allclose(cupy.asnumpy(g), c, rtol=1e-10, atol=1e-9)


# ----------------------------------------------------------------------------- CLI
def test_cli_lightcone(tmp_path, capsys):
    """``simulate --lightcone Z --observer X,Y,Z``: bad values are one line, exit 2, before
    a cluster starts, nothing written; a good run reports its crossings and stores them."""
    from cosmo_dask.cli import main

    ics = tmp_path / "ics.zarr"
    _ics(8, 100.0).to_zarr(ics)
    sim = tmp_path / "sim"
    base = ["--cpu", "--workers", "1", "simulate", str(ics), str(sim), "--steps", "3"]
    for extra, text in ((["--lightcone", "20"], "beyond the ICs' redshift"),
                        (["--lightcone", "0.5", "--observer", "1,2,300"], "outside the box"),
                        (["--observer", "1,2,3"], "--observer needs --lightcone"),
                        (["--lightcone", "0.5", "--observer", "1,2"], "expected X,Y,Z")):
        try:
            rc = main(base + extra)
        except SystemExit as exc:  # argparse
            rc = exc.code
        err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln]
        assert rc == 2 and len(err) == 1 and text in err[0], (extra, err)
        assert not sim.exists()
    assert main(base + ["--lightcone", "0.3", "--observer", "10,20,30"]) == 0
    assert "lightcone:" in capsys.readouterr().out
    lc = open_simulation(sim).lightcone()
    assert lc.observer == (10.0, 20.0, 30.0) and lc.n_particles > 0


@pytest.mark.gpu
def test_gpu_run_records_the_same_lightcone():
    """A run on CuPy chunks records its crossings on the GPU (CuPy chunks, no host copy of
    the state) and finds the CPU run's crossings: 16^3 in 160 Mpc/h, z_max = 0.1; the
    counts agree to 1e-3 (the two PM forces round differently) and the distances to
    chi(z) match as on the CPU."""
    import cupy

    ics = _ics(16, 160.0)
    kw = {"n_steps": 12, "steps": "a", "n_mesh": 32, "lightcone": {"z_max": 0.1}}
    cpu = run(ics, **kw).lightcone
    gpu = run(ics.to_device("gpu"), **kw).lightcone
    assert isinstance(gpu.pos._meta, cupy.ndarray)
    assert abs(gpu.n_particles / cpu.n_particles - 1) < 1e-3
    chi = cupy.asnumpy(gpu.chi.compute())
    z = cupy.asnumpy(gpu.redshift.compute())
    ref = _chi_reference(ics.cosmology, z)
    assert np.abs(chi - ref).max() < 0.05
