"""Tests of cosmo_dask.io.from_gadget_binary on small Gadget format-1/2 binary files.

The files are written here from the format's specification with ``struct`` and
numpy (not with the reader's own tables); most cases compare the binary read
with an HDF5 twin of the same snapshot read by ``from_gadget_hdf5``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.io import from_gadget_binary, from_gadget_hdf5
from tests.support.gadget import BOX, scaled, wrapped, write_gadget_file
from tests.support.gadget_binary import FORMATS, TWIN_HEADER, make_parts, write_binary

#: G in (kpc/h) (km/s)^2 / (1e10 Msun/h) from the IAU solar mass parameter GM_sun
#: (m^3/s^2) and the parsec, independently of astropy
G_KPC = 1.3271244e20 / 3.0856775814913673e19 / 1e6 * 1e10

ENDIANS = ["<", ">"]
# (float dtype of POS/VEL/MASS, id dtype, first id)
DTYPES = [(np.float32, np.uint32, 2**31 + 5), (np.float64, np.uint64, 2**32 + 7)]


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def assert_same_snapshot(a, b):
    """Two snapshots hold the same arrays (values and dtypes) and metadata."""
    assert set(a.arrays) == set(b.arrays)
    for name, arr in a.arrays.items():
        other = b.arrays[name]
        assert arr.dtype == other.dtype, name
        np.testing.assert_array_equal(arr.compute(), other.compute(), err_msg=name)
    for attr in ("n_particles", "particle_mass", "box_size", "scale_factor", "redshift",
                 "cosmology", "units", "G", "chunks"):
        assert getattr(a, attr) == getattr(b, attr), attr
    for attr in ("n_per_file", "cosmological", "velocity_factor", "part_type"):
        assert getattr(a.gadget_info, attr) == getattr(b.gadget_info, attr), attr


# ------------------------------------------------------------------------------ contents
@pytest.mark.parametrize("float_dtype,id_dtype,id_start", DTYPES)
@pytest.mark.parametrize("endian", ENDIANS)
@pytest.mark.parametrize("snap_format", FORMATS)
def test_reads_like_its_hdf5_twin(tmp_path, snap_format, endian, float_dtype, id_dtype,
                                  id_start):
    rng = np.random.default_rng(snap_format * 10 + len(endian))
    kw = {"float_dtype": float_dtype, "id_dtype": id_dtype}
    gas = make_parts(rng, 7, id_start=id_start, masses=True, **kw)
    dm = make_parts(rng, 50, id_start=id_start + 100, **kw)
    dm["Coordinates"][3] = [BOX, 0.0, 5.0]  # Gadget sometimes writes x == BoxSize
    dm["Coordinates"][4] = [-0.25, 1.0, BOX]
    stars = make_parts(rng, 5, id_start=id_start + 1000, masses=True, **kw)
    parts = {0: gas, 1: dm, 4: stars}
    table = [0, 0.125, 0, 0, 0, 0]  # mixed: dark matter from MassTable, gas and stars from MASS
    write_binary(tmp_path / "snap_005", parts, snap_format=snap_format, endian=endian,
                 mass_table=table)
    write_gadget_file(tmp_path / "snap_005.hdf5", parts, mass_table=table, header=TWIN_HEADER)

    for part_type, p in parts.items():
        snap = from_gadget_binary(tmp_path / "snap_005", part_type=part_type)
        assert_same_snapshot(snap, from_gadget_hdf5(tmp_path / "snap_005.hdf5", part_type))
        # and against what was written
        assert snap.pos.dtype == float_dtype and snap.ids.dtype == id_dtype
        np.testing.assert_array_equal(snap.pos.compute(), wrapped(p["Coordinates"]))
        np.testing.assert_array_equal(snap.vel.compute(), scaled(p["Velocities"], 0.5))
        np.testing.assert_array_equal(snap.ids.compute(), p["ParticleIDs"])
        if part_type == 1:
            assert snap.mass is None and snap.particle_mass == 0.125
        else:
            assert snap.particle_mass is None
            np.testing.assert_array_equal(snap.mass.compute(), p["Masses"])
    assert snap.ids.compute().min() > 2**31
    pos = from_gadget_binary(tmp_path / "snap_005").pos.compute()
    np.testing.assert_array_equal(pos[3], [0.0, 0.0, 5.0])
    np.testing.assert_array_equal(pos[4], np.asarray([BOX - 0.25, 1.0, 0.0], float_dtype))
    assert pos.min() >= 0 and pos.max() < BOX
    assert snap.box_size == BOX and snap.scale_factor == 0.5
    assert snap.redshift == pytest.approx(1.0)
    assert snap.cosmology == {"Omega_m": 0.3, "Omega_b": None, "Omega_L": 0.7, "h": 0.7,
                              "sigma8": None, "n_s": None}
    assert snap.units == {"length": "kpc/h", "velocity": "km/s (peculiar)",
                          "mass": "1e10 Msun/h"}
    assert snap.G == pytest.approx(G_KPC, rel=1e-9)
    info = snap.gadget_info
    assert info.format == f"binary-{snap_format}" and info.files == (str(tmp_path / "snap_005"),)
    assert info.header["NumPart_ThisFile"] == [7, 50, 0, 0, 5, 0]
    assert info.header["MassTable"] == table and info.header["NumFilesPerSnapshot"] == 1
    assert info.cosmological and info.velocity_factor == pytest.approx(math.sqrt(0.5))


def test_non_cosmological_and_units(tmp_path):
    rng = np.random.default_rng(3)
    p = make_parts(rng, 10)
    p["Coordinates"] -= 50  # isolated: negative positions stay as they are
    hdr = {"time": 3.0, "Omega0": 0.0, "OmegaLambda": 0.0, "BoxSize": 0.0}
    write_binary(tmp_path / "iso", {1: p}, mass_table=[0, 2.0, 0, 0, 0, 0], header=hdr)
    snap = from_gadget_binary(tmp_path / "iso")
    assert snap.box_size is None and snap.scale_factor is None and snap.cosmology is None
    assert snap.units == {"length": "kpc/h", "velocity": "km/s", "mass": "1e10 Msun/h"}
    assert snap.G == pytest.approx(G_KPC, rel=1e-9) and snap.particle_mass == 2.0
    np.testing.assert_array_equal(snap.pos.compute(), p["Coordinates"])
    np.testing.assert_array_equal(snap.vel.compute(), p["Velocities"])
    assert not snap.gadget_info.cosmological and snap.gadget_info.velocity_factor == 1.0
    snap = from_gadget_binary(tmp_path / "iso", units={"length": "Mpc/h"})
    assert snap.units["length"] == "Mpc/h" and snap.G == pytest.approx(G_KPC / 1e3, rel=1e-9)
    with pytest.raises(ParameterError, match="0..5"):
        from_gadget_binary(tmp_path / "iso", part_type=6)
    with pytest.raises(ParameterError, match="chunks"):
        from_gadget_binary(tmp_path / "iso", chunks=0)
    with pytest.raises(ParameterError, match="unknown key"):
        from_gadget_binary(tmp_path / "iso", units={"time": "Gyr"})


@pytest.fixture(params=FORMATS)
def two_files(request, tmp_path):
    """snap_042.0 (gas, dark matter, stars) and snap_042.1 (dark matter only, no MASS block)."""
    rng = np.random.default_rng(request.param)
    first = {0: make_parts(rng, 6, masses=True, id_start=1000),
             1: make_parts(rng, 20), 4: make_parts(rng, 4, masses=True, id_start=2000)}
    second = {1: make_parts(rng, 13, id_start=20)}
    total = [6, 33, 0, 0, 4, 0]
    table = [0, 0.5, 0, 0, 0, 0]
    where = [write_binary(tmp_path / f"snap_042.{i}", p, snap_format=request.param,
                          endian=">", mass_table=table, n_total=total, n_files=2)
             for i, p in enumerate([first, second])]
    assert "MASS" in where[0] and "MASS" not in where[1]
    return tmp_path, first, second


@pytest.mark.parametrize("entry", ["snap_042.0", "snap_042.1", "snap_042", "snap_042.*"])
def test_two_file_set(two_files, entry):
    folder, first, second = two_files
    snap = from_gadget_binary(folder / entry)
    assert snap.gadget_info.files == (str(folder / "snap_042.0"), str(folder / "snap_042.1"))
    assert snap.gadget_info.n_per_file == (20, 13) and snap.particle_mass == 0.5
    for name, key in [("pos", "Coordinates"), ("ids", "ParticleIDs")]:
        expected = np.concatenate([first[1][key], second[1][key]])
        np.testing.assert_array_equal(snap.arrays[name].compute(), expected)
    stars = from_gadget_binary(folder / entry, part_type=4)  # only in the first file
    assert stars.gadget_info.n_per_file == (4, 0) and stars.particle_mass is None
    np.testing.assert_array_equal(stars.mass.compute(), first[4]["Masses"])
    np.testing.assert_array_equal(stars.ids.compute(), first[4]["ParticleIDs"])
    np.testing.assert_array_equal(stars.vel.compute(), scaled(first[4]["Velocities"], 0.5))
    gas = from_gadget_binary(folder / entry, part_type=0)
    np.testing.assert_array_equal(gas.mass.compute(), first[0]["Masses"])
    with pytest.raises(SnapshotError, match=r"no particles of type 3 .*\[0, 1, 4\]"):
        from_gadget_binary(folder / entry, part_type=3)


def test_lazy_pieces_never_span_files(two_files, monkeypatch):
    folder, first, second = two_files
    reads = []
    fromfile = np.fromfile

    def spy(*args, **kwargs):
        reads.append(args[0])
        return fromfile(*args, **kwargs)

    monkeypatch.setattr(np, "fromfile", spy)
    snap = from_gadget_binary(folder / "snap_042", chunks=6)
    assert reads == []  # headers and markers only
    assert snap.chunks == (6, 6, 6, 2, 6, 6, 1)  # never across the file boundary at 20
    graph = dict(snap.pos.__dask_graph__())
    keys = [k for k in graph if k[0].startswith("gadget-read-")]
    assert len(keys) == len(snap.chunks) == len(graph)
    expected = np.concatenate([first[1]["Coordinates"], second[1]["Coordinates"]])
    np.testing.assert_array_equal(snap.pos.compute(), expected)
    assert len(reads) == 7 and {Path(r).name for r in reads} == {"snap_042.0", "snap_042.1"}
    np.testing.assert_array_equal(snap.pos[18:23].compute(), expected[18:23])
    # key names are deterministic and change with the files' stamps
    assert from_gadget_binary(folder / "snap_042", chunks=6).pos.name == snap.pos.name
    stat = os.stat(folder / "snap_042.1")
    os.utime(folder / "snap_042.1", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert from_gadget_binary(folder / "snap_042", chunks=6).pos.name != snap.pos.name


def test_computes_on_distributed_cluster(two_files, client):
    folder, first, second = two_files
    snap = from_gadget_binary(folder / "snap_042.1", chunks=5)
    pos, ids = client.compute([snap.pos, snap.ids], sync=True)
    np.testing.assert_array_equal(pos, np.concatenate([first[1]["Coordinates"],
                                                       second[1]["Coordinates"]]))
    np.testing.assert_array_equal(ids, np.concatenate([first[1]["ParticleIDs"],
                                                       second[1]["ParticleIDs"]]))


# ------------------------------------------------------------------------------ errors
def _bad(folder: Path, entry: str | Path, pattern: str, **kwargs) -> None:
    """from_gadget_binary fails with ``pattern`` and leaves every file as it was."""
    before = digests(folder)
    with pytest.raises(SnapshotError, match=pattern) as err:
        from_gadget_binary(folder / entry, **kwargs)
    assert "\n" not in str(err.value)
    assert digests(folder) == before


@pytest.fixture(params=FORMATS)
def one_file(request, tmp_path):
    rng = np.random.default_rng(5)
    where = write_binary(tmp_path / "snap", {1: make_parts(rng, 10)}, snap_format=request.param,
                         mass_table=[0, 1.0, 0, 0, 0, 0])
    return tmp_path / "snap", where


def test_error_truncated(one_file):
    path, where = one_file
    _, vel_data, _ = where["VEL"]
    with open(path, "r+b") as f:
        f.truncate(vel_data + 20)
    name = re.escape(str(path))
    _bad(path.parent, path.name, rf"{name}: block VEL: .* runs past the end .* truncated")
    with open(path, "r+b") as f:
        f.truncate(vel_data - 2)  # inside the marker itself
    _bad(path.parent, path.name, rf"{name}: block VEL: the file ends .* truncated")


def test_error_markers_disagree(one_file):
    path, where = one_file
    _, start, n = where["POS"]
    data = bytearray(path.read_bytes())
    data[start + n:start + n + 4] = struct.pack("<i", n + 4)
    path.write_bytes(bytes(data))
    _bad(path.parent, path.name, rf"{re.escape(str(path))}: block POS: leading record marker "
                                 rf"{n} and trailing marker {n + 4} disagree")


@pytest.mark.parametrize("snap_format", FORMATS)
def test_error_block_size_not_npart(tmp_path, snap_format):
    rng = np.random.default_rng(6)
    write_binary(tmp_path / "snap", {1: make_parts(rng, 10)}, snap_format=snap_format,
                 mass_table=[0, 1.0, 0, 0, 0, 0], npart=[0, 11, 0, 0, 0, 0])
    name = re.escape(str(tmp_path / "snap"))
    _bad(tmp_path, "snap", rf"{name}: block POS has 120 bytes but the header's "
                           r"npart \[0, 11, 0, 0, 0, 0\] needs 33 values")
    # a MASS block is needed (MassTable[1] is 0) but the file has none
    write_binary(tmp_path / "snap", {1: make_parts(rng, 10)}, snap_format=snap_format,
                 mass_table=[0, 1.0, 0, 0, 0, 0], header={})
    data = bytearray((tmp_path / "snap").read_bytes())
    head = 4 if snap_format == 1 else 20
    data[head + 24 + 8:head + 24 + 16] = struct.pack("<d", 0.0)  # mass[1] = 0
    (tmp_path / "snap").write_bytes(bytes(data))
    _bad(tmp_path, "snap", rf"{name}: block MASS is missing")


def test_error_format2_label_size(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "snap"
    where = write_binary(path, {1: make_parts(rng, 10)}, snap_format=2,
                         mass_table=[0, 1.0, 0, 0, 0, 0])
    label_start = where["ID"][0] - 16  # the 8-byte label record before the ID record
    data = bytearray(path.read_bytes())
    data[label_start + 8:label_start + 12] = struct.pack("<i", 999)
    path.write_bytes(bytes(data))
    _bad(tmp_path, "snap", rf"{re.escape(str(path))}: block ID: its label record announces 991")


def test_error_not_a_gadget_binary_file(tmp_path, one_file):
    path = tmp_path / "random.bin"
    path.write_bytes(np.random.default_rng(8).bytes(4096))
    _bad(tmp_path, path.name,
         rf"{re.escape(str(path))}: not a Gadget binary snapshot: first record marker is")
    (tmp_path / "empty").write_bytes(b"")
    _bad(tmp_path, "empty", r"empty: not a Gadget binary snapshot: .*\(the file has 0 bytes\)")
    rng = np.random.default_rng(9)
    write_gadget_file(tmp_path / "snap.hdf5", {1: make_parts(rng, 3)}, mass_table=[0, 1] + [0] * 4)
    _bad(tmp_path, "snap.hdf5", "not a Gadget binary snapshot.*use from_gadget_hdf5")
    before = digests(one_file[0].parent)
    with pytest.raises(SnapshotError, match="not an HDF5 file.*use from_gadget_binary"):
        from_gadget_hdf5(one_file[0])
    assert digests(one_file[0].parent) == before


@pytest.mark.parametrize("entry", ["snap_042.0", "snap_042.2", "snap_042"])
def test_error_missing_file_of_set(tmp_path, entry):
    rng = np.random.default_rng(10)
    for i in range(3):
        write_binary(tmp_path / f"snap_042.{i}", {1: make_parts(rng, 4, id_start=4 * i)},
                     mass_table=[0, 1.0, 0, 0, 0, 0], n_total=[0, 12, 0, 0, 0, 0], n_files=3)
    assert from_gadget_binary(tmp_path / entry).n_particles == 12
    (tmp_path / "snap_042.1").unlink()
    _bad(tmp_path, entry, r"header NumFilesPerSnapshot is 3 but 1 file\(s\) of the set are "
                          rf"missing: {re.escape(str(tmp_path / 'snap_042.1'))}")
    _bad(tmp_path, "snap_042.*", r"matched 2 file\(s\) but header NumFilesPerSnapshot of .* is 3")
    _bad(tmp_path, "nothing", r"no such Gadget snapshot \(tried .*nothing\.0\)")


def test_error_numpart_total(tmp_path):
    rng = np.random.default_rng(11)
    table = [0, 1.0, 0, 0, 0, 0]
    write_binary(tmp_path / "snap", {1: make_parts(rng, 5)}, mass_table=table,
                 n_total=[0, 6, 0, 0, 0, 0])
    _bad(tmp_path, "snap", r"header NumPart_Total\[1\] is 6 but NumPart_ThisFile\[1\] sums to 5")
    write_binary(tmp_path / "snap", {1: make_parts(rng, 5)}, mass_table=table,
                 header={"npartTotalHighWord": [0, 1, 0, 0, 0, 0]})
    _bad(tmp_path, "snap", rf"NumPart_Total\[1\] is {2**32 + 5} but")


def test_error_mass_table_differs(tmp_path):
    rng = np.random.default_rng(12)
    for i, m in enumerate([1.0, 2.0]):
        write_binary(tmp_path / f"s.{i}", {1: make_parts(rng, 3)}, n_files=2,
                     mass_table=[0, m, 0, 0, 0, 0], n_total=[0, 6, 0, 0, 0, 0])
    _bad(tmp_path, "s.0", r"header MassTable\[1\] differs between files")


# ------------------------------------------------------------------------------ pynbody
@pytest.mark.parametrize("snap_format", FORMATS)
def test_agrees_with_pynbody(tmp_path, snap_format):
    pynbody = pytest.importorskip("pynbody")
    rng = np.random.default_rng(13)
    dm = make_parts(rng, 40, id_dtype=np.uint32, id_start=1)
    gas = make_parts(rng, 9, id_dtype=np.uint32, id_start=100, masses=True)
    path = tmp_path / "snap_007"
    write_binary(path, {0: gas, 1: dm}, snap_format=snap_format,
                 mass_table=[0, 0.25, 0, 0, 0, 0])
    sim = pynbody.snapshot.gadget.GadgetSnap(path)
    for family, part_type in [(sim.dm, 1), (sim.gas, 0)]:
        ours = from_gadget_binary(path, part_type=part_type)
        # pynbody returns the stored values (its units carry the a^1/2 of the velocities)
        np.testing.assert_array_equal(ours.pos.compute(), np.asarray(family["pos"]))
        np.testing.assert_array_equal(ours.vel.compute(),
                                      scaled(np.asarray(family["vel"]), 0.5))
        np.testing.assert_array_equal(ours.ids.compute(),
                                      np.asarray(family["iord"]).astype(np.uint32))
    np.testing.assert_array_equal(from_gadget_binary(path, part_type=0).mass.compute(),
                                  np.asarray(sim.gas["mass"]))
