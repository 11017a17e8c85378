"""GPU tetrahedron-cube volumes and deposits against the CPU (numba) kernel: the GPU-only
options (float32 arithmetic, ``method``), the per-cell clips kept for comparison and the
lattice kernel's stress cases. The contract itself (analytic volumes, tilings, float32
upcast, uniform lattice, patches, GPU = CPU through the dispatch) is tested for both
backends in ``tests/test_kernel_contracts_density.py``."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.density import deposit_tets, snapshot_tetrahedra, tet_cube_volume

pytestmark = pytest.mark.gpu


def _cubes(rng, n, lo=-1.0, hi=2.0):
    return rng.uniform(lo, hi, size=(n, 3)), rng.uniform(0.1, 1.5, size=n)


def test_gpu_float32_arithmetic_close_to_float64(rng):
    import cupy as cp

    from cosmo_dask.density.tet_volume_gpu import tet_cube_volume_gpu

    tets = rng.uniform(0, 2, size=(200, 4, 3)).astype(np.float32)
    lo, h = _cubes(rng, 50, 0.0, 1.5)
    ref = tet_cube_volume(tets.astype(np.float64), lo.astype(np.float32).astype(np.float64),
                          h.astype(np.float32).astype(np.float64))
    gpu = tet_cube_volume_gpu(cp.asarray(tets), lo, h, arithmetic="float32")
    assert gpu.dtype == np.float32
    np.testing.assert_allclose(cp.asnumpy(gpu), ref, rtol=0, atol=1e-5 * ref.max())


@pytest.mark.parametrize("method", ["lattice"])  # "auto": tests/test_kernel_contracts_density.py
@pytest.mark.parametrize("periodic", [False, True])
def test_gpu_deposit_equals_cpu(rng, method, periodic):
    import cupy as cp

    from cosmo_dask.density.tet_volume_gpu import deposit_tets_gpu

    tets = rng.uniform(-0.5, 3.5, size=(500, 4, 3))
    tets = tets[:, :1] + 0.3 * (tets - tets[:, :1])  # a few cells across
    mass = rng.uniform(1, 2, size=500)
    args = ([0.0, 0.0, 0.0], 0.25, (12, 12, 12))
    cpu = deposit_tets(tets, mass, *args, periodic=periodic)
    gpu = deposit_tets_gpu(cp.asarray(tets), cp.asarray(mass), *args, periodic=periodic,
                           method=method)
    np.testing.assert_allclose(cp.asnumpy(gpu), cpu, rtol=1e-12, atol=1e-12 * cpu.max())


@pytest.mark.parametrize("method", ["warp", "thread"])
@pytest.mark.parametrize("periodic", [False, True])
def test_clip_deposits_kept_for_comparison_equal_cpu(rng, method, periodic):
    """The per-cell clip deposits of ``benchmarks/tet_deposit_clip_gpu.py`` (what the
    lattice kernel is timed against) still match the CPU deposit."""
    import importlib.util
    from pathlib import Path

    import cupy as cp

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tet_deposit_clip_gpu.py"
    spec = importlib.util.spec_from_file_location("tet_deposit_clip_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tets = rng.uniform(-0.5, 3.5, size=(500, 4, 3))
    tets = tets[:, :1] + 0.3 * (tets - tets[:, :1])
    mass = rng.uniform(1, 2, size=500)
    args = ([0.0, 0.0, 0.0], 0.25, (12, 12, 12))
    cpu = deposit_tets(tets, mass, *args, periodic=periodic)
    gpu = mod.deposit_tets_clip_gpu(cp.asarray(tets), cp.asarray(mass), *args,
                                    periodic=periodic, method=method)
    np.testing.assert_allclose(cp.asnumpy(gpu), cpu, rtol=1e-12, atol=1e-12 * cpu.max())


def _zeldovich_tets(n=16, box=25.0):
    from cosmo_dask.models.zeldovich_ics import zeldovich

    snap = zeldovich(n, box_size=box, redshift=0.0, precision="float64")
    return snapshot_tetrahedra(snap)


def test_gpu_lattice_zeldovich_equals_cpu_and_conserves_mass():
    import cupy as cp

    tets, mass = _zeldovich_tets()
    args = ([0.0, 0.0, 0.0], 25.0 / 32, (32, 32, 32))
    cpu = deposit_tets(tets, mass, *args, periodic=True)
    gpu = cp.asnumpy(deposit_tets(cp.asarray(tets), cp.asarray(mass), *args, periodic=True))
    # the difference is the CPU clip's rounding in thin z=0 tetrahedra (exact-arithmetic
    # checks: lattice ~1e-17, clip ~1e-12 of the largest cell)
    assert np.abs(gpu - cpu).max() <= 1e-11 * cpu.max()
    assert gpu.sum() == pytest.approx(mass.sum(), rel=1e-12)
    assert gpu.min() >= 0


def test_gpu_lattice_many_lines_per_lane():
    import cupy as cp

    # z=0 tetrahedra 4 cells across per particle spacing: bounding boxes of ~1e3 cells, so
    # each lane handles several (x, y) lines and many tetrahedra share a warp
    tets, mass = _zeldovich_tets(32, 100.0)
    sub = np.random.default_rng(3).choice(len(tets), 20000, replace=False)
    tets, mass = tets[sub], mass[sub]
    args = ([0.0, 0.0, 0.0], 100.0 / 128, (128, 128, 128))
    cpu = deposit_tets(tets, mass, *args, periodic=True)
    gpu = cp.asnumpy(deposit_tets(cp.asarray(tets), cp.asarray(mass), *args, periodic=True))
    assert np.abs(gpu - cpu).max() <= 1e-11 * cpu.max()
    assert gpu.sum() == pytest.approx(mass.sum(), rel=1e-12)


def test_gpu_lattice_big_tets_chunked(rng):
    import cupy as cp

    # bounding boxes of ~1e5 cells: the per-warp lattice buffer is filled chunk by chunk
    tets = rng.uniform(-2, 8, size=(12, 4, 3))
    for periodic in (False, True):
        args = ([0.1, 0.0, -0.2], 0.1, (40, 45, 50))
        cpu = deposit_tets(tets, 1.0, *args, periodic=periodic)
        gpu = cp.asnumpy(deposit_tets(cp.asarray(tets), 1.0, *args, periodic=periodic))
        # lattice sums cancel ~ eps * (tet section in cells^2): ~3e-13 at 100 cells across
        np.testing.assert_allclose(gpu, cpu, rtol=1e-12, atol=5e-12 * cpu.max())
        assert gpu.sum() == pytest.approx(cpu.sum(), rel=1e-12)


def test_gpu_lattice_scalar_mass_and_accumulate(rng):
    import cupy as cp

    from cosmo_dask.density.tet_volume_gpu import deposit_tets_gpu

    tets = cp.asarray(rng.uniform(0, 2, size=(50, 4, 3)))
    a = deposit_tets_gpu(tets, 2.0, [0, 0, 0], 0.5, (4, 4, 4))
    b = deposit_tets_gpu(tets, cp.full(50, 2.0), [0, 0, 0], 0.5, (4, 4, 4))
    # atomics: the order of additions (last bits) varies from run to run
    np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=1e-14)
    c = deposit_tets_gpu(tets, np.float64(1.0), [0, 0, 0], 0.5, (4, 4, 4), out=a)
    assert c is a
    np.testing.assert_allclose(cp.asnumpy(a), 1.5 * cp.asnumpy(b), rtol=1e-14)
    # tets wholly outside a non-periodic grid deposit nothing
    far = deposit_tets_gpu(tets + 100.0, 1.0, [0, 0, 0], 0.5, (4, 4, 4))
    assert float(cp.abs(far).max()) == 0.0


def test_gpu_lattice_float32_arithmetic_conserves_mass():
    import cupy as cp

    from cosmo_dask.density.tet_volume_gpu import deposit_tets_gpu

    tets, mass = _zeldovich_tets()
    args = ([0.0, 0.0, 0.0], 25.0 / 32, (32, 32, 32))
    d_t, d_m = cp.asarray(tets), cp.asarray(mass)
    g64 = deposit_tets_gpu(d_t, d_m, *args, periodic=True)
    g32 = deposit_tets_gpu(d_t, d_m, *args, periodic=True, arithmetic="float32")
    assert float(g32.sum()) == pytest.approx(mass.sum(), rel=1e-12)
    assert float(cp.abs(g32 - g64).max()) <= 1e-5 * float(g64.max())
