"""Exact tetrahedron-cube intersection volumes and tetrahedron deposits (CPU kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.density import deposit_tets, snapshot_tetrahedra, tet_cube_volume
from tests.support.density import corner_simplex_in_unit_cube, tet_volume, tiled_tets


def inside_tet(points, tet):
    """Boolean mask of points inside a tetrahedron (barycentric coordinates)."""
    m = (tet[1:] - tet[0]).T
    lam = np.linalg.solve(m, (points - tet[0]).T).T
    return np.all(lam >= 0, axis=1) & (lam.sum(axis=1) <= 1)


def test_tet_inside_cube_gives_tet_volume(rng):
    tets = rng.uniform(0.1, 0.9, size=(50, 4, 3))
    v = tet_cube_volume(tets, [0.0, 0.0, 0.0], 1.0)
    np.testing.assert_allclose(v, tet_volume(tets), rtol=1e-14, atol=0)
    # also when the cube is large and offset
    v = tet_cube_volume(tets * 3 - 7, [-8.0, -8.0, -8.0], 5.0)
    np.testing.assert_allclose(v, tet_volume(tets * 3), rtol=1e-13)


def test_cube_inside_tet_gives_cube_volume(rng):
    big = np.array([[0, 0, 0], [10, 0, 0], [0, 10, 0], [0, 0, 10.0]])
    lo = rng.uniform(0.5, 2.0, size=(20, 3))
    h = rng.uniform(0.1, 1.0, size=20)
    v = tet_cube_volume(big, lo, h)[0]
    np.testing.assert_allclose(v, h**3, rtol=1e-14)


def test_cube_inside_tet_through_the_clipping_path(rng):
    """The full clip (no fast path) also returns the cube volume."""
    from cosmo_dask.density.tet_volume import clip_volume

    stack = np.empty((16, 4, 3))
    lev = np.empty(24, np.int64)
    big = np.array([[-1, -1, -1], [10, -1, -1], [-1, 10, -1], [-1, -1, 10.0]])
    for h in (0.5, 1.0, 2.5):
        stack[0] = big
        v = clip_volume(stack, lev, np.empty((4, 3)), np.empty(4), np.empty((6, 3)), h,
                        lev[16:20], lev[20:24])
        assert v == pytest.approx(h**3, rel=1e-14)


def test_disjoint_is_zero(rng):
    tets = rng.uniform(0, 1, size=(20, 4, 3))
    assert np.all(tet_cube_volume(tets, [[1.5, 0, 0], [0, -2, 0], [0, 0, 1.0001]], 0.4) == 0)
    # bounding boxes overlap but the cube lies beyond the slanted face
    t = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1.0]])
    assert tet_cube_volume(t, [0.6, 0.6, 0.6], 0.3)[0] == 0.0


@pytest.mark.parametrize("a", [0.3, 1.0, 1.5, 2.0, 2.5, 3.0, 3.7])
def test_corner_simplex_analytic(a):
    """Tet {x,y,z >= 0, x+y+z <= a} against [0,1]^3: exact Irwin-Hall volume (faces touch)."""
    t = np.array([[0, 0, 0], [a, 0, 0], [0, a, 0], [0, 0, a]], dtype=float)
    v = tet_cube_volume(t, [0, 0, 0], 1.0)[0]
    assert v == pytest.approx(corner_simplex_in_unit_cube(a), rel=1e-13, abs=1e-15)
    # translated and scaled copies give the same fraction
    s, off = 0.37, np.array([5.0, -3.0, 2.0])
    v2 = tet_cube_volume(t * s + off, off, s)[0]
    assert v2 == pytest.approx(corner_simplex_in_unit_cube(a) * s**3, rel=1e-12)


def test_documented_case_five_sixths():
    t = np.array([[0, 0, 0], [2, 0, 0], [0, 2, 0], [0, 0, 2.0]])
    assert tet_cube_volume(t, [0, 0, 0], 1.0)[0] == pytest.approx(5 / 6, rel=1e-14)


def test_half_cube_by_a_diagonal_plane():
    """A large tet with one face on the plane x + y = 1 and the others far away: 1/2."""
    big, far = 100.0, 1000.0
    t = np.array([[1 + big, -big, -big], [-big, 1 + big, -big], [0.5, 0.5, big],
                  [-far, -far, 0.5]])
    assert tet_cube_volume(t, [0, 0, 0], 1.0)[0] == pytest.approx(0.5, rel=1e-12)
    # shifted half a cell along x: the cube [0.5, 1.5] x [0, 1]^2 keeps x + y <= 1: 1/8
    assert tet_cube_volume(t, [0.5, 0, 0], 1.0)[0] == pytest.approx(0.125, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_tiling_of_space_sums_to_tet_volume(seed):
    tets, cubes, h = tiled_tets(seed)
    total = tet_cube_volume(tets, cubes, h).sum(axis=1)
    np.testing.assert_allclose(total, tet_volume(tets), rtol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_against_monte_carlo(seed):
    rng = np.random.default_rng(100 + seed)
    tet = rng.uniform(0, 1, size=(4, 3))
    h = rng.uniform(0.3, 0.6)
    lo = rng.uniform(0.1, 0.9 - h, 3)
    n = 400_000
    pts = lo + h * rng.uniform(size=(n, 3))
    p = inside_tet(pts, tet).mean()
    mc = p * h**3
    sigma = h**3 * np.sqrt(max(p * (1 - p), 1.0 / n) / n)
    v = tet_cube_volume(tet, lo, h)[0]
    assert abs(v - mc) < 4 * sigma, (v, mc, sigma)


def test_degenerate_tets_give_zero_not_nan():
    flat = np.array([[0, 0, 0.5], [1, 0, 0.5], [0, 1, 0.5], [0.3, 0.3, 0.5]])  # coplanar
    line = np.array([[0, 0, 0], [1, 1, 1], [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]])
    point = np.full((4, 3), 0.5)
    repeated = np.array([[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 1.0]])
    v = tet_cube_volume(np.stack([flat, line, point, repeated]),
                        [[0, 0, 0], [0.25, 0.25, 0.25], [0.5, 0.5, 0.5]], [1.0, 0.5, 0.25])
    assert np.all(np.isfinite(v)) and np.all(v == 0)


def test_tets_touching_a_face_exactly():
    t_out = np.array([[1, 0, 0], [2, 0, 0], [1, 1, 0], [1, 0, 1.0]])  # face on x = 1, outside
    t_in = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0], [1, 0, 1.0]])  # same face, inside
    v = tet_cube_volume(np.stack([t_out, t_in]), [0, 0, 0], 1.0)
    assert v[0] == 0.0
    assert v[1] == pytest.approx(1 / 6, rel=1e-15)
    # a cube sharing only an edge or a vertex with a tet
    assert tet_cube_volume(t_out, [[2, 0, -1], [2, 1, 1]], 1.0).tolist() == [[0.0, 0.0]]


def test_broadcasting_and_dtypes(rng):
    tets = rng.uniform(0, 2, size=(7, 4, 3))
    lo = rng.uniform(0, 1, size=(5, 3))
    full = tet_cube_volume(tets, lo, 0.7)
    assert full.shape == (7, 5) and full.dtype == np.float64
    h = np.full(5, 0.7)
    np.testing.assert_array_equal(tet_cube_volume(tets, lo, h), full)
    np.testing.assert_array_equal(tet_cube_volume(tets, lo[2], 0.7), full[:, 2])
    assert tet_cube_volume(tets[0], lo, 0.7).shape == (1, 5)
    t32 = tets.astype(np.float32)
    np.testing.assert_array_equal(tet_cube_volume(t32, lo, 0.7),
                                  tet_cube_volume(t32.astype(np.float64), lo, 0.7))
    with pytest.raises(ParameterError):
        tet_cube_volume(tets[:, :3], lo, 0.7)
    with pytest.raises(ParameterError):
        tet_cube_volume(tets, lo, -1.0)
    with pytest.raises(ParameterError):
        tet_cube_volume(tets, lo, np.ones(3))


# --------------------------------------------------------------------------- deposit
def test_deposit_matches_pairwise_volumes(rng):
    tets = rng.uniform(0.2, 2.7, size=(6, 4, 3))
    mass = rng.uniform(1, 2, size=6)
    cs, shape, glo = 0.5, (6, 6, 6), np.zeros(3)
    grid = deposit_tets(tets, mass, glo, cs, shape)
    idx = np.stack(np.meshgrid(*[np.arange(6)] * 3, indexing="ij"), -1).reshape(-1, 3)
    w = tet_cube_volume(tets, idx * cs, cs)
    ref = (mass[:, None] * w / tet_volume(tets)[:, None]).sum(axis=0).reshape(shape)
    np.testing.assert_allclose(grid, ref, rtol=1e-12, atol=1e-15)
    assert grid.sum() == pytest.approx(mass.sum(), rel=1e-13)


def test_deposit_periodic_wraps_and_conserves(rng):
    tets = rng.uniform(-1.5, 5.5, size=(40, 4, 3))  # straddle the box [0, 4)
    grid = deposit_tets(tets, 1.0, [0, 0, 0], 0.5, (8, 8, 8), periodic=True)
    assert grid.sum() == pytest.approx(40.0, rel=1e-13)
    # the same tets shifted by a box deposit the same grid
    grid2 = deposit_tets(tets + np.array([4.0, -8.0, 4.0]), 1.0, [0, 0, 0], 0.5, (8, 8, 8),
                         periodic=True)
    np.testing.assert_allclose(grid2, grid, rtol=1e-10, atol=1e-13)


def test_deposit_non_periodic_drops_what_is_outside():
    t = np.array([[0, 0, 0], [2, 0, 0], [0, 2, 0], [0, 0, 2.0]])
    grid = deposit_tets(t, 6.0, [0, 0, 0], 0.5, (2, 2, 2))  # covers [0,1]^3
    # fraction of the tet inside [0,1]^3 = (5/6) / (8/6)
    assert grid.sum() == pytest.approx(6.0 * (5 / 6) / (8 / 6), rel=1e-13)


def test_deposit_degenerate_goes_to_centroid_cell():
    flat = np.array([[[0.1, 0.1, 0.3], [0.9, 0.1, 0.3], [0.1, 0.9, 0.3], [0.5, 0.5, 0.3]]])
    grid = deposit_tets(flat, 2.0, [0, 0, 0], 0.25, (4, 4, 4))
    assert np.all(np.isfinite(grid)) and grid.sum() == 2.0
    assert grid[1, 1, 1] == 2.0


def test_deposit_bad_grid():
    t = np.zeros((1, 4, 3))
    with pytest.raises(ParameterError):
        deposit_tets(t, 1.0, [0, 0], 1.0, (2, 2, 2))
    with pytest.raises(ParameterError):
        deposit_tets(t, 1.0, [0, 0, 0], 0.0, (2, 2, 2))
    with pytest.raises(ParameterError):
        deposit_tets(t, 1.0, [0, 0, 0], 1.0, (2, 0, 2))


# --------------------------------------------------------------------------- deposit kernel
def per_cell_deposit(tets, mass, glo, cs, shape, periodic):
    """Reference deposit: every cell of each tet's bounding box clipped on its own."""
    grid = np.zeros(shape)
    u = (np.asarray(tets, dtype=np.float64) - glo) / cs
    for t, m in zip(u, np.broadcast_to(mass, len(u)), strict=True):
        lo = np.floor(t.min(axis=0)).astype(int)
        hi = np.floor(t.max(axis=0)).astype(int)
        axes = [np.arange(a, b + 1) for a, b in zip(lo, hi, strict=True)]
        idx = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
        w = tet_cube_volume(t, idx.astype(float), 1.0)[0]
        if periodic:
            idx = idx % shape
        else:
            keep = np.all((idx >= 0) & (idx < shape), axis=1)
            idx, w = idx[keep], w[keep]
        np.add.at(grid, tuple(idx.T), m * w / tet_volume(t))
    return grid


def stretched_tets(rng, n, box, reach=None):
    """Thin, stretched tetrahedra spanning several cells, like a z=0 snapshot's: corner
    in [0, box)^3, edges from it up to ``reach`` (default box / 2) long per axis."""
    reach = box / 2 if reach is None else reach
    base = rng.uniform(0, box, size=(n, 1, 3))
    axes = rng.normal(size=(n, 3, 3)) * rng.uniform(0.1, 0.4, size=(n, 3, 1)) * reach
    axes[:, 2] *= rng.uniform(1e-3, 1.0, size=(n, 1))  # some nearly flat
    return np.concatenate([base, base + np.clip(axes, -reach, reach)], axis=1)


@pytest.mark.parametrize("periodic", [True, False])
def test_deposit_matches_per_cell_clips(rng, periodic):
    tets = stretched_tets(rng, 300, 6.0)
    mass = rng.uniform(1, 2, size=300)
    glo, cs, shape = np.array([0.3, -0.2, 0.1]), 0.45, (13, 12, 14)
    grid = deposit_tets(tets, mass, glo, cs, shape, periodic=periodic)
    ref = per_cell_deposit(tets, mass, glo, cs, shape, periodic)
    # both exact to rounding: a few 1e-17 of a cell's volume, times the densest tet's m/vol
    density = (mass / (tet_volume(tets) / cs**3)).max()
    np.testing.assert_allclose(grid, ref, rtol=0, atol=1e-15 * density)
    assert np.all(grid >= 0)


def test_deposit_zeldovich_snapshot_matches_per_cell_clips():
    from cosmo_dask.density import snapshot_tetrahedra
    from cosmo_dask.models.zeldovich_ics import zeldovich

    snap = zeldovich(8, box_size=12.5, redshift=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    cs = 12.5 / 16
    grid = deposit_tets(tets, mass, [0, 0, 0], cs, (16, 16, 16), periodic=True)
    ref = per_cell_deposit(tets, mass, np.zeros(3), cs, (16, 16, 16), True)
    density = (mass / (tet_volume(tets) / cs**3)).max()
    np.testing.assert_allclose(grid, ref, rtol=0, atol=1e-15 * density)
    assert grid.sum() == pytest.approx(mass.sum(), rel=1e-13)


def test_deposit_conserves_mass_periodic_and_inside(rng):
    tets = stretched_tets(rng, 2000, 8.0)
    mass = rng.uniform(1, 2, size=2000)
    grid = deposit_tets(tets, mass, [0, 0, 0], 0.5, (16, 16, 16), periodic=True)
    assert grid.sum() == pytest.approx(mass.sum(), rel=1e-12)
    # the same tets inside a larger non-periodic grid: nothing is lost
    grid = deposit_tets(tets, mass, [-12.0, -12.0, -12.0], 0.5, (64, 64, 64))
    assert grid.sum() == pytest.approx(mass.sum(), rel=1e-12)


def test_patches_tile_the_grid(rng):
    """Non-periodic patches of a grid (tets partly or wholly outside each) add up to it."""
    tets = stretched_tets(rng, 500, 4.0, reach=1.9)  # within one box of [0, 4)^3
    mass = rng.uniform(1, 2, size=500)
    cs, n = 0.25, 16
    full = deposit_tets(tets, mass, [0, 0, 0], cs, (n, n, n), periodic=True)
    # the same periodic box as 2 x 2 x 2 patches, each fed the tets and their 26 images
    shifts = np.stack(np.meshgrid(*[[-4.0, 0.0, 4.0]] * 3, indexing="ij"), -1).reshape(-1, 3)
    images = np.concatenate([tets + s[None, None] for s in shifts])
    im_mass = np.tile(mass, len(shifts))
    patched = np.zeros((n, n, n))
    h = n // 2
    for a in range(2):
        for b in range(2):
            for c in range(2):
                lo = np.array([a, b, c]) * h * cs
                out = patched[a * h:(a + 1) * h, b * h:(b + 1) * h, c * h:(c + 1) * h]
                deposit_tets(images, im_mass, lo, cs, (h, h, h), out=out)
    np.testing.assert_allclose(patched, full, rtol=0, atol=1e-12 * full.max())


def test_deposit_lattice_aligned_tets():
    """Kuhn tets of an unperturbed lattice: vertices on grid points, faces on grid planes
    or vertical, each lattice cell spanning 2^3 grid cells: a uniform grid."""
    from cosmo_dask.density import snapshot_tetrahedra
    from cosmo_dask.models.lattice import perturbed_lattice

    n, box = 4, 4.0
    snap = perturbed_lattice(n, box_size=box, amplitude=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    # vertices at (i + 0.5) * box / n: shift the grid so they land on cell corners
    grid = deposit_tets(tets, mass, [0.5, 0.5, 0.5], 0.5, (8, 8, 8), periodic=True)
    np.testing.assert_allclose(grid, 1.0 / 8**3, rtol=1e-13)
    # one Kuhn tet of a 2^3 cube onto unit cells: faces on x = 2, z = 0 and diagonal planes
    t = np.array([[0, 0, 0], [2, 0, 0], [2, 2, 0], [2, 2, 2.0]])
    g = deposit_tets(t, 6.0, [0, 0, 0], 1.0, (2, 2, 2))
    np.testing.assert_allclose(g, per_cell_deposit(t[None], 6.0, 0.0, 1.0, (2, 2, 2), False),
                               rtol=1e-14, atol=1e-15)
    assert g.sum() == pytest.approx(6.0, rel=1e-14)


def test_deposit_overflow_path_is_exact():
    """A polygon overflow resumes the tet with more room: forced here, same bits."""
    from cosmo_dask.density.tet_volume import _deposit_cpu

    rng = np.random.default_rng(3)
    tets = stretched_tets(rng, 400, 5.0)
    mass = rng.uniform(1, 2, size=400)
    for periodic in (True, False):
        g1 = np.zeros((9, 10, 11))
        g2 = np.zeros((9, 10, 11))
        args = (tets, mass, np.array([0.2, 0.1, 0.0]), 0.5, 9, 10, 11, periodic)
        lost1 = _deposit_cpu(*args, g1)
        lost2 = _deposit_cpu(*args, g2, 4)  # room for 4 vertices: every tet overflows
        assert np.array_equal(g1, g2)
        assert lost2 == pytest.approx(lost1, rel=1e-13, abs=1e-13)


# -------------------- on the GPU (formerly tests/test_tet_volume_gpu.py)
# GPU tetrahedron-cube volumes and deposits against the CPU (numba) kernel: the GPU-only
# options (float32 arithmetic, ``method``), the per-cell clips kept for comparison and the
# lattice kernel's stress cases. The contract itself (analytic volumes, tilings, float32
# upcast, uniform lattice, patches, GPU = CPU through the dispatch) is tested for both
# backends in ``tests/density/test_kernel_contracts.py``.


def _cubes(rng, n, lo=-1.0, hi=2.0):
    return rng.uniform(lo, hi, size=(n, 3)), rng.uniform(0.1, 1.5, size=n)


@pytest.mark.gpu
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


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lattice"])  # "auto": tests/density/test_kernel_contracts.py
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


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["warp", "thread"])
@pytest.mark.parametrize("periodic", [False, True])
def test_clip_deposits_kept_for_comparison_equal_cpu(rng, method, periodic):
    """The per-cell clip deposits of ``benchmarks/density/tet_deposit_clip_gpu.py`` (what the
    lattice kernel is timed against) still match the CPU deposit."""
    import importlib.util
    from pathlib import Path

    import cupy as cp

    path = (Path(__file__).resolve().parents[2] / "benchmarks" / "density"
            / "tet_deposit_clip_gpu.py")
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
