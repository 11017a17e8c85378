"""PM and TreePM graphs on CuPy chunks (the GPU PM kernels against the CPU ones and their
references: tests/test_kernel_contracts_gravity.py)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from cosmo_dask.gravity.pm import pm_accelerations


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
    from ewald_reference import ewald

    from cosmo_dask.gravity.treepm import treepm_accelerations

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
