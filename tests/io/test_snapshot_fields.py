"""Extra per-particle fields (``Snapshot.fields``): construction, transforms, the store
(``fields/<name>``, chunk manifest) and the three readers (every other dataset of
``PartType{n}``; the binary gas blocks U, RHO, HSML), with NaN for types without a field.

The snapshot files are written with the writers of the readers' own tests; the
binary writer's gas blocks U and RHO hold ``arange(n) + 100`` and ``arange(n) * 0.5``
(float32), and HSML is appended here.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

from cosmo_dask import Snapshot, open_snapshot
from cosmo_dask.cli import main
from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.io import from_gadget_binary, from_gadget_hdf5, from_swift
from tests.support import gadget as tg
from tests.support import gadget_binary as tb
from tests.support import swift as ts

N = 1000
TABLE = [0.0, 0.3, 0.0, 0.0, 0.0, 0.0]


def assert_fields_equal(got: dict, want: dict) -> None:
    """Same names, dtypes, shapes and values (NaN equal to NaN)."""
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        value = got[name].compute() if hasattr(got[name], "compute") else got[name]
        expected = arr.compute() if hasattr(arr, "compute") else np.asarray(arr)
        assert value.dtype == expected.dtype and value.shape == expected.shape, name
        np.testing.assert_array_equal(value, expected, err_msg=name)


@pytest.fixture
def extra():
    rng = np.random.default_rng(11)
    return {"InternalEnergy": rng.uniform(1, 2, N).astype(np.float32),
            "ElementAbundance": rng.uniform(0, 1, (N, 9)),
            "Flag": rng.random(N) > 0.5, "Generation": np.arange(N, dtype=np.int16)}


@pytest.fixture
def snap(extra):
    rng = np.random.default_rng(12)
    return Snapshot.from_arrays(rng.random((N, 3)) * 10.0, ids=np.arange(N), box_size=10.0,
                                particle_mass=1.0, chunks=300, fields=extra,
                                units={"length": "kpc/h", "velocity": "km/s",
                                       "mass": "1e10 Msun/h"})


# ------------------------------------------------------------------------------ Snapshot
def test_from_arrays_and_transforms_keep_fields(snap, extra):
    assert snap.fields["Flag"].dtype == bool and snap.field("ElementAbundance").shape == (N, 9)
    assert all(f.chunks[0] == snap.chunks for f in snap.fields.values())
    assert_fields_equal(snap.fields, extra)
    assert snap.nbytes == sum(a.nbytes for a in snap.arrays.values()) + sum(
        a.nbytes for a in extra.values())
    assert "fields" not in snap.arrays and "InternalEnergy" in repr(snap)
    for out in (snap.rechunk(128), snap.persist(), snap.to_device("cpu"),
                snap.rechunk(128).persist().to_device("cpu")):
        assert_fields_equal(out.fields, extra)
        assert all(f.chunks[0] == out.chunks for f in out.fields.values())
    assert snap.rechunk(128).fields["ElementAbundance"].chunks[0][0] == 128
    mpc = snap.to_units(length="Mpc/h")  # fields keep their values: their units are unknown
    np.testing.assert_allclose(mpc.pos.compute(), snap.pos.compute() / 1e3, rtol=1e-12)
    assert_fields_equal(mpc.fields, extra)
    assert Snapshot.from_arrays(np.zeros((3, 3))).fields == {}
    with pytest.raises(SnapshotError, match="no field 'Density'; its fields: InternalEnergy"):
        snap.field("Density")


@pytest.mark.parametrize("fields,pattern", [
    ({"pos": np.zeros(5)}, "field name 'pos' is not valid"),
    ({"a-b": np.zeros(5)}, "field name 'a-b' is not valid"),
    ({"__x": np.zeros(5)}, "field name '__x' is not valid"),
    ({"T": np.zeros((5, 2, 2))}, r"field 'T' has shape \(5, 2, 2\); expected \(N,\) or"),
    ({"T": np.zeros(5, complex)}, "field 'T' has dtype complex128; expected a float"),
    ({"T": np.array(["a"] * 5)}, "field 'T' has dtype <U1"),
    ({"T": np.zeros(4)}, "field 'T' has 4 rows but 'pos' has 5"),
    ([np.zeros(5)], "'fields' must be a mapping"),
])
def test_field_errors(fields, pattern):
    with pytest.raises(SnapshotError, match=pattern) as err:
        Snapshot.from_arrays(np.zeros((5, 3)), fields=fields)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------ the store
def test_store_round_trip(tmp_path, snap, extra):
    from cosmo_dask.store.chunk_manifest import MANIFEST

    path = tmp_path / "s.zarr"
    snap.to_zarr(path)
    meta = json.loads((path / "fields" / "ElementAbundance" / "zarr.json").read_text())
    assert meta["dimension_names"] == ["particle", "component"]
    assert meta["attributes"][MANIFEST]["n_chunks"] == 4
    meta = json.loads((path / "fields" / "Flag" / "zarr.json").read_text())
    assert meta["dimension_names"] == ["particle"] and meta["data_type"] == "bool"
    assert json.loads((path / "zarr.json").read_text())["attributes"]["format_version"] == 1
    back = open_snapshot(path)
    assert list(back.fields) == sorted(extra)  # by name
    assert_fields_equal(back.fields, extra)
    assert all(f.chunks[0] == back.chunks for f in back.fields.values())
    assert back.validate(full=True).ok
    assert_fields_equal(open_snapshot(path, chunks=128).rechunk(200).fields, extra)
    # lazy: the graph reads the field's chunk files, named by the array
    assert back.fields["InternalEnergy"].name.startswith("read-fields/InternalEnergy-")
    # a store without fields (as written before they existed) reads as before
    Snapshot.from_arrays(np.ones((10, 3))).to_zarr(tmp_path / "old.zarr")
    assert not (tmp_path / "old.zarr" / "fields").exists()
    assert open_snapshot(tmp_path / "old.zarr").fields == {}
    # a rewrite of the opened store keeps them
    back.to_zarr(tmp_path / "again.zarr")
    assert_fields_equal(open_snapshot(tmp_path / "again.zarr").fields, extra)


@pytest.mark.parametrize("name,chunk", [("InternalEnergy", "c/1"),
                                        ("ElementAbundance", "c/1/0")])
def test_a_deleted_field_chunk_is_an_error(tmp_path, capsys, snap, name, chunk):
    path = tmp_path / "s.zarr"
    snap.to_zarr(path)
    (path / "fields" / name / chunk).unlink()
    message = f"array 'fields/{name}': chunk {chunk} is missing"
    with pytest.raises(SnapshotError, match=re.escape(message)):
        open_snapshot(path)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_altered_field_chunk_fails_full_validation(tmp_path, snap):
    path = tmp_path / "s.zarr"
    snap.to_zarr(path)
    chunk = path / "fields" / "InternalEnergy" / "c" / "2"
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0xFF
    chunk.write_bytes(bytes(data))
    report = open_snapshot(path).validate(full=True, raise_errors=False)
    assert len(report.problems) == 1
    assert "array 'fields/InternalEnergy': chunk c/2 does not match the CRC-32" in (
        report.problems[0])


# ------------------------------------------------------------------------------ Gadget HDF5
@pytest.fixture
def gadget(tmp_path):
    """Gas with InternalEnergy, Density and ElementAbundance (N, 3); dark matter with the
    core datasets only (MassTable); stars with StellarFormationTime and an int32 field."""
    rng = np.random.default_rng(21)
    gas = tg.make_parts(rng, 7, masses=True)
    gas["InternalEnergy"] = rng.uniform(1, 2, 7).astype(np.float32)
    gas["Density"] = rng.uniform(1, 2, 7).astype(np.float32)
    gas["ElementAbundance"] = rng.uniform(0, 1, (7, 3)).astype(np.float32)
    dm = tg.make_parts(rng, 10, id_start=100)
    stars = tg.make_parts(rng, 4, masses=True, id_start=200)
    stars["StellarFormationTime"] = rng.uniform(0, 1, 4).astype(np.float32)
    stars["Generation"] = np.arange(4, dtype=np.int32)
    parts = {0: gas, 1: dm, 4: stars}
    path = tmp_path / "snap_000.hdf5"
    tg.write_gadget_file(path, parts, mass_table=TABLE)
    return path, parts


def nan_filled(parts: dict, name: str, dtype) -> np.ndarray:
    """A field over the types of ``parts`` in type order, NaN where a type lacks it."""
    pieces = []
    for p in parts.values():
        n = len(p["Coordinates"])
        trailing = next(q[name].shape[1:] for q in parts.values() if name in q)
        pieces.append(p[name].astype(dtype) if name in p
                      else np.full((n,) + trailing, np.nan, dtype))
    return np.concatenate(pieces)


def test_gadget_hdf5_fields(gadget, monkeypatch):
    path, parts = gadget
    reads = []
    orig = h5py.Dataset.__getitem__

    def getitem(self, key):
        reads.append(self.name)
        return orig(self, key)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", getitem)
    gas = from_gadget_hdf5(path, part_type=0, chunks=3)
    joint = from_gadget_hdf5(path, part_type="all", chunks=3)
    assert reads == []  # lazy: headers and shapes only
    graph = dict(gas.fields["Density"].__dask_graph__())
    assert len(graph) == 3 and all(k[0].startswith("gadget-read-") for k in graph)
    assert all("PartType0/Density" in map(str, task.args) for task in graph.values())
    assert_fields_equal(gas.fields, {k: parts[0][k] for k in
                                     ("InternalEnergy", "Density", "ElementAbundance")})
    assert set(reads) == {"/PartType0/InternalEnergy", "/PartType0/Density",
                          "/PartType0/ElementAbundance"}
    stars = from_gadget_hdf5(path, part_type=4)
    assert_fields_equal(stars.fields, {k: parts[4][k]
                                       for k in ("StellarFormationTime", "Generation")})
    assert from_gadget_hdf5(path, part_type=1).fields == {}

    # all types: NaN where a type lacks a field; the int32 field becomes float64
    assert joint.fields["Generation"].dtype == np.float64
    want = {"InternalEnergy": nan_filled(parts, "InternalEnergy", np.float32),
            "Density": nan_filled(parts, "Density", np.float32),
            "ElementAbundance": nan_filled(parts, "ElementAbundance", np.float32),
            "StellarFormationTime": nan_filled(parts, "StellarFormationTime", np.float32),
            "Generation": nan_filled(parts, "Generation", np.float64)}
    assert_fields_equal(joint.fields, want)
    assert all(f.chunks[0] == joint.chunks for f in joint.fields.values())
    u = joint.field("InternalEnergy").compute()
    ptype = joint.ptype.compute()
    assert np.isfinite(u[ptype == 0]).all() and np.isnan(u[ptype != 0]).all()
    subset = from_gadget_hdf5(path, part_type=[0, 4], fields=["Density"])
    assert_fields_equal(subset.fields, {"Density": nan_filled({t: parts[t] for t in (0, 4)},
                                                              "Density", np.float32)})


def test_fields_argument(gadget):
    path, parts = gadget
    assert from_gadget_hdf5(path, part_type=0, fields=()).fields == {}
    only = from_gadget_hdf5(path, part_type=0, fields=["Density"])
    assert_fields_equal(only.fields, {"Density": parts[0]["Density"]})
    message = (f"{path}: no field 'Temperature' in particle type(s) 0; available: Density, "
               "ElementAbundance, InternalEnergy")
    with pytest.raises(SnapshotError, match=re.escape(message)):
        from_gadget_hdf5(path, part_type=0, fields=["Density", "Temperature"])
    with pytest.raises(SnapshotError, match="'StellarFormationTime' in particle type"):
        from_gadget_hdf5(path, part_type=0, fields=["StellarFormationTime"])
    with pytest.raises(ParameterError, match="fields must be None"):
        from_gadget_hdf5(path, part_type=0, fields="Density")


def test_field_missing_in_one_file_of_a_set(tmp_path, caplog):
    """By default a dataset only some files of a set hold is left out (logged); asked for
    by name, it is an error of the set."""
    rng = np.random.default_rng(22)
    a, b = tg.make_parts(rng, 5, masses=True), tg.make_parts(rng, 4, masses=True, id_start=5)
    a["Density"], b["Density"] = np.ones(5, np.float32), np.full(4, 2.0, np.float32)
    a["Potential"] = np.zeros(5, np.float32)
    a["Sub-Density"], b["Sub-Density"] = np.ones(5), np.ones(4)  # no field name
    for i, p in enumerate([a, b]):
        tg.write_gadget_file(tmp_path / f"snap_001.{i}.hdf5", {0: p}, n_total=[9, 0, 0, 0, 0, 0],
                             n_files=2)
    with caplog.at_level(logging.WARNING, logger="cosmo_dask.io.gadget"):
        snap = from_gadget_hdf5(tmp_path / "snap_001", part_type=0)
    assert_fields_equal(snap.fields, {"Density": np.r_[a["Density"], b["Density"]]})
    assert "Potential, Sub-Density left out" in caplog.text
    with pytest.raises(SnapshotError, match="all files must hold the same datasets"):
        from_gadget_hdf5(tmp_path / "snap_001", part_type=0, fields=["Potential"])
    with pytest.raises(SnapshotError, match="field name 'Sub-Density' is not valid"):
        from_gadget_hdf5(tmp_path / "snap_001", part_type=0, fields=["Sub-Density"])


# ------------------------------------------------------------------------------ binary
def append_block(path: Path, label: str, data: bytes, snap_format: int) -> None:
    """Append one block (with its format-2 label record) to a binary file."""
    out = b""
    if snap_format == 2:
        out += tb._record(label.ljust(4).encode() + struct.pack("<i", len(data) + 8), "<")
    path.write_bytes(path.read_bytes() + out + tb._record(data, "<"))


@pytest.mark.parametrize("snap_format", tb.FORMATS)
def test_binary_gas_blocks_equal_the_hdf5_twin(tmp_path, snap_format):
    rng = np.random.default_rng(30 + snap_format)
    gas = tb.make_parts(rng, 7, masses=True)
    dm = tb.make_parts(rng, 9, id_start=100)
    stars = tb.make_parts(rng, 3, masses=True, id_start=200)
    hsml = rng.uniform(0.1, 1, 7).astype(np.float32)
    parts = {0: gas, 1: dm, 4: stars}
    tb.write_binary(tmp_path / "snap", parts, snap_format=snap_format, mass_table=TABLE)
    append_block(tmp_path / "snap", "HSML", hsml.tobytes(), snap_format)
    # the binary writer's U and RHO blocks
    twin_gas = dict(gas, InternalEnergy=np.arange(7, dtype=np.float32) + 100,
                    Density=np.arange(7, dtype=np.float32) * 0.5, SmoothingLength=hsml)
    twin = {0: twin_gas, 1: dm, 4: stars}
    tg.write_gadget_file(tmp_path / "twin.hdf5", twin, mass_table=TABLE, header=tb.TWIN_HEADER)

    # format 1 knows gas blocks by position: only U and RHO (what follows them differs
    # between codes); format 2 names HSML by its label
    names = ["InternalEnergy", "Density"] + (["SmoothingLength"] if snap_format == 2 else [])
    binary = from_gadget_binary(tmp_path / "snap", part_type=0)
    hdf5 = from_gadget_hdf5(tmp_path / "twin.hdf5", part_type=0, fields=names)
    assert list(binary.fields) == names
    assert_fields_equal(binary.fields, hdf5.fields)
    assert_fields_equal(binary.fields, {k: twin_gas[k] for k in binary.fields})
    joint = from_gadget_binary(tmp_path / "snap", part_type="all")
    assert_fields_equal(joint.fields, from_gadget_hdf5(tmp_path / "twin.hdf5",
                                                       part_type="all", fields=names).fields)
    assert np.isnan(joint.field("Density").compute()[7:]).all()
    assert from_gadget_binary(tmp_path / "snap", part_type=1).fields == {}
    if snap_format == 2:
        only = from_gadget_binary(tmp_path / "snap", part_type=0, fields=["SmoothingLength"])
        assert_fields_equal(only.fields, {"SmoothingLength": hsml})
    else:
        with pytest.raises(SnapshotError, match="SmoothingLength"):
            from_gadget_binary(tmp_path / "snap", part_type=0, fields=["SmoothingLength"])
    assert from_gadget_binary(tmp_path / "snap", part_type=0, fields=()).fields == {}


def test_binary_gas_block_of_another_size_is_skipped(tmp_path, caplog):
    rng = np.random.default_rng(40)
    snap_format = 2  # format 1 does not read HSML at all
    tb.write_binary(tmp_path / "snap", {0: tb.make_parts(rng, 5, masses=True)},
                    snap_format=snap_format)
    append_block(tmp_path / "snap", "HSML", np.ones(3, np.float32).tobytes(), snap_format)
    with caplog.at_level(logging.WARNING, logger="cosmo_dask.io.gadget_binary"):
        snap = from_gadget_binary(tmp_path / "snap", part_type=0)
    assert list(snap.fields) == ["InternalEnergy", "Density"]
    assert "block HSML has 12 bytes, not 5 gas values of 4 or 8 bytes; block HSML not read" in (
        caplog.text)


def test_format1_gas_blocks_after_one_of_another_size_are_skipped(tmp_path, caplog):
    """Format 1 knows the gas blocks only by position: once one has another size, the
    block after it is not taken for RHO either."""
    rng = np.random.default_rng(41)
    path = tmp_path / "snap"
    where = tb.write_binary(path, {0: tb.make_parts(rng, 5, masses=True)}, snap_format=1)
    data = path.read_bytes()
    path.write_bytes(data[:where["U"][0]] + tb._record(bytes(12), "<")
                     + data[where["RHO"][0]:])
    with caplog.at_level(logging.WARNING, logger="cosmo_dask.io.gadget_binary"):
        snap = from_gadget_binary(path, part_type=0)
    assert snap.fields == {} and snap.n_particles == 5
    assert "block U has 12 bytes, not 5 gas values of 4 or 8 bytes; blocks U, RHO " \
           "not read" in caplog.text


# ------------------------------------------------------------------------------ SWIFT
def test_swift_extra_datasets(tmp_path):
    rng = np.random.default_rng(50)
    gas, dm = ts.make_parts(rng, 6), ts.make_parts(rng, 8, id_start=10)
    gas["InternalEnergies"] = rng.uniform(1, 2, 6).astype(np.float32)
    gas["ElementMassFractions"] = rng.uniform(0, 1, (6, 9)).astype(np.float32)
    exponents = {"InternalEnergies": (2, 0, -2, -2.0), "ElementMassFractions": (0, 0, 0, 0.0)}
    path = tmp_path / "snap_0000.hdf5"
    ts.write_swift_file(path, {0: gas, 1: dm}, exponents=exponents)
    snap = from_swift(path, part_type=0)
    # read as stored: the a-scale exponent (-2) of InternalEnergies is not applied
    assert_fields_equal(snap.fields, {k: gas[k] for k in exponents})
    joint = from_swift(path, part_type="all", fields=["ElementMassFractions"])
    want = np.concatenate([gas["ElementMassFractions"], np.full((8, 9), np.nan, np.float32)])
    assert_fields_equal(joint.fields, {"ElementMassFractions": want})


# ------------------------------------------------------------------------------ CLI
def test_convert_all_then_info_lists_the_fields(tmp_path, capsys, gadget):
    path, parts = gadget
    out = tmp_path / "s.zarr"
    assert main(["--cpu", "--workers", "1", "convert", "gadget", str(path), str(out),
                 "--part-type", "all"]) == 0
    back = open_snapshot(out)
    assert_fields_equal(back.fields, from_gadget_hdf5(path, part_type="all").fields)
    capsys.readouterr()
    assert main(["--cpu", "--workers", "1", "info", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("fields        Density (N,) float32, ElementAbundance (N, 3) float32, Generation "
            "(N,) float64, InternalEnergy (N,) float32, StellarFormationTime (N,) float32"
            ) in lines
    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fields"]["ElementAbundance"] == {"shape": [21, 3], "dtype": "float32"}
