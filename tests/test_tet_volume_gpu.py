"""GPU tetrahedron-cube volumes and deposits against the CPU (numba) kernel."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.density import deposit_tets, snapshot_tetrahedra, tet_cube_volume
from cosmo_dask.models.lattice import perturbed_lattice

pytestmark = pytest.mark.gpu


def _cubes(rng, n, lo=-1.0, hi=2.0):
    return rng.uniform(lo, hi, size=(n, 3)), rng.uniform(0.1, 1.5, size=n)


def test_gpu_volumes_equal_cpu_float64(rng):
    import cupy as cp

    tets = rng.uniform(-1, 2, size=(300, 4, 3))
    lo, h = _cubes(rng, 200)
    cpu = tet_cube_volume(tets, lo, h)
    gpu = tet_cube_volume(cp.asarray(tets), lo, h)
    assert isinstance(gpu, cp.ndarray) and gpu.dtype == np.float64
    np.testing.assert_allclose(cp.asnumpy(gpu), cpu, rtol=1e-12, atol=1e-15)
    assert (cpu > 0).mean() > 0.2  # many non-trivial pairs were compared


def test_gpu_analytic_cases():
    import cupy as cp

    t = np.array([[0, 0, 0], [2, 0, 0], [0, 2, 0], [0, 0, 2.0]])
    assert float(tet_cube_volume(cp.asarray(t), [0, 0, 0], 1.0)[0]) == pytest.approx(5 / 6)
    flat = cp.asarray(np.array([[0, 0, 0.5], [1, 0, 0.5], [0, 1, 0.5], [0.3, 0.3, 0.5]]))
    v = tet_cube_volume(flat, [0, 0, 0], 1.0)
    assert bool(cp.all(v == 0))


def test_gpu_float32_input_is_upcast(rng):
    import cupy as cp

    tets = rng.uniform(0, 2, size=(200, 4, 3)).astype(np.float32)
    lo, h = _cubes(rng, 50, 0.0, 1.5)
    gpu = tet_cube_volume(cp.asarray(tets), lo, h)
    assert gpu.dtype == np.float64
    np.testing.assert_allclose(cp.asnumpy(gpu), tet_cube_volume(tets, lo, h), rtol=1e-12,
                               atol=1e-15)


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


@pytest.mark.parametrize("method", ["warp", "thread", "auto"])
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


def test_gpu_deposit_lattice_uniform():
    import cupy as cp

    snap = perturbed_lattice(6, box_size=3.0, amplitude=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    grid = deposit_tets(cp.asarray(tets), cp.asarray(mass), [0, 0, 0], 0.25, (12, 12, 12),
                        periodic=True)
    np.testing.assert_allclose(cp.asnumpy(grid), 1.0 / 12**3, rtol=1e-12)
