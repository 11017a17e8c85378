"""Raw Zarr stores for the malformed-store tests: groups written directly, without
cosmo_dask's validation, and the attributes of a valid snapshot."""

from __future__ import annotations

import json
import os

import numpy as np


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
