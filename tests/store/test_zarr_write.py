"""Every store writer goes through ``zarr_write.store_arrays``: compute chunks that do not
align with the store's chunk grid, and CuPy chunks, are written exactly."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

from cosmo_dask.density.mesh_store import open_mesh, write_mesh
from cosmo_dask.expansion.output import open_expansion, write_expansion
from cosmo_dask.gravity.output import open_gravity
from cosmo_dask.gravity.output import to_zarr as write_gravity
from cosmo_dask.halos.result import HaloResult, open_catalog
from cosmo_dask.store.snapshot import Snapshot, open_snapshot
from cosmo_dask.store.zarr_write import plain_attrs, regular_rows, store_arrays

IRREGULAR = (7, 13, 5, 20, 1, 54)  # 100 rows, no two chunks alike


def _on(arr: da.Array, device: str, meta_numpy: bool = False) -> da.Array:
    """``arr`` with CuPy chunks on "gpu"; ``meta_numpy`` keeps a NumPy meta (as a
    map_blocks without ``meta=`` does), so writers cannot rely on the meta."""
    if device == "cpu":
        return arr
    cupy = pytest.importorskip("cupy")
    meta = None if meta_numpy else cupy.empty((0,) * arr.ndim, arr.dtype)
    return arr.map_blocks(cupy.asarray, dtype=arr.dtype, meta=meta)


def _halos(labels: da.Array) -> HaloResult:
    catalog = xr.Dataset({"n_members": ("halo", np.array([3], np.int64))})
    return HaloResult(labels, catalog, {"linking_length": 0.2})


@pytest.mark.parametrize("chunks", [(7, 13, 5, 20, 1, 54), (30, 30, 30, 10), (64, 36)])
def test_regular_rows_gives_a_grid_every_chunk_fits(chunks):
    arr = da.zeros(sum(chunks), chunks=(chunks,))
    rows = regular_rows(arr)
    assert rows >= chunks[-1] if len(set(chunks[:-1])) <= 1 else rows == max(chunks)


def _check_all_writers(tmp_path, device, meta_numpy=False):
    rng = np.random.default_rng(3)
    n = sum(IRREGULAR)
    pos = rng.random((n, 3)) * 10.0
    ids = rng.permutation(n).astype(np.int64)
    labels = rng.integers(-1, 4, n).astype(np.int64)
    acc = rng.standard_normal((n, 3))
    pot = rng.standard_normal(n)
    mesh = rng.random((12, 12, 12))

    def dask_rows(x):
        return _on(da.from_array(x, chunks=(IRREGULAR,) + x.shape[1:]), device, meta_numpy)

    snap = Snapshot.from_arrays(dask_rows(pos), ids=dask_rows(ids), box_size=10.0,
                                particle_mass=1.0)
    back = open_snapshot(snap.to_zarr(tmp_path / "s.zarr"))
    np.testing.assert_array_equal(back.pos.compute(), pos)
    np.testing.assert_array_equal(back.ids.compute(), ids)

    out = open_catalog(_halos(dask_rows(labels)).to_zarr(tmp_path / "h.zarr"))
    np.testing.assert_array_equal(out.labels.compute(), labels)

    ds = open_gravity(write_gravity(dask_rows(acc), dask_rows(pot), tmp_path / "g.zarr"))
    np.testing.assert_array_equal(ds["acc"].values, acc)
    np.testing.assert_array_equal(ds["pot"].values, pot)

    ex = open_expansion(write_expansion(tmp_path / "e.zarr", method="mex", parameters={},
                                        acc=dask_rows(acc), pot=dask_rows(pot)))
    np.testing.assert_array_equal(ex["acc"].compute(), acc)

    mesh_d = _on(da.from_array(mesh, chunks=(5, 7, 12)), device, meta_numpy)
    stored, _ = open_mesh(write_mesh(tmp_path / "m.zarr", mesh_d, box_size=1.0, scheme="cic"))
    np.testing.assert_array_equal(stored.compute(), mesh)


def test_misaligned_chunks_every_writer(tmp_path):
    _check_all_writers(tmp_path, "cpu")


def test_store_arrays_chunk_grid_and_subgroups(tmp_path):
    group = zarr.open_group(str(tmp_path / "x.zarr"), mode="w", zarr_format=3)
    group.create_group("sub")
    a = da.arange(100, chunks=(IRREGULAR,))
    b = da.ones((9, 4, 4), chunks=(2, 3, 4))
    store_arrays(group, {"a": a, "sub/b": b}, root=tmp_path / "x.zarr", label="test",
                 chunks={"sub/b": (1, 4, 4)}, dims={"sub/b": ("leaf", "x", "y")}, show=False)
    assert group["a"].chunks == (max(IRREGULAR),)
    assert group["sub/b"].chunks == (1, 4, 4)
    np.testing.assert_array_equal(group["a"][:], np.arange(100))
    np.testing.assert_array_equal(group["sub/b"][:], np.ones((9, 4, 4)))


def test_read_chunk_size_config(tmp_path):
    snap = Snapshot.from_arrays(np.random.default_rng(1).random((100, 3)), box_size=1.0,
                                particle_mass=1.0)
    path = snap.to_zarr(tmp_path / "s.zarr")
    with dask.config.set({"cosmo_dask.read_chunk_size": 30}):
        assert open_snapshot(path).pos.chunks[0] == (30, 30, 30, 10)
    assert open_snapshot(path).pos.chunks[0] == (100,)


@pytest.mark.gpu
@pytest.mark.parametrize("meta_numpy", [False, True])
def test_cupy_chunks_every_writer(tmp_path, meta_numpy):
    _check_all_writers(tmp_path, "gpu", meta_numpy)


def test_gpu_read_rows_are_whole_store_chunks():
    from cosmo_dask.store.snapshot import GPU_READ_ROWS, gpu_read_rows

    assert gpu_read_rows(1 << 20) == GPU_READ_ROWS
    assert gpu_read_rows(3000) % 3000 == 0 and GPU_READ_ROWS - 3000 < gpu_read_rows(3000) <= (
        GPU_READ_ROWS)
    assert gpu_read_rows(1 << 25) == 1 << 25


def test_plain_attrs_is_the_one_json_converter():
    """Store attributes, catalog and product attributes, SCF attributes and Gadget headers
    all become JSON values through ``plain_attrs``."""
    import json
    from types import MappingProxyType

    value = MappingProxyType({1: (np.int32(3), np.float32(0.5)), "a": np.arange(3),
                              "z": np.array(2.5), "b": np.bool_(True), "s": b"gadget",
                              "n": [np.float64("nan"), np.inf]})
    plain = plain_attrs(value)
    assert plain["1"] == [3, 0.5] and plain["a"] == [0, 1, 2] and plain["z"] == 2.5
    assert plain["b"] is True and plain["s"] == "gadget"
    assert type(plain["1"][0]) is int and type(plain["1"][1]) is float
    text = plain_attrs(value, nonfinite_as_text=True)
    assert text["n"] == ["nan", "inf"]
    assert json.loads(json.dumps(text, allow_nan=False)) == text
