"""populate_hod: Zheng et al. (2007) occupations, NFW satellites, member satellites,
reproducibility, bad input, and wp(rp) against halotools' mock on the same halos."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos import fof, populate_hod
from cosmo_dask.halos.hod import hod_masses, mean_occupation, zheng07_mean_occupation
from cosmo_dask.halos.overdensity import nfw_f
from cosmo_dask.models import halo_blobs
from cosmo_dask.store.snapshot import Snapshot
from tests.support.devices import DEVICES
from tests.support.hod import synthetic_catalog

PARAMS = {"logMmin": 12.5, "sigma_logM": 0.3, "logM0": 12.0, "logM1": 13.3, "alpha": 1.0}
COSMO = {"Omega_m": 0.3, "Omega_L": 0.7, "Omega_b": 0.05, "h": 0.7, "sigma8": 0.8, "n_s": 0.96}


@pytest.fixture(scope="module")
def many_halos():
    return synthetic_catalog(60000, 300.0, seed=2, log_m=(11.0, 15.0))


@pytest.fixture(scope="module")
def blobs():
    snap = halo_blobs(24**3, box_size=60.0, n_halos=60, seed=4, cosmology=COSMO, chunks=4000)
    return snap, fof(snap)


def test_mean_occupations_match_zheng07(many_halos):
    """Per mass bin, the mean central and satellite counts equal the Zheng07 formulas
    averaged over the bin's halos, within 4 standard errors (Bernoulli p(1 - p) and
    Poisson variances); and their chi^2 over the bins is that of noise."""
    gal = populate_hod(many_halos, params=PARAMS, satellites="nfw", seed=7)
    mass, name = hod_masses(many_halos)
    assert name == "M_200c"
    edges = np.logspace(11.0, 15.0, 17)
    ds = mean_occupation(gal, mass, edges)
    ncen, nsat = zheng07_mean_occupation(np.log10(mass), PARAMS)
    which = np.digitize(mass, edges) - 1
    chi2, dof = 0.0, 0
    for b in range(edges.size - 1):
        sel = which == b
        n = sel.sum()
        exp_c, var_c = ncen[sel].mean(), (ncen[sel] * (1 - ncen[sel])).sum() / n**2
        exp_s, var_s = nsat[sel].mean(), nsat[sel].sum() / n**2
        for meas, exp, var in ((ds.mean_ncen[b], exp_c, var_c), (ds.mean_nsat[b], exp_s, var_s)):
            if var > 0:
                z = (float(meas) - exp) / np.sqrt(var)
                assert abs(z) < 4, (b, float(meas), exp)
                chi2, dof = chi2 + z * z, dof + 1
            else:
                assert float(meas) == exp  # 0: no satellite below M0
    assert dof > 20 and chi2 < dof + 5 * np.sqrt(2 * dof)
    # centrals sit on the centres with the bulk velocities
    host = gal.field("host_id").compute()
    cen = gal.field("is_central").compute()
    np.testing.assert_allclose(gal.pos.compute()[cen],
                               many_halos.center_of_mass.values[host[cen]], atol=1e-9)
    np.testing.assert_array_equal(gal.vel.compute()[cen], many_halos.velocity.values[host[cen]])
    assert np.array_equal(gal.ids.compute(), np.arange(gal.n_particles))
    assert np.all(np.diff(host) >= 0)  # grouped by halo, the central first
    assert gal.box_size == 300.0 and gal.units["length"] == "Mpc/h"


def test_nfw_satellites_profile_and_velocities():
    """Satellite radii / R follow the truncated NFW mass profile at the catalog's
    concentration (KS test); velocity offsets are Gaussian with the stated dispersion
    sqrt(G M / (2 a R))."""
    from scipy import stats

    ds = synthetic_catalog(3000, 300.0, seed=3, log_m=(14.0, 14.5), conc=(6.0, 6.0))
    gal = populate_hod(ds, params=PARAMS, satellites="nfw", seed=1)
    host = gal.field("host_id").compute()
    sat = ~gal.field("is_central").compute()
    assert sat.sum() > 5000
    d = gal.pos.compute()[sat] - ds.center_of_mass.values[host[sat]]
    d -= 300.0 * np.round(d / 300.0)
    x = np.linalg.norm(d, axis=1) / ds.R_200c.values[host[sat]]
    c = 6.0
    ks = stats.kstest(x, lambda q: nfw_f(np.clip(q, 0, 1) * c) / nfw_f(c))
    assert ks.pvalue > 1e-3, ks
    # isotropy: the mean direction is zero
    assert np.abs((d / np.linalg.norm(d, axis=1)[:, None]).mean(axis=0)).max() < 0.05
    G = 4.30091727e-9  # noqa: N806  (km/s)^2 Mpc / Msun
    sigma = np.sqrt(G * ds.M_200c.values / ds.R_200c.values / 2.0)[host[sat]]
    dv = (gal.vel.compute()[sat] - ds.velocity.values[host[sat]]) / sigma[:, None]
    assert abs(dv.std() - 1.0) < 0.02 and abs(dv.mean()) < 0.03
    assert stats.kstest(dv.ravel(), "norm").pvalue > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_particle_satellites_are_members_and_chunking_free(blobs, device):
    """Satellites sit on particles of their own halo, with those particles' velocities;
    the mock depends on the seed only: the same for another chunking of the snapshot (its
    chunks on ``device``: CuPy chunks are read on the host), different for another
    seed."""
    snap, res = blobs
    p = dict(PARAMS, logMmin=13.0, logM0=12.5, logM1=13.5)
    gal = populate_hod(res, params=p, seed=5, snapshot=snap)
    host = gal.field("host_id").compute()
    sat = ~gal.field("is_central").compute()
    assert sat.sum() > 50
    labels = res.labels.compute()
    ppos, pvel = snap.pos.compute(), snap.vel.compute()
    gpos, gvel = gal.pos.compute(), gal.vel.compute()
    for i in np.flatnonzero(sat):
        members = np.flatnonzero(labels == host[i])
        j = members[np.argmin(np.abs(ppos[members] - gpos[i]).sum(axis=1))]
        assert np.array_equal(ppos[j], gpos[i]) and np.array_equal(pvel[j], gvel[i])
    again = populate_hod(res, params=p, seed=5, snapshot=snap.rechunk(1500).to_device(device))
    assert np.array_equal(again.pos.compute(), gpos)
    assert np.array_equal(again.field("host_id").compute(), host)
    other = populate_hod(res, params=p, seed=6, snapshot=snap)
    assert not (other.n_particles == gal.n_particles
                and np.array_equal(other.pos.compute(), gpos))
    assert gal.provenance["mass_definition"] == "mass"
    assert gal.scale_factor == snap.scale_factor and gal.cosmology == snap.cosmology


def test_particle_satellites_with_members_spread_over_chunks(blobs):
    """The particles (and labels) shuffled, so every halo's members lie in many chunks:
    each satellite is still a particle of its own halo, and the halos' occupations are
    those of the unshuffled snapshot (the same per-block draws)."""
    from cosmo_dask.halos import HaloResult

    snap, res = blobs
    perm = np.random.default_rng(0).permutation(snap.n_particles)
    pos, vel = snap.pos.compute()[perm], snap.vel.compute()[perm]
    labels = res.labels.compute()[perm]
    shuffled = Snapshot.from_arrays(pos, vel, box_size=snap.box_size, chunks=1000,
                                    particle_mass=snap.particle_mass,
                                    scale_factor=snap.scale_factor, cosmology=snap.cosmology,
                                    units=snap.units)
    p = dict(PARAMS, logMmin=13.0, logM0=12.5, logM1=13.5)
    gal = populate_hod(HaloResult(da.from_array(labels, chunks=1000), res.catalog),
                       params=p, seed=5, snapshot=shuffled)
    ref = populate_hod(res, params=p, seed=5, snapshot=snap)
    host = gal.field("host_id").compute()
    np.testing.assert_array_equal(host, ref.field("host_id").compute())
    gpos = gal.pos.compute()
    for i in np.flatnonzero(~gal.field("is_central").compute()):
        assert np.any(np.all(pos[labels == host[i]] == gpos[i], axis=1))


def test_fof_mass_nfw_needs_and_uses_the_snapshot(blobs):
    """With the FOF mass, NFW radii are R_200m of that mass (Omega_m from the snapshot):
    every satellite lies within it of its centre."""
    snap, res = blobs
    gal = populate_hod(res, params=PARAMS, seed=1, satellites="nfw", snapshot=snap)
    host = gal.field("host_id").compute()
    sat = ~gal.field("is_central").compute()
    mass = hod_masses(res)[0]
    r200m = np.cbrt(3 * mass / (4 * np.pi * 200 * 0.3 * 2.775366e11))
    d = gal.pos.compute()[sat] - res.catalog.mbp_position.values[host[sat]]
    d -= 60.0 * np.round(d / 60.0)
    assert np.all(np.linalg.norm(d, axis=1) <= r200m[host[sat]] * (1 + 1e-6))
    with pytest.raises(ParameterError, match="Omega_m"):
        populate_hod(res.catalog, satellites="nfw",
                     snapshot=Snapshot(snap.arrays, {**snap.attrs, "cosmology": None}))


@pytest.mark.parametrize("kwargs, message", [
    ({"params": {"sigma_logM": 0.0}}, "sigma_logM must be > 0"),
    ({"params": {"alpha": -0.5}}, "alpha must be >= 0"),
    ({"params": {"logM1": float("nan")}}, "logM1 must be a finite number"),
    ({"params": {"logM1": -30.0}}, "logM1 = -30 is outside"),
    ({"params": {"logMcut": 12.0}}, "unknown zheng07 parameter 'logMcut'"),
    ({"model": "leauthaud11"}, "unknown model 'leauthaud11'"),
    ({"satellites": "sph"}, "satellites must be one of"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"mass": "M_500c"}, "mass must be one of"),
])
def test_bad_parameters_one_line_before_work(many_halos, kwargs, message):
    with pytest.raises(ParameterError, match=message) as err:
        populate_hod(many_halos, **{"satellites": "nfw", **kwargs})
    assert "\n" not in str(err.value)


def test_particles_without_members_names_nfw(many_halos):
    with pytest.raises(ParameterError, match="use satellites='nfw'") as err:
        populate_hod(many_halos, satellites="particles")
    assert "\n" not in str(err.value)


def test_wp_against_halotools_on_the_same_halos():
    """wp(rp) of our NFW mock against halotools' Zheng07 mock (modulate_with_cenocc,
    NFW satellites at the same concentrations and radii) on the same clustered halo
    catalog: per rp bin the means over 4 seeds each agree within 4 standard errors of
    the difference (the errors: the seed-to-seed scatter of each, over sqrt(4))."""
    pytest.importorskip("halotools")
    from tests.support.hod import halotools_wp, halotools_zheng07

    box = 150.0
    ds = synthetic_catalog(8000, box, seed=1, log_m=(11.5, 14.5), clusters=800)
    rp = np.logspace(-1, 1.2, 9)
    ours, theirs = [], []
    for seed in range(4):
        gal = populate_hod(ds, params=PARAMS, satellites="nfw", seed=seed)
        ours.append(halotools_wp(gal.pos.compute(), box, rp, 30.0))
        pos = halotools_zheng07(ds.center_of_mass.values, ds.velocity.values,
                                ds.M_200c.values, ds.R_200c.values, ds.c_nfw_fit.values, box,
                                PARAMS, seed=seed + 100)
        theirs.append(halotools_wp(pos, box, rp, 30.0))
    ours, theirs = np.array(ours), np.array(theirs)
    err = np.sqrt(ours.var(axis=0, ddof=1) / 4 + theirs.var(axis=0, ddof=1) / 4)
    z = (ours.mean(0) - theirs.mean(0)) / err
    assert np.all(np.abs(z) < 4), z
    assert np.all(ours.mean(0)[:4] > 10)  # the one-halo term is measured, not noise


def test_mock_is_a_snapshot_the_statistics_take(tmp_path):
    """The mock is a Snapshot: power_spectrum takes it (galaxies counted, shot noise
    V / N) and its store round-trips with the fields and provenance."""
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.store.snapshot import open_snapshot

    ds = synthetic_catalog(2000, 200.0, seed=1, log_m=(11.5, 14.5), clusters=200)
    gal = populate_hod(ds, params=PARAMS, satellites="nfw", seed=2)
    pk = power_spectrum(gal, n_mesh=16)
    assert float(pk["shot_noise"]) == pytest.approx(200.0**3 / gal.n_particles, rel=1e-12)
    back = open_snapshot(gal.to_zarr(tmp_path / "gal.zarr"))
    np.testing.assert_array_equal(back.field("host_id").compute(),
                                  gal.field("host_id").compute())
    assert back.provenance["params"] == PARAMS and back.provenance["seed"] == 2
