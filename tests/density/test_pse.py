"""pse_density: adaptive octree, gather/reduce graphs, against independent references."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq

from cosmo_dask.core.backend import to_device
from cosmo_dask.core.errors import ParameterError, SnapshotError
from cosmo_dask.density import deposit_tets, pse_density, snapshot_tetrahedra
from cosmo_dask.density.pse_octree import build_octree
from cosmo_dask.density.tessellation import lagrangian_blocks
from cosmo_dask.models.lattice import perturbed_lattice
from cosmo_dask.models.zeldovich_ics import zeldovich
from cosmo_dask.store.snapshot import Snapshot


def leaf_masses(octree):
    patches = np.asarray(octree.patches.compute())
    return patches * octree.cell_size[:, None, None, None] ** 3


@pytest.fixture(scope="module")
def zel16():
    return zeldovich(16, box_size=50.0, redshift=0.0, precision="float64", chunks=1000)


def uniform_grid(octree):
    """The leaves of a one-level octree pasted into one (n, n, n) mass grid."""
    p = octree.patch_size
    lev = int(octree.level[0])
    assert np.all(octree.level == lev)
    n = p * 2**lev
    out = np.zeros((n, n, n))
    for o, m in zip(octree.origin, leaf_masses(octree), strict=True):
        a = o * p
        out[a[0]:a[0] + p, a[1]:a[1] + p, a[2]:a[2] + p] = m
    return out


def test_uniform_octree_equals_a_direct_periodic_deposit(zel16):
    octree = pse_density(zel16, patch_size=8, strategy="gather", block=4)
    assert octree.effective_resolution == 32
    direct = deposit_tets(*snapshot_tetrahedra(zel16), [0, 0, 0], 50.0 / 32, (32,) * 3,
                          periodic=True)
    grid = uniform_grid(octree)
    assert np.max(np.abs(grid - direct)) <= 1e-12 * direct.max()


@pytest.mark.parametrize("strategy", ["gather", "reduce"])
def test_zeldovich_mass_is_conserved(zel16, strategy):
    octree = pse_density(zel16, patch_size=4, strategy=strategy, block=4,
                         max_tets_per_node=3000, max_level=3, max_partials=2)
    assert len(np.unique(octree.level)) >= 2  # adaptive
    total = 16**3 * float(zel16.particle_mass)
    assert octree.total_mass() == pytest.approx(total, rel=1e-12)
    assert octree.attrs["strategy"] == strategy


def test_gather_and_reduce_agree_with_1_and_4_workers(zel16):
    from distributed import Client, LocalCluster

    kw = dict(patch_size=4, block=4, max_tets_per_node=3000, max_level=3, max_partials=3)
    ref = leaf_masses(pse_density(zel16, strategy="gather", **kw))
    total = 16**3 * float(zel16.particle_mass)
    for workers in (1, 4):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster):
            for strategy in ("gather", "reduce"):
                octree = pse_density(zel16, strategy=strategy, **kw)
                m = leaf_masses(octree)
                assert np.max(np.abs(m - ref)) <= 1e-12 * np.abs(ref).max()
                assert m.sum() == pytest.approx(total, rel=1e-12)
            auto = pse_density(zel16, strategy="auto", **kw)
            est = auto.attrs["estimated_bytes_moved"]
            if workers == 1:
                assert est == {"gather": 0.0, "reduce": 0.0}
                assert auto.attrs["strategy"] == "gather"
            else:
                want = "reduce" if est["reduce"] < est["gather"] else "gather"
                assert auto.attrs["strategy"] == want


@pytest.mark.parametrize("strategy", ["gather", "reduce"])
def test_columns_whose_holder_is_unknown_are_placed_by_the_scheduler(zel16, client,
                                                                     monkeypatch, strategy):
    """A column the scheduler cannot place (its worker was lost after the columns were
    persisted: CI saw a TypeError sorting None with worker addresses) leaves the tasks
    unplaced, with the placed run's result."""
    import cosmo_dask.density.pse as pse_module

    kw = dict(patch_size=4, block=4, max_tets_per_node=3000, max_level=3, max_partials=3)
    placed = leaf_masses(pse_density(zel16, strategy=strategy, **kw))
    real = client.who_has

    def lost_one(futures):
        where = dict(real(futures))
        where[next(iter(where))] = ()  # the first column's holder is gone
        return where

    monkeypatch.setattr(client, "who_has", lost_one)
    seen = []
    column_workers = pse_module.column_workers
    monkeypatch.setattr(pse_module, "column_workers",
                        lambda values: seen.append(column_workers(values)) or seen[-1])
    m = leaf_masses(pse_density(zel16, strategy=strategy, **kw))
    assert seen == [None]  # no placement: the scheduler places the tasks
    assert np.max(np.abs(m - placed)) <= 1e-12 * np.abs(placed).max()


def test_unperturbed_lattice_is_exactly_uniform():
    snap = perturbed_lattice(8, box_size=3.0, amplitude=0.0, precision="float64")
    octree = pse_density(snap, patch_size=4, block=4)
    rho = np.asarray(octree.patches.compute())
    mean = 1.0 / 3.0**3  # total mass 1
    assert np.max(np.abs(rho / mean - 1)) <= 1e-12


def test_isolated_snapshot_uses_the_bounding_cube(zel16):
    pos = np.asarray(zel16.pos.compute())
    iso = Snapshot.from_arrays(pos, ids=np.arange(len(pos)), particle_mass=1.0,
                               lagrangian_shape=(16, 16, 16))
    octree = pse_density(iso, patch_size=4, block=4, max_tets_per_node=2000, max_level=3)
    assert octree.total_mass() == pytest.approx(15**3, rel=1e-12)
    lo = pos.min(axis=0)
    assert np.all(octree.root_lo <= lo) and octree.root_size >= np.ptp(pos, axis=0).max()


def test_octree_estimate_and_refinement():
    """Refinement follows the bounding-box estimate; leaves tile the root."""
    snap = zeldovich(16, box_size=50.0, redshift=0.0, precision="float64")
    blocks = lagrangian_blocks(snap, block=4)
    lay = build_octree(blocks, root_lo=np.zeros(3), root_size=50.0, box_size=50.0,
                       max_level=4, max_tets_per_node=1500)
    vol = np.sum((50.0 / 2.0**lay.level) ** 3)
    assert vol == pytest.approx(50.0**3, rel=1e-12)
    assert np.all(lay.est_tets[lay.level < 4] <= 1500)
    # the estimate sums the blocks' tetrahedra over the box (all images counted once)
    assert lay.est_tets.sum() == pytest.approx(blocks.n_tets.sum(), rel=1e-9)


# --------------------------------------------------------------------------- 1D pancake
def pancake(nx, amp_k, ny=3):
    """Plane-wave Zel'dovich displacement along x in a unit box: x = q + A sin(2 pi q)."""
    a = amp_k / (2 * np.pi)
    i, j, k = np.meshgrid(np.arange(nx), np.arange(ny), np.arange(ny), indexing="ij")
    q = np.stack([(i + 0.5) / nx, (j + 0.5) / ny, (k + 0.5) / ny], -1).reshape(-1, 3)
    pos = q.copy()
    pos[:, 0] = np.mod(q[:, 0] + a * np.sin(2 * np.pi * q[:, 0]), 1.0)
    n = len(pos)
    snap = Snapshot.from_arrays(pos, ids=np.arange(n), particle_mass=1.0 / n, box_size=1.0,
                                lagrangian_shape=(nx, ny, ny))
    return snap, a


def analytic_cell_density(lo, hi, a):
    """Cell average of the multistream density (mean 1): Lagrangian measure mapped into [lo, hi].

    x(q) = q + a sin(2 pi q) is monotonic between the zeros of 1 + 2 pi a cos(2 pi q);
    on each branch the preimage of [lo, hi] (and of its images lo+n, hi+n) is an
    interval found by root bracketing.
    """
    def x(q):
        return q + a * np.sin(2 * np.pi * q)

    kk = 2 * np.pi * a
    edges = [0.0, 1.0]
    if kk > 1:
        c = np.arccos(-1 / kk) / (2 * np.pi)
        edges = sorted([0.0, c, 1 - c, 1.0])
    measure = 0.0
    for ql, qr in zip(edges[:-1], edges[1:], strict=True):
        xl, xr = x(ql), x(qr)
        lo_x, hi_x = min(xl, xr), max(xl, xr)
        for shift in (-1.0, 0.0, 1.0):
            a0, b0 = max(lo + shift, lo_x), min(hi + shift, hi_x)
            if b0 <= a0:
                continue
            q0 = brentq(lambda q, t=a0: x(q) - t, ql, qr, xtol=1e-15, rtol=1e-15)
            q1 = brentq(lambda q, t=b0: x(q) - t, ql, qr, xtol=1e-15, rtol=1e-15)
            measure += abs(q1 - q0)
    return measure / (hi - lo)


@pytest.mark.parametrize("amp_k", [0.5, 1.5], ids=["before-crossing", "after-crossing"])
def test_pancake_matches_the_analytic_multistream_density(amp_k):
    nx, p, x0, side = 16384, 8, 0.4375, 0.125
    snap, a = pancake(nx, amp_k)
    octree = pse_density(snap, patch_size=p, max_level=0, block=64,
                         root=((x0, 0.0, 0.0), side))
    rho = np.asarray(octree.patches.compute())[0]
    h = side / p
    # density is independent of y and z
    assert np.max(np.abs(rho - rho[:, :1, :1])) <= 1e-9 * rho.max()
    caustics = []
    if amp_k > 1:
        c = np.arccos(-1 / amp_k) / (2 * np.pi)
        caustics = [(qc + a * np.sin(2 * np.pi * qc)) % 1.0 for qc in (c, 1 - c)]
    checked = 0
    for i in range(p):
        lo, hi = x0 + i * h, x0 + (i + 1) * h
        if any(lo <= xc <= hi for xc in caustics):
            continue  # a cell holding a caustic
        ref = analytic_cell_density(lo, hi, a)
        assert rho[i, 0, 0] == pytest.approx(ref, rel=1e-6), (i, lo, hi)
        checked += 1
    assert checked >= 6
    if amp_k > 1:
        assert len(caustics) == 2 and all(x0 < xc < x0 + side for xc in caustics)


# --------------------------------------------------------------------------- bad input
def test_bad_input(zel16):
    pos = np.asarray(zel16.pos.compute())
    n = len(pos)
    no_ids = Snapshot.from_arrays(pos, particle_mass=1.0, box_size=50.0,
                                  lagrangian_shape=(16, 16, 16))
    with pytest.raises(SnapshotError, match="ids"):
        pse_density(no_ids)
    no_shape = Snapshot.from_arrays(pos, ids=np.arange(n), particle_mass=1.0, box_size=50.0)
    with pytest.raises(SnapshotError, match="lagrangian_shape"):
        pse_density(no_shape)
    dup = np.arange(n)
    dup[5] = 4
    bad_ids = Snapshot.from_arrays(pos, ids=dup, particle_mass=1.0, box_size=50.0,
                                   lagrangian_shape=(16, 16, 16))
    with pytest.raises(SnapshotError, match="1 duplicated, 1 missing"):
        pse_density(bad_ids)
    for kw in ({"patch_size": 6}, {"patch_size": 0}, {"max_level": -1},
               {"max_tets_per_node": 0}, {"strategy": "scatter"}, {"root": ((0, 0), 1.0)},
               {"root": ((0, 0, 0), -1.0)}, {"max_partials": 0}, {"split_every": 1},
               {"block": 0}):
        with pytest.raises(ParameterError):
            pse_density(zel16, **kw)


def test_all_particles_at_one_point_deposit_there():
    """Every tetrahedron degenerate (zero volume): the mass lands in the cell holding the
    point, all of it; not a crash in the schedule (leaves that no piece overlaps)."""
    n, box, point = 8, 3.0, np.array([1.3, 0.4, 2.2])
    snap = Snapshot.from_arrays(np.tile(point, (n**3, 1)), np.zeros((n**3, 3)),
                                ids=np.arange(n**3), box_size=box, particle_mass=1.0,
                                lagrangian_shape=(n, n, n))
    octree = pse_density(snap, patch_size=4, block=4)
    masses = leaf_masses(octree)
    assert masses.sum() == pytest.approx(n**3, rel=1e-12)
    leaf, i, j, k = np.unravel_index(np.argmax(masses), masses.shape)
    assert masses[leaf, i, j, k] == pytest.approx(n**3, rel=1e-12)
    cell = octree.cell_size[leaf]
    lo = octree.origin[leaf] * octree.patch_size * cell + np.array([i, j, k]) * cell
    assert np.all((lo <= point) & (point < lo + cell))


# -------------------- on the GPU (formerly tests/test_pse_density_gpu.py)
# pse_density on CuPy snapshots: tessellated and deposited on the GPU, against the CPU path.


def gpu_copy(snap):
    return Snapshot.from_arrays(to_device(snap.pos, "gpu"), ids=snap.ids, box_size=snap.box_size,
                                particle_mass=snap.particle_mass,
                                lagrangian_shape=snap.lagrangian_shape)


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_gpu_pse_unperturbed_lattice_is_uniform():
    from cosmo_dask.models.lattice import perturbed_lattice

    snap = perturbed_lattice(8, box_size=3.0, amplitude=0.0, precision="float64")
    octree = pse_density(gpu_copy(snap), patch_size=4, block=4)
    import cupy

    rho = cupy.asnumpy(octree.patches.compute())
    assert np.max(np.abs(rho * 27.0 - 1)) <= 1e-12


@pytest.mark.gpu
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
