"""CuPy-backed snapshots and a LocalCUDACluster (run on an H100/H200 host).

Every test is marked ``gpu`` and skipped without a CUDA device (conftest.py).
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from cosmo_dask import Snapshot, SnapshotError, connect, open_snapshot
from cosmo_dask.core.backend import array_module, device_of, gpu_count, to_device

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


def _store(tmp_path, rng, n=5000, box=10.0, chunks=700):
    pos = rng.random((n, 3)) * box
    vel = rng.normal(size=(n, 3)).astype(np.float32)
    mass = rng.uniform(1, 2, n)
    ids = np.arange(n, dtype=np.int64)
    Snapshot.from_arrays(pos, vel, ids, mass, box_size=box, chunks=chunks).to_zarr(
        tmp_path / "s.zarr")
    return tmp_path / "s.zarr", (pos, vel, ids, mass)


def test_backend_dispatch_and_to_device(cupy):
    x = da.from_array(np.arange(30.0).reshape(10, 3), chunks=(4, 3))
    g = to_device(x, "gpu")
    assert isinstance(g._meta, cupy.ndarray) and array_module(g) is cupy
    assert device_of(g) == "gpu" and device_of(x) == "cpu"
    out = g.compute()
    assert isinstance(out, cupy.ndarray)
    np.testing.assert_array_equal(to_device(g, "cpu").compute(), x.compute())


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


def test_local_cuda_cluster_computes_on_gpu_workers(tmp_path, rng, cupy):
    path, (pos, *_rest) = _store(tmp_path, rng, n=20000, chunks=3000)
    with connect(gpu=True, quiet=True) as client:
        workers = client.scheduler_info()["workers"]
        assert len(workers) == gpu_count()
        assert type(client.cluster).__name__ == "LocalCUDACluster"
        snap = open_snapshot(path, device="gpu")
        mean = client.compute(snap.pos.mean(axis=0), sync=True)
        assert isinstance(mean, cupy.ndarray)
        np.testing.assert_allclose(mean.get(), pos.astype(np.float64).mean(axis=0), rtol=1e-12)
        assert snap.validate(full=True).ok
    # the cluster the client started is closed with it
    assert client.status == "closed"


def test_gpu_check_errors_cross_the_cluster(tmp_path, rng, cupy):
    from conftest import good_attrs, write_raw_store

    pos = rng.random((4000, 3))
    pos[2500] = [1.0, 0.5, 0.5]  # == box_size: outside [0, 1)
    path = write_raw_store(tmp_path / "o.zarr", {"pos": pos}, good_attrs(box_size=1.0),
                           chunks=500)
    with connect(gpu=True, quiet=True) as client:
        snap = open_snapshot(path, device="gpu")
        with pytest.raises(SnapshotError, match="particle 2500 at \\[1.0, 0.5, 0.5\\]"):
            client.compute(snap.pos.sum(), sync=True)
        wrapped = open_snapshot(path, device="gpu", wrap=True).pos
        assert float(client.compute(wrapped.max(), sync=True)) < 1.0


def test_zeldovich_on_gpu_matches_cpu(cupy):
    pytest.importorskip("scipy")
    from cosmo_dask.models import zeldovich

    snap = zeldovich(32, box_size=64.0, redshift=2.0, seed=9, chunks=5000)
    cpu = snap.pos.compute()
    gpu = snap.to_device("gpu").pos.compute()
    assert isinstance(gpu, cupy.ndarray)
    np.testing.assert_array_equal(gpu.get(), cpu)


def test_rmm_options_need_rmm(cupy):
    import importlib.util

    from cosmo_dask.core.errors import ClusterError

    if importlib.util.find_spec("rmm") is not None:
        with connect(gpu=True, rmm_pool_size="1GB", rmm_cupy=True, quiet=True) as client:
            assert len(client.scheduler_info()["workers"]) == gpu_count()
    else:
        with pytest.raises(ClusterError, match="'rmm' package is not installed"):
            connect(gpu=True, rmm_pool_size="1GB", quiet=True)


def test_worker_count_against_gpu_count(cupy):
    from cosmo_dask.core.errors import DeviceError

    n = gpu_count()
    with pytest.raises(DeviceError, match=f"{n + 1} GPU workers asked for"):
        connect(gpu=True, n_workers=n + 1, quiet=True)
    # "auto" with more workers than GPUs runs CPU workers
    with connect(gpu="auto", n_workers=n + 1, processes=False, quiet=True) as client:
        assert type(client.cluster).__name__ == "LocalCluster"
        assert len(client.scheduler_info()["workers"]) == n + 1
