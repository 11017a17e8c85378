"""Tests of the halo mass function (cosmo_dask.halos.mass_function)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import xarray as xr
from scipy import integrate

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos.mass_functions import (
    dlnsigma_dlnM,
    mass_function,
    multiplicity_warren2006,
    multiplicity_watson2013_fof,
    plot_mass_function,
    sigma_of_mass,
    theory_mass_function,
)
from cosmo_dask.models import Cosmology
from cosmo_dask.models.zeldovich_ics import RHO_CRIT_1E10

OTHER = {"Omega_m": 0.25, "Omega_b": 0.04, "h": 0.72, "sigma8": 0.75, "n_s": 1.0}


def _masses(n=2000, seed=1):
    rng = np.random.default_rng(seed)
    return 10.0 ** rng.uniform(1.0, 5.0, n)  # 1e11 .. 1e15 Msun/h


def _rho_m(cosmo):
    return cosmo.Omega_m * RHO_CRIT_1E10


# --------------------------------------------------------------------------- measured
def test_counts_and_density_match_histogram():
    m = _masses()
    box = 250.0
    ds = mass_function(m, 12, box)
    edges = np.geomspace(m.min(), m.max(), 13)
    ref, _ = np.histogram(m, bins=edges)
    np.testing.assert_array_equal(ds["counts"].values, ref)
    assert ds["counts"].sum() == m.size  # smallest and largest halos both counted
    assert ds.sizes == {"mass_bin": 12}
    np.testing.assert_allclose(ds["mass_lo"].values, edges[:-1], rtol=1e-12)
    np.testing.assert_allclose(ds["mass_hi"].values, edges[1:], rtol=1e-12)
    np.testing.assert_allclose(ds["mass"].values, np.sqrt(edges[:-1] * edges[1:]), rtol=1e-12)
    dlnm = np.log(edges[1:] / edges[:-1])
    vol = box**3
    np.testing.assert_allclose(ds["dn_dlnM"].values, ref / vol / dlnm, rtol=1e-12)
    np.testing.assert_allclose(ds["dn_dlnM_error"].values, np.sqrt(ref) / vol / dlnm, rtol=1e-12)
    assert ds.attrs["volume"] == pytest.approx(vol)
    assert ds["dn_dlnM"].attrs["units"] == "h3 / Mpc3"
    assert ds["mass"].attrs["units"] == "1e10 Msun/h"


def test_explicit_edges_volume_and_outside():
    m = _masses()
    edges = np.array([30.0, 100.0, 1000.0, 3000.0])
    ds = mass_function(m, edges, None, volume=1.0e6)
    ref, _ = np.histogram(m, bins=edges)
    np.testing.assert_array_equal(ds["counts"].values, ref)
    np.testing.assert_allclose(
        ds["dn_dlnM"].values, ref / 1.0e6 / np.log(edges[1:] / edges[:-1]), rtol=1e-12
    )
    assert ds.attrs["n_outside_bins"] == m.size - ref.sum() > 0
    # volume overrides box_size
    ds2 = mass_function(m, edges, 10.0, volume=1.0e6)
    np.testing.assert_allclose(ds2["dn_dlnM"].values, ds["dn_dlnM"].values)


def test_dataset_input():
    m = _masses(300)
    cat = xr.Dataset({"mass": ("halo", m), "n_members": ("halo", np.arange(300))},
                     attrs={"box_size": 100.0})
    ds = mass_function(cat, 5, 100.0)
    ref = mass_function(m, 5, 100.0)
    xr.testing.assert_identical(ds, ref)
    # box_size may come from the catalog's attributes
    xr.testing.assert_identical(mass_function(cat, 5, None), ref)


def test_empty_input():
    ds = mass_function(np.array([]), 4, 100.0)
    assert ds.sizes["mass_bin"] == 4
    assert np.all(ds["counts"].values == 0)
    assert np.all(ds["dn_dlnM"].values == 0) and np.all(ds["dn_dlnM_error"].values == 0)
    ds = mass_function([], [1.0, 10.0, 100.0], 100.0)
    np.testing.assert_array_equal(ds["counts"].values, [0, 0])
    one = mass_function([5.0, 5.0], 3, 100.0)
    assert one["counts"].sum() == 2


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([1.0, 2.0], 3, 0.0), {}, "box_size"),
        (([1.0, 2.0], 3, -5.0), {}, "box_size"),
        (([1.0, 2.0], 3, None), {}, "box_size"),
        (([1.0, 2.0], 3, 10.0), {"volume": 0.0}, "volume"),
        (([1.0, 2.0], 3, 10.0), {"volume": float("nan")}, "volume"),
        (([1.0, 2.0], 0, 10.0), {}, "bins"),
        (([1.0, 2.0], -2, 10.0), {}, "bins"),
        (([1.0, 2.0], True, 10.0), {}, "bins"),
        (([1.0, 2.0], [1.0], 10.0), {}, "edges"),
        (([1.0, 2.0], [1.0, 0.5, 3.0], 10.0), {}, "increasing"),
        (([1.0, 2.0], [0.0, 3.0], 10.0), {}, "> 0"),
        (([1.0, 0.0], 3, 10.0), {}, "masses must be > 0"),
        (([1.0, -2.0], 3, 10.0), {}, "masses must be > 0"),
        (([1.0, np.nan], 3, 10.0), {}, "finite"),
        ((xr.Dataset({"m": ("halo", [1.0])}), 3, 10.0), {}, "'mass'"),
    ],
)
def test_bad_inputs(args, kwargs, match):
    with pytest.raises(ParameterError, match=match):
        mass_function(*args, **kwargs)


# --------------------------------------------------------------------------- sigma(M)
@pytest.mark.parametrize("cosmology", [None, OTHER])
def test_sigma8_recovered(cosmology):
    cosmo = Cosmology.coerce(cosmology)
    m8 = 4.0 / 3.0 * math.pi * _rho_m(cosmo) * 8.0**3
    assert sigma_of_mass(m8, cosmology) == pytest.approx(cosmo.sigma8, abs=1e-6)


def test_sigma_monotone_and_matches_cosmology():
    cosmo = Cosmology()
    m = np.geomspace(1e-6, 1e8, 300)
    s = sigma_of_mass(m)
    assert s.shape == m.shape
    assert np.all(np.diff(s) < 0)
    radius = np.cbrt(3.0 * m[[0, 150, 299]] / (4.0 * math.pi * _rho_m(cosmo)))
    ref = [cosmo.sigma(r) for r in radius]
    np.testing.assert_allclose(s[[0, 150, 299]], ref, rtol=1e-6)
    # linear growth scales sigma
    d = float(cosmo.growth_factor(0.5))
    np.testing.assert_allclose(sigma_of_mass(m[::50], redshift=1.0), d * s[::50], rtol=1e-12)


def test_slope_matches_finite_difference():
    m = np.array([1e-5, 1e-2, 1.0, 1e2, 1e4, 1e6])
    h = 1e-3
    s = sigma_of_mass(np.concatenate([m * math.exp(h), m * math.exp(-h)]))
    fd = (np.log(s[: m.size]) - np.log(s[m.size :])) / (2.0 * h)
    slope = dlnsigma_dlnM(m)
    assert np.all(slope < 0)
    np.testing.assert_allclose(slope, fd, rtol=1e-4)


def test_sigma_with_own_power_spectrum():
    """A callable, a table and a scaled spectrum: sigma follows the spectrum given."""
    cosmo = Cosmology()
    m = np.array([1.0, 1e2, 1e4, 1e5])  # 1e10 .. 1e15 Msun/h
    default = sigma_of_mass(m)
    # the cosmology's own spectrum as a callable: the same integral
    np.testing.assert_allclose(sigma_of_mass(m, power_spectrum=cosmo.power_spectrum), default,
                               rtol=1e-12)
    # P scaled by 4: sigma doubles, the slope and the multiplicity's argument follow
    np.testing.assert_allclose(
        sigma_of_mass(m, power_spectrum=lambda k: 4.0 * cosmo.power_spectrum(k)), 2 * default,
        rtol=1e-12)
    np.testing.assert_allclose(
        dlnsigma_dlnM(m, power_spectrum=lambda k: 4.0 * cosmo.power_spectrum(k)),
        dlnsigma_dlnM(m), rtol=1e-12)
    np.testing.assert_allclose(
        theory_mass_function(m, model="watson2013_fof",
                             power_spectrum=lambda k: 4.0 * cosmo.power_spectrum(k)),
        multiplicity_watson2013_fof(2 * default) * _rho_m(cosmo) / m
        * np.abs(dlnsigma_dlnM(m)), rtol=1e-10)


def test_sigma_from_table_file(tmp_path):
    """A (k, P) table is integrated over the k range it covers: a table of the default
    spectrum on 1e-4..20 h/Mpc gives sigma within 1e-4 from 1e12 Msun/h up (the modes
    beyond k = 20 h/Mpc it lacks add 6e-4 at 1e10 Msun/h)."""
    cosmo = Cosmology()
    k = np.geomspace(1e-4, 20.0, 2000)
    path = tmp_path / "pk.txt"
    np.savetxt(path, np.column_stack([k, cosmo.power_spectrum(k)]))
    m = np.array([1e2, 1e4, 1e5])
    np.testing.assert_allclose(sigma_of_mass(m, power_spectrum=str(path)), sigma_of_mass(m),
                               rtol=1e-4)
    low = sigma_of_mass(1.0, power_spectrum=str(path)) / sigma_of_mass(1.0)
    assert 1 - 1e-3 < low < 1  # only the missing high-k modes
    with pytest.raises(ParameterError, match="theory_mass_function: power_spectrum"):
        theory_mass_function(m, power_spectrum=str(tmp_path / "missing.txt"))


# --------------------------------------------------------------------------- fits
@pytest.mark.parametrize("s", [0.3, 0.7, 1.0, 1.686, 3.0])
def test_multiplicity_formulas(s):
    warren = 0.7234 * (1.0 / s**1.625 + 0.2538) * math.exp(-1.1982 / (s * s))
    watson = 0.282 * (math.pow(1.406 / s, 2.163) + 1.0) * math.exp(-1.210 / (s * s))
    assert multiplicity_warren2006(s) == pytest.approx(warren, rel=1e-12)
    assert multiplicity_watson2013_fof(s) == pytest.approx(watson, rel=1e-12)


def test_multiplicity_vectorised_and_literal():
    s = np.array([0.5, 1.0, 2.0])
    assert multiplicity_warren2006(s).shape == (3,)
    # sigma = 1: 0.7234 * 1.2538 * e^-1.1982 and 0.282 * (1.406^2.163 + 1) * e^-1.21
    assert multiplicity_warren2006(1.0) == pytest.approx(0.273675, rel=1e-5)
    assert multiplicity_watson2013_fof(1.0) == pytest.approx(0.259821, rel=1e-5)
    with pytest.raises(ParameterError):
        multiplicity_warren2006([1.0, -1.0])


def test_theory_mass_fraction_below_one():
    cosmo = Cosmology()
    lnm = np.linspace(math.log(1e-6), math.log(1e8), 801)
    m = np.exp(lnm)
    for model in ("warren2006", "watson2013_fof"):
        dn = theory_mass_function(m, model=model)
        assert dn.shape == m.shape and np.all(dn > 0)
        fraction = integrate.simpson(m * dn, x=lnm) / _rho_m(cosmo)  # ∫ M dn/dM dM / rho_m
        assert 0.5 < fraction < 1.0


def test_theory_definition_and_redshift():
    cosmo = Cosmology.coerce(OTHER)
    m = np.array([1.0, 1e3, 1e5])
    s = sigma_of_mass(m, OTHER, 0.5)
    h = 1e-3
    sp = sigma_of_mass(np.concatenate([m * math.exp(h), m * math.exp(-h)]), OTHER, 0.5)
    dlninv = -(np.log(sp[:3]) - np.log(sp[3:])) / (2.0 * h)
    expected = multiplicity_warren2006(s) * _rho_m(cosmo) / m * dlninv
    got = theory_mass_function(m, cosmology=OTHER, redshift=0.5)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    z0 = theory_mass_function(np.array([1e4, 1e5]))
    z1 = theory_mass_function(np.array([1e4, 1e5]), redshift=1.0)
    assert np.all(z1 < z0)
    assert z1[1] < 0.1 * z0[1]  # 1e15 Msun/h halos are far rarer at z = 1


def test_theory_bad_inputs():
    with pytest.raises(ParameterError, match="unknown model"):
        theory_mass_function(1.0, model="press_schechter")
    with pytest.raises(ParameterError, match="redshift"):
        theory_mass_function(1.0, redshift=-1.0)
    with pytest.raises(ParameterError, match="> 0"):
        sigma_of_mass([1.0, 0.0])


# --------------------------------------------------------------------------- plot
def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    ds = mass_function(_masses(), 10, 200.0)
    path = tmp_path / "hmf.png"
    ax = plot_mass_function(ds, path=path)
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.get_lines()) >= 2  # the two fits (plus error-bar lines)


def test_plot_on_given_axes_and_empty():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    out = plot_mass_function(mass_function([], 3, 100.0), fits=(), ax=ax)
    assert out is ax
    with pytest.raises(ParameterError, match="unknown fit"):
        plot_mass_function(mass_function([1.0], 3, 100.0), fits=("nope",), ax=ax)


def test_plot_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="plot"):
        plot_mass_function(mass_function([1.0], 3, 100.0))
