"""pse_density on CuPy snapshots: tessellated and deposited on the GPU, against the CPU path."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.backend import to_device
from cosmo_dask.density import pse_density
from cosmo_dask.models.zeldovich import zeldovich
from cosmo_dask.snapshot import Snapshot

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


def test_gpu_column_tets_equal_the_array_path():
    """The one-launch tessellation kernel reproduces the CuPy-array construction bit for bit."""
    import cupy

    from cosmo_dask.density import tessellation as tess
    from cosmo_dask.density.tessellation_gpu import column_block_tets_gpu

    rng = np.random.default_rng(3)
    n = 12
    snap = zeldovich(n, box_size=20.0, redshift=0.0, precision="float64")
    mass = rng.uniform(0.5, 2.0, n**3)
    snap = Snapshot.from_arrays(snap.pos, ids=snap.ids, mass=mass, box_size=20.0,
                                lagrangian_shape=(n, n, n))
    for periodic_snap in (snap, Snapshot.from_arrays(
            np.asarray(snap.pos.compute()), ids=np.arange(n**3), mass=mass,
            lagrangian_shape=(n, n, n))):
        pos, m = tess.id_ordered(periodic_snap)
        shape = (n, n, n)
        box = periodic_snap.box_size
        ncz = tess.cells_shape(shape, box is not None)[2]
        slab = tess._x_slab(pos, shape, 4, 5, box is not None).compute()
        ms = tess._x_slab(m, shape, 4, 5, box is not None).compute()
        col = tess._column(slab, ms, shape, 4, 8, box is not None)
        gcol = (cupy.asarray(col[0]), cupy.asarray(col[1]))
        bks = [2, 0, 1] if ncz > 8 else [1, 0]
        shifts = np.array([[0, 0, 0], [20.0, 0, -20.0], [0, 20.0, 0]])[:len(bks)]
        if box is None:
            shifts = np.zeros_like(shifts)  # isolated: no images
        t_ref, m_ref = [], []
        for bk, sh in zip(bks, shifts, strict=True):
            corners, cm = tess.block_window(gcol, bk, 4, ncz)
            ref = corners[0, 0, 0] if box is not None else None
            t, w = tess.block_tets_from_corners(corners, cm, box, ref)
            t_ref.append(t + cupy.asarray(sh))
            m_ref.append(w)
        t, w = column_block_tets_gpu(gcol, bks, 4, ncz, box, None, shifts)
        np.testing.assert_array_equal(cupy.asnumpy(t), cupy.asnumpy(cupy.concatenate(t_ref)))
        np.testing.assert_array_equal(cupy.asnumpy(w), cupy.asnumpy(cupy.concatenate(m_ref)))


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
