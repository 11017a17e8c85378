"""HOD references: a synthetic halo catalog, and halotools' Zheng07 mock and wp on it.

Used by tests/halos/test_hod.py and benchmarks/halos/hod.py. halotools is imported only
inside the functions that need it.
"""

from __future__ import annotations

import numpy as np
import xarray as xr


def synthetic_catalog(n_halos: int, box: float, *, seed: int = 0, log_m=(11.0, 15.0),
                      conc=(4.0, 12.0), clusters: int | None = None,
                      cluster_sigma: float = 3.0) -> xr.Dataset:
    """A catalog Dataset as ``fof`` + ``--so 200c`` write it: ``M_200c`` (Msun/h, log-uniform
    in ``log_m``), ``R_200c`` (Mpc/h, from 200 rho_crit,0 at a = 1), ``c_nfw_fit``
    (uniform in ``conc``), ``center_of_mass`` (uniform, or Gaussian clumps of
    ``cluster_sigma`` Mpc/h around ``clusters`` uniform points), ``velocity`` (km/s,
    Gaussian 300 per axis), ``n_members``; attrs ``box_size``, units, ``so_scale_factor``
    1."""
    from cosmo_dask.halos.hod import RHO_CRIT0

    rng = np.random.default_rng(seed)
    mass = 10.0 ** rng.uniform(*log_m, n_halos)
    radius = np.cbrt(3.0 * mass / (4.0 * np.pi * 200.0 * RHO_CRIT0))
    if clusters:
        parent = rng.uniform(0.0, box, (clusters, 3))
        pos = parent[rng.integers(0, clusters, n_halos)] + rng.normal(0.0, cluster_sigma,
                                                                     (n_halos, 3))
        pos = np.mod(pos, box)
    else:
        pos = rng.uniform(0.0, box, (n_halos, 3))
    ds = xr.Dataset(
        {"M_200c": ("halo", mass, {"units": "Msun/h"}),
         "R_200c": ("halo", radius, {"units": "Mpc/h"}),
         "c_nfw_fit": ("halo", rng.uniform(*conc, n_halos), {"units": "1"}),
         "center_of_mass": (("halo", "axis"), pos, {"units": "Mpc/h"}),
         "velocity": (("halo", "axis"), rng.normal(0.0, 300.0, (n_halos, 3)),
                      {"units": "km/s"}),
         "n_members": ("halo", np.full(n_halos, 100, np.int64), {"units": "1"})},
        coords={"halo": np.arange(n_halos)},
        attrs={"box_size": float(box), "length_unit": "Mpc/h", "mass_unit": "Msun/h",
               "so_scale_factor": 1.0})
    return ds


def halotools_zheng07(centres, velocity, mass, radius, conc, box: float, params: dict,
                      seed: int, redshift: float = 0.0) -> np.ndarray:
    """Galaxy positions (Mpc/h) of halotools' ``zheng07`` model (centrals modulating the
    satellites, as Zheng et al. 2007 write it; NFW satellites at ``conc`` inside
    ``radius``) populated on the halos given (masses Msun/h as ``halo_mvir``, radii Mpc/h
    as ``halo_rvir``)."""
    from halotools.empirical_models import PrebuiltHodModelFactory
    from halotools.sim_manager import UserSuppliedHaloCatalog

    n = len(mass)
    ids = np.arange(1, n + 1)
    halocat = UserSuppliedHaloCatalog(
        redshift=redshift, Lbox=box, particle_mass=1.0,
        halo_x=centres[:, 0], halo_y=centres[:, 1], halo_z=centres[:, 2],
        halo_vx=velocity[:, 0], halo_vy=velocity[:, 1], halo_vz=velocity[:, 2],
        halo_id=ids, halo_hostid=ids, halo_upid=np.full(n, -1), halo_mvir=mass,
        halo_rvir=radius, halo_nfw_conc=conc)
    model = PrebuiltHodModelFactory("zheng07", threshold=-20, redshift=redshift,
                                    modulate_with_cenocc=True)
    model.param_dict.update(params)
    model.populate_mock(halocat, seed=seed, Num_ptcl_requirement=0)
    gal = model.mock.galaxy_table
    pos = np.stack([np.asarray(gal[k], np.float64) for k in ("x", "y", "z")], axis=1)
    return np.mod(pos, box)


def halotools_wp(pos, box: float, rp_bins, pi_max: float) -> np.ndarray:
    """halotools' projected correlation function wp(rp) of positions in a periodic box
    (line of sight z)."""
    from halotools.mock_observables import wp

    return np.asarray(wp(np.asarray(pos, np.float64), rp_bins, pi_max, period=box,
                         num_threads=1))
