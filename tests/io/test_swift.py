"""Tests of cosmo_dask.io.from_swift on small SWIFT-layout HDF5 files.

The files are written here with h5py from SWIFT's snapshot specification (its
documentation's "Snapshots" page and its i/o code): a 3-vector ``BoxSize``,
``Scale-factor``, ``Code = SWIFT``, the ``Units``, ``Cosmology`` and ``Parameters``
groups, attributes as length-1 arrays, and on every dataset its unit exponents and
``a-scale exponent`` (Coordinates 1, Velocities 0: SWIFT writes ``a dx/dt``).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from cosmo_dask import open_snapshot
from cosmo_dask.cli import main
from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.io import from_gadget_hdf5, from_swift
from tests.support.gadget import write_gadget_file
from tests.support.swift import BOX, MASKED, A, H, make_parts, one, write_swift_file

#: G in Mpc (km/s)^2 / (1e10 Msun) from the IAU solar mass parameter GM_sun (m^3/s^2)
#: and the parsec, independently of astropy
G_MPC = 1.3271244e20 / 3.0856775814913673e22 / 1e6 * 1e10


def concat(pieces: list[dict[int, dict]]) -> dict[int, dict]:
    types = sorted({t for p in pieces for t in p})
    return {t: {k: np.concatenate([p[t][k] for p in pieces if t in p])
                for k in next(p[t] for p in pieces if t in p)} for t in types}


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def assert_same(a, b):
    """Two snapshots hold the same arrays (values and dtypes) and metadata."""
    assert set(a.arrays) == set(b.arrays)
    for name, arr in a.arrays.items():
        assert arr.dtype == b.arrays[name].dtype, name
        np.testing.assert_array_equal(arr.compute(), b.arrays[name].compute(), err_msg=name)
    for attr in ("n_particles", "particle_mass", "box_size", "scale_factor", "cosmology",
                 "units", "G"):
        assert getattr(a, attr) == getattr(b, attr), attr


def bad(folder: Path, pattern: str, call, *args, **kwargs) -> None:
    """``call`` fails with a one-line SnapshotError matching ``pattern`` and leaves every
    file of ``folder`` as it was."""
    before = digests(folder)
    with pytest.raises(SnapshotError, match=pattern) as err:
        call(*args, **kwargs)
    assert "\n" not in str(err.value)
    assert digests(folder) == before


@pytest.fixture
def single(tmp_path):
    """One file: 40 dark-matter and 6 star particles, a = 0.5; one particle on the box
    edge."""
    rng = np.random.default_rng(11)
    dm = make_parts(rng, 40)
    dm["Coordinates"][3] = [BOX, 0.0, 5.0]
    stars = make_parts(rng, 6, id_start=1000)
    path = tmp_path / "snap_0007.hdf5"
    write_swift_file(path, {1: dm, 4: stars})
    return path, dm, stars


# ------------------------------------------------------------------------------ contents
def test_single_file_values_units_and_box(single):
    path, dm, _ = single
    snap = from_swift(path)
    assert snap.n_particles == 40 and snap.box_size == BOX
    pos = snap.pos.compute()
    assert pos.dtype == np.float64 and pos.min() >= 0 and pos.max() < BOX
    expected = dm["Coordinates"].copy()
    expected[3, 0] = 0.0  # x == BoxSize wraps to 0
    np.testing.assert_array_equal(pos, expected)
    # a-scale exponent 0: a**0 = 1, SWIFT's velocities are already peculiar
    np.testing.assert_array_equal(snap.vel.compute(), dm["Velocities"])
    np.testing.assert_array_equal(snap.ids.compute(), dm["ParticleIDs"])
    np.testing.assert_array_equal(snap.mass.compute(), dm["Masses"])
    assert snap.particle_mass is None and snap.mass.dtype == np.float32
    assert snap.scale_factor == A and snap.redshift == pytest.approx(1 / A - 1)
    assert snap.cosmology == {"Omega_m": 0.307, "Omega_b": 0.0482, "Omega_L": 0.693,
                              "h": H, "sigma8": None, "n_s": None}
    assert snap.units == {"length": "Mpc", "velocity": "km/s (peculiar)", "mass": "1e10 Msun"}
    assert snap.G == pytest.approx(G_MPC, rel=1e-9)
    info = snap.gadget_info
    assert info.format == "swift" and info.files == (str(path),) and info.cosmological
    assert info.cosmological_rule == "Cosmology/Cosmological run = 1"
    assert info.velocity_factor == 1.0
    assert "a-scale exponent of Velocities = 0" in info.velocity_rule
    stars = from_swift(path, part_type=4)
    assert stars.n_particles == 6 and stars.gadget_info.part_type == 4


def test_gadget_reader_reads_the_swift_box(single):
    path, dm, _ = single
    with pytest.warns(UserWarning, match="Header/Code is 'SWIFT'.*use cosmo_dask.io.from_swift"):
        snap = from_gadget_hdf5(path)
    assert snap.box_size == BOX  # a 3-vector BoxSize is no longer "isolated"
    np.testing.assert_array_equal(snap.pos.compute(), from_swift(path).pos.compute())


@pytest.mark.parametrize("exponent", [-1.0, MASKED])
def test_velocity_factor_from_the_a_scale_exponent(tmp_path, exponent):
    rng = np.random.default_rng(12)
    dm = make_parts(rng, 9)
    path = tmp_path / "snap.hdf5"
    write_swift_file(path, {1: dm}, a=0.25,
                     exponents={"Velocities": (1, 0, -1, exponent)})
    info = from_swift(path).gadget_info
    vel = from_swift(path).vel.compute()
    if exponent is MASKED:  # no attribute: SWIFT's peculiar velocities assumed
        np.testing.assert_array_equal(vel, dm["Velocities"])
        assert info.velocity_factor == 1.0 and "0 assumed" in info.velocity_rule
    else:
        expected = (dm["Velocities"].astype(np.float64) * 0.25**-1).astype(np.float32)
        np.testing.assert_array_equal(vel, expected)
        assert info.velocity_factor == 4.0 and "= -1" in info.velocity_rule


def test_non_cosmological_and_isolated_runs(tmp_path):
    rng = np.random.default_rng(13)
    dm = make_parts(rng, 8)
    path = tmp_path / "iso.hdf5"
    write_swift_file(path, {1: dm}, a=1.0, cosmological=False,
                     exponents={"Velocities": (1, 0, -1, 1.0)}, periodic=0)
    snap = from_swift(path)
    assert snap.scale_factor is None and snap.cosmology is None and snap.box_size is None
    assert snap.units == {"length": "Mpc", "velocity": "km/s", "mass": "1e10 Msun"}
    np.testing.assert_array_equal(snap.vel.compute(), dm["Velocities"])
    assert snap.gadget_info.cosmological_rule == "Cosmology/Cosmological run = 0"
    write_swift_file(path, {1: dm}, periodic=1)
    assert from_swift(path).box_size == BOX


def test_older_files_without_cosmological_run_or_omega_m(tmp_path):
    rng = np.random.default_rng(20)
    dm = make_parts(rng, 5)
    path = tmp_path / "old.hdf5"
    write_swift_file(path, {1: dm})
    with h5py.File(path, "r+") as f:
        del f["Cosmology"].attrs["Cosmological run"], f["Cosmology"].attrs["Omega_m"]
        f["Cosmology"].attrs["Omega_cdm"] = one(0.307 - 0.0482)
    snap = from_swift(path)
    assert snap.gadget_info.cosmological_rule.startswith(
        "0 < Header/Scale-factor <= 1 and Cosmology/Omega_m > 0 (Scale-factor = 0.5")
    assert snap.scale_factor == A and snap.cosmology["Omega_m"] == pytest.approx(0.307)
    assert snap.units["velocity"] == "km/s (peculiar)"


def test_other_units_and_units_override(tmp_path):
    rng = np.random.default_rng(14)
    path = tmp_path / "u.hdf5"
    units = {"U_L": 3.0e24, "U_M": 1.98841e33, "U_t": 3.0e19}  # 1e5 cm/s, Msun
    write_swift_file(path, {1: make_parts(rng, 5)}, units=units)
    snap = from_swift(path)
    assert snap.units == {"length": "3e+24 cm", "velocity": "km/s (peculiar)", "mass": "Msun"}
    assert snap.G == pytest.approx(G_MPC * 1e-10 * 3.0856775814913673e24 / 3.0e24, rel=1e-9)
    snap = from_swift(path, units={"length": "Mpc"})
    assert snap.units["length"] == "Mpc" and snap.G == pytest.approx(G_MPC * 1e-10, rel=1e-9)
    with pytest.raises(ParameterError, match="unknown key"):
        from_swift(path, units={"time": "Gyr"})


def test_to_units_equals_a_gadget_file_in_mpc_over_h(tmp_path):
    """The SWIFT read in Mpc/h and 1e10 Msun/h equals a Gadget file of the same particles
    (positions and masses times h, velocities / sqrt(a)) read by from_gadget_hdf5."""
    rng = np.random.default_rng(15)
    dm = make_parts(rng, 30, float_dtype=np.float64)
    write_swift_file(tmp_path / "swift.hdf5", {1: dm})
    gadget = {"Coordinates": dm["Coordinates"] * H, "Velocities": dm["Velocities"] / np.sqrt(A),
              "Masses": dm["Masses"] * H, "ParticleIDs": dm["ParticleIDs"]}
    write_gadget_file(tmp_path / "gadget.hdf5", {1: gadget}, header={
        "Time": A, "Redshift": 1 / A - 1, "BoxSize": BOX * H, "Omega0": 0.307,
        "OmegaBaryon": 0.0482, "OmegaLambda": 0.693, "HubbleParam": H})
    ours = from_swift(tmp_path / "swift.hdf5").to_units(length="Mpc/h", mass="1e10 Msun/h")
    ref = from_gadget_hdf5(tmp_path / "gadget.hdf5")
    assert ours.units == ref.units == {"length": "Mpc/h", "velocity": "km/s (peculiar)",
                                       "mass": "1e10 Msun/h"}
    for name in ("pos", "vel", "mass"):
        np.testing.assert_allclose(ours.arrays[name].compute(), ref.arrays[name].compute(),
                                   rtol=1e-12, atol=0, err_msg=name)
    np.testing.assert_array_equal(ours.ids.compute(), ref.ids.compute())
    assert ours.box_size == pytest.approx(ref.box_size, rel=1e-12)
    assert ours.G == pytest.approx(ref.G, rel=1e-12)
    assert ours.cosmology == ref.cosmology and ours.scale_factor == ref.scale_factor


@pytest.fixture
def distributed_snapshot(tmp_path):
    """The same particles as one file (one/), as a two-file set and as SWIFT's virtual
    file over that set (set/); stars only in the first file."""
    rng = np.random.default_rng(16)
    pieces = [{1: make_parts(rng, 20), 4: make_parts(rng, 5, id_start=500)},
              {1: make_parts(rng, 13, id_start=20)}]
    whole = concat(pieces)
    (tmp_path / "one").mkdir()
    (tmp_path / "set").mkdir()
    write_swift_file(tmp_path / "one" / "snap_0003.hdf5", whole)
    total = [0, 33, 0, 0, 5, 0, 0]
    for i, piece in enumerate(pieces):
        write_swift_file(tmp_path / "set" / f"snap_0003.{i}.hdf5", piece, n_total=total,
                         n_files=2, this_file=i)
    write_swift_file(tmp_path / "set" / "snap_0003.hdf5", whole,
                     virtual=[(f"snap_0003.{i}.hdf5", p) for i, p in enumerate(pieces)])
    return tmp_path, whole


@pytest.mark.parametrize("part_type", [1, 4])
@pytest.mark.parametrize("entry", ["snap_0003.hdf5", "snap_0003", "snap_0003.1.hdf5",
                                   "snap_0003.[01].hdf5"])
def test_multi_file_and_virtual_read_like_one_file(distributed_snapshot, entry, part_type):
    root, whole = distributed_snapshot
    one_file = from_swift(root / "one" / "snap_0003.hdf5", part_type=part_type, chunks=7)
    snap = from_swift(root / "set" / entry, part_type=part_type, chunks=7)
    assert_same(snap, one_file)
    np.testing.assert_array_equal(snap.ids.compute(), whole[part_type]["ParticleIDs"])
    virtual = entry in ("snap_0003.hdf5", "snap_0003")
    counts = {1: (20, 13), 4: (5, 0)}[part_type]
    assert snap.gadget_info.n_per_file == ((sum(counts),) if virtual else counts)


def test_virtual_file_is_read_lazily_by_row_slices(distributed_snapshot, monkeypatch):
    root, whole = distributed_snapshot
    path = root / "set" / "snap_0003.hdf5"
    reads = []
    orig = h5py.Dataset.__getitem__

    def getitem(self, key):
        reads.append((self.file.filename, self.name, key))
        return orig(self, key)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", getitem)
    snap = from_swift(path, chunks=8)
    assert reads == [] and snap.chunks == (8, 8, 8, 8, 1)
    np.testing.assert_array_equal(snap.pos.compute(), whole[1]["Coordinates"])
    assert sorted(key.start for _, _, key in reads) == [0, 8, 16, 24, 32]
    assert {(f, name) for f, name, _ in reads} == {(str(path), "/PartType1/Coordinates")}
    # the task keys follow the sub-files' modification times
    sub = root / "set" / "snap_0003.1.hdf5"
    st = os.stat(sub)
    os.utime(sub, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert from_swift(path, chunks=8).pos.name != snap.pos.name


def test_cli_convert_swift(distributed_snapshot):
    root, _ = distributed_snapshot
    source, out = root / "set" / "snap_0003.hdf5", root / "s.zarr"
    assert main(["--cpu", "--workers", "1", "convert", "swift", str(source), str(out)]) == 0
    stored, api = open_snapshot(out), from_swift(source)
    assert_same(stored, api)


# ------------------------------------------------------------------------------ errors
def test_error_non_cubic_box(tmp_path):
    path = tmp_path / "snap.hdf5"
    write_swift_file(path, {1: make_parts(np.random.default_rng(17), 4)},
                     box=(BOX, BOX, BOX / 2))
    message = re.escape(f"{path}: Header/BoxSize has sides 50.0, 50.0, 25.0; non-cubic boxes "
                        "are not supported yet")
    bad(tmp_path, message, from_swift, path)
    bad(tmp_path, message, from_gadget_hdf5, path)


def test_error_no_units_group_unless_units_given(tmp_path):
    path = tmp_path / "snap.hdf5"
    write_swift_file(path, {1: make_parts(np.random.default_rng(18), 4)}, units=MASKED)
    bad(tmp_path, re.escape(f"{path}: no 'Units' group, so the units of the particle arrays "
                            "are unknown; give the length and velocity and mass unit(s)"),
        from_swift, path)
    bad(tmp_path, "give the mass unit", from_swift, path,
        units={"length": "Mpc", "velocity": "km/s"})
    before = digests(tmp_path)
    units = {"length": "kpc", "velocity": "km/s", "mass": "Msun"}
    snap = from_swift(path, units=units)
    assert snap.units == units and snap.G == pytest.approx(G_MPC * 1e-7, rel=1e-9)
    assert digests(tmp_path) == before


def test_error_missing_source_of_virtual_file(distributed_snapshot):
    root, _ = distributed_snapshot
    (root / "set" / "snap_0003.1.hdf5").rename(root / "elsewhere.hdf5")
    path = root / "set" / "snap_0003.hdf5"
    bad(root / "set", re.escape(f"{path}: 'PartType1/Coordinates' is a virtual dataset over "
                                "snap_0003.1.hdf5, which is not at "), from_swift, path)


@pytest.mark.parametrize("case,pattern", [
    ("gadget", "not a SWIFT snapshot .*use from_gadget_hdf5"),
    ("not-hdf5", "not an HDF5 file; from_swift reads SWIFT HDF5 snapshots"),
    ("no-masses", "PartType1 has no 'Masses' dataset .SWIFT writes per-particle masses."),
    ("h-exponent", "PartType1/Coordinates has h-scale exponent 1.0; SWIFT units are h-free"),
    ("physical-positions", "PartType1/Coordinates has a-scale exponent 0; expected 1"),
    ("no-stars", "no 'PartType4' group in any of the 1 file.s.; particle types with "
                 r"particles: \[1\]"),
])
def test_errors_name_the_file(tmp_path, case, pattern):
    rng = np.random.default_rng(19)
    path = tmp_path / "snap.hdf5"
    dm, part_type = make_parts(rng, 4), 1
    if case == "gadget":
        write_gadget_file(path, {1: dm})
    elif case == "not-hdf5":
        path.write_bytes(b"\x00" * 300)
    elif case == "no-masses":
        del dm["Masses"]
        write_swift_file(path, {1: dm})
    elif case == "h-exponent":
        write_swift_file(path, {1: dm})
        with h5py.File(path, "r+") as f:
            f["PartType1/Coordinates"].attrs["h-scale exponent"] = one(np.float32(1))
    elif case == "physical-positions":
        write_swift_file(path, {1: dm}, exponents={"Coordinates": (1, 0, 0, 0.0)})
    else:
        write_swift_file(path, {1: dm})
        part_type = 4
    bad(tmp_path, re.escape(str(path)) + ".*" + pattern, from_swift, path, part_type=part_type)


def test_error_part_type(single):
    path, _, _ = single
    with pytest.raises(ParameterError, match=r"SWIFT particle type 0\.\.6 \(0 gas, .*6 "
                                             r"neutrinos\), got 7"):
        from_swift(path, part_type=7)
