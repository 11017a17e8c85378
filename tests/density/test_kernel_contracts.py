"""The kernel contracts of ``cosmo_dask.density.dispatch``: one suite per contract, run on
every backend (NumPy chunks reach the CPU kernel, CuPy chunks the GPU one), each against
an independent float64 reference (textbook assignment weights, analytic volumes, exact
tilings, a brute-force tessellation written here); on the GPU also against the CPU kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.density import snapshot_tetrahedra
from cosmo_dask.density import tessellation as tess
from cosmo_dask.density.dispatch import (
    column_bboxes_kernel,
    column_tets_kernel,
    deposit_tets_kernel,
    paint_kernel,
    rows_tets_kernel,
    tet_cube_volume_kernel,
)
from cosmo_dask.density.tessellation_kernels import CORNER_OFFSETS, KUHN_TETS
from cosmo_dask.models.lattice import perturbed_lattice
from cosmo_dask.models.zeldovich_ics import zeldovich
from cosmo_dask.store.snapshot import Snapshot
from tests.support.density import (
    corner_simplex_in_unit_cube,
    reference_paint,
    tet_volume,
    tiled_tets,
)
from tests.support.kernels import cpu_implementation

BACKENDS = [pytest.param("cpu"), pytest.param("gpu", marks=pytest.mark.gpu)]


def xp_of(backend):
    if backend == "gpu":
        import cupy

        return cupy
    return np


def to_host(a):
    return a.get() if type(a).__module__.startswith("cupy") else np.asarray(a)


# --------------------------------------------------------------------------- paint
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme", ["ngp", "cic", "tsc", "pcs"])
@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_paint_contract(rng, backend, scheme, shift):
    xp = xp_of(backend)
    pos = rng.uniform(-5.0, 55.0, size=(3000, 3))  # some outside the box: wrapped
    mass = rng.uniform(0.5, 2.0, size=3000)
    ref = reference_paint(np.mod(pos, 50.0), mass, 12, 50.0, scheme, shift=shift)
    mesh = paint_kernel(xp.asarray(pos), xp.asarray(mass), 12, 50.0, scheme, shift)
    assert isinstance(mesh, xp.ndarray) and mesh.dtype == np.float64
    np.testing.assert_allclose(to_host(mesh), ref, rtol=0, atol=1e-12 * ref.max())
    assert abs(float(mesh.sum()) - mass.sum()) <= 1e-12 * mass.sum()
    # planes [3, 8) of the same mesh, accumulated into ``out``, with a scalar mass
    out = xp.ones((5, 12, 12))
    got = paint_kernel(xp.asarray(pos), 2.0, 12, 50.0, scheme, shift, planes=(3, 8), out=out)
    assert got is out
    ref2 = reference_paint(np.mod(pos, 50.0), 2.0, 12, 50.0, scheme, shift=shift)[3:8]
    np.testing.assert_allclose(to_host(got) - 1.0, ref2, rtol=0, atol=1e-12 * ref2.max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_paint_contract_rejects_nonfinite(rng, backend):
    xp = xp_of(backend)
    pos = rng.uniform(0, 10.0, size=(100, 3))
    pos[7, 2] = np.inf
    with pytest.raises(ValueError, match="1 particle position"):
        paint_kernel(xp.asarray(pos), 1.0, 8, 10.0, "cic")


# --------------------------------------------------------------------------- tet volumes
@pytest.mark.parametrize("backend", BACKENDS)
def test_tet_cube_volume_contract_analytic(backend):
    xp = xp_of(backend)
    for a in (0.3, 1.0, 1.5, 2.5, 3.7):
        t = xp.asarray(np.array([[0, 0, 0], [a, 0, 0], [0, a, 0], [0, 0, a]], float))
        v = tet_cube_volume_kernel(t, [0, 0, 0], 1.0)
        assert isinstance(v, xp.ndarray) and v.shape == (1,) and v.dtype == np.float64
        assert float(v[0]) == pytest.approx(corner_simplex_in_unit_cube(a), rel=1e-12,
                                            abs=1e-15)
    t = xp.asarray(np.array([[0, 0, 0], [2, 0, 0], [0, 2, 0], [0, 0, 2.0]]))
    assert float(tet_cube_volume_kernel(t, [0, 0, 0], 1.0)[0]) == pytest.approx(5 / 6)
    flat = xp.asarray(np.array([[0, 0, 0.5], [1, 0, 0.5], [0, 1, 0.5], [0.3, 0.3, 0.5]]))
    assert bool(xp.all(tet_cube_volume_kernel(flat, [0, 0, 0], 1.0) == 0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(2))
def test_tet_cube_volume_contract_tiling(backend, seed):
    """Cubes tiling space: each tetrahedron's volumes add up to |det| / 6."""
    xp = xp_of(backend)
    tets, cubes, h = tiled_tets(seed)
    total = to_host(tet_cube_volume_kernel(xp.asarray(tets), cubes, h)).sum(axis=1)
    np.testing.assert_allclose(total, tet_volume(tets), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tet_cube_volume_contract_float32_and_cpu(rng, backend):
    """float32 input is upcast (the result is that of its float64 copy); on the GPU the
    volumes equal the CPU kernel's."""
    xp = xp_of(backend)
    tets = rng.uniform(-1, 2, size=(300, 4, 3))
    lo, h = rng.uniform(-1.0, 2.0, size=(200, 3)), rng.uniform(0.1, 1.5, size=200)
    got = tet_cube_volume_kernel(xp.asarray(tets), lo, h)
    assert isinstance(got, xp.ndarray) and got.dtype == np.float64
    cpu = cpu_implementation(tet_cube_volume_kernel)(tets, lo, h)
    if backend == "gpu":
        np.testing.assert_allclose(to_host(got), cpu, rtol=1e-12, atol=1e-15)
        assert (cpu > 0).mean() > 0.2  # many non-trivial pairs were compared
    t32 = tets.astype(np.float32)
    got32 = tet_cube_volume_kernel(xp.asarray(t32), lo, h)
    assert got32.dtype == np.float64
    ref32 = cpu_implementation(tet_cube_volume_kernel)(t32.astype(np.float64), lo, h)
    np.testing.assert_allclose(to_host(got32), ref32, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- tet deposit
@pytest.mark.parametrize("backend", BACKENDS)
def test_deposit_tets_contract_uniform_lattice(backend):
    """An unperturbed periodic lattice deposits its mean density exactly."""
    xp = xp_of(backend)
    snap = perturbed_lattice(6, box_size=3.0, amplitude=0.0, precision="float64")
    tets, mass = snapshot_tetrahedra(snap)
    grid = deposit_tets_kernel(xp.asarray(tets), xp.asarray(mass), [0, 0, 0], 0.25,
                               (12, 12, 12), periodic=True)
    assert isinstance(grid, xp.ndarray) and grid.dtype == np.float64
    np.testing.assert_allclose(to_host(grid), 1.0 / 12**3, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("periodic", [False, True])
def test_deposit_tets_contract_mass_and_cpu(rng, backend, periodic):
    """Tetrahedra a few cells across: inside the grid (or periodic) the mass is conserved;
    ``out`` is accumulated into; on the GPU the grid equals the CPU kernel's."""
    xp = xp_of(backend)
    tets = rng.uniform(-0.5, 3.5, size=(500, 4, 3))
    tets = tets[:, :1] + 0.3 * (tets - tets[:, :1])
    mass = rng.uniform(1, 2, size=500)
    args = ([0.0, 0.0, 0.0], 0.25, (12, 12, 12))
    grid = deposit_tets_kernel(xp.asarray(tets), xp.asarray(mass), *args, periodic=periodic)
    if periodic:
        assert float(grid.sum()) == pytest.approx(mass.sum(), rel=1e-12)
    inside = np.all((tets.min(axis=1) >= 0) & (tets.max(axis=1) <= 3.0), axis=1)
    g_in = to_host(deposit_tets_kernel(xp.asarray(tets[inside]), xp.asarray(mass[inside]),
                                       *args, periodic=False))
    assert inside.sum() > 100 and g_in.sum() == pytest.approx(mass[inside].sum(), rel=1e-12)
    before = to_host(grid).copy()
    again = deposit_tets_kernel(xp.asarray(tets), 1.0, *args, periodic=periodic, out=grid)
    assert again is grid
    ones = to_host(deposit_tets_kernel(xp.asarray(tets), 1.0, *args, periodic=periodic))
    np.testing.assert_allclose(to_host(again), before + ones, rtol=1e-14,
                               atol=1e-14 * before.max())
    if backend == "gpu":
        cpu = cpu_implementation(deposit_tets_kernel)(tets, mass, *args, periodic=periodic)
        np.testing.assert_allclose(before, cpu, rtol=1e-12, atol=1e-12 * cpu.max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_deposit_tets_contract_patches_tile_the_grid(rng, backend):
    """Non-periodic patches of a grid (tetrahedra partly outside each) add up to it."""
    xp = xp_of(backend)
    tets = rng.uniform(0.3, 3.7, size=(400, 4, 3))
    tets = tets[:, :1] + 0.4 * (tets - tets[:, :1])
    mass = xp.asarray(rng.uniform(1, 2, size=400))
    d_t = xp.asarray(tets)
    whole = deposit_tets_kernel(d_t, mass, [0, 0, 0], 0.25, (16, 16, 16))
    parts = xp.zeros((16, 16, 16))
    for o in np.ndindex(2, 2, 2):
        lo = np.array(o) * 8
        patch = deposit_tets_kernel(d_t, mass, lo * 0.25, 0.25, (8, 8, 8))
        parts[lo[0]:lo[0] + 8, lo[1]:lo[1] + 8, lo[2]:lo[2] + 8] = patch
    whole = to_host(whole)
    tol = (dict(rtol=1e-13, atol=1e-14 * whole.max()) if backend == "gpu"
           else dict(rtol=0, atol=1e-12 * whole.max()))
    np.testing.assert_allclose(to_host(parts), whole, **tol)
    assert float(parts.sum()) == pytest.approx(float(mass.sum()), rel=1e-12)


# --------------------------------------------------------------------------- tessellation
N, BOX, BLOCK = 12, 20.0, 4


def _snapshot(periodic):
    rng = np.random.default_rng(3)
    snap = zeldovich(N, box_size=BOX, redshift=0.0, precision="float64")
    mass = rng.uniform(0.5, 2.0, N**3)
    if periodic:
        return Snapshot.from_arrays(snap.pos, ids=snap.ids, mass=mass, box_size=BOX,
                                    lagrangian_shape=(N, N, N))
    return Snapshot.from_arrays(np.asarray(snap.pos.compute()), ids=np.arange(N**3),
                                mass=mass, lagrangian_shape=(N, N, N))


def _columns(snap, xp, bi, bjs):
    """Computed block columns ``(bi, bj)`` for ``bj`` in ``bjs``, on ``xp``."""
    shape = (N, N, N)
    periodic = snap.box_size is not None
    ncells = tess.cells_shape(shape, periodic)
    pos, m = tess.id_ordered(snap)
    i0 = bi * BLOCK
    count = min(i0 + BLOCK, ncells[0]) - i0 + 1
    slab = tess._x_slab(pos, shape, i0, count, periodic).compute()
    ms = tess._x_slab(m, shape, i0, count, periodic).compute()
    cols = []
    for bj in bjs:
        j0 = bj * BLOCK
        p, c = tess._column(slab, ms, shape, j0, min(j0 + BLOCK, ncells[1]), periodic)
        cols.append((xp.asarray(p), xp.asarray(c)))
    return cols, ncells[2]


def reference_block_tets(snap, bi, bj, bk, shift=(0.0, 0.0, 0.0), particle_mass=None):
    """Brute force: the 6 Kuhn tetrahedra of every cell of block (bi, bj, bk) from the
    particle ids of its corners; periodic cells unwrapped by minimum image about their
    corner 000, which is moved next to the block's first particle."""
    pos = np.asarray(snap.pos.compute()).reshape(N, N, N, 3)  # ids are arange(N^3)
    mass = np.asarray(snap.mass.compute()).reshape(N, N, N)
    periodic = snap.box_size is not None
    nc = N if periodic else N - 1
    lo = np.array([bi, bj, bk]) * BLOCK
    hi = np.minimum(lo + BLOCK, nc)
    cells = np.stack(np.meshgrid(*[np.arange(a, b) for a, b in zip(lo, hi, strict=True)],
                                 indexing="ij"), -1).reshape(-1, 3)
    corner = cells[:, None, None, :] + CORNER_OFFSETS[KUHN_TETS][None]  # (C, 6, 4, 3)
    corner = corner % N if periodic else corner
    v = pos[corner[..., 0], corner[..., 1], corner[..., 2]]
    c000 = pos[cells[:, 0], cells[:, 1], cells[:, 2]][:, None, None, :]
    if periodic:
        def minimage(d):
            return d - BOX * np.floor(d / BOX + 0.5)

        ref = pos[lo[0], lo[1], lo[2]]
        anchor = ref + minimage(c000 - ref)
        v = anchor + minimage(v - c000)
    m = mass[cells[:, 0], cells[:, 1], cells[:, 2]] / 6.0 * (particle_mass or 1.0)
    return v.reshape(-1, 4, 3) + np.asarray(shift), np.repeat(m, 6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("periodic", [True, False])
def test_column_tets_contract(backend, periodic):
    xp = xp_of(backend)
    snap = _snapshot(periodic)
    (col,), ncz = _columns(snap, xp, 1, [1])
    bks = [2, 0, 1]
    shifts = (np.array([[0, 0, 0], [BOX, 0, -BOX], [0, BOX, 0]]) if periodic
              else np.zeros((3, 3)))
    box = snap.box_size
    t, m = column_tets_kernel(col, bks, BLOCK, ncz, box, 2.0, shifts)
    assert isinstance(t, xp.ndarray) and isinstance(m, xp.ndarray)
    refs = [reference_block_tets(snap, 1, 1, bk, sh, 2.0) for bk, sh in zip(bks, shifts,
                                                                              strict=True)]
    np.testing.assert_allclose(to_host(t), np.concatenate([r[0] for r in refs]), rtol=0,
                               atol=1e-12 * BOX)
    np.testing.assert_allclose(to_host(m), np.concatenate([r[1] for r in refs]), rtol=1e-15)
    if backend == "gpu":
        # the one-launch kernel reproduces the CuPy-array construction bit for bit
        from cosmo_dask.density.tessellation_kernels import block_tets_from_corners, block_window

        t_ref, m_ref = [], []
        for bk, sh in zip(bks, shifts, strict=True):
            corners, cm = block_window(col, bk, BLOCK, ncz)
            ref = corners[0, 0, 0] if box is not None else None
            tt, w = block_tets_from_corners(corners, cm, box, ref)
            t_ref.append(tt + xp.asarray(sh))
            m_ref.append(w)
        t, m = column_tets_kernel(col, bks, BLOCK, ncz, box, None, shifts)
        np.testing.assert_array_equal(to_host(t), to_host(xp.concatenate(t_ref)))
        np.testing.assert_array_equal(to_host(m), to_host(xp.concatenate(m_ref)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("periodic", [True, False])
def test_rows_tets_contract(backend, periodic):
    """Rows (slot, bk, sx, sy, sz) over two columns: the blocks in row order, each
    translated by whole boxes."""
    xp = xp_of(backend)
    snap = _snapshot(periodic)
    cols, ncz = _columns(snap, xp, 2, [0, 2])
    img = [0, 0, 0], [1, 0, -1], [0, -1, 0]
    if not periodic:
        img = [0, 0, 0], [0, 0, 0], [0, 0, 0]
    rows = np.array([[0, 1, *img[0]], [0, 0, *img[1]], [1, 2, *img[2]], [1, 0, *img[0]]],
                    np.int64)
    t, m = rows_tets_kernel(cols, rows, BLOCK, ncz, snap.box_size, 0.5)
    assert isinstance(t, xp.ndarray)
    scale = BOX if periodic else 0.0
    refs = [reference_block_tets(snap, 2, (0, 2)[s], bk, np.array([sx, sy, sz]) * scale, 0.5)
            for s, bk, sx, sy, sz in rows]
    np.testing.assert_allclose(to_host(t), np.concatenate([r[0] for r in refs]), rtol=0,
                               atol=1e-12 * BOX)
    np.testing.assert_allclose(to_host(m), np.concatenate([r[1] for r in refs]), rtol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("periodic", [True, False])
def test_column_bboxes_contract(backend, periodic):
    """Bounding boxes of every block of a column (a shorter last block included)."""
    xp = xp_of(backend)
    snap = _snapshot(periodic)
    ncz_blocks = -(-(N if periodic else N - 1) // BLOCK)
    (col,), ncz = _columns(snap, xp, 0, [1])
    lo, hi = column_bboxes_kernel(col, BLOCK, ncz, snap.box_size)
    assert isinstance(lo, xp.ndarray) and lo.shape == (ncz_blocks, 3)
    refs = [reference_block_tets(snap, 0, 1, bk)[0] for bk in range(ncz_blocks)]
    np.testing.assert_allclose(to_host(lo), [r.min(axis=(0, 1)) for r in refs], rtol=0,
                               atol=1e-12 * BOX)
    np.testing.assert_allclose(to_host(hi), [r.max(axis=(0, 1)) for r in refs], rtol=0,
                               atol=1e-12 * BOX)
    if backend == "gpu":
        host_col = tuple(to_host(a) for a in col)
        c_lo, c_hi = cpu_implementation(column_bboxes_kernel)(host_col, BLOCK, ncz,
                                                               snap.box_size)
        np.testing.assert_array_equal(to_host(lo), c_lo)
        np.testing.assert_array_equal(to_host(hi), c_hi)


def test_column_contracts_reject_other_chunk_types():
    from cosmo_dask.core.errors import DeviceError

    with pytest.raises(DeviceError, match="column_block_tets: no kernel for chunks of type "
                                          "builtins.list"):
        column_tets_kernel(([0.0],), [0], 1, 1, 1.0, None)
