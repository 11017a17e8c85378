"""The distributed slab FFT (cosmo_dask.spatial.fft) against numpy.fft, on every layout."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.spatial.fft import default_slab_count, irfftn, rfftn, slab_chunks

SHAPES = [(16, 16, 16), (12, 18, 10), (15, 15, 15)]
SLABS = [1, 2, 5, 16]
RTOL = {np.float64: 1e-12, np.float32: 1e-5}


def _mesh(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _slabs(x, n_slabs):
    return da.from_array(x, chunks=(slab_chunks(x.shape[0], n_slabs),) + x.shape[1:])


def _close(a, b, rtol):
    """Max-norm relative error: |a - b|_max <= rtol |b|_max."""
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= rtol * np.abs(b).max()


# --------------------------------------------------------------------------- slab sizes
def test_slab_chunks():
    assert slab_chunks(16, 5) == (4, 3, 3, 3, 3)
    assert slab_chunks(16, 1) == (16,)
    assert slab_chunks(12, 16) == (1,) * 12  # at most one slab per plane
    assert sum(slab_chunks(257, 8)) == 257
    with pytest.raises(ParameterError):
        slab_chunks(16, 0)
    with pytest.raises(ParameterError):
        slab_chunks(0, 2)


def test_default_slab_count():
    # at least one slab per 64 MiB of the complex mesh, never more than the planes
    assert default_slab_count((512, 512, 512), np.float32) >= 8
    assert default_slab_count((512, 512, 512), np.float64) >= 16
    assert default_slab_count((2, 64, 64), np.float64) <= 2
    assert default_slab_count((64, 3, 64), np.float64) <= 3


# --------------------------------------------------------------------------- values
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_slabs", SLABS)
def test_rfftn_matches_numpy(shape, dtype, n_slabs):
    x = _mesh(shape, dtype)
    k = rfftn(_slabs(x, n_slabs))
    n0, n1, n2 = shape
    assert k.shape == (n0, n1, n2 // 2 + 1)
    assert k.dtype == (np.complex64 if dtype == np.float32 else np.complex128)
    # the layout: k-space slabs along axis 1, as many as the input's slabs (<= n0, n1)
    assert k.chunks == ((n0,), slab_chunks(n1, min(n_slabs, n0)), (n2 // 2 + 1,))
    assert type(k._meta) is np.ndarray
    kc = k.compute()
    assert kc.dtype == k.dtype
    _close(kc, np.fft.rfftn(x.astype(np.float64)), RTOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_slabs", SLABS)
def test_irfftn_matches_numpy_and_round_trips(shape, dtype, n_slabs):
    x = _mesh(shape, dtype, seed=1)
    kref = np.fft.rfftn(x).astype(np.complex64 if dtype == np.float32 else np.complex128)
    n0, n1, nk = kref.shape
    kmesh = da.from_array(kref, chunks=(n0, slab_chunks(n1, n_slabs), nk))
    r = irfftn(kmesh, shape)
    assert r.shape == shape and r.dtype == dtype
    assert r.chunks == (slab_chunks(n0, n_slabs), (n1,), (shape[2],))  # real slabs on axis 0
    rc = r.compute()
    assert rc.dtype == dtype
    _close(rc, np.fft.irfftn(kref.astype(np.complex128), s=shape, axes=(0, 1, 2)), RTOL[dtype])
    # round trip through both distributed transforms
    back = irfftn(rfftn(_slabs(x, n_slabs)), shape).compute()
    _close(back, x, RTOL[dtype])


@pytest.mark.parametrize("n2", [10, 11])
def test_irfftn_takes_shape_for_even_and_odd_last_axis(n2):
    x = _mesh((6, 8, n2), np.float64)
    k = rfftn(_slabs(x, 3))
    assert k.shape[2] == 6  # the same for n2 = 10 and 11: shape tells them apart
    _close(irfftn(k, x.shape).compute(), x, 1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_slab_count_does_not_change_the_bits(dtype):
    """Observed, not promised: every 1-d line is transformed by the same pocketfft
    call whatever the batching, so the result is bitwise the same for any slab count
    (here on scipy's pocketfft; float64 even matches numpy.fft.rfftn bitwise). If a
    future FFT library batches lines with different arithmetic, relax to allclose."""
    x = _mesh((15, 12, 14), dtype)
    k1, k5 = (rfftn(_slabs(x, s)).compute() for s in (1, 5))
    assert np.array_equal(k1, k5)
    r1, r4 = (irfftn(da.from_array(k1, chunks=(15, c, 8)), x.shape, slabs=s).compute()
              for c, s in ((12, 1), (3, 4)))
    assert np.array_equal(r1, r4)


def test_slabs_parameter_and_array_inputs():
    x = _mesh((12, 18, 10), np.float64)
    k = rfftn(_slabs(x, 2), slabs=6)
    assert k.chunks[1] == slab_chunks(18, 6)
    _close(k.compute(), np.fft.rfftn(x), 1e-12)
    # NumPy input is wrapped in slabs; integer meshes are transformed in float64
    kn = rfftn(x, slabs=3)
    assert isinstance(kn, da.Array) and kn.chunks[1] == slab_chunks(18, 3)
    _close(kn.compute(), np.fft.rfftn(x), 1e-12)
    xi = np.arange(12 * 18 * 10).reshape(12, 18, 10) % 7
    ki = rfftn(xi, slabs=3)
    assert ki.dtype == np.complex128
    _close(ki.compute(), np.fft.rfftn(xi), 1e-12)
    r = irfftn(np.fft.rfftn(x), x.shape, slabs=4)
    assert r.chunks[0] == slab_chunks(12, 4)
    _close(r.compute(), x, 1e-12)


def test_rechunks_meshes_not_in_slabs():
    """A mesh chunked in cubes is rechunked to slabs (keeping its axis-0 chunks);
    a k-space mesh chunked along axis 0 or 2 to k-slabs (keeping its axis-1 chunks)."""
    x = _mesh((16, 16, 16), np.float64)
    k = rfftn(da.from_array(x, chunks=8))
    assert k.chunks == ((16,), (8, 8), (9,))
    kc = k.compute()
    _close(kc, np.fft.rfftn(x), 1e-12)
    r = irfftn(da.from_array(kc, chunks=(4, 8, 3)), x.shape)
    assert r.chunks == ((8, 8), (16,), (16,))
    _close(r.compute(), x, 1e-12)


def test_task_names():
    x = _mesh((8, 8, 8), np.float32)
    k = rfftn(_slabs(x, 2))
    r = irfftn(k, x.shape)
    kinds = {key[0].rsplit("-", 1)[0] for key in dict(r.__dask_graph__()) if isinstance(key, tuple)}
    assert {"fft-r2c", "fft-c2c", "fft-ic2c", "fft-c2r"} <= kinds
    assert k.name.startswith("fft-c2c-") and r.name.startswith("fft-c2r-")


# --------------------------------------------------------------------------- bad input
def test_bad_input_errors():
    x = _mesh((8, 8, 8), np.float64)
    with pytest.raises(ParameterError, match="3-d"):
        rfftn(da.zeros((8, 8), chunks=4))
    with pytest.raises(ParameterError, match="real"):
        rfftn(da.zeros((8, 8, 8), dtype=np.complex128, chunks=(4, 8, 8)))
    with pytest.raises(ParameterError, match="float32 or float64"):
        rfftn(np.zeros((4, 4, 4), dtype=np.float16))
    with pytest.raises(ParameterError, match="at least one cell"):
        rfftn(np.zeros((0, 4, 4)))
    with pytest.raises(ParameterError, match="slabs"):
        rfftn(_slabs(x, 2), slabs=0)
    k = rfftn(_slabs(x, 2))
    with pytest.raises(ParameterError, match="k-space mesh of shape"):
        irfftn(k, (8, 8, 10))  # 10 // 2 + 1 = 6 != 5
    with pytest.raises(ParameterError, match="k-space mesh of shape"):
        irfftn(k, (8, 4, 8))
    with pytest.raises(ParameterError, match="three"):
        irfftn(k, (8, 8))
    with pytest.raises(ParameterError, match="complex64 or complex128"):
        irfftn(k.real, (8, 8, 8))
    with pytest.raises(ParameterError, match="slabs"):
        irfftn(k, (8, 8, 8), slabs=-1)


# --------------------------------------------------------------------------- distributed
@pytest.mark.parametrize("method", ["tasks", "p2p"])
def test_local_cluster_matches_local_scheduler(method):
    """Two worker processes (the transpose really crosses processes), Dask's task
    rechunk and its P2P rechunk: the same bits as the local threaded scheduler."""
    from distributed import Client, LocalCluster

    x = _mesh((12, 18, 10), np.float64)
    local_k = rfftn(_slabs(x, 4)).compute(scheduler="threads")
    local_r = irfftn(local_k, x.shape, slabs=3).compute(scheduler="threads")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client, \
            dask.config.set({"array.rechunk.method": method}):
        # the graph is built with the client as default (Dask picks the rechunk method then)
        k = rfftn(_slabs(x, 4))
        r = irfftn(k, x.shape, slabs=3)
        kc, rc = client.compute([k, r], sync=True)
    assert np.array_equal(kc, local_k)
    assert np.array_equal(rc, local_r)
    _close(kc, np.fft.rfftn(x), 1e-12)
    _close(rc, x, 1e-12)


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_cupy_chunks_match_cupy_fft():
    cupy = pytest.importorskip("cupy")
    x = _mesh((16, 12, 10), np.float32)
    xg = cupy.asarray(x)
    mesh = da.from_array(xg, chunks=(slab_chunks(16, 5), 12, 10), asarray=False)
    k = rfftn(mesh)
    assert type(k._meta) is cupy.ndarray and k.dtype == np.complex64
    kc = k.compute()
    assert type(kc) is cupy.ndarray
    ref = cupy.fft.rfftn(xg)
    assert float(abs(kc - ref).max()) <= 1e-5 * float(abs(ref).max())
    r = irfftn(k, x.shape)
    assert type(r._meta) is cupy.ndarray and r.dtype == np.float32
    rc = r.compute()
    assert type(rc) is cupy.ndarray
    assert float(abs(rc - xg).max()) <= 1e-5 * float(abs(xg).max())


@pytest.mark.gpu
def test_cupy_slabs_under_the_threaded_scheduler():
    """Slab tasks on several threads at once (the local threaded scheduler): cuFFT
    called from several threads failed at random (CUFFT_EXEC_FAILED); every call now
    runs on one thread. Round trips of a small odd mesh, repeated."""
    cupy = pytest.importorskip("cupy")
    x = _mesh((16, 12, 10), np.float32)
    xg = cupy.asarray(x)
    for _ in range(20):
        mesh = da.from_array(xg, chunks=(slab_chunks(16, 7), 12, 10), asarray=False)
        r = irfftn(rfftn(mesh), x.shape).compute(scheduler="threads", num_workers=8)
        assert float(abs(r - xg).max()) <= 1e-5 * float(abs(xg).max())


# --------------------------------------------------------------------------- k-space slabs
def test_map_kslabs_matches_full_mesh_filter():
    """A Gaussian filter applied slab by slab equals the whole-mesh NumPy filter."""
    from cosmo_dask.spatial.fft import map_kslabs

    rng = np.random.default_rng(5)
    shape = (12, 10, 9)
    box = 7.0
    x = rng.standard_normal(shape)
    kmesh = rfftn(da.from_array(x, chunks=(4, 10, 9)), slabs=3)

    def smooth(block, kx, ky, kz, r):
        return block * np.exp(-0.5 * (kx**2 + ky**2 + kz**2) * r * r)

    out = irfftn(map_kslabs(smooth, kmesh, 0.8, shape=shape, box_size=box, name="smooth"),
                 shape).compute()
    kx = 2 * np.pi * np.fft.fftfreq(shape[0], d=box / shape[0])
    ky = 2 * np.pi * np.fft.fftfreq(shape[1], d=box / shape[1])
    kz = 2 * np.pi * np.fft.rfftfreq(shape[2], d=box / shape[2])
    k2 = kx[:, None, None]**2 + ky[None, :, None]**2 + kz[None, None, :]**2
    ref = np.fft.irfftn(np.fft.rfftn(x) * np.exp(-0.5 * k2 * 0.64), s=shape)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    assert np.abs(out - x).max() > 0.1  # the filter did something


def test_map_kslabs_refuses_unslabbed_mesh():
    from cosmo_dask.spatial.fft import map_kslabs

    k = da.zeros((4, 4, 3), chunks=(2, 4, 3), dtype=np.complex128)
    with pytest.raises(ParameterError, match="slabs along axis 1"):
        map_kslabs(lambda b, kx, ky, kz: b, k, shape=(4, 4, 4), box_size=1.0, name="x")


@pytest.mark.parametrize("threads, shape, dtype, expected", [
    (2, (1024,) * 3, np.float32, 65),      # 4 GiB complex: one slab per 64 MiB, as before
    (256, (1024,) * 3, np.float32, 96),    # one per thread, at most 96 while 320 MiB do
    (8, (1024,) * 3, np.float64, 96),      # 8 GiB: 129 slabs of 64 MiB -> 96
    (2, (2048,) * 3, np.float32, 103),     # 32 GiB: 103 slabs of 19-20 planes, not 513
    (256, (2048,) * 3, np.float64, 205),   # 64 GiB: slabs of at most 320 MiB
    (2, (4096,) * 3, np.float32, 820)])
def test_default_slab_count_of_big_meshes(monkeypatch, threads, shape, dtype, expected):
    """One slab per 64 MiB of the complex mesh (at least one per thread), but at most 96
    slabs while slabs of 320 MiB suffice: the counts written out by hand."""
    import cosmo_dask.spatial.fft as fft

    monkeypatch.setattr(fft, "worker_threads", lambda: threads)
    n0, n1, n2 = shape
    kbytes = n0 * n1 * (n2 // 2 + 1) * 2 * np.dtype(dtype).itemsize
    assert default_slab_count(shape, dtype) == expected
    assert kbytes / expected <= max(320 * 2**20, kbytes / 96)
