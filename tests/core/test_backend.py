"""Array-module dispatch, device moves, device detection and the precision policy."""

from __future__ import annotations

import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.backend import (
    array_module,
    cupy_installed,
    default_chunk_size,
    device_of,
    gpu_available,
    resolve_precision,
    to_device,
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
