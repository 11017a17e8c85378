"""Mesh painting: NGP/CIC/TSC/PCS against a direct NumPy reference, mass, chunks, wrap, errors."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.analysis import power_spectrum
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.density import density_contrast, paint
from tests.support.density import reference_paint

SCHEMES = ["ngp", "cic", "tsc", "pcs"]


@pytest.fixture
def particles(rng):
    pos = rng.uniform(0, 50.0, size=(3000, 3))
    mass = rng.uniform(0.5, 2.0, size=3000)
    return pos, mass


@pytest.mark.parametrize("scheme", SCHEMES)
def test_matches_numpy_reference(particles, scheme):
    pos, mass = particles
    mesh = paint(pos, mass, n_mesh=12, box_size=50.0, scheme=scheme).compute()
    ref = reference_paint(pos, mass, 12, 50.0, scheme)
    assert mesh.shape == (12, 12, 12)
    np.testing.assert_allclose(mesh, ref, rtol=0, atol=1e-12 * ref.max())
    assert abs(mesh.sum() - mass.sum()) <= 1e-12 * mass.sum()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_shifted_mesh_matches_reference(particles, scheme):
    pos, mass = particles
    mesh = paint(pos, mass, n_mesh=10, box_size=50.0, scheme=scheme, shift=0.5).compute()
    ref = reference_paint(pos, mass, 10, 50.0, scheme, shift=0.5)
    np.testing.assert_allclose(mesh, ref, rtol=0, atol=1e-12 * ref.max())


def test_mass_conservation_large(rng):
    pos = rng.uniform(0, 1.0, size=(200_000, 3))
    mass = rng.lognormal(size=200_000)
    for scheme in SCHEMES:
        mesh = paint(da.from_array(pos, chunks=(50_000, 3)), da.from_array(mass, chunks=50_000),
                     n_mesh=32, box_size=1.0, scheme=scheme).compute()
        assert abs(mesh.sum() - mass.sum()) <= 1e-12 * mass.sum()
        assert mesh.min() >= 0


def test_chunk_and_worker_invariance(particles, client):
    pos, mass = particles
    one = paint(da.from_array(pos, chunks=(3000, 3)), da.from_array(mass, chunks=3000),
                n_mesh=16, box_size=50.0, scheme="tsc")
    four = paint(da.from_array(pos, chunks=(750, 3)), da.from_array(mass, chunks=750),
                 n_mesh=16, box_size=50.0, scheme="tsc", split_every=2)
    with dask.config.set(scheduler="synchronous"):
        m1 = one.compute()
        m4_local = four.compute()
    m4_dist = client.compute(four).result()  # two workers
    m1_dist = client.compute(one).result()
    for other in (m4_local, m4_dist, m1_dist):
        np.testing.assert_allclose(other, m1, rtol=0, atol=1e-12 * m1.max())


def test_periodic_wrap_at_edges():
    box, n = 10.0, 5
    pos = np.array([[0.0, 0.0, 0.0], [np.nextafter(box, 0), 5.0, 5.0], [box, 1.0, 1.0],
                    [-1.0, 11.0, 25.0]])
    mass = np.array([1.0, 2.0, 3.0, 4.0])
    for scheme in SCHEMES:
        mesh = paint(pos, mass, n_mesh=n, box_size=box, scheme=scheme).compute()
        ref = reference_paint(pos % box, mass, n, box, scheme)
        np.testing.assert_allclose(mesh, ref, rtol=0, atol=1e-12 * mass.sum())
        assert abs(mesh.sum() - 10.0) < 1e-12 * 10
    # CIC: a particle at the origin is shared equally by the 8 corner cells
    mesh = paint(pos[:1], 1.0, n_mesh=n, box_size=box, scheme="cic").compute()
    corners = mesh[np.ix_([0, n - 1], [0, n - 1], [0, n - 1])]
    np.testing.assert_allclose(corners, 0.125, atol=1e-15)
    # NGP: x = box lands in cell 0 (wrapped), x just below box in the last cell
    mesh = paint(pos[1:3], mass[1:3], n_mesh=n, box_size=box, scheme="ngp").compute()
    assert mesh[n - 1, 2, 2] == 2.0 and mesh[0, 0, 0] == 3.0


def test_lattice_is_uniform_for_every_scheme():
    n = 8
    g = (np.arange(n) + 0.5) * (20.0 / n)
    pos = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
    for scheme in SCHEMES:
        mesh = paint(pos, n_mesh=n, box_size=20.0, scheme=scheme).compute()
        np.testing.assert_allclose(mesh, 1.0, rtol=1e-13)
        delta = density_contrast(paint(pos, n_mesh=n, box_size=20.0, scheme=scheme)).compute()
        assert np.abs(delta).max() < 1e-13


def test_snapshot_input_and_float32(rng):
    pos = rng.uniform(0, 30.0, size=(2000, 3))
    snap = Snapshot.from_arrays(pos=pos, box_size=30.0, particle_mass=2.5)
    mesh = paint(snap, n_mesh=8, scheme="cic").compute()
    np.testing.assert_allclose(mesh, reference_paint(pos, 2.5, 8, 30.0, "cic"), atol=1e-11)
    m32 = paint(snap, n_mesh=8, scheme="cic", precision="float32").compute()
    assert m32.dtype == np.float32
    np.testing.assert_allclose(m32, mesh, rtol=1e-5)


def test_interlaced_mesh_conserves_mass_and_smooths(particles):
    pos, mass = particles
    plain = paint(pos, mass, n_mesh=16, box_size=50.0, scheme="cic").compute()
    inter = paint(pos, mass, n_mesh=16, box_size=50.0, scheme="cic", interlace=True).compute()
    assert abs(inter.sum() - mass.sum()) < 1e-10 * mass.sum()
    # the two are the same field up to aliasing: strongly correlated, not identical
    corr = np.corrcoef(plain.ravel(), inter.ravel())[0, 1]
    assert 0.8 < corr < 1 - 1e-6


def test_bad_input(particles):
    pos, mass = particles
    for n_mesh in (0, -4, 2.5, True, "8"):
        with pytest.raises(ParameterError, match="n_mesh"):
            paint(pos, n_mesh=n_mesh, box_size=1.0)
    with pytest.raises(ParameterError, match="scheme"):
        paint(pos, n_mesh=8, box_size=50.0, scheme="sph")
    with pytest.raises(ParameterError, match="box_size"):
        paint(pos, n_mesh=8)
    with pytest.raises(ParameterError, match="box_size"):
        paint(Snapshot.from_arrays(pos=pos, particle_mass=1.0), n_mesh=8)
    with pytest.raises(ParameterError, match="box_size"):
        paint(pos, n_mesh=8, box_size=-1.0)
    bad = mass.copy()
    bad[5] = 0.0
    with pytest.raises(ParameterError, match="positive"):
        paint(pos, bad, n_mesh=8, box_size=50.0)
    with pytest.raises(ParameterError, match="positive"):
        paint(pos, -1.0, n_mesh=8, box_size=50.0)
    with pytest.raises(ParameterError, match="shape"):
        paint(pos[:, :2], n_mesh=8, box_size=50.0)
    nan_pos = pos.copy()
    nan_pos[3, 1] = np.nan
    with pytest.raises(ParameterError, match="not finite"):
        paint(nan_pos, n_mesh=8, box_size=50.0).compute()
    nan_pos[3, 0] = np.nan  # routed to slab 0 of a mesh in slabs, which reports it
    with pytest.raises(ParameterError, match="not finite"):
        paint(nan_pos, n_mesh=8, box_size=50.0, slabs=3).compute()


# ----------------------------------------------------------------------------- slabs
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n_slabs, chunks", [(1, 700), (2, 3000), (3, 700), (5, 1100),
                                             (12, 700)])
def test_slab_mesh_matches_reference(particles, scheme, n_slabs, chunks):
    """Each slab deposited by its own tasks from the pieces of every chunk (with the
    kernel's spill into the next slabs, periodic) equals the whole-mesh NumPy reference
    to float64 rounding, for any slab count and chunking."""
    pos, mass = particles
    pos = pos - 5.0  # some outside the box: the wrap crosses slab 0 / last slab
    mesh = paint(da.from_array(pos, chunks=(chunks, 3)), da.from_array(mass, chunks=chunks),
                 n_mesh=12, box_size=50.0, scheme=scheme, slabs=n_slabs, shift=0.5)
    from cosmo_dask.spatial.fft import slab_chunks

    assert mesh.chunks == (slab_chunks(12, n_slabs), (12,), (12,))
    ref = reference_paint(pos % 50.0, mass, 12, 50.0, scheme, shift=0.5)
    np.testing.assert_allclose(mesh.compute(), ref, rtol=0, atol=1e-12 * ref.max())


def test_slab_mesh_float32_and_cluster(particles, client):
    """float32 slabs within 1e-6 of the float64 reference; on the two-worker cluster
    equal to the threaded scheduler's (bit for bit: the same tasks, the same order)."""
    pos, mass = particles
    p, m = da.from_array(pos, chunks=(800, 3)), da.from_array(mass, chunks=800)
    ref = reference_paint(pos, mass, 10, 50.0, "pcs")
    m32 = paint(p, m, n_mesh=10, box_size=50.0, scheme="pcs", slabs=4, precision="float32")
    with dask.config.set(scheduler="threads"):
        local = m32.compute()
    assert local.dtype == np.float32
    assert np.abs(local - ref).max() <= 1e-6 * ref.max()
    np.testing.assert_array_equal(client.compute(m32).result(), local)


def test_interlaced_slabs_match_fourier_average(particles):
    """interlace=True in slabs: (F0 + F1 exp(i (kx + ky + kz) H / 2)) / 2 of the two
    reference meshes, by NumPy's FFT."""
    pos, mass = particles
    n, box = 12, 50.0
    m0 = reference_paint(pos, mass, n, box, "cic")
    m1 = reference_paint(pos, mass, n, box, "cic", shift=0.5)
    q = 2 * np.pi * np.fft.fftfreq(n)
    qz = 2 * np.pi * np.fft.rfftfreq(n)
    phase = np.exp(0.5j * (q[:, None, None] + q[None, :, None] + qz[None, None, :]))
    ref = np.fft.irfftn((np.fft.rfftn(m0) + np.fft.rfftn(m1) * phase) / 2, s=(n, n, n),
                       axes=(0, 1, 2))
    for n_slabs in (1, 3, 5):
        mesh = paint(pos, mass, n_mesh=n, box_size=box, scheme="cic", interlace=True,
                     slabs=n_slabs).compute()
        np.testing.assert_allclose(mesh, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_mesh_size_and_memory_errors(particles, monkeypatch):
    import importlib

    paint_module = importlib.import_module("cosmo_dask.density.painting")
    pos, _ = particles
    with pytest.raises(ParameterError, match="n_mesh=4097 is larger than 4096"):
        paint(pos, n_mesh=4097, box_size=50.0)
    with pytest.raises(ParameterError, match="n_mesh=22 has the prime factor 11.*21 and 24"):
        paint(pos, n_mesh=22, box_size=50.0)
    monkeypatch.setattr(paint_module, "memory_per_worker", lambda gpu: (2**40, "worker"))
    assert paint(pos, n_mesh=4096, box_size=50.0, slabs=64).chunks[0] == (64,) * 64  # lazy
    # 2 workers of 64 MiB: a 256^3 float64 mesh (128 MiB) fits over both, not 512^3
    monkeypatch.setattr(paint_module, "memory_per_worker", lambda gpu: (2**26, "worker"))
    monkeypatch.setattr(paint_module, "worker_count", lambda: 2)
    with pytest.raises(ParameterError, match=r"n_mesh=512 needs at least 1\.0 GiB .* more "
                                             r"than the 0\.1 GiB of 2 workers together; the "
                                             r"largest n_mesh that fits is about 256"):
        paint(pos, n_mesh=512, box_size=50.0)
    mesh = paint(pos, n_mesh=256, box_size=50.0)  # default slabs: raised to fit a worker
    assert len(mesh.chunks[0]) >= 4 * 2**27 / 2**26
    with pytest.raises(ParameterError, match="2 slabs of a 256.3 float64 mesh need about "
                                             "0.2 GiB per task.*use slabs >= 8"):
        paint(pos, n_mesh=256, box_size=50.0, slabs=2)
    with pytest.raises(ParameterError, match="slabs must be a positive integer"):
        paint(pos, n_mesh=8, box_size=50.0, slabs=0)


# -------------------- on the GPU (formerly tests/test_paint_gpu.py)
# Mesh painting and P(k) on the GPU: CuPy kernels against the (reference-checked) CPU path.


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["ngp", "cic", "tsc", "pcs"])
@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_gpu_paint_matches_cpu_float64(rng, scheme, shift):
    import cupy

    pos = rng.uniform(-5.0, 55.0, size=(40_000, 3))  # some outside the box: wrapped
    mass = rng.uniform(0.5, 2.0, size=40_000)
    cpu = paint(pos, mass, n_mesh=24, box_size=50.0, scheme=scheme, shift=shift).compute()
    gpos = da.from_array(cupy.asarray(pos), chunks=(10_000, 3), asarray=False)
    gm = da.from_array(cupy.asarray(mass), chunks=10_000, asarray=False)
    gpu = paint(gpos, gm, n_mesh=24, box_size=50.0, scheme=scheme, shift=shift).compute()
    assert isinstance(gpu, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=0, atol=1e-12 * cpu.max())
    assert abs(float(gpu.sum()) - mass.sum()) <= 1e-12 * mass.sum()


@pytest.mark.gpu
def test_gpu_paint_float32_and_scalar_mass(rng):
    import cupy

    pos = rng.uniform(0, 10.0, size=(20_000, 3))
    cpu = paint(pos, 2.0, n_mesh=16, box_size=10.0, scheme="tsc").compute()
    gpu = paint(cupy.asarray(pos.astype(np.float32)), 2.0, n_mesh=16, box_size=10.0,
                scheme="tsc", precision="float32").compute()
    assert gpu.dtype == np.float32
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=2e-4, atol=1e-4 * cpu.max())


@pytest.mark.gpu
def test_gpu_power_spectrum_matches_cpu(rng):
    import cupy

    pos = rng.uniform(0, 100.0, size=(100_000, 3))
    cpu = power_spectrum(pos, n_mesh=32, box_size=100.0, los=2, poles=(0, 2))
    gpu = power_spectrum(cupy.asarray(pos), n_mesh=32, box_size=100.0, los=2, poles=(0, 2))
    np.testing.assert_allclose(gpu["power"].values, cpu["power"].values, rtol=1e-9)
    np.testing.assert_allclose(gpu["multipoles"].values, cpu["multipoles"].values,
                               rtol=1e-8, atol=1e-9 * float(cpu["power"].max()))
    np.testing.assert_array_equal(gpu["n_modes"].values, cpu["n_modes"].values)


@pytest.mark.gpu
def test_gpu_nonfinite_position_raises(rng):
    import cupy

    pos = rng.uniform(0, 10.0, size=(100, 3))
    pos[7, 2] = np.inf
    with pytest.raises(ParameterError, match="not finite"):
        paint(cupy.asarray(pos), n_mesh=8, box_size=10.0).compute()


@pytest.mark.gpu
@pytest.mark.parametrize("slabs", [2, 5])
def test_gpu_slabs_match_cpu(rng, slabs):
    """The mesh path in slabs on CuPy chunks: the painted slabs (CUDA kernel per slab),
    P(k) binned per k-space slab (cuFFT blocks) and the interlaced paint equal the
    NumPy path's."""
    import cupy

    pos = rng.uniform(0, 40.0, size=(30_000, 3))
    gpos = da.from_array(cupy.asarray(pos), chunks=(7_000, 3), asarray=False)
    kw = dict(n_mesh=20, box_size=40.0, scheme="tsc", slabs=slabs)
    cpu = paint(pos, **kw).compute()
    gpu = paint(gpos, **kw)
    assert isinstance(gpu._meta, cupy.ndarray) and len(gpu.chunks[0]) == slabs
    np.testing.assert_allclose(cupy.asnumpy(gpu.compute()), cpu, rtol=0,
                               atol=1e-12 * cpu.max())
    inter_c = paint(pos, interlace=True, **kw).compute()
    inter_g = cupy.asnumpy(paint(gpos, interlace=True, **kw).compute())
    np.testing.assert_allclose(inter_g, inter_c, rtol=0, atol=1e-11 * np.abs(inter_c).max())
    pk_c = power_spectrum(pos, n_mesh=20, box_size=40.0, los=1, poles=(0, 2), slabs=slabs)
    pk_g = power_spectrum(gpos, n_mesh=20, box_size=40.0, los=1, poles=(0, 2), slabs=slabs)
    np.testing.assert_allclose(pk_g["multipoles"].values, pk_c["multipoles"].values,
                               rtol=1e-9, atol=1e-9 * float(pk_c["power"].max()))
