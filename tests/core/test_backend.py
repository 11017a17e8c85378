"""Array-module dispatch, device moves, device detection and the precision policy."""

from __future__ import annotations

import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core import backend
from cosmo_dask.core.backend import (
    array_module,
    array_token,
    as_dask_rows,
    chunk_ranges,
    cupy_installed,
    default_chunk_size,
    device_of,
    gpu_available,
    resolve_precision,
    to_device,
    value_ranges,
)
from cosmo_dask.core.errors import DeviceError, ParameterError


def test_dispatch_on_chunk_type():
    x = np.zeros(3)
    d = da.from_array(np.arange(12.0).reshape(4, 3), chunks=(2, 3))
    assert array_module(x) is np and array_module(d) is np
    assert device_of(d) == "cpu"


def test_to_device_cpu_is_identity_and_bad_device_is_refused():
    d = da.ones((10, 3), chunks=(5, 3))
    assert to_device(d, "cpu") is d
    with pytest.raises(ParameterError, match="device must be 'cpu' or 'gpu'"):
        to_device(d, "tpu")


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU error")
def test_to_device_gpu_without_gpu_is_a_clear_error():
    with pytest.raises(DeviceError, match="needs a GPU"):
        to_device(da.ones(4, chunks=2), "gpu")


@pytest.mark.skipif(cupy_installed(), reason="checks a machine without CuPy")
def test_cupy_is_never_imported_without_it():
    code = (
        "import sys, numpy as np, cosmo_dask\n"
        "from cosmo_dask.core.backend import gpu_available, array_module\n"
        "assert not gpu_available()\n"
        "s = cosmo_dask.Snapshot.from_arrays(np.zeros((4, 3)))\n"
        "array_module(s.pos); s.validate(full=True)\n"
        "print('cupy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_precision_policy():
    assert resolve_precision() == np.float64
    assert resolve_precision("float32") == np.float32
    assert resolve_precision(np.float64) == np.float64
    with dask.config.set({"cosmo_dask.precision": "float32"}):
        assert resolve_precision() == np.float32
    for bad in ("float16", "int64", "double-ish", 3):
        with pytest.raises(ParameterError, match="precision must be 'float32' or 'float64'"):
            resolve_precision(bad)


def test_chunk_size_config_is_checked():
    assert default_chunk_size() == 2**20
    with dask.config.set({"cosmo_dask.chunk_size": 0}), pytest.raises(ParameterError):
        default_chunk_size()


# -------------------- on the GPU (formerly tests/test_gpu.py)
# CuPy-backed snapshots and a LocalCUDACluster (run on an H100/H200 host).


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_backend_dispatch_and_to_device(cupy):
    x = da.from_array(np.arange(30.0).reshape(10, 3), chunks=(4, 3))
    g = to_device(x, "gpu")
    assert isinstance(g._meta, cupy.ndarray) and array_module(g) is cupy
    assert device_of(g) == "gpu" and device_of(x) == "cpu"
    out = g.compute()
    assert isinstance(out, cupy.ndarray)
    np.testing.assert_array_equal(to_device(g, "cpu").compute(), x.compute())


def _splitmix_sum_reference(buf: bytes) -> list[int]:
    """The content hash in plain Python integers (independent of NumPy's uint64)."""
    mask = (1 << 64) - 1
    buf = bytes(buf) + b"\0" * (-len(buf) % 8)
    out = []
    for seed in backend._HASH_SEEDS:
        h = 0
        for i in range(len(buf) // 8):
            z = int.from_bytes(buf[8 * i:8 * i + 8], "little") ^ ((seed + i * backend._HASH_STEP)
                                                                   & mask)
            z = ((z ^ (z >> 30)) * backend._HASH_MUL1) & mask
            z = ((z ^ (z >> 27)) * backend._HASH_MUL2) & mask
            h = (h + (z ^ (z >> 31))) & mask
        out.append(h)
    return out


@pytest.mark.parametrize("shape,dtype", [((50, 3), np.float64), ((13,), np.uint8),
                                         ((7, 3), np.float32), ((0, 3), np.float64)])
def test_content_hash_matches_a_plain_python_reference(rng, monkeypatch, shape, dtype):
    x = (rng.random(shape) * 200).astype(dtype)
    ref = _splitmix_sum_reference(x.tobytes())
    assert [int(v) for v in backend._content_hash(np, x)] == ref
    monkeypatch.setattr(backend, "_HASH_BLOCK", 5)  # blocks of words give the same sums
    assert [int(v) for v in backend._content_hash(np, x)] == ref
    # a strided view hashes its values in C order, as a contiguous copy
    assert [int(v) for v in backend._content_hash(np, x[::-1])] == \
        _splitmix_sum_reference(np.ascontiguousarray(x[::-1]).tobytes())


def test_content_hash_sees_every_byte_and_every_position(rng):
    x = rng.normal(size=(64, 3))
    h = [int(v) for v in backend._content_hash(np, x)]
    flipped = x.copy()
    flipped.reshape(-1).view(np.uint8)[517] ^= 1  # one bit
    swapped = x.copy()
    swapped[[3, 40]] = swapped[[40, 3]]  # same values, other places
    for other in (flipped, swapped):
        assert [int(v) for v in backend._content_hash(np, other)] != h


@pytest.mark.gpu
def test_cupy_rows_are_named_by_their_contents_on_the_device(cupy, rng):
    """A CuPy input's key comes from the device hash (no copy to the host, as dask's
    pickling tokenizer makes): the NumPy values of the same bytes, equal for equal
    contents, different after one changed value."""
    x = rng.normal(size=(1000, 3))
    d = cupy.asarray(x)
    assert [int(v) for v in backend._content_hash(cupy, d)] == \
        [int(v) for v in backend._content_hash(np, x)]
    a = as_dask_rows(d)
    assert array_token(d) == array_token(cupy.asarray(x))
    assert a.name == as_dask_rows(cupy.asarray(x)).name
    d[5, 1] += 1.0
    assert as_dask_rows(d).name != a.name
    odd = np.arange(11, dtype=np.float32)[1:]  # a view 4 bytes into its buffer
    assert [int(v) for v in backend._content_hash(cupy, cupy.arange(11, dtype=np.float32)[1:])] \
        == [int(v) for v in backend._content_hash(np, odd)]
    np.testing.assert_array_equal(cupy.asnumpy(as_dask_rows(d).compute()), cupy.asnumpy(d))


def test_chunk_ranges_are_each_chunks_min_and_max(rng):
    """One task per chunk gives what min() and max() over the whole arrays give, NaN and
    infinities included, with an empty chunk."""
    pos = rng.normal(size=(40, 3))
    mass = rng.random(40) + 0.5
    dp = da.from_array(pos, chunks=((10, 0, 18, 12), 3))
    dm = da.from_array(mass, chunks=((10, 0, 18, 12),))
    table = chunk_ranges(dp, dm)
    assert table.numblocks == (4, 1) and len(dict(table.__dask_graph__())) <= 3 * 4
    t = table.compute()
    assert t.shape == (4, 4)
    np.testing.assert_array_equal(t[2], [pos[10:28].min(), pos[10:28].max(),
                                         mass[10:28].min(), mass[10:28].max()])
    assert value_ranges(t) == [(pos.min(), pos.max()), (mass.min(), mass.max())]
    for bad in (np.nan, np.inf, -np.inf):
        p = pos.copy()
        p[31, 1] = bad
        (lo, hi), _ = value_ranges(chunk_ranges(da.from_array(p, chunks=(10, 3)),
                                                 da.from_array(mass, chunks=10)).compute())
        assert not (np.isfinite(lo) and np.isfinite(hi))
