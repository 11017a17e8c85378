"""Several particle types in one snapshot (``part_type=[...]`` or ``"all"``) through the
Gadget HDF5, Gadget binary and SWIFT readers, and the import's provenance in the store.

The files are written with the writers of the readers' own tests, from the formats'
specifications; the joint snapshot is checked against what was written and against
the single-type reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import dask
import h5py
import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from cosmo_dask import Snapshot, open_snapshot
from cosmo_dask.cli import main
from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.halos import fof
from cosmo_dask.io import from_gadget_binary, from_gadget_hdf5, from_swift
from tests.support import gadget as tg
from tests.support import gadget_binary as tb
from tests.support import swift as ts

MASS_TABLE = [0.0, 0.3, 0.0, 0.0, 0.0, 0.0]
TOTAL = [12, 20, 0, 0, 4, 0]
BIG = 2**32 + 1  # first dark-matter id: above what 32 bits hold


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.iterdir() if p.is_file()}


def joined(snaps: dict[int, Snapshot], name: str, dtype) -> np.ndarray:
    """The single-type reads' arrays, concatenated in type order, as ``dtype``."""
    return np.concatenate([s.arrays[name].compute().astype(dtype) for s in snaps.values()])


def masses_of(snaps: dict[int, Snapshot], dtype) -> np.ndarray:
    return np.concatenate([
        np.full(s.n_particles, s.particle_mass, dtype=dtype) if s.mass is None
        else s.mass.compute().astype(dtype) for s in snaps.values()])


def assert_joint(snap: Snapshot, singles: dict[int, Snapshot]) -> None:
    """``snap`` is the single-type snapshots joined: arrays in type order in the promoted
    dtypes, per-particle masses, ptype, counts."""
    assert snap.particle_mass is None and snap.ptype.dtype == np.uint8
    for name in ("pos", "vel", "ids"):
        dtype = np.result_type(*(s.arrays[name].dtype for s in singles.values()))
        assert snap.arrays[name].dtype == dtype, name
        np.testing.assert_array_equal(snap.arrays[name].compute(),
                                      joined(singles, name, dtype), err_msg=name)
    np.testing.assert_array_equal(snap.mass.compute(), masses_of(singles, snap.mass.dtype))
    np.testing.assert_array_equal(
        snap.ptype.compute(), np.repeat(list(singles), [s.n_particles for s in singles.values()]))
    counts = {t: s.n_particles for t, s in singles.items()}
    assert snap.species() == counts and snap.gadget_info.n_per_type == counts
    assert snap.gadget_info.part_type == tuple(singles)
    for attr in ("box_size", "scale_factor", "cosmology", "units", "G"):
        assert getattr(snap, attr) == getattr(next(iter(singles.values())), attr), attr


# ------------------------------------------------------------------------------ HDF5
@pytest.fixture
def hdf5_set(tmp_path):
    """snap_010.0/.1.hdf5: gas (Masses, float32 positions), dark matter (MassTable 0.3,
    float64 positions, ids above 2^32), stars (Masses, uint32 ids) only in file 0."""
    rng = np.random.default_rng(31)
    gas = [tg.make_parts(rng, 7, masses=True, id_start=100),
           tg.make_parts(rng, 5, masses=True, id_start=107)]
    dm = [tg.make_parts(rng, 11, pos_dtype=np.float64, id_start=BIG),
          tg.make_parts(rng, 9, pos_dtype=np.float64, id_start=BIG + 11)]
    stars = tg.make_parts(rng, 4, masses=True, id_start=500)
    stars["ParticleIDs"] = stars["ParticleIDs"].astype(np.uint32)
    for i, parts in enumerate([{0: gas[0], 1: dm[0], 4: stars}, {0: gas[1], 1: dm[1]}]):
        tg.write_gadget_file(tmp_path / f"snap_010.{i}.hdf5", parts, n_total=TOTAL, n_files=2,
                             mass_table=MASS_TABLE)
    written = {0: {k: np.concatenate([g[k] for g in gas]) for k in gas[0]},
               1: {k: np.concatenate([d[k] for d in dm]) for k in dm[0]}, 4: stars}
    return tmp_path / "snap_010", written


def test_all_types_hdf5_join_in_type_order(hdf5_set, monkeypatch):
    base, written = hdf5_set
    reads = []
    orig = h5py.Dataset.__getitem__

    def getitem(self, key):
        reads.append((self.name, key))
        return orig(self, key)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", getitem)
    snap = from_gadget_hdf5(base, part_type="all", chunks=4)
    assert reads == []  # lazy: headers and shapes only
    assert snap.n_particles == 36
    # pieces of at most 4 rows, never across a type or a file: gas 7+5, dm 11+9, stars 4
    assert snap.chunks == (4, 3, 4, 1, 4, 4, 3, 4, 4, 1, 4)
    assert all(a.chunks[0] == snap.chunks for a in snap.arrays.values())

    np.testing.assert_array_equal(snap.pos.compute(), np.concatenate(
        [written[t]["Coordinates"].astype(np.float64) for t in (0, 1, 4)]))
    assert snap.pos.dtype == np.float64 and snap.vel.dtype == np.float32
    np.testing.assert_array_equal(snap.vel.compute(), np.concatenate(
        [tg.scaled(written[t]["Velocities"], 0.5) for t in (0, 1, 4)]))
    ids = snap.ids.compute()
    assert snap.ids.dtype == np.uint64 and ids.max() == BIG + 19  # above 2^32, exact
    np.testing.assert_array_equal(ids, np.concatenate(
        [written[t]["ParticleIDs"].astype(np.uint64) for t in (0, 1, 4)]))
    assert snap.mass.dtype == np.float64
    np.testing.assert_array_equal(snap.mass.compute(), np.concatenate(
        [written[0]["Masses"], np.full(20, 0.3), written[4]["Masses"]]))
    np.testing.assert_array_equal(snap.ptype.compute(), np.repeat([0, 1, 4], [12, 20, 4]))
    assert snap.species() == {0: 12, 1: 20, 4: 4}
    info = snap.gadget_info
    assert info.part_type == (0, 1, 4) and info.n_per_type == {0: 12, 1: 20, 4: 4}
    assert info.n_per_file == (22, 14) and info.n_particles == 36 and info.dropped == {}
    assert_joint(snap, {t: from_gadget_hdf5(base, part_type=t) for t in (0, 1, 4)})


def test_subset_list_tuple_and_single_int(hdf5_set):
    base, written = hdf5_set
    snap = from_gadget_hdf5(base, part_type=[4, 1], chunks=8)
    assert_joint(snap, {t: from_gadget_hdf5(base, part_type=t) for t in (1, 4)})
    same = from_gadget_hdf5(base, part_type=(1, 4), chunks=8)
    assert same.pos.name == snap.pos.name and same.mass.name == snap.mass.name
    np.testing.assert_array_equal(snap.ids.compute()[:20], written[1]["ParticleIDs"])
    one = from_gadget_hdf5(base, part_type=[1])  # a list: the joint form, even of one type
    assert one.ptype is not None and one.particle_mass is None and one.gadget_info.part_type == (1,)
    dm = from_gadget_hdf5(base, part_type=1)  # an int: as before
    assert dm.ptype is None and dm.particle_mass == 0.3 and dm.gadget_info.part_type == 1
    assert dm.gadget_info.n_per_type == {1: 20} and dm.provenance["part_types"] == [1]


def test_keys_hash_the_files(hdf5_set):
    base, _ = hdf5_set
    snap = from_gadget_hdf5(base, part_type="all")
    assert from_gadget_hdf5(base, part_type="all").pos.name == snap.pos.name
    path = base.parent / "snap_010.1.hdf5"
    with h5py.File(path, "r+") as f:
        f["PartType0/Coordinates"][0] = [1.0, 2.0, 3.0]
    assert from_gadget_hdf5(base, part_type="all").pos.name != snap.pos.name


def test_field_missing_for_one_type_is_dropped(tmp_path, caplog):
    rng = np.random.default_rng(32)
    gas, dm = tg.make_parts(rng, 5, masses=True), tg.make_parts(rng, 6, id_start=5)
    del gas["Velocities"]
    path = tmp_path / "snap.hdf5"
    tg.write_gadget_file(path, {0: gas, 1: dm}, mass_table=MASS_TABLE)
    with caplog.at_level(logging.INFO, logger="cosmo_dask.io.gadget"):
        snap = from_gadget_hdf5(path, part_type="all")
    assert snap.vel is None and snap.ids is not None and snap.n_particles == 11
    assert snap.gadget_info.dropped == {"vel": (0,)}
    assert "'vel' is left out of the joint snapshot: 'PartType0/Velocities' missing" in caplog.text
    assert from_gadget_hdf5(path, part_type=1).vel is not None


# ------------------------------------------------------------------------------ binary, SWIFT
def test_binary_all_types(tmp_path):
    rng = np.random.default_rng(33)
    kw = {"float_dtype": np.float64, "id_dtype": np.uint64}
    first = {0: tb.make_parts(rng, 6, masses=True, id_start=BIG + 1000, **kw),
             1: tb.make_parts(rng, 20, id_start=BIG, **kw),
             4: tb.make_parts(rng, 4, masses=True, id_start=BIG + 2000, **kw)}
    second = {0: tb.make_parts(rng, 3, masses=True, id_start=BIG + 1006, **kw),
              1: tb.make_parts(rng, 13, id_start=BIG + 20, **kw)}
    for i, parts in enumerate([first, second]):
        tb.write_binary(tmp_path / f"snap_042.{i}", parts, snap_format=2, endian=">",
                        mass_table=[0, 0.5, 0, 0, 0, 0], n_total=[9, 33, 0, 0, 4, 0], n_files=2)
    snap = from_gadget_binary(tmp_path / "snap_042", part_type="all", chunks=5)
    assert_joint(snap, {t: from_gadget_binary(tmp_path / "snap_042", part_type=t)
                        for t in (0, 1, 4)})
    np.testing.assert_array_equal(snap.mass.compute(), np.concatenate(
        [first[0]["Masses"], second[0]["Masses"], np.full(33, 0.5), first[4]["Masses"]]))
    np.testing.assert_array_equal(snap.ids.compute()[9:42], np.concatenate(
        [first[1]["ParticleIDs"], second[1]["ParticleIDs"]]))
    assert snap.gadget_info.format == "binary-2" and snap.provenance["format"] == "binary-2"
    assert snap.provenance["header"]["MassTable"] == [0, 0.5, 0, 0, 0, 0]


def test_swift_all_types(tmp_path):
    rng = np.random.default_rng(34)
    pieces = [{0: ts.make_parts(rng, 5, id_start=BIG + 100), 1: ts.make_parts(rng, 8),
               4: ts.make_parts(rng, 3, id_start=BIG + 200)},
              {0: ts.make_parts(rng, 2, id_start=BIG + 105), 1: ts.make_parts(rng, 6, id_start=8)}]
    for i, piece in enumerate(pieces):
        ts.write_swift_file(tmp_path / f"snap_0003.{i}.hdf5", piece, n_total=[7, 14, 0, 0, 3, 0, 0],
                            n_files=2, this_file=i)
    snap = from_swift(tmp_path / "snap_0003", part_type="all", chunks=4)
    singles = {t: from_swift(tmp_path / "snap_0003", part_type=t) for t in (0, 1, 4)}
    assert_joint(snap, singles)
    # float32 Masses with float64 Coordinates: masses promoted to float64, values kept
    assert singles[0].mass.dtype == np.float32 and snap.mass.dtype == np.float64
    assert snap.provenance["format"] == "swift" and snap.provenance["part_types"] == [0, 1, 4]
    assert snap.provenance["header"]["Code"] == "SWIFT"


def test_swift_velocity_factor_differing_between_types_is_an_error(tmp_path):
    rng = np.random.default_rng(35)
    path = tmp_path / "snap.hdf5"
    ts.write_swift_file(path, {1: ts.make_parts(rng, 4), 4: ts.make_parts(rng, 2, id_start=9)})
    with h5py.File(path, "r+") as f:
        f["PartType4/Velocities"].attrs["a-scale exponent"] = ts.one(np.float32(1))
    before = digests(tmp_path)
    with pytest.raises(SnapshotError, match="velocity factor differs between the particle types"):
        from_swift(path, part_type="all")
    assert digests(tmp_path) == before


# ------------------------------------------------------------------------------ FOF
def reference_groups(pos: np.ndarray, ll: float, box: float, min_members: int) -> np.ndarray:
    """Connected components of the pairs within ``ll`` (periodic), each group named by its
    first index, -1 for groups below ``min_members``."""
    n = len(pos)
    pairs = cKDTree(pos, boxsize=box).query_pairs(ll, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    return canonical(comp, min_members)


def canonical(labels: np.ndarray, min_members: int = 1) -> np.ndarray:
    """Labels renamed by each group's first index (-1 kept, small groups -1)."""
    out = np.full(len(labels), -1)
    for label in np.unique(labels[labels >= 0]):
        members = np.flatnonzero(labels == label)
        if len(members) >= min_members:
            out[members] = members[0]
    return out


def test_fof_links_all_types_together(tmp_path):
    rng = np.random.default_rng(36)
    box = tg.BOX
    centres = rng.uniform(0, box, size=(12, 3))
    pos = np.mod(np.concatenate([rng.uniform(0, box, size=(600, 3))]
                                + [c + rng.normal(scale=0.4, size=(40, 3)) for c in centres]),
                 box)
    kind = rng.integers(0, 2, size=len(pos))  # every blob mixes gas and dark matter
    parts = {}
    for t in (0, 1):
        sel = pos[kind == t]
        parts[t] = {"Coordinates": sel, "Velocities": np.zeros_like(sel, dtype=np.float32),
                    "ParticleIDs": np.flatnonzero(kind == t).astype(np.uint64)}
    parts[0]["Masses"] = np.full((kind == 0).sum(), 0.2)
    path = tmp_path / "blobs.hdf5"
    tg.write_gadget_file(path, parts, mass_table=MASS_TABLE)
    snap = from_gadget_hdf5(path, part_type="all", chunks=200)
    ll, min_members = 1.0, 2
    with dask.config.set(scheduler="threads"):
        result = fof(snap, ll, absolute=True, min_members=min_members, centers=(), n_domains=8)
        labels = result.labels.compute()
    joint_pos = snap.pos.compute()
    expected = reference_groups(joint_pos, ll, box, min_members)
    np.testing.assert_array_equal(canonical(labels), expected)
    ptype = snap.ptype.compute()
    mixed = [g for g in np.unique(expected[expected >= 0])
             if len(np.unique(ptype[expected == g])) == 2]
    assert len(mixed) >= 10  # groups holding both types: linked together
    assert float(result.catalog["mass"].sum()) == pytest.approx(
        snap.mass.compute()[labels >= 0].sum(), rel=1e-12)


# ------------------------------------------------------------------------------ store, CLI
def test_store_keeps_ptype_masses_and_provenance(hdf5_set, tmp_path):
    base, _ = hdf5_set
    snap = from_gadget_hdf5(base, part_type="all", chunks=4)
    prov = snap.provenance
    files = [str(base.parent / f"snap_010.{i}.hdf5") for i in range(2)]
    assert prov["files"] == files and all(Path(f).is_absolute() for f in files)
    assert prov["format"] == "hdf5" and prov["part_types"] == [0, 1, 4]
    assert prov["n_per_type"] == {"0": 12, "1": 20, "4": 4}
    header = prov["header"]
    assert header["MassTable"] == MASS_TABLE and header["NumPart_Total"] == TOTAL
    assert header["NumPart_ThisFile"] == [7, 11, 0, 0, 4, 0]
    assert header["BoxSize"] == tg.BOX and header["Time"] == 0.5
    json.dumps(prov)  # plain JSON values
    for derived in (snap.rechunk(5), snap.to_device("cpu"), snap.persist(),
                    snap.to_units(length="kpc/h")):
        assert derived.provenance == prov

    out = tmp_path / "joint.zarr"
    snap.to_units(length="kpc/h").to_zarr(out)
    attrs = json.loads((out / "zarr.json").read_text())["attributes"]
    assert attrs["provenance"] == prov
    back = open_snapshot(out)
    assert back.provenance == prov and back.rechunk(7).provenance == prov
    assert back.units["length"] == "kpc/h" and back.species() == {0: 12, 1: 20, 4: 4}
    for name in ("ptype", "mass", "ids", "vel"):
        assert back.arrays[name].dtype == snap.arrays[name].dtype, name
        np.testing.assert_array_equal(back.arrays[name].compute(),
                                      snap.arrays[name].compute(), err_msg=name)
    np.testing.assert_allclose(back.pos.compute(), snap.pos.compute() * 1e3, rtol=1e-15)


def test_stores_without_provenance(tmp_path):
    plain = Snapshot.from_arrays(np.full((4, 3), 0.5), box_size=1.0, particle_mass=1.0)
    assert plain.provenance is None
    out = plain.to_zarr(tmp_path / "plain.zarr")
    meta = Path(out) / "zarr.json"
    assert "provenance" not in json.loads(meta.read_text())["attributes"]  # as before
    assert open_snapshot(out).provenance is None
    doc = json.loads(meta.read_text())
    doc["attributes"]["provenance"] = "somewhere"
    meta.write_text(json.dumps(doc))
    with pytest.raises(SnapshotError, match="attribute 'provenance' must be a mapping"):
        open_snapshot(out)


def test_cli_convert_all_and_info(hdf5_set, tmp_path, capsys):
    base, _ = hdf5_set
    out = tmp_path / "joint.zarr"
    argv = ["--cpu", "--workers", "1"]
    assert main(argv + ["convert", "gadget", str(base), str(out), "--part-type", "all"]) == 0
    said = capsys.readouterr().out
    assert "(PartType0: 12, PartType1: 20, PartType4: 4; N=36;" in said
    assert main(argv + ["info", str(out)]) == 0
    said = capsys.readouterr().out
    assert "species       type 0: 12, type 1: 20, type 4: 4" in said
    assert (f"imported from {base.parent / 'snap_010.0.hdf5'} (+1 more file(s)), format hdf5, "
            "part types 0, 1, 4") in said
    subset = tmp_path / "subset.zarr"
    assert main(argv + ["convert", "gadget", str(base), str(subset), "--part-type", "1,4"]) == 0
    assert "(PartType1: 20, PartType4: 4; N=24;" in capsys.readouterr().out
    assert open_snapshot(subset).provenance["part_types"] == [1, 4]


def test_cli_bad_part_types(hdf5_set, tmp_path, capsys):
    base, _ = hdf5_set
    before = digests(base.parent)
    out = tmp_path / "bad.zarr"
    argv = ["--cpu", "--workers", "1", "convert", "gadget", str(base), str(out), "--part-type"]
    assert main(argv + ["0,9"]) == 2
    err = capsys.readouterr().err
    assert "--part-type must be a Gadget particle type 0..5" in err and "got 9 in [0, 9]" in err
    assert main(argv + ["1,3"]) == 2
    assert re.search(r"no 'PartType3' group .*\[0, 1, 4\]", capsys.readouterr().err)
    for bad in ("x", "1,", "dm"):
        with pytest.raises(SystemExit) as exit_:
            main(argv + [bad])
        assert exit_.value.code == 2
        assert "comma list of types (0,1,4) or 'all'" in capsys.readouterr().err
    assert not out.exists() and digests(base.parent) == before


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("bad", [[0, 9], [1, 1], [], "ALL", [1.0, 4], (True,)])
def test_error_bad_part_type_lists(hdf5_set, bad):
    base, _ = hdf5_set
    with pytest.raises(ParameterError, match="part_type"):
        from_gadget_hdf5(base, part_type=bad)


def test_error_absent_type_lists_the_present_ones(hdf5_set, tmp_path):
    base, _ = hdf5_set
    rng = np.random.default_rng(37)
    stars = tb.make_parts(rng, 2, masses=True)
    tb.write_binary(tmp_path / "bin", {1: tb.make_parts(rng, 3), 4: stars},
                    mass_table=[0, 0.5, 0, 0, 0, 0])
    ts.write_swift_file(tmp_path / "sw.hdf5", {1: ts.make_parts(rng, 3)})
    empty = tmp_path / "empty.hdf5"
    tg.write_gadget_file(empty, {})
    before = digests(tmp_path)
    with pytest.raises(SnapshotError, match=r"no 'PartType3' group in any of the 2 file.s.; "
                                            r"particle types with particles: \[0, 1, 4\]"):
        from_gadget_hdf5(base, part_type=[1, 3])
    with pytest.raises(SnapshotError, match=r"no particles of type 0 .*\[1, 4\]"):
        from_gadget_binary(tmp_path / "bin", part_type=[0, 1])
    with pytest.raises(SnapshotError, match=r"no 'PartType4' group .*\[1\]"):
        from_swift(tmp_path / "sw.hdf5", part_type=[1, 4])
    with pytest.raises(SnapshotError, match="no particles of any type"):
        from_gadget_hdf5(empty, part_type="all")
    assert digests(tmp_path) == before


def test_error_ids_without_a_common_integer_dtype(tmp_path):
    rng = np.random.default_rng(38)
    gas, dm = tg.make_parts(rng, 3, masses=True), tg.make_parts(rng, 4, id_start=3)
    gas["ParticleIDs"] = gas["ParticleIDs"].astype(np.int64)
    path = tmp_path / "snap.hdf5"
    tg.write_gadget_file(path, {0: gas, 1: dm}, mass_table=MASS_TABLE)
    before = digests(tmp_path)
    with pytest.raises(SnapshotError, match=re.escape(
            "'PartType0/ParticleIDs' int64, 'PartType1/ParticleIDs' uint64: no integer dtype "
            "holds them all")) as err:
        from_gadget_hdf5(path, part_type="all")
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert digests(tmp_path) == before
