"""``cosmo-dask halos --so``: spherical-overdensity variables written into the halo catalog,
equal to the Python API on the same snapshot; bad ``--so`` input exits 2 and writes
nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.cli import main
from cosmo_dask.cli.halos import SO_RENAMES, _so_center
from cosmo_dask.models.zeldovich_ics import G_COSMO, RHO_CRIT_1E10, ZELDOVICH_UNITS

BOX = 50.0
A = 0.8  # z = 0.25
COSMO = {"Omega_m": 0.3, "Omega_b": 0.05, "Omega_L": 0.7, "h": 0.7, "sigma8": 0.8,
         "n_s": 0.96}
M200 = 1.0e4  # 1e10 Msun/h, M_200c at z = 0.25
E2 = COSMO["Omega_m"] / A**3 + COSMO["Omega_L"]
# comoving R_200c: M = 200 rho_c(z) 4/3 pi (a R)^3
R200 = (3 * M200 / (4 * math.pi * 200 * RHO_CRIT_1E10 * E2)) ** (1 / 3) / A
N200 = 5000
CENTRES = np.array([[12.0, 15.0, 20.0], [35.0, 30.0, 28.0]])
CONCS = (5.0, 9.0)


def _f(x):
    return np.log1p(x) - x / (1 + x)


def _snapshot(rng, **over):
    parts = []
    for c, centre in zip(CONCS, CENTRES, strict=True):
        x_t = 2.0 * c  # truncated at 2 R200
        n = int(round(N200 * _f(x_t) / _f(c)))
        grid = np.geomspace(1e-6, x_t, 20001)
        x = np.interp(rng.random(n) * _f(x_t), _f(grid), grid)
        mu, phi = rng.uniform(-1, 1, n), rng.uniform(0, 2 * np.pi, n)
        s = np.sqrt(1 - mu**2)
        d = (x * R200 / c)[:, None] * np.stack([s * np.cos(phi), s * np.sin(phi), mu], 1)
        parts.append(centre + d)
    parts.append(rng.random((2000, 3)) * BOX)
    pos = np.mod(np.concatenate(parts), BOX)
    pos[pos >= BOX] = 0.0
    kw = dict(box_size=BOX, particle_mass=M200 / N200, scale_factor=A, cosmology=COSMO,
              units=dict(ZELDOVICH_UNITS), G=G_COSMO, chunks=6000)
    kw.update(over)
    return Snapshot.from_arrays(pos, np.zeros_like(pos), **kw)


@pytest.fixture(scope="module")
def snap_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("so") / "nfw.zarr"
    _snapshot(np.random.default_rng(3)).to_zarr(path)
    return path


HALOS = ["--linking-length", "0.2", "--min-members", "1000"]


def test_so_writes_masses_with_units_equal_to_the_api(snap_path, tmp_path, capsys):
    from cosmo_dask import open_snapshot
    from cosmo_dask.halos import fof, open_catalog, spherical_overdensity

    out = tmp_path / "h.zarr"
    assert main(["--cpu", "--workers", "1", "halos", str(snap_path), str(out), *HALOS,
                 "--so", "200c,200m,vir"]) == 0
    said = capsys.readouterr().out
    assert "spherical overdensity: 2/2 with M_200c" in said and "median c (NFW fit)" in said
    assert "(centre mbp)" in said
    back = open_catalog(out)
    cat = back.catalog
    assert back.n_halos == 2
    for d in ("200c", "200m", "vir"):
        assert cat[f"M_{d}"].attrs["units"] == "1e10 Msun/h"
        assert cat[f"R_{d}"].attrs["units"] == "Mpc/h"
    assert cat["V_max"].attrs["units"] == "km/s (peculiar)"
    assert "R_Vmax" in cat and "R_max" not in cat and "r_max" in cat  # FOF extent kept
    assert cat["density_profile"].dims == ("halo", "r_bin")
    assert cat["r_profile"].attrs["units"] == "Mpc/h"
    assert cat.attrs["so_center"] == "mbp" and list(cat.attrs["so_deltas"]) == [
        "200c", "200m", "vir"]
    assert cat.attrs["so_redshift"] == pytest.approx(0.25)
    assert back.parameters["so"] == ["200c", "200m", "vir"]
    # the sampled haloes: M_200c = 1e4 within 3 % (5000 particles, mbp centre)
    order = np.argsort(cat["center_of_mass"].values[:, 0])
    np.testing.assert_allclose(cat["M_200c"].values, M200, rtol=0.03)
    np.testing.assert_allclose(cat["c_nfw_fit"].values[order], CONCS, rtol=0.15)
    # the Python API on the same snapshot gives the same numbers
    snap = open_snapshot(snap_path)
    ref_cat = fof(snap, 0.2, min_members=1000, centers=("mbp", "mcp")).catalog
    ref = spherical_overdensity(snap, ref_cat, ("200c", "200m", "vir"), center="mbp")
    ref = ref.rename({k: v for k, v in SO_RENAMES.items() if k in ref.variables})
    for name in list(ref.data_vars) + ["r_profile"]:
        np.testing.assert_allclose(cat[name].values, ref[name].values, rtol=1e-12,
                                   equal_nan=True, err_msg=name)
        assert cat[name].attrs["units"] == ref[name].attrs["units"]


def test_so_center_choice():
    """mbp when asked for (mbp or mbp_grid), else mcp, else mbp is added."""
    assert _so_center(("mbp", "mcp")) == ("mbp", ("mbp", "mcp"))
    assert _so_center(("mbp_grid",)) == ("mbp", ("mbp_grid",))
    assert _so_center(("mcp",)) == ("mcp", ("mcp",))
    assert _so_center(()) == ("mbp", ("mbp",))


@pytest.mark.parametrize("so, message", [
    ("200c,500x", "--so: unknown overdensity '500x'; use a comma list of 200c, 200m, vir"),
    ("", "--so '': give a comma list of 200c, 200m, vir"),
    ("200c,,vir", "give a comma list"),
    ("200c,200c", "repeated delta"),
])
def test_bad_so_exits_2_and_writes_nothing(snap_path, tmp_path, capsys, so, message):
    out = tmp_path / "h.zarr"
    code = main(["--cpu", "--workers", "1", "halos", str(snap_path), str(out), *HALOS,
                 "--so", so])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err, err
    assert err.startswith("cosmo-dask: error:")
    assert not out.exists()


@pytest.mark.parametrize("drop, message", [
    ("box_size", "--so: needs a periodic snapshot"),
    ("cosmology", "--so: the snapshot has no cosmology"),
])
def test_so_needs_box_and_cosmology(tmp_path, capsys, drop, message):
    path = tmp_path / "s.zarr"
    _snapshot(np.random.default_rng(1), **{drop: None}).to_zarr(path)
    out = tmp_path / "h.zarr"
    code = main(["--cpu", "--workers", "1", "halos", str(path), str(out), "--absolute",
                 "--linking-length", "0.3", "--so", "200c"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err, err
    assert not out.exists()
