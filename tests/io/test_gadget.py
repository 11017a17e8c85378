"""Tests of cosmo_dask.io.from_gadget_hdf5 on small Gadget-layout HDF5 files."""

from __future__ import annotations

import math
import re
from pathlib import Path

import dask
import h5py
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.io import find_gadget_files, from_gadget_hdf5
from cosmo_dask.io.gadget import DEFAULT_UNITS
from cosmo_dask.units import gravitational_constant
from tests.support.gadget import (
    BOX,
    MPC_CM,
    MSUN10_G,
    make_parts,
    scaled,
    wrapped,
    write_gadget_file,
)

#: G in (kpc/h) (km/s)^2 / (1e10 Msun/h) from the IAU solar mass parameter GM_sun
#: (m^3/s^2) and the parsec, independently of astropy
G_KPC = 1.3271244e20 / 3.0856775814913673e19 / 1e6 * 1e10

KPC_CM = 3.085678e21


@pytest.fixture
def single(tmp_path):
    """One file: 50 dark-matter particles (MassTable) and 7 gas particles (Masses)."""
    rng = np.random.default_rng(1)
    dm = make_parts(rng, 50)
    dm["Coordinates"][3] = [BOX, 0.0, 5.0]  # Gadget sometimes writes x == BoxSize
    dm["Coordinates"][4] = [-0.25, 1.0, BOX]
    gas = make_parts(rng, 7, masses=True, id_start=1000)
    path = tmp_path / "snap_000.hdf5"
    write_gadget_file(path, {0: gas, 1: dm}, mass_table=[0, 0.125, 0, 0, 0, 0])
    return path, dm, gas


@pytest.fixture
def multi(tmp_path):
    """Three files with 20, 0 (no PartType1 group) and 13 particles, Masses, Time = 0.25."""
    rng = np.random.default_rng(2)
    parts = [make_parts(rng, 20, masses=True), None, make_parts(rng, 13, masses=True, id_start=20)]
    total = [0, 33, 0, 0, 0, 0]
    for i, p in enumerate(parts):
        write_gadget_file(tmp_path / f"snap_000.{i}.hdf5", {} if p is None else {1: p},
                          n_total=total, n_files=3, header={"Time": 0.25})
    expected = {k: np.concatenate([parts[0][k], parts[2][k]]) for k in parts[0]}
    return tmp_path / "snap_000", expected


# ------------------------------------------------------------------------------ contents
def test_single_file_arrays_and_metadata(single):
    path, dm, _ = single
    snap = from_gadget_hdf5(path)
    assert snap.n_particles == 50
    assert snap.pos.dtype == np.float32 and snap.ids.dtype == np.uint64
    pos = snap.pos.compute()
    np.testing.assert_array_equal(pos, wrapped(dm["Coordinates"]))
    np.testing.assert_array_equal(pos[3], [0.0, 0.0, 5.0])
    np.testing.assert_array_equal(pos[4], np.float32([BOX - 0.25, 1.0, 0.0]))
    assert pos.min() >= 0 and pos.max() < BOX
    np.testing.assert_array_equal(snap.vel.compute(), scaled(dm["Velocities"], 0.5))
    np.testing.assert_array_equal(snap.ids.compute(), dm["ParticleIDs"])
    assert snap.mass is None and snap.particle_mass == 0.125
    assert snap.box_size == BOX
    assert snap.scale_factor == 0.5 and snap.redshift == pytest.approx(1.0)
    assert snap.cosmology == {"Omega_m": 0.3, "Omega_b": 0.05, "Omega_L": 0.7, "h": 0.7,
                              "sigma8": None, "n_s": None}
    assert snap.units == {"length": "Mpc/h", "velocity": "km/s (peculiar)",
                          "mass": "1e10 Msun/h"}
    assert snap.G == pytest.approx(G_KPC / 1e3, rel=1e-9)
    info = snap.gadget_info
    assert info.files == (str(path),) and info.cosmological
    assert info.velocity_factor == pytest.approx(math.sqrt(0.5))


def test_part_type_with_masses(single):
    path, _, gas = single
    snap = from_gadget_hdf5(str(path), part_type=0)
    assert snap.n_particles == 7 and snap.particle_mass is None
    np.testing.assert_array_equal(snap.mass.compute(), gas["Masses"])
    np.testing.assert_array_equal(snap.ids.compute(), gas["ParticleIDs"])
    np.testing.assert_array_equal(snap.pos.compute(), gas["Coordinates"])


@pytest.mark.parametrize("entry", ["snap_000.0.hdf5", "snap_000.2.hdf5", "snap_000",
                                   "snap_000.*.hdf5", "snap_00?.[012].hdf5"])
def test_multi_file_set(multi, entry):
    base, expected = multi
    snap = from_gadget_hdf5(base.parent / entry)
    assert snap.gadget_info.files == tuple(str(base.parent / f"snap_000.{i}.hdf5")
                                           for i in range(3))
    assert snap.gadget_info.n_per_file == (20, 0, 13)
    assert snap.n_particles == 33
    np.testing.assert_array_equal(snap.pos.compute(), expected["Coordinates"])
    np.testing.assert_array_equal(snap.vel.compute(), scaled(expected["Velocities"], 0.25))
    np.testing.assert_array_equal(snap.ids.compute(), expected["ParticleIDs"])
    np.testing.assert_array_equal(snap.mass.compute(), expected["Masses"])
    assert snap.particle_mass is None and snap.scale_factor == 0.25


def test_files_ordered_by_number(tmp_path):
    rng = np.random.default_rng(3)
    parts = [make_parts(rng, 3, id_start=10 * i) for i in range(12)]
    for i, p in enumerate(parts):
        write_gadget_file(tmp_path / f"s.{i}.hdf5", {1: p}, n_total=[0, 36, 0, 0, 0, 0],
                          n_files=12, mass_table=[0, 1, 0, 0, 0, 0])
    files = find_gadget_files(tmp_path / "s.*.hdf5")
    assert [Path(f).name for f in files] == [f"s.{i}.hdf5" for i in range(12)]
    ids = from_gadget_hdf5(tmp_path / "s.10.hdf5").ids.compute()
    np.testing.assert_array_equal(ids, np.concatenate([p["ParticleIDs"] for p in parts]))


def test_chunks_smaller_than_a_file(multi):
    base, expected = multi
    snap = from_gadget_hdf5(base, chunks=7)
    assert snap.chunks == (7, 7, 6, 7, 6)  # never across the file boundary at 20
    for arr in snap.arrays.values():
        assert arr.chunks[0] == snap.chunks
    np.testing.assert_array_equal(snap.pos.compute(), expected["Coordinates"])
    np.testing.assert_array_equal(snap.pos[18:23].compute(), expected["Coordinates"][18:23])
    with dask.config.set({"cosmo_dask.chunk_size": 8}):
        assert from_gadget_hdf5(base).chunks == (8, 8, 4, 8, 5)
    assert from_gadget_hdf5(base).chunks == (20, 13)


def test_reads_lazily(multi, monkeypatch):
    base, expected = multi
    reads = []
    orig_getitem, orig_read_direct = h5py.Dataset.__getitem__, h5py.Dataset.read_direct

    def getitem(self, key):
        reads.append(self.name)
        return orig_getitem(self, key)

    def read_direct(self, *args, **kwargs):
        reads.append(self.name)
        return orig_read_direct(self, *args, **kwargs)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", getitem)
    monkeypatch.setattr(h5py.Dataset, "read_direct", read_direct)
    snap = from_gadget_hdf5(base, chunks=10)
    assert reads == []
    keys = [k for k in dict(snap.pos.__dask_graph__()) if k[0].startswith("gadget-read-")]
    assert len(keys) == 4
    np.testing.assert_array_equal(snap.ids.compute(), expected["ParticleIDs"])
    assert reads and set(reads) == {"/PartType1/ParticleIDs"}


def test_non_cosmological_run(tmp_path):
    rng = np.random.default_rng(4)
    p = make_parts(rng, 10)
    p["Coordinates"] -= 50  # isolated: negative positions stay as they are
    path = tmp_path / "iso.hdf5"
    write_gadget_file(path, {1: p}, mass_table=[0, 2.0, 0, 0, 0, 0],
                      header={"Time": 3.0, "Omega0": 0.0, "OmegaLambda": 0.0, "BoxSize": 0.0,
                              "UnitLength_in_cm": KPC_CM})
    snap = from_gadget_hdf5(path)
    assert snap.box_size is None and snap.scale_factor is None and snap.cosmology is None
    assert snap.units == {"length": "kpc/h", "velocity": "km/s", "mass": "1e10 Msun/h"}
    assert snap.G == pytest.approx(G_KPC, rel=1e-9)
    np.testing.assert_array_equal(snap.pos.compute(), p["Coordinates"])
    np.testing.assert_array_equal(snap.vel.compute(), p["Velocities"])
    assert not snap.gadget_info.cosmological and snap.gadget_info.velocity_factor == 1.0


def test_comoving_flag_in_parameters_wins(tmp_path):
    rng = np.random.default_rng(5)
    p = make_parts(rng, 4)
    path = tmp_path / "flag.hdf5"
    write_gadget_file(path, {1: p}, mass_table=[0, 1, 0, 0, 0, 0],
                      parameters={"ComovingIntegrationOn": np.int32(0)})
    snap = from_gadget_hdf5(path)
    np.testing.assert_array_equal(snap.vel.compute(), p["Velocities"])
    assert snap.scale_factor is None
    assert "ComovingIntegrationOn" in snap.gadget_info.cosmological_rule


def test_units(tmp_path):
    rng = np.random.default_rng(6)
    p = make_parts(rng, 4)
    path = tmp_path / "u.hdf5"
    none = {"UnitLength_in_cm": None, "UnitMass_in_g": None, "UnitVelocity_in_cm_per_s": None}
    write_gadget_file(path, {1: p}, mass_table=[0, 1, 0, 0, 0, 0], header=none)
    snap = from_gadget_hdf5(path)
    assert snap.units == DEFAULT_UNITS and snap.G == pytest.approx(G_KPC, rel=1e-9)
    snap = from_gadget_hdf5(path, units={"length": "Mpc/h"})
    assert snap.units["length"] == "Mpc/h" and snap.G == pytest.approx(G_KPC / 1e3, rel=1e-9)
    # any physical units: G from the unit system; pc against 1e10 Msun/h needs h
    snap = from_gadget_hdf5(path, units={"length": "pc"})
    assert snap.G == pytest.approx(G_KPC * 1e3 / snap.cosmology["h"], rel=1e-9)
    snap = from_gadget_hdf5(path, units={"length": "N-body length"})
    assert snap.G is None
    write_gadget_file(path, {1: p}, mass_table=[0, 1, 0, 0, 0, 0],
                      header={"UnitLength_in_cm": 3.0e22})
    snap = from_gadget_hdf5(path)
    assert snap.units["length"] == "3e+22 cm/h"
    assert snap.G == pytest.approx(G_KPC * 3.0856775814913673e21 / 3.0e22, rel=1e-9)
    assert gravitational_constant({"length": "kpc/h", "velocity": "km/s",
                                   "mass": "1e10 Msun/h"}) == pytest.approx(G_KPC, rel=1e-9)
    with pytest.raises(ParameterError, match="unknown key"):
        from_gadget_hdf5(path, units={"time": "Gyr"})


def test_units_from_parameters_group(tmp_path):
    """Gadget-4 / AREPO keep units, h and the comoving flag in Parameters only."""
    rng = np.random.default_rng(13)
    p = make_parts(rng, 6)
    path = tmp_path / "g4.hdf5"
    only_in_parameters = {"UnitLength_in_cm": MPC_CM, "UnitMass_in_g": MSUN10_G,
                          "UnitVelocity_in_cm_per_s": 1e5, "HubbleParam": 0.6774,
                          "ComovingIntegrationOn": np.int32(1)}
    write_gadget_file(path, {1: p}, mass_table=[0, 1, 0, 0, 0, 0],
                      header=dict.fromkeys(only_in_parameters), parameters=only_in_parameters)
    snap = from_gadget_hdf5(path)
    assert snap.units == {"length": "Mpc/h", "velocity": "km/s (peculiar)",
                          "mass": "1e10 Msun/h"}
    assert snap.G == pytest.approx(G_KPC / 1e3, rel=1e-9) and snap.cosmology["h"] == 0.6774
    assert snap.gadget_info.cosmological_rule == "Parameters/ComovingIntegrationOn = 1"
    np.testing.assert_array_equal(snap.pos.compute(), p["Coordinates"])
    np.testing.assert_array_equal(snap.vel.compute(), scaled(p["Velocities"], 0.5))
    # in both groups, equal to a relative 1e-6: accepted
    write_gadget_file(path, {1: p}, mass_table=[0, 1, 0, 0, 0, 0],
                      parameters={"UnitLength_in_cm": MPC_CM * (1 + 1e-8), "HubbleParam": 0.7})
    snap = from_gadget_hdf5(path)
    assert snap.units["length"] == "Mpc/h" and snap.cosmology["h"] == 0.7


@pytest.mark.parametrize("key,in_header,in_parameters", [
    ("UnitLength_in_cm", MPC_CM, KPC_CM),
    ("HubbleParam", 0.7, 0.6774),
    ("UnitVelocity_in_cm_per_s", 1e5, 1e5 * (1 + 1e-5)),
])
def test_units_header_and_parameters_disagree(tmp_path, key, in_header, in_parameters):
    rng = np.random.default_rng(14)
    path = tmp_path / "g4.hdf5"
    write_gadget_file(path, {1: make_parts(rng, 3)}, mass_table=[0, 1, 0, 0, 0, 0],
                      header={key: in_header}, parameters={key: in_parameters})
    message = (f"{path}: Header/{key} is {in_header!r} but Parameters/{key} is "
               f"{in_parameters!r}")
    with pytest.raises(SnapshotError, match=re.escape(message)):
        from_gadget_hdf5(path)


def test_computes_on_distributed_cluster(multi):
    distributed = pytest.importorskip("distributed")
    base, expected = multi
    snap = from_gadget_hdf5(base, chunks=6)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        pos, vel, ids = client.compute([snap.pos, snap.vel, snap.ids], sync=True)
        total = client.compute(snap.mass.sum(), sync=True)
    np.testing.assert_array_equal(pos, expected["Coordinates"])
    np.testing.assert_array_equal(vel, scaled(expected["Velocities"], 0.25))
    np.testing.assert_array_equal(ids, expected["ParticleIDs"])
    assert total == pytest.approx(expected["Masses"].sum())


# ------------------------------------------------------------------------------ errors
def test_error_nothing_matches(tmp_path):
    with pytest.raises(SnapshotError, match="no such Gadget snapshot"):
        from_gadget_hdf5(tmp_path / "nothing")
    with pytest.raises(SnapshotError, match="matches no file"):
        from_gadget_hdf5(tmp_path / "nothing_*.hdf5")
    with pytest.raises(SnapshotError, match="is a directory"):
        from_gadget_hdf5(tmp_path)


def test_error_not_hdf5(tmp_path):
    path = tmp_path / "snap.hdf5"
    path.write_text("not hdf5")
    with pytest.raises(SnapshotError, match="not an HDF5 file"):
        from_gadget_hdf5(path)


def test_error_no_header(tmp_path):
    path = tmp_path / "snap.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("PartType1/Coordinates", data=np.zeros((2, 3)))
    with pytest.raises(SnapshotError, match="no 'Header' group"):
        from_gadget_hdf5(path)


@pytest.mark.parametrize("bad", [-1, 6, True, "1", 1.0])
def test_error_part_type(single, bad):
    with pytest.raises(ParameterError, match="0..5"):
        from_gadget_hdf5(single[0], part_type=bad)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "big"])
def test_error_chunks(single, bad):
    with pytest.raises(ParameterError, match="chunks"):
        from_gadget_hdf5(single[0], chunks=bad)


def test_error_no_group_for_type(single):
    with pytest.raises(SnapshotError, match=r"no 'PartType3' group.*\[0, 1\]"):
        from_gadget_hdf5(single[0], part_type=3)


@pytest.mark.parametrize("entry", ["snap_000.0.hdf5", "snap_000"])
def test_error_missing_file_of_set(multi, entry):
    base, _ = multi
    (base.parent / "snap_000.1.hdf5").unlink()
    with pytest.raises(SnapshotError, match=r"missing: .*snap_000\.1\.hdf5"):
        from_gadget_hdf5(base.parent / entry)
    with pytest.raises(SnapshotError, match="NumFilesPerSnapshot of .* is 3"):
        from_gadget_hdf5(base.parent / "snap_000.*.hdf5")


def test_error_inconsistent_dtypes(multi):
    base, _ = multi
    rng = np.random.default_rng(7)
    write_gadget_file(base.parent / "snap_000.2.hdf5",
                      {1: make_parts(rng, 13, masses=True, pos_dtype=np.float64)},
                      n_total=[0, 33, 0, 0, 0, 0], n_files=3)
    with pytest.raises(SnapshotError, match="dtype float64 but it is float32"):
        from_gadget_hdf5(base)


def test_error_inconsistent_datasets(multi):
    base, _ = multi
    rng = np.random.default_rng(8)
    write_gadget_file(base.parent / "snap_000.2.hdf5", {1: make_parts(rng, 13)},
                      n_total=[0, 33, 0, 0, 0, 0], n_files=3)
    with pytest.raises(SnapshotError, match="same datasets"):
        from_gadget_hdf5(base)


def test_error_numpart_total(tmp_path):
    rng = np.random.default_rng(9)
    path = tmp_path / "snap.hdf5"
    write_gadget_file(path, {1: make_parts(rng, 5)}, n_total=[0, 6, 0, 0, 0, 0],
                      mass_table=[0, 1, 0, 0, 0, 0])
    with pytest.raises(SnapshotError, match=r"NumPart_Total\[1\] is 6 but .* sums to 5"):
        from_gadget_hdf5(path)
    write_gadget_file(path, {1: make_parts(rng, 5)}, mass_table=[0, 1, 0, 0, 0, 0],
                      header={"NumPart_Total_HighWord": np.uint32([0, 1, 0, 0, 0, 0])})
    with pytest.raises(SnapshotError, match=f"is {2**32 + 5} but"):
        from_gadget_hdf5(path)


def test_error_dataset_length(tmp_path):
    rng = np.random.default_rng(10)
    path = tmp_path / "snap.hdf5"
    parts = make_parts(rng, 5)
    parts["ParticleIDs"] = parts["ParticleIDs"][:4]
    write_gadget_file(path, {1: parts}, mass_table=[0, 1, 0, 0, 0, 0])
    with pytest.raises(SnapshotError, match="ParticleIDs' has shape"):
        from_gadget_hdf5(path)


def test_error_no_masses(tmp_path):
    rng = np.random.default_rng(11)
    path = tmp_path / "snap.hdf5"
    write_gadget_file(path, {1: make_parts(rng, 5)})
    with pytest.raises(SnapshotError, match=r"no 'Masses' dataset and Header/MassTable\[1\]"):
        from_gadget_hdf5(path)


def test_error_pattern_spans_two_snapshots(tmp_path):
    rng = np.random.default_rng(12)
    for i in range(2):
        write_gadget_file(tmp_path / f"snap_00{i}.hdf5", {1: make_parts(rng, 3)},
                          mass_table=[0, 1, 0, 0, 0, 0])
    with pytest.raises(SnapshotError, match="exactly the files of one snapshot"):
        from_gadget_hdf5(tmp_path / "snap_*.hdf5")
