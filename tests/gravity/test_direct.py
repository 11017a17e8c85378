"""Direct summation gravity (CPU): P2P numba kernels and the block-pair Dask graph."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.gravity.direct import direct_accelerations
from cosmo_dask.gravity.p2p_kernels import p2p_block
from tests.support.devices import DEVICES, array_module, to_host
from tests.support.gravity import reference, rel_err, spline_KP


@pytest.fixture(scope="module")
def cloud():
    rng = np.random.default_rng(7)
    n = 400
    x = rng.normal(size=(n, 3)) * np.array([1.0, 0.5, 2.0]) + 100.0   # off-origin
    m = rng.uniform(0.5, 1.5, n)
    return x, m


# --------------------------------------------------------------------------- reference sanity
def test_spline_reference_is_consistent():
    """K r = -dP/dr, continuity at h, Newtonian beyond h, P(0) = 1/eps."""
    eps = 0.7
    r = np.linspace(0.05, 2.5, 500)
    K, P = spline_KP(r, eps)
    dP = (spline_KP(r + 1e-6, eps)[1] - spline_KP(r - 1e-6, eps)[1]) / 2e-6
    assert np.max(np.abs(K * r + dP) / (K * r)) < 1e-6
    assert spline_KP(np.array([0.0]), eps)[1][0] == pytest.approx(1.0 / eps, rel=1e-10)
    h = 2.8 * eps
    kk, pp = spline_KP(np.array([h * (1 - 1e-9), h * 1.5]), eps)
    assert kk[0] == pytest.approx(1 / h ** 3, rel=1e-6) and pp[1] == pytest.approx(1 / (1.5 * h))


# --------------------------------------------------------------------------- kernel
@pytest.mark.parametrize("kernel", ["plummer", "spline"])
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_p2p_float64(cloud, kernel, eps):
    x, m = cloud
    a0, p0 = reference(x, m, G=2.5, eps=eps, kernel=kernel)
    a, p = p2p_block(x, x, m, G=2.5, softening=eps, softening_kernel=kernel, exclude="index")
    assert a.dtype == np.float64
    assert rel_err(a, a0).max() < 1e-12
    assert rel_err(p, p0).max() < 1e-12


@pytest.mark.parametrize("kernel", ["plummer", "spline"])
def test_p2p_float32_error(cloud, kernel):
    """float32 pair arithmetic (relative positions, float64 sums): ~1e-6 relative."""
    x, m = cloud
    a0, p0 = reference(x, m, eps=0.05, kernel=kernel)
    a, p = p2p_block(x, x, m, softening=0.05, softening_kernel=kernel, precision="float32",
                     exclude="index")
    assert a.dtype == np.float32 and p.dtype == np.float32
    # measured: max 2e-6 (acc), 1e-7 (pot); positions are ~100 from the origin, so without
    # the relative-to-centre step float32 would lose ~3 more digits
    assert rel_err(a, a0).max() < 2e-5
    assert np.median(rel_err(a, a0)) < 1e-6
    assert rel_err(p, p0).max() < 1e-6


def test_exclude_zero_and_coincident(cloud):
    x, m = cloud
    a0, p0 = reference(x, m, eps=0.1)
    a, p = p2p_block(x, x, m, softening=0.1, exclude="zero")
    assert rel_err(a, a0).max() < 1e-12 and rel_err(p, p0).max() < 1e-12
    # two distinct coincident particles: softened pair counts (index rule), singular one not
    y = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    _, p = p2p_block(y, y, 1.0, softening=0.5, exclude="index")
    assert p[0] == pytest.approx(-(1 / 0.5 + 1 / np.sqrt(1.25)))
    a, p = p2p_block(y, y, 1.0, softening=0.0, exclude="index")
    assert np.all(np.isfinite(a)) and p[0] == pytest.approx(-1.0)


def test_sources_targets_different(cloud):
    x, m = cloud
    a0, p0 = reference(x, m)
    a, p = p2p_block(x[:100], x[100:], m[100:])
    b, q = p2p_block(x[:100], x[:100], m[:100], exclude="index")
    assert rel_err(a + b, a0[:100]).max() < 1e-12
    assert rel_err(p + q, p0[:100]).max() < 1e-12


def test_periodic_minimum_image():
    rng = np.random.default_rng(3)
    box = 10.0
    x = rng.uniform(0, box, size=(300, 3))
    m = rng.uniform(1, 2, 300)
    a0, p0 = reference(x, m, eps=0.05, box=box)
    for prec, tol in (("float64", 1e-11), ("float32", 3e-5)):
        a, p = p2p_block(x, x, m, softening=0.05, box_size=box, precision=prec,
                         exclude="index")
        assert np.median(rel_err(a, a0)) < tol / 10
        assert np.max(np.linalg.norm(a - a0, axis=1)) < tol * np.abs(a0).max()
        assert rel_err(p, p0).max() < tol
    # images: shifting a particle by a box vector changes nothing
    x2 = x.copy()
    x2[::3] += box * np.array([1.0, -1.0, 2.0])
    a2, _ = p2p_block(x2, x2, m, softening=0.05, box_size=box, exclude="index")
    assert np.max(np.linalg.norm(a2 - a0, axis=1)) < 1e-10 * np.abs(a0).max()


@pytest.mark.parametrize("level", [None, 0, 2, 4])
def test_truncated_kernel(level):
    rng = np.random.default_rng(11)
    box = 8.0
    x = rng.uniform(0, box, size=(350, 3))
    m = rng.uniform(1, 2, 350)
    rs, r_cut = 0.5, 2.25
    a0, p0 = reference(x, m, eps=0.01, box=box, rs=rs, r_cut=r_cut)
    a, p = p2p_block(x, x, m, softening=0.01, box_size=box, rs=rs, r_cut=r_cut,
                     table_level=level, exclude="index")
    tol = {None: 1e-12, 0: 2e-2, 2: 1e-6, 4: 1e-11}[level]
    scale = np.linalg.norm(a0, axis=1)
    assert np.max(np.linalg.norm(a - a0, axis=1) / scale) < tol
    assert rel_err(p, p0).max() < 1e-12      # potential factor erfc is always exact
    # default cutoff is 4.5 rs
    a1, _ = p2p_block(x, x, m, softening=0.01, box_size=box, rs=rs, exclude="index")
    b1, _ = reference(x, m, eps=0.01, box=box, rs=rs, r_cut=4.5 * rs)
    assert rel_err(a1, b1).max() < 1e-12


# --------------------------------------------------------------------------- dask graph
def test_direct_chunk_independence(cloud):
    x, m = cloud
    a0, p0 = reference(x, m, G=0.5, eps=0.1, kernel="spline")
    results = []
    for ch in (400, 128, 97):
        acc, pot = direct_accelerations(da.from_array(x, chunks=(ch, 3)),
                                        da.from_array(m, chunks=ch), G=0.5, softening=0.1,
                                        softening_kernel="spline")
        assert acc.chunks[0] == da.from_array(x, chunks=(ch, 3)).chunks[0]
        a, p = dask.compute(acc, pot, scheduler="sync")
        assert rel_err(a, a0).max() < 1e-12 and rel_err(p, p0).max() < 1e-12
        results.append((a, p))
    for a, p in results[1:]:
        assert rel_err(a, results[0][0]).max() < 1e-13
        assert rel_err(p, results[0][1]).max() < 1e-13


def test_direct_graph_keys_and_scalar_mass(cloud):
    x, _ = cloud
    acc, pot = direct_accelerations(da.from_array(x, chunks=(50, 3)), 0.25, G=1.0,
                                    precision="float32", potential=False)
    assert pot is None and acc.dtype == np.float32
    names = {k[0] if isinstance(k, tuple) else k for k in dict(acc.__dask_graph__())}
    assert sum(n.startswith("gravity-direct-") and "-sum-" not in n and "-acc-" not in n
               for n in names) == 1
    n_pairs = sum(1 for k in dict(acc.__dask_graph__()) if isinstance(k, tuple)
                  and k[0].startswith("gravity-direct-") and len(k) == 3
                  and "-sum-" not in k[0] and "-acc-" not in k[0])
    assert n_pairs == 64
    a0, _ = reference(x, 0.25)
    a = acc.compute()
    assert np.median(rel_err(a, a0)) < 1e-6 and rel_err(a, a0).max() < 1e-4


def test_direct_distributed(client, cloud):
    x, m = cloud
    a0, p0 = reference(x, m, eps=0.05, box=300.0)
    acc, pot = direct_accelerations(da.from_array(x, chunks=(150, 3)),
                                    da.from_array(m, chunks=150), G=1.0, softening=0.05,
                                    box_size=300.0)
    a, p = client.compute([acc, pot], sync=True)
    assert rel_err(a, a0).max() < 1e-12 and rel_err(p, p0).max() < 1e-12


@pytest.mark.parametrize("kwargs, match", [
    (dict(softening=-1.0), "softening"),
    (dict(softening=float("nan")), "softening"),
    (dict(softening_kernel="gauss"), "softening_kernel"),
    (dict(precision="float16"), "precision"),
    (dict(box_size=0.0), "box_size"),
    (dict(rs=-1.0), "rs"),
    (dict(table_level=2), "rs"),
    (dict(rs=1.0, table_level=7), "level"),
    (dict(G="x"), "G"),
])
def test_bad_parameters(cloud, kwargs, match):
    x, m = cloud
    kw = dict(G=1.0)
    kw.update(kwargs)
    with pytest.raises(ParameterError, match=match):
        direct_accelerations(da.from_array(x, chunks=(100, 3)), da.from_array(m), **kw)


def test_bad_arrays(cloud):
    x, m = cloud
    with pytest.raises(ParameterError, match="pos"):
        direct_accelerations(da.from_array(x[:, :2]), 1.0, G=1.0)
    with pytest.raises(ParameterError, match="mass"):
        direct_accelerations(da.from_array(x), da.from_array(m[:10]), G=1.0)
    with pytest.raises(ParameterError, match="mass"):
        direct_accelerations(da.from_array(x), "heavy", G=1.0)
    with pytest.raises(ParameterError, match="pos"):
        direct_accelerations(da.from_array(x.astype(np.int64)), 1.0, G=1.0)


# -------------------- on the GPU (formerly tests/test_gravity_direct_gpu.py)
# Direct summation gravity on the GPU (CuPy RawKernel) against float64 NumPy references:
# launch shapes and the graph on CuPy chunks (the kernel's contract on both backends:
# tests/gravity/test_kernel_contracts.py).


@pytest.fixture(scope="module")
def padded_cloud():
    rng = np.random.default_rng(21)
    n = 1500      # not a multiple of any tile: exercises the padding
    x = rng.normal(size=(n, 3)) + 50.0
    m = rng.uniform(0.5, 1.5, n)
    return x, m


@pytest.mark.gpu
@pytest.mark.parametrize("threads, per_thread, splits", [(64, 1, 1), (128, 4, None),
                                                          (256, 8, 3), (32, 2, 7)])
def test_gpu_launch_shapes_agree(padded_cloud, threads, per_thread, splits):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.gravity.p2p_kernels_gpu import p2p_block_gpu

    x, m = padded_cloud
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


@pytest.mark.parametrize("device", DEVICES)
def test_dask_graph_device_chunks(padded_cloud, device):
    xp = array_module(device)
    x, m = padded_cloud
    a0, p0 = reference(x, m, G=2.0, eps=0.05, kernel="spline")
    pos = da.from_array(xp.asarray(x), chunks=(400, 3), asarray=False)
    mass = da.from_array(xp.asarray(m), chunks=400, asarray=False)
    acc, pot = direct_accelerations(pos, mass, G=2.0, softening=0.05, softening_kernel="spline")
    assert isinstance(acc._meta, xp.ndarray) and acc.chunks[0] == pos.chunks[0]
    a, p = acc.compute(), pot.compute()
    assert isinstance(a, xp.ndarray) and isinstance(p, xp.ndarray)
    assert rel_err(to_host(a), a0).max() < 1e-11 and rel_err(to_host(p), p0).max() < 1e-11
    acc32, _ = direct_accelerations(pos, mass, G=2.0, softening=0.05,
                                    softening_kernel="spline", precision="float32")
    a32 = acc32.compute()
    assert a32.dtype == np.float32 and np.median(rel_err(to_host(a32), a0)) < 3e-6
