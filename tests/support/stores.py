"""Zarr stores for tests: raw groups written directly (no cosmo_dask validation) for the
malformed-store tests, the attributes of a valid snapshot, and a small valid snapshot
store with its arrays."""

from __future__ import annotations

import json
import os

import numpy as np

from cosmo_dask import Snapshot


def write_raw_store(path, arrays: dict, attrs: dict | None, *, zarr_format: int = 3,
                    chunks: int = 64):
    """Write a Zarr group directly (no cosmo_dask validation): for malformed-store tests."""
    import zarr

    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    if attrs is not None:
        group.attrs.update(attrs)
    for name, data in arrays.items():
        data = np.asarray(data)
        arr = group.create_array(name, shape=data.shape, dtype=data.dtype,
                                 chunks=(chunks,) + data.shape[1:], compressors=None)
        arr[...] = data
    return path


def good_attrs(**extra):
    attrs = {"format": "cosmo_dask.snapshot", "format_version": 1, "box_size": None}
    attrs.update(extra)
    return attrs


def read_json(path):
    with open(os.path.join(path, "zarr.json")) as f:
        return json.load(f)


def snapshot_store(tmp_path, rng, n=5000, box=10.0, chunks=700):
    """``tmp_path/s.zarr``: ``n`` random particles in a box of ``box`` (float64 positions,
    float32 velocities, masses 1-2); returns the path and ``(pos, vel, ids, mass)``."""
    pos = rng.random((n, 3)) * box
    vel = rng.normal(size=(n, 3)).astype(np.float32)
    mass = rng.uniform(1, 2, n)
    ids = np.arange(n, dtype=np.int64)
    Snapshot.from_arrays(pos, vel, ids, mass, box_size=box, chunks=chunks).to_zarr(
        tmp_path / "s.zarr")
    return tmp_path / "s.zarr", (pos, vel, ids, mass)
