"""Direct summation gravity on the GPU (CuPy RawKernel) against float64 NumPy references."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from test_gravity_direct import reference, rel_err

from cosmo_dask.gravity.direct import direct_accelerations

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cloud():
    rng = np.random.default_rng(21)
    n = 1500      # not a multiple of any tile: exercises the padding
    x = rng.normal(size=(n, 3)) + 50.0
    m = rng.uniform(0.5, 1.5, n)
    return x, m


@pytest.mark.parametrize("kernel", ["plummer", "spline"])
@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_gpu_p2p_vs_reference(cloud, kernel, eps):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.gravity.p2p_kernels_gpu import p2p_block_gpu

    x, m = cloud
    a0, p0 = reference(x, m, G=1.5, eps=eps, kernel=kernel)
    xd, md = cupy.asarray(x), cupy.asarray(m)
    a, p = p2p_block_gpu(xd, xd, md, G=1.5, softening=eps, softening_kernel=kernel,
                         precision="float64", exclude="index")
    assert isinstance(a, cupy.ndarray) and a.dtype == np.float64
    assert rel_err(a.get(), a0).max() < 1e-11
    assert rel_err(p.get(), p0).max() < 1e-11
    a, p = p2p_block_gpu(xd, xd, md, G=1.5, softening=eps, softening_kernel=kernel,
                         precision="float32", exclude="index")
    assert a.dtype == np.float32
    ea = rel_err(a.get(), a0)
    # float32 pair arithmetic and float32 sums over 1500 sources
    assert np.median(ea) < 3e-6 and ea.max() < 1e-4
    assert rel_err(p.get(), p0).max() < 1e-5


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


def test_gpu_periodic_and_truncated():
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.gravity.p2p_kernels_gpu import p2p_block_gpu

    rng = np.random.default_rng(5)
    box = 8.0
    x = rng.uniform(0, box, size=(1200, 3))
    m = rng.uniform(1, 2, 1200)
    xd, md = cupy.asarray(x), cupy.asarray(m)
    a0, p0 = reference(x, m, eps=0.02, box=box)
    a, p = p2p_block_gpu(xd, xd, md, softening=0.02, box_size=box, exclude="index")
    assert rel_err(a.get(), a0).max() < 1e-10 and rel_err(p.get(), p0).max() < 1e-11
    rs, r_cut = 0.5, 2.25
    a0, p0 = reference(x, m, eps=0.02, box=box, rs=rs, r_cut=r_cut)
    scale = np.linalg.norm(a0, axis=1)
    for level, tol in ((None, 1e-11), (2, 1e-6), (4, 1e-10)):
        a, p = p2p_block_gpu(xd, xd, md, softening=0.02, box_size=box, rs=rs, r_cut=r_cut,
                             table_level=level, exclude="index")
        assert np.max(np.linalg.norm(a.get() - a0, axis=1) / scale) < tol
        assert rel_err(p.get(), p0).max() < 1e-11
        a, p = p2p_block_gpu(xd, xd, md, softening=0.02, box_size=box, rs=rs, r_cut=r_cut,
                             table_level=level, exclude="index", precision="float32")
        assert np.median(np.linalg.norm(a.get() - a0, axis=1) / scale) < 2e-5
        assert np.median(rel_err(p.get(), p0)) < 2e-5


def test_gpu_exclude_zero():
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.gravity.p2p_kernels_gpu import p2p_block_gpu

    rng = np.random.default_rng(8)
    x = rng.normal(size=(600, 3))
    m = rng.uniform(1, 2, 600)
    a0, p0 = reference(x, m, eps=0.1)
    xd = cupy.asarray(x)
    a, p = p2p_block_gpu(xd, xd, cupy.asarray(m), softening=0.1, exclude="zero")
    assert rel_err(a.get(), a0).max() < 1e-11 and rel_err(p.get(), p0).max() < 1e-11


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
