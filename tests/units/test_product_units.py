"""Every product carries ``units`` derived from its snapshot's units, and the numbers agree:
a product of a snapshot in kpc/h, m/s and Msun/h, converted with cosmo_dask.units.factor,
equals the product of the same snapshot in Mpc/h, km/s and 1e10 Msun/h."""

from __future__ import annotations

import astropy.constants as const
import astropy.units as u
import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.density import DensityOctree, open_density_octree, paint, pse_density
from cosmo_dask.density.mesh_store import open_mesh, write_mesh
from cosmo_dask.expansion import MEX, SCF
from cosmo_dask.expansion.output import open_expansion, write_expansion
from cosmo_dask.gravity import accelerations, open_gravity
from cosmo_dask.halos import fof, open_catalog
from cosmo_dask.models import halo_blobs, hernquist, zeldovich
from cosmo_dask.units import factor, gravitational_constant, parse
from cosmo_dask.units.products import DIMENSIONS, product_units

MPC = {"length": "Mpc/h", "velocity": "km/s (peculiar)", "mass": "1e10 Msun/h"}
KPC = {"length": "kpc/h", "velocity": "m/s", "mass": "Msun/h"}
RTOL = 1e-10

#: an astropy unit of each quantity's physical type
REFERENCE = {"length": u.m, "velocity": u.m / u.s, "mass": u.kg, "volume": u.m**3,
             "volume_squared": u.m**6, "number_density": u.m**-3, "inverse_length": 1 / u.m,
             "density": u.kg / u.m**3,
             "acceleration": u.m / u.s**2, "potential": u.m**2 / u.s**2,
             "specific_angular_momentum": u.m**2 / u.s,
             "gravitational_constant": u.m**3 / (u.kg * u.s**2), "dimensionless": u.one}


def _factors(new: dict, old: dict) -> dict[str, float]:
    """cosmo_dask.units.factor of each base quantity, ``new`` units to ``old``."""
    return {q: factor(new[q], old[q], q) for q in ("length", "velocity", "mass")}


def _kpc(snap: Snapshot) -> Snapshot:
    out = snap.to_units(**KPC)
    assert out.units == {**KPC, "velocity": "m/s (peculiar)"}
    return out


def _close(a, b, rtol=RTOL):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(b).max() if b.size else 1.0
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


# ----------------------------------------------------------------------------- the strings
def test_unit_strings_of_a_cosmological_snapshot():
    pu = product_units(MPC)
    assert pu == {
        "length": "Mpc/h", "velocity": "km/s (peculiar)", "mass": "1e10 Msun/h",
        "volume": "Mpc3 / h3", "volume_squared": "Mpc6 / h6",
        "number_density": "h3 / Mpc3", "inverse_length": "h / Mpc",
        "density": "1e+10 h2 Msun / Mpc3", "acceleration": "km2 h Mpc-1 s-2",
        "potential": "km2 / s2", "specific_angular_momentum": "Mpc km h-1 s-1",
        "gravitational_constant": "1e-10 km2 Mpc Msun-1 s-2", "dimensionless": "1"}
    assert product_units(pu) == pu  # already composed: returned as it is
    assert product_units({"length": "kpc/h", "velocity": "km/s", "mass": "1e10 Msun/h"})[
        "density"] == "1e+10 h2 Msun / kpc3"


def test_labels_and_g_one():
    nbody = {"length": "N-body length", "velocity": "N-body velocity", "mass": "N-body mass"}
    pu = product_units(nbody)
    assert pu["density"] == "N-body mass / N-body length^3"
    assert pu["acceleration"] == "N-body velocity^2 / N-body length"
    assert pu["potential"] == "N-body velocity^2" and pu["volume"] == "N-body length^3"
    assert product_units(None)["mass"] == "input mass"
    g1 = product_units(None, g_one=True)
    assert g1["potential"] == "input mass / input length (G = 1)"
    assert g1["acceleration"] == "input mass / input length^2 (G = 1)"
    phys = product_units({"length": "kpc", "velocity": "km/s", "mass": "Msun"}, g_one=True)
    assert phys["potential"] == "Msun / kpc (G = 1)"
    assert parse(phys["potential"]).scale == u.Msun / u.kpc  # the note is no part of it
    mixed = product_units({"length": "Mpc/h", "mass": "particle masses"})
    assert mixed["density"] == "particle masses / (Mpc/h)^3"
    assert mixed["velocity"] == "input velocity"


@pytest.mark.parametrize("units", [
    MPC, KPC, {"length": "kpc", "velocity": "km/s", "mass": "Msun"},
    {"length": "cm", "velocity": "cm/s", "mass": "g"},
    {"length": "Mpc/h", "velocity": "km/s/h", "mass": "1e10 Msun/h/h"}])
def test_composed_units_read_with_astropy_and_have_the_right_type(units):
    pu = product_units(units)
    assert set(pu) == {*DIMENSIONS, "dimensionless"}
    base = {q: parse(units[q], q) for q in ("length", "velocity", "mass")}
    for name, text in pu.items():
        got = parse(text)
        assert got.physical, (name, text)
        assert got.scale.is_equivalent(REFERENCE[name]), (name, text, got.scale)
        if name == "dimensionless":
            continue
        powers = DIMENSIONS[name]
        want = u.one
        for b, p in zip(base.values(), powers, strict=True):
            want = want * b.scale**p
        assert got.scale.to(want) == pytest.approx(1.0, rel=1e-14), (name, text)
        assert got.h_div == sum(b.h_div * p for b, p in zip(base.values(), powers,
                                                              strict=True))
        if got.h_div == 0:  # no h in it: cosmo_dask.units reads it the same
            assert parse(text).scale.to(got.scale) == pytest.approx(1.0, rel=1e-14)
    g = parse(pu["gravitational_constant"])
    if g.h_div == 0:
        assert const.G.to(g.scale).value == pytest.approx(gravitational_constant(units),
                                                          rel=1e-12)


def test_composed_units_convert_like_their_factors():
    a, b = product_units(KPC), product_units(MPC)
    f = _factors(KPC, MPC)
    for name, want in (("density", f["mass"] / f["length"] ** 3),
                       ("acceleration", f["velocity"] ** 2 / f["length"]),
                       ("potential", f["velocity"] ** 2), ("volume", f["length"] ** 3),
                       ("specific_angular_momentum", f["length"] * f["velocity"])):
        old, new = parse(a[name]), parse(b[name])
        assert old.h_div == new.h_div
        assert old.scale.to(new.scale) == pytest.approx(want, rel=1e-14), name


# ----------------------------------------------------------------------------- halos
@pytest.fixture(scope="module")
def blobs():
    snap = halo_blobs(3000, box_size=100.0, n_halos=12, min_members=40, seed=3,
                      precision="float64", chunks=1000)
    return snap, _kpc(snap)


def _halos(snap):
    return fof(snap, 0.2, min_members=20, centers=("mbp", "mcp"))


def test_halo_catalog_units_survive_the_store(blobs, tmp_path):
    snap, kpc = blobs
    ref, res = _halos(snap), _halos(kpc)
    assert ref.n_halos >= 5 and res.n_halos == ref.n_halos
    want = {"n_members": "1", "mass": "1e10 Msun/h", "center_of_mass": "Mpc/h",
            "r_max": "Mpc/h", "first_member_id": "1", "velocity": "km/s (peculiar)",
            "mcp_index": "1", "mcp_position": "Mpc/h", "mcp_friends": "1", "mbp_index": "1",
            "mbp_position": "Mpc/h", "mbp_potential": "km2 / s2"}
    assert {k: v.attrs.get("units") for k, v in ref.catalog.data_vars.items()} == want
    assert ref.catalog.attrs["length_unit"] == "Mpc/h"
    assert ref.catalog.attrs["mass_unit"] == "1e10 Msun/h"
    back = open_catalog(res.to_zarr(tmp_path / "halos.zarr"))
    got = {k: v.attrs.get("units") for k, v in back.catalog.data_vars.items()}
    assert got == {**want, "mass": "Msun/h", "center_of_mass": "kpc/h", "r_max": "kpc/h",
                   "velocity": "m/s (peculiar)", "mcp_position": "kpc/h",
                   "mbp_position": "kpc/h", "mbp_potential": "m2 / s2"}
    import zarr

    assert zarr.open_group(str(tmp_path / "halos.zarr"))["labels"].attrs["units"] == "1"
    html = back._repr_html_()
    assert "center_of_mass [kpc/h]" in html and "m2 / s2" in html
    # the real check: the kpc/h catalog converted to Mpc/h units is the Mpc/h catalog
    cat, ref_cat = back.catalog, ref.catalog
    for name in ("n_members", "first_member_id", "mcp_index", "mbp_index", "mcp_friends"):
        np.testing.assert_array_equal(cat[name].values, ref_cat[name].values)
    for name in ("mass", "center_of_mass", "r_max", "velocity", "mcp_position",
                 "mbp_position", "mbp_potential"):
        f = factor(cat[name].attrs["units"], ref_cat[name].attrs["units"])
        _close(cat[name].values * f, ref_cat[name].values)


def test_halo_catalog_without_units_or_g():
    rng = np.random.default_rng(4)
    pos = np.concatenate([rng.normal(5.0, 0.05, (30, 3)), rng.uniform(0, 10, (70, 3))])
    snap = Snapshot.from_arrays(pos % 10.0, box_size=10.0, chunks=50)
    cat = fof(snap, 0.2, min_members=10, centers=("mbp",)).catalog
    assert cat["mass"].attrs["units"] == cat.attrs["mass_unit"] == "particle masses"
    assert cat["center_of_mass"].attrs["units"] == "input length"
    assert cat["mbp_potential"].attrs["units"] == "particle masses / input length (G = 1)"


# ----------------------------------------------------------------------------- meshes
@pytest.fixture(scope="module")
def zel():
    snap = zeldovich(16, box_size=100.0, redshift=0.0, seed=1, precision="float64",
                     chunks=1024)
    return snap, _kpc(snap)


def test_mesh_store_units(zel, tmp_path):
    snap, kpc = zel
    meshes = {}
    for name, s in (("mpc", snap), ("kpc", kpc)):
        path = write_mesh(tmp_path / f"{name}.zarr", paint(s, n_mesh=8, scheme="cic"),
                          box_size=s.box_size, scheme="cic", units=s.units)
        meshes[name] = open_mesh(path)
    mesh, attrs = meshes["mpc"]
    assert attrs["mass_units"] == "1e10 Msun/h" and attrs["cell_size_units"] == "Mpc/h"
    assert attrs["box_size_units"] == "Mpc/h"
    assert attrs["density_units"] == "1e+10 h2 Msun / Mpc3"
    import zarr

    assert zarr.open_group(str(tmp_path / "mpc.zarr"))["mass"].attrs["units"] == "1e10 Msun/h"
    kmesh, kattrs = meshes["kpc"]
    assert kattrs["mass_units"] == "Msun/h" and kattrs["cell_size_units"] == "kpc/h"
    _close(kmesh.compute() * factor(kattrs["mass_units"], attrs["mass_units"]),
           mesh.compute())
    assert kattrs["cell_size"] * factor("kpc/h", "Mpc/h") == pytest.approx(
        attrs["cell_size"], rel=1e-14)
    _, plain = open_mesh(write_mesh(tmp_path / "plain.zarr", mesh, box_size=1.0,
                                    scheme="cic"))
    assert plain["mass_units"] == "input mass"


# ----------------------------------------------------------------------------- PSE octree
def test_density_octree_units(zel, tmp_path):
    snap, kpc = zel
    trees = {}
    for name, s in (("mpc", snap), ("kpc", kpc)):
        t = pse_density(s, patch_size=4, block=4, max_level=1)
        # pse_density does not pass the snapshot's units (yet): give them here
        t = DensityOctree(t.root_lo, t.root_size, t.patch_size, t.level, t.origin, t.patches,
                          box_size=t.box_size, attrs=t.attrs, units=s.units)
        trees[name] = open_density_octree(t.to_zarr(tmp_path / f"{name}.zarr"))
    ref, tree = trees["mpc"], trees["kpc"]
    assert ref.units == snap.units and tree.units == kpc.units
    assert ref.unit_strings["density"] == "1e+10 h2 Msun / Mpc3"
    import zarr

    group = zarr.open_group(str(tmp_path / "kpc.zarr"))
    assert group.attrs["root_size_units"] == "kpc/h"
    assert group.attrs["density_units"] == "h2 Msun / kpc3"
    for name, sub in group.groups():
        assert sub["density"].attrs["units"] == "h2 Msun / kpc3", name
        assert sub["origin"].attrs["units"] == "1" and sub.attrs["cell_size_units"] == "kpc/h"
    uni, ref_uni = tree.to_uniform(4), ref.to_uniform(4)
    assert uni.attrs["units"] == "h2 Msun / kpc3" and uni["x"].attrs["units"] == "kpc/h"
    f = parse(uni.attrs["units"]).scale.to(parse(ref_uni.attrs["units"]).scale)
    assert f == pytest.approx(1e-10 / 1e-9, rel=1e-14)
    _close(uni.values * f, ref_uni.values)
    _close(tree.total_mass() * factor("Msun/h", "1e10 Msun/h"), ref.total_mass())


# ----------------------------------------------------------------------------- gravity
def test_gravity_store_units(zel, tmp_path):
    snap, kpc = zel
    out = {}
    for name, s in (("mpc", snap), ("kpc", kpc)):
        soft = 0.5 * factor("Mpc/h", s.units["length"], "length")
        accelerations(s, method="direct", softening=soft, precision="float64",
                      out=tmp_path / f"{name}.zarr")
        out[name] = open_gravity(tmp_path / f"{name}.zarr")
    ref, ds = out["mpc"], out["kpc"]
    assert ref["acc"].attrs["units"] == "km2 h Mpc-1 s-2"
    assert ref["pot"].attrs["units"] == "km2 / s2"
    assert ds["acc"].attrs["units"] == "m2 h kpc-1 s-2" and ds["pot"].attrs["units"] == "m2 / s2"
    assert ref.attrs["units"]["length"] == "Mpc/h" and ref.attrs["length_units"] == "Mpc/h"
    f = _factors(kpc.units, snap.units)
    for name, want in (("acc", f["velocity"] ** 2 / f["length"]), ("pot", f["velocity"] ** 2)):
        old = parse(ds[name].attrs["units"]).scale
        assert old.to(parse(ref[name].attrs["units"]).scale) == pytest.approx(
            want, rel=1e-14)
        _close(ds[name].values * want, ref[name].values)


def test_gravity_raw_arrays_use_labels(tmp_path):
    pos = np.random.default_rng(2).uniform(0, 1, (50, 3))
    accelerations(pos, 1.0, method="direct", softening=0.1, out=tmp_path / "g.zarr")
    ds = open_gravity(tmp_path / "g.zarr")
    assert ds["acc"].attrs["units"] == "input mass / input length^2 (G = 1)"
    assert ds["pot"].attrs["units"] == "input mass / input length (G = 1)"


# ----------------------------------------------------------------------------- expansions
@pytest.fixture(scope="module")
def halo():
    """A Hernquist sphere in kpc/h, km/s, 1e10 Msun/h (G from astropy), and in Mpc/h etc."""
    h = hernquist(2000, scale=10.0, mass=100.0, seed=5, precision="float64", chunks=700)
    units = {"length": "kpc/h", "velocity": "km/s", "mass": "1e10 Msun/h"}
    g = gravitational_constant(units)
    snap = Snapshot.from_arrays(h.pos, h.vel * np.sqrt(g), particle_mass=h.particle_mass,
                                units=units, G=g)
    return snap, snap.to_units(length="Mpc/h", velocity="m/s", mass="Msun/h")


def test_scf_units(halo, tmp_path):
    snap, other = halo
    rs = 10.0
    ref = SCF(4, 2, scale_radius=rs).fit(snap)
    scf = SCF(4, 2, scale_radius=rs * factor("kpc/h", "Mpc/h")).fit(other)
    a = ref.coefficients.attrs
    assert a["units"] == "1" and ref.variance.attrs["units"] == "1"
    assert a["scale_radius_units"] == a["center_units"] == "kpc/h"
    assert a["mass_units"] == "1e10 Msun/h" and a["potential_units"] == "km2 / s2"
    assert a["acceleration_units"] == "km2 h kpc-1 s-2"
    assert a["density_units"] == "1e+10 h2 Msun / kpc3"
    back = SCF.from_zarr(scf.to_zarr(tmp_path / "scf.zarr"))
    b = back.coefficients.attrs
    assert b["units"] == "1" and b["acceleration_units"] == "m2 h Mpc-1 s-2"
    assert b["scale_radius_units"] == "Mpc/h" and b["potential_units"] == "m2 / s2"
    assert back.truncate(1.0).coefficients.attrs["units"] == "1"
    # dimensionless coefficients agree; forces convert with their units
    _close(back.coefficients.values, ref.coefficients.values)
    f = _factors(other.units, snap.units)
    acc = back.accelerations(other.pos).compute()
    _close(acc * f["velocity"] ** 2 / f["length"], ref.accelerations(snap.pos).compute())
    _close(back.potential(other.pos).compute() * f["velocity"] ** 2,
           ref.potential(snap.pos).compute())
    path = write_expansion(tmp_path / "out.zarr", method="scf", parameters={}, scf=back,
                           acc=back.accelerations(other.pos), pot=back.potential(other.pos))
    assert open_expansion(path)["units"] == {"acc": "m2 h Mpc-1 s-2", "pot": "m2 / s2"}


def test_mex_units(halo, tmp_path):
    snap, other = halo
    ref, mex = MEX(2).fit(snap), MEX(2).fit(other)
    assert ref.units_["acceleration"] == "km2 h kpc-1 s-2"
    assert mex.units_["potential"] == "m2 / s2"
    f = _factors(other.units, snap.units)
    _close(mex.accelerations().compute() * f["velocity"] ** 2 / f["length"],
           ref.accelerations().compute())
    path = write_expansion(tmp_path / "mex.zarr", method="mex", parameters={},
                           acc=mex.accelerations(), pot=mex.potential(), units=mex.units_)
    got = open_expansion(path)
    assert got["units"] == {"acc": "m2 h Mpc-1 s-2", "pot": "m2 / s2"}
    raw = MEX(0).fit(np.asarray(snap.pos), 1.0)
    assert raw.units_["potential"] == "input mass / input length (G = 1)"
