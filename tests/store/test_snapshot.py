"""Snapshot construction, Zarr round trips, laziness, chunking and xarray view."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import cosmo_dask
from cosmo_dask import ParameterError, Snapshot, SnapshotError, open_snapshot
from cosmo_dask.store import zarr_read
from tests.support.stores import snapshot_store as _store


def _snap(rng, n=1000, box=10.0, chunks=128, dtype=np.float64, **kw):
    pos = (rng.random((n, 3)) * box).astype(dtype)
    vel = rng.normal(size=(n, 3)).astype(dtype)
    ids = rng.permutation(n).astype(np.uint64)
    mass = rng.uniform(0.5, 2.0, n).astype(dtype)
    return Snapshot.from_arrays(pos, vel, ids, mass, box_size=box, chunks=chunks,
                                scale_factor=0.5, cosmology={"Omega_m": 0.3, "h": 0.7},
                                units={"length": "Mpc/h", "velocity": "km/s", "mass": "1e10"},
                                G=43.0091, **kw), (pos, vel, ids, mass)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_on_distributed_cluster(tmp_path, rng, client, dtype):
    snap, (pos, vel, ids, mass) = _snap(rng, dtype=dtype)
    path = snap.to_zarr(tmp_path / "s.zarr")
    back = open_snapshot(path)
    assert isinstance(back.pos, da.Array) and back.pos.shape == (1000, 3)
    assert back.pos.dtype == dtype and back.ids.dtype == np.uint64
    got = client.compute([back.pos, back.vel, back.ids, back.mass], sync=True)
    for a, b in zip(got, (pos, vel, ids, mass), strict=True):
        np.testing.assert_array_equal(a, b)
    assert back.box_size == 10.0 and back.scale_factor == 0.5
    assert back.redshift == pytest.approx(1.0)
    assert back.cosmology == {"Omega_m": 0.3, "h": 0.7}
    assert back.units["length"] == "Mpc/h" and back.G == 43.0091
    assert back.n_particles == 1000 and back.chunks == snap.chunks


def test_open_reads_no_particle_data(tmp_path, rng, monkeypatch):
    snap, _ = _snap(rng)
    snap.to_zarr(tmp_path / "s.zarr")
    calls = []
    real = zarr_read._read_rows
    monkeypatch.setattr(zarr_read, "_read_rows", lambda *a: calls.append(a) or real(*a))
    back = open_snapshot(tmp_path / "s.zarr")
    assert calls == []
    _ = back.pos, back.vel, back.mass, back.to_xarray()
    assert calls == []
    back.pos[:10].compute(scheduler="sync")
    assert len(calls) == 1  # only the first chunk was read


@pytest.mark.parametrize("rows", [7, 77, 128, 300, 5000])
def test_reading_with_other_chunking(tmp_path, rng, rows):
    snap, (pos, _, ids, _) = _snap(rng, chunks=128)
    snap.to_zarr(tmp_path / "s.zarr")
    back = open_snapshot(tmp_path / "s.zarr", chunks=rows)
    assert back.pos.chunks[0][0] == min(rows, 1000)
    np.testing.assert_array_equal(back.pos.compute(), pos)
    np.testing.assert_array_equal(back.ids.compute(), ids)


@pytest.mark.parametrize("compressor", ["zstd", "blosc"])
def test_compressed_round_trip(tmp_path, rng, compressor):
    snap, (pos, vel, ids, mass) = _snap(rng)
    snap.to_zarr(tmp_path / "s.zarr", compressor=compressor)
    back = open_snapshot(tmp_path / "s.zarr", chunks=100)
    np.testing.assert_array_equal(back.vel.compute(), vel)
    np.testing.assert_array_equal(back.mass.compute(), mass)


def test_chunks_that_hold_only_fill_values_read_back(tmp_path):
    # zarr writes no file for a chunk equal to the fill value (0): it must read as zeros
    pos = np.zeros((300, 3))
    pos[250:] = 1.0
    Snapshot.from_arrays(pos, chunks=100).to_zarr(tmp_path / "z.zarr")
    np.testing.assert_array_equal(open_snapshot(tmp_path / "z.zarr").pos.compute(), pos)


def test_default_chunk_size_from_dask_config(rng):
    pos = rng.random((1000, 3))
    assert Snapshot.from_arrays(pos).chunks == (1000,)
    with dask.config.set({"cosmo_dask.chunk_size": 300}):
        assert Snapshot.from_arrays(pos).chunks == (300, 300, 300, 100)
    assert dask.config.get("cosmo_dask.chunk_size") == 2**20


def test_dask_inputs_keep_their_chunks_and_are_not_computed(rng):
    pos = da.from_array(rng.random((1000, 3)), chunks=(250, 3))
    snap = Snapshot.from_arrays(pos)
    assert snap.chunks == (250,) * 4
    assert snap.pos is pos


def test_from_arrays_shape_errors(rng):
    with pytest.raises(SnapshotError, match="'pos' has shape"):
        Snapshot.from_arrays(rng.random((10, 2)))
    with pytest.raises(SnapshotError, match="'vel' has 9 rows"):
        Snapshot.from_arrays(rng.random((10, 3)), vel=rng.random((9, 3)))
    with pytest.raises(SnapshotError, match="'ids' has dtype float64"):
        Snapshot.from_arrays(rng.random((10, 3)), ids=rng.random(10))
    with pytest.raises(SnapshotError, match="lagrangian_shape"):
        Snapshot.from_arrays(rng.random((10, 3)), lagrangian_shape=(2, 2, 2))
    with pytest.raises(SnapshotError, match="box_size"):
        Snapshot.from_arrays(rng.random((10, 3)), box_size=-1.0)
    with pytest.raises(SnapshotError, match="both a 'mass' array and a 'particle_mass'"):
        Snapshot.from_arrays(rng.random((10, 3)), mass=np.ones(10), particle_mass=1.0)
    for key, bad in (("box_size", "ten"), ("scale_factor", 0), ("particle_mass", -2.0),
                     ("G", float("nan"))):
        with pytest.raises(SnapshotError, match=f"attribute '{key}' is"):
            Snapshot.from_arrays(rng.random((10, 3)), **{key: bad})
    with pytest.raises(SnapshotError, match="'units' must be a mapping"):
        Snapshot.from_arrays(rng.random((10, 3)), units="Mpc")
    with pytest.raises(ParameterError, match="chunks must be a positive"):
        Snapshot.from_arrays(rng.random((10, 3)), chunks=0)


def test_from_arrays_defers_value_checks_to_validate(rng):
    pos = rng.random((100, 3))
    pos[7, 1] = np.nan
    snap = Snapshot.from_arrays(pos, chunks=30)  # no error at construction
    with pytest.raises(SnapshotError, match="1 non-finite"):
        snap.validate(full=True)
    report = snap.validate(full=True, raise_errors=False)
    assert not report.ok and report.figures["pos_nonfinite"] == 1


def test_to_xarray(rng):
    snap, (pos, *_rest) = _snap(rng)
    ds = snap.to_xarray()
    assert ds["pos"].dims == ("particle", "axis") and ds["ids"].dims == ("particle",)
    assert list(ds["axis"].values) == ["x", "y", "z"]
    assert ds.attrs["box_size"] == 10.0 and ds.attrs["G"] == 43.0091
    np.testing.assert_array_equal(ds["pos"].values, pos)
    assert ds["pos"].attrs["units"] == snap.units["length"]
    assert ds["vel"].attrs["units"] == snap.units["velocity"]
    assert ds["mass"].attrs["units"] == snap.units["mass"] and ds["ids"].attrs["units"] == "1"


def test_particle_masses_broadcasts_particle_mass(rng):
    snap = Snapshot.from_arrays(rng.random((50, 3)), particle_mass=2.5, chunks=20)
    m = snap.particle_masses()
    assert m.chunks == ((20, 20, 10),)
    np.testing.assert_array_equal(m.compute(), np.full(50, 2.5))
    with pytest.raises(SnapshotError, match="masses are unknown"):
        Snapshot.from_arrays(rng.random((50, 3))).particle_masses()


def test_rechunk_and_repr(rng):
    snap, _ = _snap(rng)
    assert snap.rechunk(400).chunks == (400, 400, 200)
    assert "N=1000" in repr(snap) and "box 10" in repr(snap)


def test_public_api_names():
    for name in ("connect", "open_snapshot", "Snapshot", "SnapshotError"):
        assert hasattr(cosmo_dask, name)


def test_particle_types_survive_the_store_and_are_counted(tmp_path, capsys):
    from cosmo_dask.cli import main

    rng = np.random.default_rng(4)
    types = np.repeat(np.array([0, 1, 4], dtype=np.uint8), [300, 600, 100])
    snap = Snapshot.from_arrays(rng.random((1000, 3)) * 10, mass=rng.random(1000) + 0.5,
                                ptype=types, box_size=10.0, chunks=256)
    assert snap.species() == {0: 300, 1: 600, 4: 100}
    for other in (snap.rechunk(100), snap.persist(), snap.to_device("cpu")):
        np.testing.assert_array_equal(other.ptype.compute(), types)
    snap.to_zarr(tmp_path / "s.zarr")
    back = open_snapshot(tmp_path / "s.zarr")
    np.testing.assert_array_equal(back.ptype.compute(), types)
    assert back.ptype.dtype == np.uint8 and back.species() == {0: 300, 1: 600, 4: 100}
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    assert "species       type 0: 300, type 1: 600, type 4: 100" in capsys.readouterr().out
    with pytest.raises(SnapshotError, match="array 'ptype' has shape"):
        Snapshot.from_arrays(rng.random((10, 3)), ptype=np.zeros((10, 2), np.uint8))


# -------------------- on the GPU (formerly tests/test_gpu.py)
# CuPy-backed snapshots and a LocalCUDACluster (run on an H100/H200 host).


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_open_snapshot_on_gpu(tmp_path, rng, cupy):
    path, (pos, vel, ids, mass) = _store(tmp_path, rng)
    snap = open_snapshot(path, device="gpu")
    assert snap.device == "gpu"
    for arr in snap.arrays.values():
        assert isinstance(arr._meta, cupy.ndarray)
    got = snap.pos.compute()
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(got.get(), pos)
    np.testing.assert_array_equal(snap.vel.compute().get(), vel)
    np.testing.assert_array_equal(snap.ids.compute().get(), ids)
    # a float64 reduction on the GPU against NumPy
    np.testing.assert_allclose(float(snap.mass.sum().compute()), mass.sum(), rtol=1e-12)
    assert snap.validate(full=True).ok
    assert isinstance(snap.to_device("cpu").pos.compute(), np.ndarray)


@pytest.mark.gpu
@pytest.mark.parametrize("compressor", [None, "zstd"])
def test_gpu_store_read_in_pieces(tmp_path, rng, cupy, monkeypatch, compressor):
    """The GPU read (pinned pieces copied on per-thread streams) gives the stored values
    for any piece size, across store chunks and dask chunks, compressed or not; a bad
    value is reported by particle, as on the CPU."""
    import cosmo_dask.store.zarr_read as zr

    n, box = 10_007, 10.0
    pos = rng.random((n, 3)) * box
    ids = rng.permutation(n).astype(np.int64)
    vel = rng.normal(size=(n, 3)).astype(np.float32)
    pos[7_777] = [1.0, box + 1.0, 2.0]  # outside the box
    import zarr
    from zarr.codecs import ZstdCodec

    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    group.attrs.update({"format": "cosmo_dask.snapshot", "format_version": 1,
                        "box_size": box})
    for name, data in {"pos": pos, "vel": vel, "ids": ids}.items():
        arr = group.create_array(name, shape=data.shape, dtype=data.dtype,
                                 chunks=(1000,) + data.shape[1:],
                                 compressors=(ZstdCodec(level=3),) if compressor else None)
        arr[...] = data
    monkeypatch.setattr(zr, "_STAGE_BYTES", 24 * 37)  # 37 float64 rows, 111 int64 ids
    snap = open_snapshot(tmp_path / "s.zarr", device="gpu", chunks=3000)
    assert isinstance(snap.pos._meta, cupy.ndarray)
    np.testing.assert_array_equal(snap.ids.compute().get(), ids)
    np.testing.assert_array_equal(snap.vel.compute().get(), vel)
    raw = open_snapshot(tmp_path / "s.zarr", device="gpu", chunks=3000, check=False)
    np.testing.assert_array_equal(raw.pos.compute().get(), pos)
    with pytest.raises(SnapshotError, match="particle 7777"):
        snap.pos.compute()
    wrapped = open_snapshot(tmp_path / "s.zarr", device="gpu", wrap=True).pos.compute().get()
    np.testing.assert_array_equal(wrapped[7_777], [1.0, 1.0, 2.0])


@pytest.mark.gpu
def test_gpu_chunks_are_validated(tmp_path, rng, cupy):
    pos = cupy.asarray(rng.random((1000, 3)))
    pos[321, 0] = cupy.nan
    snap = Snapshot.from_arrays(pos, box_size=1.0, chunks=100)
    assert snap.device == "gpu"
    with pytest.raises(SnapshotError, match="particle 321 has non-finite"):
        snap.to_zarr(tmp_path / "bad.zarr")
    assert not (tmp_path / "bad.zarr").exists()
    report = snap.validate(full=True, raise_errors=False)
    assert report.figures["pos_nonfinite"] == 1


@pytest.mark.gpu
def test_cupy_inputs_round_trip(tmp_path, rng, cupy):
    pos = cupy.asarray(rng.random((3000, 3)).astype(np.float32))
    mass = cupy.asarray(rng.uniform(1, 2, 3000))
    snap = Snapshot.from_arrays(pos, mass=mass, chunks=1000)
    snap.to_zarr(tmp_path / "g.zarr")
    back = open_snapshot(tmp_path / "g.zarr")
    np.testing.assert_array_equal(back.pos.compute(), pos.get())
    np.testing.assert_array_equal(back.mass.compute(), mass.get())
    pm = Snapshot.from_arrays(pos, particle_mass=2.0, chunks=1000).particle_masses()
    assert isinstance(pm.compute(), cupy.ndarray)
