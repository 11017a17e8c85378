"""Periodic PM forces against the Ewald reference (tests/support/ewald_reference.py), conservation,
self-force, chunk independence, precision, errors.

Measured values (CPU, 2026-11-21) are stated in each test's docstring.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.gravity.pm import pm_accelerations
from cosmo_dask.gravity.pm_kernels import cic_interpolate_numpy
from tests.support.ewald_reference import ewald, ewald_long_range

BOX = 1.0


@pytest.fixture(scope="module")
def random_set():
    rng = np.random.default_rng(7)
    n = 600
    pos = rng.random((n, 3)) * BOX
    mass = rng.random(n) + 0.5
    full, _ = ewald(pos, mass, BOX, tol=1e-10)
    return pos, mass, full


def _pm(pos, mass, chunks=128, **kw):
    kw.setdefault("G", 1.0)
    kw.setdefault("box_size", BOX)
    p = da.from_array(pos, chunks=(chunks, 3))
    m = da.from_array(mass, chunks=chunks) if np.ndim(mass) else mass
    acc, pot = pm_accelerations(p, m, **kw)
    return dask.compute(acc, pot) if pot is not None else (acc.compute(), None)


@pytest.mark.parametrize("interlace, med_tol, p99_tol", [(True, 3e-3, 2e-2), (False, 1.2e-2, 7e-2)])
def test_long_range_vs_ewald(random_set, interlace, med_tol, p99_tol):
    """32^3 mesh, rs = 1.2 H: |a_PM - a_long(Ewald)| / |a_total(Ewald)| over 600 random
    particles. Measured: interlaced median 2.0e-3, p99 1.0e-2; one mesh median 8.2e-3,
    p99 4.4e-2. Potential (self-pair term removed): median |dphi| / mean |phi| measured
    2.5e-3 interlaced, 8.5e-3 one mesh."""
    pos, mass, full = random_set
    n = 32
    rs = 1.2 * BOX / n
    acc, pot = _pm(pos, mass, n_mesh=n, r_split=rs, interlace=interlace)
    ref, ref_pot = ewald_long_range(pos, mass, BOX, rs=rs)
    err = np.linalg.norm(acc - ref, axis=1) / np.linalg.norm(full, axis=1)
    assert np.median(err) <= med_tol
    assert np.percentile(err, 99) <= p99_tol
    ref_pot = ref_pot + mass / (np.sqrt(np.pi) * rs)
    perr = np.abs(pot - ref_pot) / np.abs(ref_pot).mean()
    assert np.median(perr) <= (4e-3 if interlace else 1e-2)


@pytest.mark.parametrize("rs_cells, tol", [(0.0, 3e-2), (1.2, 4e-3)])
def test_far_pair(rs_cells, tol):
    """32^3 mesh, a pair 8-11 cells apart vs the full Ewald force (the short-range part is
    < 1e-9 there), worst of 12 random orientations. Measured: no split (4-point difference,
    one mesh) 1.4e-2; rs = 1.2 H (spectral, interlaced) 2.0e-3."""
    rng = np.random.default_rng(3)
    worst = 0.0
    for _ in range(12):
        a = rng.random(3) * BOX
        u = rng.normal(size=3)
        b = (a + (0.25 + 0.1 * rng.random()) * u / np.linalg.norm(u)) % BOX
        pos = np.array([a, b])
        acc, _ = _pm(pos, 1.0, n_mesh=32, r_split=rs_cells * BOX / 32, potential=False,
                     interlace=rs_cells > 0)
        ref, _ = ewald(pos, 1.0, BOX)
        worst = max(worst, np.abs(acc - ref).max() / np.abs(ref).max())
    assert worst <= tol


def test_momentum_conservation(random_set):
    """sum_i m_i a_i = 0: measured 1e-17 of sum |m a| (any split, interlaced or not)."""
    pos, mass, _ = random_set
    for rs in (0.0, 0.05):
        acc, _ = _pm(pos, mass, n_mesh=16, r_split=rs, potential=False)
        ma = mass[:, None] * acc
        assert np.abs(ma.sum(axis=0)).max() <= 1e-13 * np.abs(ma).sum()


def test_single_particle_self_force():
    """One particle alone: no self-force (measured < 1e-16 G m / H^2) and, with the split,
    the potential is its own images' Ewald long-range term (measured 5e-4 relative)."""
    rng = np.random.default_rng(5)
    n, m = 16, 2.0
    h = BOX / n
    for _ in range(5):
        pos = rng.random((1, 3)) * BOX
        acc, _ = _pm(pos, m, n_mesh=n, r_split=0.0)
        assert np.abs(acc).max() <= 1e-12 * m / h**2
        rs = 1.5 * h
        acc, pot = _pm(pos, m, n_mesh=n, r_split=rs)
        assert np.abs(acc).max() <= 1e-12 * m / h**2
        _, ref = ewald_long_range(pos, m, BOX, rs=rs)
        ref = ref + m / (np.sqrt(np.pi) * rs)
        assert abs(pot[0] - ref[0]) <= 3e-3 * m / rs


def test_chunk_independence(random_set, client):
    """Chunks of 600 vs 97 rows (and a distributed cluster): equal to 1e-12 relative
    (only the partial-mesh summation order differs)."""
    pos, mass, _ = random_set
    a1, p1 = _pm(pos, mass, chunks=600, n_mesh=16, r_split=0.1)
    a2, p2 = _pm(pos, mass, chunks=97, n_mesh=16, r_split=0.1)
    assert np.abs(a1 - a2).max() <= 1e-12 * np.abs(a1).max()
    assert np.abs(p1 - p2).max() <= 1e-12 * np.abs(p1).max()


def test_outputs_follow_input(random_set):
    pos, mass, _ = random_set
    p = da.from_array(pos, chunks=(250, 3))
    acc, pot = pm_accelerations(p, 1.0, G=2.0, box_size=BOX, n_mesh=8, r_split=0.1,
                                precision="float32")
    assert acc.chunks == ((250, 250, 100), (3,))
    assert pot.chunks == ((250, 250, 100),)
    assert acc.dtype == np.float32 and pot.dtype == np.float32
    keys = [k[0] if isinstance(k, tuple) else k for k in dict(acc.__dask_graph__())]
    assert any(str(k).startswith("gravity-pm-interp") for k in keys)
    assert any(str(k).startswith("gravity-pm-green") for k in keys)  # the slab solve
    assert any(str(k).startswith("fft-c2r") for k in keys)
    a32, p32 = dask.compute(acc, pot)
    a64, p64 = _pm(pos, 1.0, G=2.0, n_mesh=8, r_split=0.1)
    assert np.abs(a32 - a64).max() <= 1e-5 * np.abs(a64).max()
    assert np.abs(p32 - p64).max() <= 1e-5 * np.abs(p64).max()
    acc_only, none = pm_accelerations(p, 1.0, G=1.0, box_size=BOX, n_mesh=8, potential=False)
    assert none is None and acc_only.shape == (600, 3)


def test_interpolation_is_deposit_transpose():
    """<mesh, deposit(x)> = interp(mesh)(x) for the paint CIC deposit (shift 0 and 1/2)."""
    from cosmo_dask.density.paint_kernels import paint_numpy

    rng = np.random.default_rng(1)
    n = 8
    mesh = rng.random((2, n, n, n))
    pos = rng.random((50, 3)) * BOX
    for shift in (0.0, 0.5):
        vals = cic_interpolate_numpy(pos, mesh, BOX, shift)
        for i in range(0, 50, 7):
            dep = paint_numpy(pos[i:i + 1], 1.0, n, BOX, "cic", shift)
            np.testing.assert_allclose(vals[i], (mesh * dep).sum(axis=(1, 2, 3)), rtol=1e-13)


def test_bad_input():
    pos = da.from_array(np.full((4, 3), 0.5), chunks=2)
    with pytest.raises(ParameterError, match="box_size is required"):
        pm_accelerations(pos, 1.0, G=1.0, box_size=None, n_mesh=8)
    for bad in (0, -4, 2.5, True, "8"):
        with pytest.raises(ParameterError, match="n_mesh"):
            pm_accelerations(pos, 1.0, G=1.0, box_size=1.0, n_mesh=bad)
    with pytest.raises(ParameterError, match="n_mesh=8192 is larger than 4096"):
        pm_accelerations(pos, 1.0, G=1.0, box_size=1.0, n_mesh=8192)
    with pytest.raises(ParameterError, match="n_mesh=34 has the prime factor 17.* 32 and 35"):
        pm_accelerations(pos, 1.0, G=1.0, box_size=1.0, n_mesh=34)
    with pytest.raises(ParameterError, match="r_split"):
        pm_accelerations(pos, 1.0, G=1.0, box_size=1.0, n_mesh=8, r_split=-0.1)
    with pytest.raises(ParameterError, match="precision"):
        pm_accelerations(pos, 1.0, G=1.0, box_size=1.0, n_mesh=8, precision="float16")
    outside = da.from_array(np.array([[0.5, 0.5, 0.5], [0.2, 1.0, 0.3]]), chunks=1)
    acc, _ = pm_accelerations(outside, 1.0, G=1.0, box_size=1.0, n_mesh=8)
    with pytest.raises(ParameterError, match="particle 1 .* outside the periodic box"):
        acc.compute()


# ----------------------------------------------------------------------------- slabs
def reference_pm(pos, mass, n, box, G, rs, interlace, potential):
    """Whole-mesh NumPy PM: test_paint's direct CIC painting, numpy.fft on the whole mesh,
    the Green's function and gradient written from pm_kernels' docstring, CIC gathering
    of the 8 nodes around each particle; (N, 3 or 4) float64."""
    from tests.support.density import reference_paint

    h = box / n
    kf = 2 * np.pi / box
    full = np.fft.fftfreq(n, 1.0 / n) * kf
    half = np.fft.rfftfreq(n, 1.0 / n) * kf
    kx, ky, kz = full[:, None, None], full[None, :, None], half[None, None, :]
    k2 = kx**2 + ky**2 + kz**2
    k2[0, 0, 0] = 1.0
    if rs > 0:
        w = np.sinc(kx * h / (2 * np.pi)) * np.sinc(ky * h / (2 * np.pi)) * \
            np.sinc(kz * h / (2 * np.pi))
        green = np.exp(-k2 * rs**2) / (k2 * w**4)
        deriv = [np.where(np.abs(np.abs(k) * h - np.pi) < 1e-9, 0.0, k) for k in (kx, ky, kz)]
    else:
        green = 1.0 / k2
        deriv = [(8 * np.sin(k * h) - np.sin(2 * k * h)) / (6 * h) for k in (kx, ky, kz)]
    green[0, 0, 0] = 0.0
    shifts = (0.0, 0.5) if interlace else (0.0,)
    out = 0.0
    for shift in shifts:
        mesh = reference_paint(pos, mass, n, box, "cic", shift=shift)
        phi = -4 * np.pi * G / h**3 * np.fft.rfftn(mesh) * green
        comps = [np.fft.irfftn(-1j * d * phi, s=(n, n, n), axes=(0, 1, 2)) for d in deriv]
        if potential:
            comps.append(np.fft.irfftn(phi, s=(n, n, n), axes=(0, 1, 2)))
        u = pos / h - 0.5 + shift
        i0 = np.floor(u).astype(np.int64)
        f = u - i0
        vals = np.zeros((len(pos), len(comps)))
        for dx in (0, 1):
            for dy in (0, 1):
                for dz in (0, 1):
                    wgt = (np.where(dx, f[:, 0], 1 - f[:, 0]) * np.where(dy, f[:, 1], 1 - f[:, 1])
                           * np.where(dz, f[:, 2], 1 - f[:, 2]))
                    idx = ((i0[:, 0] + dx) % n, (i0[:, 1] + dy) % n, (i0[:, 2] + dz) % n)
                    vals += wgt[:, None] * np.stack([c[idx] for c in comps], axis=1)
        out = out + vals
    out = out / len(shifts)
    if potential and rs > 0:
        out[:, 3] += G * mass / (np.sqrt(np.pi) * rs)
    return out


@pytest.mark.parametrize("rs, interlace", [(0.0, True), (0.07, True), (0.07, False)])
@pytest.mark.parametrize("n_slabs, chunks", [(1, 600), (2, 97), (3, 250), (7, 600), (14, 150)])
def test_slab_pm_matches_numpy_reference(random_set, rs, interlace, n_slabs, chunks):
    """Deposit, solve and interpolation slab by slab (each force component after the
    previous one, the interlaced meshes one after the other) equal a whole-mesh NumPy
    PM to float64 rounding, for any slab count and chunking."""
    pos, mass, _ = random_set
    n = 14
    ref = reference_pm(pos, mass, n, BOX, 1.3, rs, interlace, True)
    acc, pot = _pm(pos, mass, chunks=chunks, G=1.3, n_mesh=n, r_split=rs, interlace=interlace,
                   slabs=n_slabs)
    assert np.abs(acc - ref[:, :3]).max() <= 1e-12 * np.abs(ref[:, :3]).max()
    assert np.abs(pot - ref[:, 3]).max() <= 1e-12 * np.abs(ref[:, 3]).max()


def test_slab_pm_float32_and_cluster(random_set, client):
    """float32 slabs within 1e-6 of the float64 reference (accelerations and potential);
    the two-worker cluster gives the threaded scheduler's values bit for bit."""
    pos, mass, _ = random_set
    ref = reference_pm(pos, mass, 16, BOX, 1.0, 0.08, True, True)
    p, m = da.from_array(pos, chunks=(150, 3)), da.from_array(mass, chunks=150)
    acc, pot = pm_accelerations(p, m, G=1.0, box_size=BOX, n_mesh=16, r_split=0.08,
                                precision="float32", slabs=5)
    with dask.config.set(scheduler="threads"):
        a32, p32 = dask.compute(acc, pot)
    assert a32.dtype == np.float32
    assert np.abs(a32 - ref[:, :3]).max() <= 1e-6 * np.abs(ref[:, :3]).max()
    assert np.abs(p32 - ref[:, 3]).max() <= 1e-6 * np.abs(ref[:, 3]).max()
    a_c, p_c = client.compute([acc, pot], sync=True)
    np.testing.assert_array_equal(a_c, a32)
    np.testing.assert_array_equal(p_c, p32)


# -------------------- on the GPU (formerly tests/test_pm_gpu.py)
# PM and TreePM graphs on CuPy chunks (the GPU PM kernels against the CPU ones and their
# references: tests/gravity/test_kernel_contracts.py).


@pytest.mark.gpu
@pytest.mark.parametrize("slabs", [1, 3])
def test_pm_accelerations_cupy_chunks(slabs):
    """CuPy chunks give CuPy-backed results equal to the NumPy path to 1e-11, in one
    slab (cuFFT on the whole mesh) and in three (the distributed FFT's CuPy blocks)."""
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(2)
    pos = rng.random((4000, 3))
    mass = rng.random(4000) + 0.5
    rs = 1.2 / 32
    kw = dict(G=1.0, box_size=1.0, n_mesh=32, r_split=rs, slabs=slabs)
    a_cpu, p_cpu = dask.compute(*pm_accelerations(da.from_array(pos, chunks=(1000, 3)),
                                                  da.from_array(mass, chunks=1000), **kw))
    pg = da.from_array(cupy.asarray(pos), chunks=(1000, 3), asarray=False)
    mg = da.from_array(cupy.asarray(mass), chunks=1000, asarray=False)
    acc, pot = pm_accelerations(pg, mg, **kw)
    assert isinstance(acc._meta, cupy.ndarray)
    a_gpu, p_gpu = dask.compute(acc, pot)
    a_gpu, p_gpu = a_gpu.get(), p_gpu.get()
    assert np.abs(a_gpu - a_cpu).max() <= 1e-11 * np.abs(a_cpu).max()
    assert np.abs(p_gpu - p_cpu).max() <= 1e-11 * np.abs(p_cpu).max()


@pytest.mark.gpu
def test_treepm_cupy_chunks():
    """TreePM with CuPy chunks (GPU tree short range) against Ewald and the CPU TreePM.

    The GPU and CPU trees differ (their groups and accepted cells), so the two
    potentials differ at the tree's error level, which after the background
    term is a few 1e-3 of the largest potential on single particles: both are
    held to the Ewald reference instead, and to each other in the median."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("cosmo_dask.gravity.tree.forces_gpu")
    from cosmo_dask.gravity.treepm import treepm_accelerations
    from tests.support.ewald_reference import ewald

    rng = np.random.default_rng(3)
    pos = rng.random((4096, 3))
    kw = dict(G=1.0, box_size=1.0, n_mesh=16)
    a_cpu, p_cpu = dask.compute(*treepm_accelerations(da.from_array(pos, chunks=(1024, 3)),
                                                      1.0, **kw))
    pg = da.from_array(cupy.asarray(pos), chunks=(1024, 3), asarray=False)
    a_gpu, p_gpu = dask.compute(*treepm_accelerations(pg, 1.0, **kw))
    a_gpu, p_gpu = cupy.asnumpy(a_gpu), cupy.asnumpy(p_gpu)
    err = np.linalg.norm(a_gpu - a_cpu, axis=1) / np.linalg.norm(a_cpu, axis=1)
    assert np.median(err) <= 1e-4
    rms = np.sqrt(np.mean(p_cpu**2))
    assert np.median(np.abs(p_gpu - p_cpu)) <= 1e-4 * rms
    idx = rng.choice(len(pos), 200, replace=False)
    ref_a, ref_p = ewald(pos, np.ones(len(pos)), 1.0, G=1.0, targets=idx)
    for a, p in ((a_gpu, p_gpu), (a_cpu, p_cpu)):
        e = np.linalg.norm(a[idx] - ref_a, axis=1) / np.linalg.norm(ref_a, axis=1)
        assert np.median(e) <= 2e-3
        assert np.median(np.abs(p[idx] - ref_p)) <= 2e-3 * rms
