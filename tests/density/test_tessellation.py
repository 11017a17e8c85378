"""PSE tessellation: Kuhn split, periodic unwrapping, tiling, blocks and deposits."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.errors import SnapshotError
from cosmo_dask.density import (
    block_tetrahedra,
    deposit_tets,
    lagrangian_blocks,
    snapshot_tetrahedra,
)
from cosmo_dask.density.tessellation_kernels import CORNER_OFFSETS, KUHN_TETS, tet_vertex_ids
from cosmo_dask.models.lattice import perturbed_lattice
from cosmo_dask.store.snapshot import Snapshot


def signed_volumes(tets):
    return np.linalg.det(tets[:, 1:] - tets[:, :1]) / 6.0


def lattice_positions(n, box):
    i, j, k = np.meshgrid(*[np.arange(n)] * 3, indexing="ij")
    return (np.stack([i, j, k], -1).reshape(-1, 3) + 0.5) * (box / n)


def wave_snapshot(n, box, amp, *, shuffle=None, chunks=None, mass=None):
    """Smooth periodic (Zel'dovich-like) displacement, no shell crossing for amp*2pi < 1/3."""
    q = lattice_positions(n, box)
    k = 2 * np.pi / box
    psi = np.stack([np.sin(k * q[:, 0]) + 0.5 * np.sin(k * (q[:, 1] + q[:, 2])),
                    np.sin(k * q[:, 1] + 1.0) * np.cos(k * q[:, 0]),
                    np.cos(k * q[:, 2]) + 0.3 * np.sin(2 * k * q[:, 0])], axis=1)
    pos = np.mod(q + amp * box * psi, box)
    ids = np.arange(n**3)
    if shuffle is not None:
        pos, ids = pos[shuffle], ids[shuffle]
        mass = None if mass is None else mass[shuffle]
    return Snapshot.from_arrays(pos, ids=ids, mass=mass, box_size=box,
                                particle_mass=None if mass is not None else 2.0,
                                lagrangian_shape=(n, n, n), chunks=chunks)


def test_kuhn_split_tiles_the_unit_cube():
    v = CORNER_OFFSETS[KUHN_TETS].astype(float)
    vols = signed_volumes(v)
    np.testing.assert_allclose(vols, 1 / 6, rtol=1e-15)
    # every tet contains the main diagonal 000-111
    assert all(0 in t and 7 in t for t in KUHN_TETS)
    # the six tets tile the cube: a random point is in exactly one (barycentric test)
    rng = np.random.default_rng(0)
    pts = rng.uniform(size=(2000, 3))
    count = np.zeros(len(pts), int)
    for t in v:
        lam = np.linalg.solve((t[1:] - t[0]).T, (pts - t[0]).T).T
        count += np.all(lam >= 0, axis=1) & (lam.sum(axis=1) <= 1)
    assert np.all(count == 1)


def test_unperturbed_lattice_cells_have_exact_volume():
    n, box = 6, 3.0
    snap = perturbed_lattice(n, box_size=box, amplitude=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    assert tets.shape == (6 * n**3, 4, 3)
    vols = signed_volumes(tets)
    np.testing.assert_allclose(vols, (box / n) ** 3 / 6, rtol=1e-12)
    cell_vol = vols.reshape(-1, 6).sum(axis=1)
    np.testing.assert_allclose(cell_vol, (box / n) ** 3, rtol=1e-12)
    np.testing.assert_allclose(mass, 1.0 / n**3 / 6, rtol=1e-15)
    assert mass.sum() == pytest.approx(1.0, rel=1e-13)


def test_perturbed_lattice_tiles_the_box():
    n, box = 8, 5.0
    snap = wave_snapshot(n, box, 0.03)
    tets, mass = snapshot_tetrahedra(snap)
    vols = signed_volumes(tets)
    assert np.all(vols > 0)
    assert np.abs(vols).sum() == pytest.approx(box**3, rel=1e-10)
    assert mass.sum() == pytest.approx(2.0 * n**3, rel=1e-13)


def test_zeldovich_snapshot_tiles_the_box():
    from cosmo_dask.models.zeldovich_ics import zeldovich

    snap = zeldovich(8, box_size=100.0, redshift=20.0, precision="float64")
    tets, _ = snapshot_tetrahedra(snap)
    vols = signed_volumes(tets)
    assert np.all(vols > 0)
    assert vols.sum() == pytest.approx(100.0**3, rel=1e-10)


def test_shared_faces_match():
    n = 5
    ids = tet_vertex_ids((n, n, n), periodic=True)
    faces = np.concatenate([np.sort(ids[:, [a, b, c]], axis=1)
                            for a, b, c in ((1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2))])
    _, counts = np.unique(faces, axis=0, return_counts=True)
    assert np.all(counts == 2)
    # isolated grid: interior triangles twice, boundary ones once
    ids_open = tet_vertex_ids((n, n, n), periodic=False)
    faces = np.concatenate([np.sort(ids_open[:, [a, b, c]], axis=1)
                            for a, b, c in ((1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2))])
    _, counts = np.unique(faces, axis=0, return_counts=True)
    assert set(counts.tolist()) == {1, 2}
    assert (counts == 1).sum() == 6 * 2 * (n - 1) ** 2  # 2 triangles per boundary square


def test_vertex_ids_match_positions():
    n, box = 4, 1.0
    snap = wave_snapshot(n, box, 0.02)
    tets, _ = snapshot_tetrahedra(snap)
    ids = tet_vertex_ids((n, n, n))
    pos = np.asarray(snap.pos.compute())
    d = tets - pos[ids]
    np.testing.assert_allclose(d - box * np.round(d / box), 0, atol=1e-12)


def test_periodic_straddling_tets_are_unwrapped():
    n, box = 6, 2.0
    snap = wave_snapshot(n, box, 0.03)
    tets, _ = snapshot_tetrahedra(snap)
    edges = tets[:, :, None, :] - tets[:, None, :, :]
    assert np.sqrt((edges**2).sum(-1)).max() < box / 2
    assert (tets.max(axis=(1, 2)) > box).any() or (tets.min(axis=(1, 2)) < 0).any()


@pytest.mark.parametrize("grid_n", [6, 12])
def test_deposit_unperturbed_lattice_is_uniform(grid_n):
    n, box = 6, 3.0
    snap = perturbed_lattice(n, box_size=box, amplitude=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    grid = deposit_tets(tets, mass, [0, 0, 0], box / grid_n, (grid_n,) * 3, periodic=True)
    np.testing.assert_allclose(grid, 1.0 / grid_n**3, rtol=1e-12)


def test_deposit_perturbed_conserves_mass():
    n, box = 8, 5.0
    snap = wave_snapshot(n, box, 0.03)
    tets, mass = snapshot_tetrahedra(snap)
    grid = deposit_tets(tets, mass, [0, 0, 0], box / 10, (10, 10, 10), periodic=True)
    assert grid.sum() == pytest.approx(2.0 * n**3, rel=1e-12)
    assert grid.min() > 0


def _canonical(tets, box):
    """Tets shifted so vertex 0 lies in [0, box): compare up to whole-box shifts."""
    shift = np.floor(tets[:, :1, :] / box) * box
    return tets - shift


def test_blocks_reproduce_the_whole_tessellation():
    n, box, block = 10, 4.0, 4
    snap = wave_snapshot(n, box, 0.03, chunks=137)
    ref, ref_mass = snapshot_tetrahedra(snap)
    blocks = lagrangian_blocks(snap, block=block)
    assert blocks.cells_shape == (n, n, n)
    assert blocks.index.shape == (27, 3)
    assert blocks.n_tets.sum() == 6 * n**3
    ref_c = _canonical(ref, box).reshape(n, n, n, 6, 4, 3)
    total = 0.0
    for (bi, bj, bk), lo, hi, nt in zip(blocks.index, blocks.lo, blocks.hi, blocks.n_tets,
                                        strict=True):
        tets, mass = block_tetrahedra(snap, (bi, bj, bk), block=block)
        assert len(tets) == nt
        np.testing.assert_array_equal(tets.min(axis=(0, 1)), lo)
        np.testing.assert_array_equal(tets.max(axis=(0, 1)), hi)
        assert np.all(hi - lo < box / 2)  # compact: no wrapping across the box
        sl = tuple(slice(b * block, min((b + 1) * block, n)) for b in (bi, bj, bk))
        np.testing.assert_allclose(_canonical(tets, box), ref_c[sl].reshape(-1, 4, 3),
                                   rtol=0, atol=1e-12)
        total += mass.sum()
    assert total == pytest.approx(ref_mass.sum(), rel=1e-13)


def test_shuffled_ids_and_mass_array():
    n, box = 5, 1.0
    rng = np.random.default_rng(3)
    perm = rng.permutation(n**3)
    masses = rng.uniform(1, 2, n**3)
    ordered = wave_snapshot(n, box, 0.02, mass=masses)
    shuffled = wave_snapshot(n, box, 0.02, shuffle=perm, mass=masses)
    t1, m1 = snapshot_tetrahedra(ordered)
    t2, m2 = snapshot_tetrahedra(shuffled)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(m1, m2)
    assert m1.sum() == pytest.approx(masses.sum(), rel=1e-13)
    tb, mb = block_tetrahedra(shuffled, (0, 0, 0), block=3)
    np.testing.assert_array_equal(mb, m1.reshape(n, n, n, 6)[:3, :3, :3].reshape(-1))


def test_isolated_grid_has_one_fewer_cell_per_axis():
    n = 4
    pos = lattice_positions(n, 1.0)
    snap = Snapshot.from_arrays(pos, ids=np.arange(n**3), particle_mass=1.0,
                                lagrangian_shape=(n, n, n))
    tets, mass = snapshot_tetrahedra(snap)
    assert len(tets) == 6 * (n - 1) ** 3
    assert signed_volumes(tets).sum() == pytest.approx(((n - 1) / n) ** 3, rel=1e-12)
    blocks = lagrangian_blocks(snap, block=2)
    assert blocks.cells_shape == (3, 3, 3) and blocks.n_tets.sum() == len(tets)


def test_bad_input():
    pos = lattice_positions(3, 1.0)
    with pytest.raises(SnapshotError, match="lagrangian_shape"):
        snapshot_tetrahedra(Snapshot.from_arrays(pos, ids=np.arange(27), box_size=1.0,
                                                 particle_mass=1.0))
    with pytest.raises(SnapshotError, match="ids"):
        snapshot_tetrahedra(Snapshot.from_arrays(pos, box_size=1.0, particle_mass=1.0,
                                                 lagrangian_shape=(3, 3, 3)))
    ids = np.arange(27)
    ids[5] = 4
    with pytest.raises(SnapshotError, match="duplicated"):
        snapshot_tetrahedra(Snapshot.from_arrays(pos, ids=ids, box_size=1.0, particle_mass=1.0,
                                                 lagrangian_shape=(3, 3, 3)))
