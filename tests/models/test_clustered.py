"""The clustered synthetic box (models.halo_blobs): chunk independence, box, halo recovery."""

import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.models import halo_blobs
from cosmo_dask.models.clustered import halo_table


def test_particles_do_not_depend_on_chunks_and_stay_in_the_box():
    a = halo_blobs(50_000, box_size=50.0, n_halos=40, seed=3, precision="float64", chunks=7001)
    b = halo_blobs(50_000, box_size=50.0, n_halos=40, seed=3, precision="float64", chunks=50_000)
    pa, pb = a.pos.compute(), b.pos.compute()
    np.testing.assert_array_equal(pa, pb)
    np.testing.assert_array_equal(a.vel.compute(), b.vel.compute())
    assert pa.min() >= 0.0 and pa.max() < 50.0
    g_mpc = 1.3271244e20 / 3.0856775814913673e22 / 1e6 * 1e10  # G from IAU GM_sun
    rho_crit = 3 * 100.0**2 / (8 * np.pi * g_mpc)
    assert a.particle_mass == pytest.approx(a.cosmology["Omega_m"] * rho_crit * 50.0**3 / 5e4,
                                            rel=1e-9)


def test_halo_members_sit_inside_their_truncated_plummer_spheres():
    n, box = 40_000, 40.0
    snap = halo_blobs(n, box_size=box, n_halos=20, seed=5, precision="float64")
    table = halo_table(n, n_halos=20, halo_fraction=0.7, slope=-1.9, min_members=30,
                       box_size=box, particle_mass=snap.particle_mass, seed=5)
    pos = snap.pos.compute()
    counts = np.diff(table["first"])
    assert counts.sum() == pytest.approx(0.7 * n, rel=0.01)
    for h in (0, 7, 19):
        members = pos[table["first"][h]:table["first"][h + 1]]
        d = (members - table["centre"][h] + box / 2) % box - box / 2  # periodic offsets
        r = np.sqrt((d * d).sum(axis=1))
        assert r.max() <= 10.0 * table["scale"][h] * (1 + 1e-12)
        # Plummer: half the (untruncated) mass inside 1.305 a; truncation at 10 a keeps 98.5%
        assert np.median(r) / table["scale"][h] == pytest.approx(1.305 * 0.99, rel=0.15)


def test_friends_of_friends_recovers_the_big_halos():
    from cosmo_dask.halos import fof

    n, box = 64**3 // 2, 80.0
    snap = halo_blobs(n, box_size=box, n_halos=100, seed=7, precision="float64")
    table = halo_table(n, n_halos=100, halo_fraction=0.7, slope=-1.9, min_members=30,
                       box_size=box, particle_mass=snap.particle_mass, seed=7)
    labels = fof(snap, 0.2, min_members=20, centers=()).labels.compute()
    for h in range(5):  # the five largest halos: one FOF group holds most of each
        own = labels[table["first"][h]:table["first"][h + 1]]
        best = np.bincount(own[own >= 0]).max()
        assert best / own.size > 0.6


def test_bad_parameters_are_clear_errors():
    with pytest.raises(ParameterError, match="n_halos"):
        halo_blobs(10, box_size=1.0, n_halos=20)
    with pytest.raises(ParameterError, match="slope"):
        halo_blobs(1000, box_size=1.0, slope=-0.5)
    with pytest.raises(ParameterError, match="halo_fraction"):
        halo_blobs(1000, box_size=1.0, halo_fraction=1.5)
