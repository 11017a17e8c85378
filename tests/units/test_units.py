"""The one unit system (cosmo_dask.units on astropy.units): conversions and G against
independent numbers; Snapshot.to_units; the same snapshot in kpc/h and in Mpc/h gives the
same FOF partition, mass function and P(k) once converted (issue 16's equivalence)."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from cosmo_dask import units
from cosmo_dask.core.errors import ParameterError

KPC_M = 3.0856775814913673e19  # IAU 2012: 1 pc = 648000/pi au, au = 149597870700 m
GM_SUN = 1.3271244e20  # m^3 s^-2, IAU 2015 nominal solar mass parameter


def test_factors_against_definitions():
    assert units.factor("kpc/h", "Mpc/h", "length") == pytest.approx(1e-3, rel=1e-15)
    # 1 Mpc/h is 1/h Mpc
    assert units.factor("Mpc/h", "kpc", "length", h=0.7) == pytest.approx(1e3 / 0.7, rel=1e-15)
    assert units.factor("kpc", "Mpc/h", "length", h=0.7) == pytest.approx(0.7e-3, rel=1e-15)
    assert units.factor("1e10 Msun/h", "Msun/h", "mass") == pytest.approx(1e10, rel=1e-15)
    assert units.factor("3.085678e24 cm/h", "Mpc/h", "length") == pytest.approx(
        3.085678e24 / (KPC_M * 1e5), rel=1e-12)
    assert units.factor("km/s (peculiar)", "km/s", "velocity") == 1.0
    assert units.factor("N-body length", "N-body length") == 1.0


def test_g_from_the_solar_mass_parameter():
    # G Msun in kpc (km/s)^2: GM_sun / (m per kpc) / (m^2/s^2 per (km/s)^2)
    g = GM_SUN / KPC_M / 1e6 * 1e10
    want = {"kpc/h": g, "Mpc/h": g / 1e3}
    for length, value in want.items():
        got = units.gravitational_constant({"length": length, "velocity": "km/s (peculiar)",
                                            "mass": "1e10 Msun/h"})
        assert got == pytest.approx(value, rel=1e-9)
    # h powers that do not cancel need h
    mixed = {"length": "kpc", "velocity": "km/s", "mass": "1e10 Msun/h"}
    assert units.gravitational_constant(mixed) is None
    assert units.gravitational_constant(mixed, h=0.7) == pytest.approx(g / 0.7, rel=1e-9)
    assert units.gravitational_constant({"length": "box units", "velocity": "box units",
                                         "mass": "total mass 1"}) is None


@pytest.mark.parametrize("old, new, quantity, match", [
    ("km/s", "kpc", "length", "not a unit of length"),
    ("kpc/h", "kpc", "length", "needs the Hubble parameter h"),
    ("N-body length", "kpc", "length", "no physical unit"),
])
def test_conversions_that_cannot_be_made_say_why(old, new, quantity, match):
    with pytest.raises(ParameterError, match=match):
        units.factor(old, new, quantity)


def _zeldovich():
    from cosmo_dask.models import zeldovich

    return zeldovich(32, box_size=64.0, redshift=0.0, seed=7)


def test_to_units_converts_everything_together():
    snap = _zeldovich()
    kpc = snap.to_units(length="kpc/h", mass="Msun/h")
    assert kpc.units == {"length": "kpc/h", "velocity": "km/s (peculiar)", "mass": "Msun/h"}
    assert kpc.box_size == pytest.approx(64e3, rel=1e-15)
    assert kpc.particle_mass == pytest.approx(snap.particle_mass * 1e10, rel=1e-15)
    # G follows the units: the one astropy gives for the new set
    assert kpc.G == pytest.approx(units.gravitational_constant(kpc.units), rel=1e-12)
    assert kpc.G == pytest.approx(snap.G * 1e3 / 1e10, rel=1e-12)
    np.testing.assert_allclose(kpc.pos.compute(), snap.pos.compute() * 1e3, rtol=1e-15)
    np.testing.assert_array_equal(kpc.vel.compute(), snap.vel.compute())
    back = kpc.to_units(length="Mpc/h", mass="1e10 Msun/h")
    np.testing.assert_allclose(back.pos.compute(), snap.pos.compute(), rtol=1e-14, atol=1e-13)
    assert back.validate(full=True).problems == []
    # plain units with the cosmology's h
    mpc = snap.to_units(length="Mpc")
    assert mpc.box_size == pytest.approx(64.0 / snap.cosmology["h"], rel=1e-15)


def test_to_units_needs_units():
    from cosmo_dask import Snapshot

    snap = Snapshot.from_arrays(np.random.default_rng(0).random((10, 3)), box_size=1.0,
                                particle_mass=1.0)
    with pytest.raises(ParameterError, match="states no units"):
        snap.to_units(length="kpc")


def test_kpc_and_mpc_give_the_same_halos_mass_function_and_power():
    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.halos import fof
    from cosmo_dask.halos.mass_functions import mass_function

    mpc = _zeldovich()
    kpc = mpc.to_units(length="kpc/h")
    with dask.config.set(scheduler="threads"):
        res = {name: fof(s, 0.2, min_members=5) for name, s in (("mpc", mpc), ("kpc", kpc))}
        labels = {k: np.asarray(r.labels.compute()) for k, r in res.items()}
        pk = {name: power_spectrum(s, n_mesh=32) for name, s in (("mpc", mpc), ("kpc", kpc))}
    np.testing.assert_array_equal(labels["kpc"], labels["mpc"])  # identical partitions
    assert res["mpc"].n_halos > 10
    mf = {k: mass_function(r.catalog, 8, None) for k, r in res.items()}
    assert mf["kpc"]["dn_dlnM"].attrs["units"] == "h3 / kpc3"
    assert mf["mpc"]["dn_dlnM"].attrs["units"] == "h3 / Mpc3"
    to_mpc3 = units.factor("kpc/h", "Mpc/h", "length") ** 3
    np.testing.assert_allclose(mf["kpc"]["dn_dlnM"].values / to_mpc3, mf["mpc"]["dn_dlnM"].values,
                               rtol=1e-10)
    np.testing.assert_allclose(mf["kpc"]["mass"].values, mf["mpc"]["mass"].values, rtol=1e-12)
    # P(k): k in h/kpc and (kpc/h)^3, converted to h/Mpc and (Mpc/h)^3
    assert pk["kpc"]["k"].attrs["units"] == "h / kpc"
    assert pk["mpc"]["k"].attrs["units"] == "h / Mpc"
    # the strings are units the unit system reads: the factors follow from them
    assert units.factor(mf["kpc"]["dn_dlnM"].attrs["units"],
                        mf["mpc"]["dn_dlnM"].attrs["units"]) == pytest.approx(1e9, rel=1e-14)
    assert units.factor(pk["kpc"]["power"].attrs["units"],
                        pk["mpc"]["power"].attrs["units"]) == pytest.approx(1e-9, rel=1e-14)
    np.testing.assert_allclose(pk["kpc"]["k"].values * 1e3, pk["mpc"]["k"].values, rtol=1e-10)
    np.testing.assert_allclose(pk["kpc"]["power"].values * 1e-9, pk["mpc"]["power"].values,
                               rtol=1e-10)


def _gadget_file(path, snap):
    """A one-file Gadget HDF5 snapshot in kpc/h of ``snap`` (Mpc/h): no sigma8, no n_s in
    its header, as Gadget writes them."""
    h5py = pytest.importorskip("h5py")
    pos = snap.pos.compute() * 1e3
    n = len(pos)
    with h5py.File(path, "w") as f:
        h = f.create_group("Header")
        h.attrs.update({"NumPart_ThisFile": [0, n, 0, 0, 0, 0],
                        "NumPart_Total": [0, n, 0, 0, 0, 0], "NumPart_Total_HighWord": [0] * 6,
                        "MassTable": [0, snap.particle_mass, 0, 0, 0, 0],
                        "NumFilesPerSnapshot": 1, "BoxSize": snap.box_size * 1e3, "Time": 1.0,
                        "Redshift": 0.0, "Omega0": 0.3111, "OmegaLambda": 0.6889,
                        "OmegaBaryon": 0.049, "HubbleParam": 0.6766})
        g = f.create_group("PartType1")
        g["Coordinates"] = pos
        g["Velocities"] = snap.vel.compute()
        g["ParticleIDs"] = np.arange(n, dtype=np.uint64)
    return path


@pytest.mark.parametrize("command", ["halos", "power"])
def test_plots_without_sigma8_show_the_measurement_and_say_what_is_missing(
        tmp_path, capsys, command):
    from cosmo_dask.cli import main

    gadget = _gadget_file(tmp_path / "snap_000.hdf5", _zeldovich())
    store = tmp_path / "g.zarr"
    assert main(["--cpu", "--workers", "1", "convert", "gadget", str(gadget), str(store)]) == 0
    extra = ([str(tmp_path / "h.zarr"), "--min-members", "5"] if command == "halos"
             else ["--n-mesh", "32"])
    capsys.readouterr()
    png = tmp_path / "a.png"
    assert main(["--cpu", "--workers", "1", command, str(store), *extra,
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "the theory curve needs sigma8, n_s" in out and png.stat().st_size > 0
    assert "--sigma8 VALUE --cosmology n_s=VALUE" in out
    # given the missing parameters, the theory curve is drawn (no such line)
    png2 = tmp_path / "b.png"
    if command == "halos":
        extra = [str(tmp_path / "h2.zarr"), "--min-members", "5"]
    assert main(["--cpu", "--workers", "1", command, str(store), *extra, "--plot", str(png2),
                 "--sigma8", "0.81", "--cosmology", "n_s=0.9665"]) == 0
    out = capsys.readouterr().out
    assert "theory curve needs" not in out and png2.stat().st_size > png.stat().st_size


def test_the_api_plot_without_sigma8_shows_the_measurement_and_warns(tmp_path):
    from cosmo_dask.halos.mass_functions import mass_function, plot_mass_function

    rng = np.random.default_rng(2)
    ds = mass_function(10 ** rng.uniform(1, 3, 300), 6, 100.0)
    gadget_like = {"Omega_m": 0.31, "Omega_b": 0.049, "Omega_L": 0.69, "h": 0.68,
                   "sigma8": None, "n_s": None}
    with pytest.warns(UserWarning, match="the fits need sigma8, n_s"):
        ax = plot_mass_function(ds, cosmology=gadget_like, path=tmp_path / "m.png")
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["measured (300 halos)"]  # the measurement only
    full = plot_mass_function(ds, cosmology=dict(gadget_like, sigma8=0.81, n_s=0.96))
    assert sorted(full.get_legend_handles_labels()[1]) == [
        "Warren et al. 2006", "Watson et al. 2013 (FoF)", "measured (300 halos)"]
