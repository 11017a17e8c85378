"""Direct summation gravity on the GPU (CuPy RawKernel) against float64 NumPy references:
launch shapes and the graph on CuPy chunks (the kernel's contract on both backends:
tests/test_kernel_contracts_gravity.py)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from cosmo_dask.gravity.direct import direct_accelerations
from tests.support.gravity import reference, rel_err

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cloud():
    rng = np.random.default_rng(21)
    n = 1500      # not a multiple of any tile: exercises the padding
    x = rng.normal(size=(n, 3)) + 50.0
    m = rng.uniform(0.5, 1.5, n)
    return x, m


@pytest.mark.parametrize("threads, per_thread, splits", [(64, 1, 1), (128, 4, None),
                                                          (256, 8, 3), (32, 2, 7)])
def test_gpu_launch_shapes_agree(cloud, threads, per_thread, splits):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.gravity.p2p_kernels_gpu import p2p_block_gpu

    x, m = cloud
    a0, p0 = reference(x, m, eps=0.01)
    xd, md = cupy.asarray(x), cupy.asarray(m)
    a, p = p2p_block_gpu(xd, xd, md, softening=0.01, exclude="index", threads=threads,
                         per_thread=per_thread, splits=splits)
    assert rel_err(a.get(), a0).max() < 1e-11 and rel_err(p.get(), p0).max() < 1e-11
    # separate targets and sources (no self pairs in the block), and a scalar mass
    a, p = p2p_block_gpu(xd[:700], xd[700:], 2.0, softening=0.01, threads=threads,
                         per_thread=per_thread, splits=splits)
    b0, q0 = reference(x, np.where(np.arange(len(x)) < 700, 0.0, 2.0), eps=0.01)
    assert rel_err(a.get(), b0[:700]).max() < 1e-11 and rel_err(p.get(), q0[:700]).max() < 1e-11


def test_dask_graph_cupy_chunks(cloud):
    cupy = pytest.importorskip("cupy")
    x, m = cloud
    a0, p0 = reference(x, m, G=2.0, eps=0.05, kernel="spline")
    pos = da.from_array(cupy.asarray(x), chunks=(400, 3), asarray=False)
    mass = da.from_array(cupy.asarray(m), chunks=400, asarray=False)
    acc, pot = direct_accelerations(pos, mass, G=2.0, softening=0.05, softening_kernel="spline")
    assert isinstance(acc._meta, cupy.ndarray) and acc.chunks[0] == pos.chunks[0]
    a, p = acc.compute(), pot.compute()
    assert isinstance(a, cupy.ndarray) and isinstance(p, cupy.ndarray)
    assert rel_err(a.get(), a0).max() < 1e-11 and rel_err(p.get(), p0).max() < 1e-11
    acc32, _ = direct_accelerations(pos, mass, G=2.0, softening=0.05,
                                    softening_kernel="spline", precision="float32")
    a32 = acc32.compute()
    assert a32.dtype == np.float32 and np.median(rel_err(a32.get(), a0)) < 3e-6
