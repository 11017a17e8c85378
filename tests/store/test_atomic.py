"""Atomic writes: failures and interruptions leave nothing; existing stores are protected."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from cosmo_dask import Snapshot, SnapshotError, open_snapshot


def _exploding_pos(n=1000, rows=100, fail_at=7, exc=None):
    exc = RuntimeError("disk on fire") if exc is None else exc

    def block(b, block_info=None):
        if block_info[0]["chunk-location"][0] == fail_at:
            raise exc
        return b

    base = da.from_array(np.random.default_rng(1).random((n, 3)), chunks=(rows, 3))
    return base.map_blocks(block, dtype=base.dtype)


def _leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize("scheduler", ["threads", "sync"])
def test_exception_mid_write_leaves_no_store(tmp_path, scheduler):
    import dask

    snap = Snapshot.from_arrays(_exploding_pos())
    with dask.config.set(scheduler=scheduler), pytest.raises(RuntimeError, match="disk on fire"):
        snap.to_zarr(tmp_path / "out.zarr")
    assert _leftovers(tmp_path) == []


def test_exception_mid_write_on_distributed_cluster(tmp_path, client):
    snap = Snapshot.from_arrays(_exploding_pos())
    with pytest.raises(RuntimeError, match="disk on fire"):
        snap.to_zarr(tmp_path / "out.zarr")
    assert _leftovers(tmp_path) == []


def test_keyboard_interrupt_mid_write_leaves_no_store(tmp_path):
    import dask

    snap = Snapshot.from_arrays(_exploding_pos(exc=KeyboardInterrupt()))
    with dask.config.set(scheduler="sync"), pytest.raises(KeyboardInterrupt):
        snap.to_zarr(tmp_path / "out.zarr")
    assert _leftovers(tmp_path) == []


def test_existing_store_is_protected_and_overwrite_replaces(tmp_path, rng):
    first = Snapshot.from_arrays(rng.random((100, 3)), chunks=30)
    first.to_zarr(tmp_path / "s.zarr")
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    second = Snapshot.from_arrays(rng.random((50, 3)), chunks=30)
    with pytest.raises(SnapshotError, match="already exists; pass overwrite=True"):
        second.to_zarr(tmp_path / "s.zarr")
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert before == after
    second.to_zarr(tmp_path / "s.zarr", overwrite=True)
    np.testing.assert_array_equal(open_snapshot(tmp_path / "s.zarr").pos.compute(),
                                  second.pos.compute())
    assert _leftovers(tmp_path) == ["s.zarr"]


def test_failed_overwrite_keeps_the_old_store(tmp_path, rng):
    first = Snapshot.from_arrays(rng.random((100, 3)), chunks=30)
    first.to_zarr(tmp_path / "s.zarr")
    with pytest.raises(RuntimeError):
        Snapshot.from_arrays(_exploding_pos()).to_zarr(tmp_path / "s.zarr", overwrite=True)
    np.testing.assert_array_equal(open_snapshot(tmp_path / "s.zarr").pos.compute(),
                                  first.pos.compute())
    assert _leftovers(tmp_path) == ["s.zarr"]


def test_overwriting_the_store_being_read(tmp_path, rng):
    Snapshot.from_arrays(rng.random((100, 3)), chunks=30).to_zarr(tmp_path / "s.zarr")
    snap = open_snapshot(tmp_path / "s.zarr")
    expected = snap.pos.compute()
    snap.rechunk(64).to_zarr(tmp_path / "s.zarr", overwrite=True)
    back = open_snapshot(tmp_path / "s.zarr")
    assert back.chunks == (64, 36)
    np.testing.assert_array_equal(back.pos.compute(), expected)


def test_bad_targets(tmp_path, rng):
    snap = Snapshot.from_arrays(rng.random((10, 3)))
    (tmp_path / "f").write_text("x")
    with pytest.raises(SnapshotError, match="is a file"):
        snap.to_zarr(tmp_path / "f", overwrite=True)
    with pytest.raises(SnapshotError, match="parent directory"):
        snap.to_zarr(tmp_path / "no" / "such" / "s.zarr")
    with pytest.raises(NotImplementedError, match="remote URLs"):
        snap.to_zarr("s3://bucket/s.zarr")
