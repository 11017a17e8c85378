"""pse_density on CuPy snapshots: tessellated and deposited on the GPU, against the CPU path."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.backend import to_device
from cosmo_dask.density import pse_density
from cosmo_dask.models.zeldovich_ics import zeldovich
from cosmo_dask.store.snapshot import Snapshot

pytestmark = pytest.mark.gpu


def gpu_copy(snap):
    return Snapshot.from_arrays(to_device(snap.pos, "gpu"), ids=snap.ids, box_size=snap.box_size,
                                particle_mass=snap.particle_mass,
                                lagrangian_shape=snap.lagrangian_shape)


@pytest.mark.parametrize("strategy", ["gather", "reduce"])
def test_gpu_pse_matches_cpu(strategy):
    import cupy

    snap = zeldovich(16, box_size=50.0, redshift=0.0, precision="float64", chunks=1000)
    kw = dict(patch_size=4, block=4, max_tets_per_node=3000, max_level=3, strategy=strategy)
    cpu = pse_density(snap, **kw)
    gpu = pse_density(gpu_copy(snap), **kw)
    chunk = gpu.patches.blocks[0].compute()
    assert isinstance(chunk, cupy.ndarray)
    np.testing.assert_array_equal(gpu.level, cpu.level)
    a = cupy.asnumpy(gpu.patches.compute())
    b = np.asarray(cpu.patches.compute())
    assert np.max(np.abs(a - b)) <= 1e-12 * np.abs(b).max()
    total = 16**3 * float(snap.particle_mass)
    assert gpu.total_mass() == pytest.approx(total, rel=1e-12)


def test_gpu_pse_unperturbed_lattice_is_uniform():
    from cosmo_dask.models.lattice import perturbed_lattice

    snap = perturbed_lattice(8, box_size=3.0, amplitude=0.0, precision="float64")
    octree = pse_density(gpu_copy(snap), patch_size=4, block=4)
    import cupy

    rho = cupy.asnumpy(octree.patches.compute())
    assert np.max(np.abs(rho * 27.0 - 1)) <= 1e-12


@pytest.mark.parametrize("box", [20.0, None])
def test_gpu_block_bboxes_equal_the_cpu_ones(box):
    """The bounding-box kernel (no tetrahedra made) gives the CPU path's boxes exactly."""
    from cosmo_dask.density.tessellation import block_columns

    n = 12
    snap = zeldovich(n, box_size=20.0, redshift=0.0, precision="float64")
    if box is None:
        snap = Snapshot.from_arrays(np.asarray(snap.pos.compute()), ids=np.arange(n**3),
                                    particle_mass=1.0, lagrangian_shape=(n, n, n))
    cpu = block_columns(snap, 5).blocks
    gpu = block_columns(gpu_copy(snap), 5).blocks
    assert isinstance(gpu.lo, np.ndarray)
    np.testing.assert_array_equal(gpu.lo, cpu.lo)
    np.testing.assert_array_equal(gpu.hi, cpu.hi)
    np.testing.assert_array_equal(gpu.n_tets, cpu.n_tets)
