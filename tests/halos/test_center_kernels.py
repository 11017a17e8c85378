"""Halo-centre kernels: exact segment potentials, per-segment selections, grid-Poisson MBP."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos.center_kernels import (
    grid_mbp,
    grid_potential,
    mcp_rows,
    member_potentials,
    poisson_dirichlet,
    segment_mbp,
    segment_potentials,
    segmented_argmin,
)
from tests.support.halos import _gpu_case, brute_potentials, mbp_case, model_halo, nfw, plummer

# --------------------------------------------------------------------------- #
# references and halo models
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# segment_potentials
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_segment_potentials_match_brute_force(rng, eps):
    sizes = [1, 2, 5, 0, 37, 300, 1, 2000, 3, 0, 128]
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    n = starts[-1]
    pos = np.concatenate([rng.normal(size=(k, 3)) * rng.uniform(0.1, 3) + rng.uniform(-50, 50, 3)
                          for k in sizes if k])
    mass = rng.uniform(0.5, 2.0, n)
    pot = segment_potentials(pos, mass, starts, softening=eps, G=2.5)
    ref = brute_potentials(pos, mass, starts, eps=eps, G=2.5)
    singles = starts[:-1][np.asarray(sizes) == 1]
    assert np.all(pot[singles] == 0.0)
    np.testing.assert_allclose(pot, ref, rtol=1e-12, atol=0)
    assert pot.dtype == np.float64 and pot.shape == (n,)


def test_segment_potentials_coincident_and_outside_rows(rng):
    pos = rng.normal(size=(10, 3))
    pos[4] = pos[3]  # a duplicate: with eps = 0 the pair contributes 0
    mass = np.ones(10)
    starts = np.array([2, 6, 6, 9], dtype=np.int64)  # rows 0, 1 and 9 in no segment
    pot = segment_potentials(pos, mass, starts)
    ref = brute_potentials(pos, mass, starts)
    assert np.all(np.isfinite(pot))
    np.testing.assert_allclose(pot, ref, rtol=1e-13)
    assert pot[0] == pot[1] == pot[9] == 0.0
    # scalar mass and softening
    np.testing.assert_allclose(segment_potentials(pos, 2.0, starts, softening=0.1),
                               brute_potentials(pos, 2.0 * mass, starts, eps=0.1), rtol=1e-13)
    assert np.all(segment_potentials(pos, mass, np.array([0], dtype=np.int64)) == 0.0)


@pytest.mark.parametrize("eps", [0.0, 0.02])
def test_segment_potentials_periodic_straddling(rng, eps):
    box = 20.0
    sizes = [700, 1, 50, 400]
    centres = [np.array([0.1, 19.9, 10.0]), np.array([0.0, 0.0, 0.0]),
               np.array([19.95, 0.02, 19.9]), np.array([10.0, 10.0, 10.0])]
    unwrapped = np.concatenate([c + rng.normal(size=(k, 3)) * 0.8
                                for c, k in zip(centres, sizes, strict=True)])
    wrapped = np.mod(unwrapped, box)
    assert np.any(wrapped != unwrapped)
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    mass = rng.uniform(0.5, 2.0, starts[-1])
    pot = segment_potentials(wrapped, mass, starts, box_size=box, softening=eps)
    ref = brute_potentials(unwrapped, mass, starts, eps=eps)
    np.testing.assert_allclose(pot, ref, rtol=1e-11)


def test_segment_potentials_periodic_large_segment_uses_minimum_image(rng):
    # a segment spread over the whole box: every pair takes its minimum image
    box = 5.0
    pos = rng.uniform(0.0, box, size=(300, 3))
    mass = rng.uniform(0.5, 2.0, 300)
    starts = np.array([0, 200, 300], dtype=np.int64)
    pot = segment_potentials(pos, mass, starts, box_size=box, softening=0.01)
    ref = brute_potentials(pos, mass, starts, eps=0.01, box=box)
    np.testing.assert_allclose(pot, ref, rtol=1e-12)


def test_segment_potentials_rejects_bad_input(rng):
    pos = rng.normal(size=(5, 3))
    m = np.ones(5)
    with pytest.raises(ParameterError):
        segment_potentials(pos, m, np.array([0, 3, 2, 5]))
    with pytest.raises(ParameterError):
        segment_potentials(pos, m, np.array([0, 6]))
    with pytest.raises(ParameterError):
        segment_potentials(pos, m, np.array([0.0, 5.0]))
    with pytest.raises(ParameterError):
        segment_potentials(pos[:, :2], m, np.array([0, 5]))
    with pytest.raises(ParameterError):
        segment_potentials(pos, m[:4], np.array([0, 5]))
    with pytest.raises(ParameterError):
        segment_potentials(pos, m, np.array([0, 5]), softening=-1.0)
    with pytest.raises(ParameterError):
        segment_potentials(pos, m, np.array([0, 5]), box_size=0.0)


def test_member_potentials_match_brute_force_and_segment_potentials(rng):
    # one halo straddling two faces of a periodic box; a few rows of it
    box = 20.0
    unwrapped = np.array([0.1, 19.9, 10.0]) + rng.normal(size=(900, 3)) * 0.8
    pos = np.mod(unwrapped, box)
    mass = rng.uniform(0.5, 2.0, 900)
    rows = np.array([0, 17, 17, 899, 450])
    got = member_potentials(pos, mass, rows, box_size=box, softening=0.02, G=1.5)
    ref = brute_potentials(unwrapped, mass, np.array([0, 900]), eps=0.02, G=1.5)
    np.testing.assert_allclose(got, ref[rows], rtol=1e-12)
    whole = segment_potentials(pos, mass, np.array([0, 900]), box_size=box, softening=0.02,
                               G=1.5)
    np.testing.assert_array_equal(got, whole[rows])  # the same arithmetic
    assert member_potentials(pos, mass, np.array([], np.int64)).shape == (0,)
    with pytest.raises(ParameterError, match="rows"):
        member_potentials(pos, mass, np.array([900]))
    with pytest.raises(ParameterError, match="rows"):
        member_potentials(pos, mass, np.array([0.5]))


# --------------------------------------------------------------------------- #
# segment_mbp
# --------------------------------------------------------------------------- #


def _mbp_reference(pos, mass, starts, **kw):
    pot = segment_potentials(pos, mass, starts, **kw)
    best = segmented_argmin(pot, starts)
    return best, np.where(best >= 0, pot[np.maximum(best, 0)], np.nan)


@pytest.mark.parametrize("eps", [0.0, 0.01])
def test_segment_mbp_is_the_argmin_of_every_potential(rng, eps):
    box, _, pos, mass, starts, _ = mbp_case(rng)
    rows, pot = segment_mbp(pos, mass, starts, box_size=box, softening=eps, G=1.7)
    want_rows, want_pot = _mbp_reference(pos, mass, starts, box_size=box, softening=eps, G=1.7)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(pot, want_pot)  # the same potentials, bit for bit
    assert rows[5] == -1 and np.isnan(pot[5])
    # against the float64 double sum, on every backend: test_kernel_contracts_halos.py


def test_segment_mbp_open_boundaries_and_fallbacks(rng):
    pos = np.concatenate([model_halo(rng, "nfw", 4000, clump=True),
                          model_halo(rng, "plummer", 3100, clump=False) + 50.0])
    starts = np.array([0, 4000, 7100], dtype=np.int64)
    mass = rng.uniform(0.5, 1.5, 7100)
    for G, m in ((1.0, mass), (-1.0, mass), (0.0, mass), (1.0, mass - 1.0)):
        rows, pot = segment_mbp(pos, m, starts, softening=0.02, G=G)
        want_rows, want_pot = _mbp_reference(pos, m, starts, softening=0.02, G=G)
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_array_equal(pot, want_pot)
    with pytest.raises(ParameterError):
        segment_mbp(pos, mass, np.array([0, 7200]))


def test_grid_mbp_candidates_pruned_as_if_all_were_evaluated(rng, monkeypatch):
    # a cored Plummer sphere: many members near the grid minimum; the octree bounds
    # must leave grid_mbp's answer unchanged (the exact argmin over its candidates)
    import cosmo_dask.halos.center_kernels as ck

    box = 40.0
    for seed in range(3):
        r = np.random.default_rng(seed)
        pos = np.mod(model_halo(r, "plummer", 6000 + 1000 * seed, clump=seed != 1)
                     + np.array([0.1, 20.0, 39.9]), box)
        mass = r.uniform(0.5, 1.5, len(pos))
        got = grid_mbp(pos, mass, box_size=box, softening=0.01)
        monkeypatch.setattr(ck, "_TREE_MIN", 10**12)  # every candidate evaluated
        want = grid_mbp(pos, mass, box_size=box, softening=0.01)
        monkeypatch.undo()
        assert got == want


# --------------------------------------------------------------------------- #
# segmented_argmin / mcp_rows
# --------------------------------------------------------------------------- #


def _loop_argmin(values, starts):
    out = []
    for s in range(len(starts) - 1):
        best = -1
        for j in range(starts[s], starts[s + 1]):
            if not np.isnan(values[j]) and (best < 0 or values[j] < values[best]):
                best = j
        out.append(best)
    return np.array(out, dtype=np.int64)


def _loop_mcp(friends, ids, starts):
    out = []
    for s in range(len(starts) - 1):
        rows = range(starts[s], starts[s + 1])
        out.append(min(rows, key=lambda j: (-friends[j], ids[j])) if len(rows) else -1)
    return np.array(out, dtype=np.int64)


def test_segmented_argmin_matches_loop_with_ties(rng):
    sizes = rng.integers(0, 30, 200)
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    values = rng.integers(-5, 5, starts[-1]).astype(np.float64)  # many ties
    values[rng.uniform(size=values.shape) < 0.05] = np.nan
    got = segmented_argmin(values, starts)
    np.testing.assert_array_equal(got, _loop_argmin(values, starts))
    assert got.dtype == np.int64
    assert np.all(got[sizes == 0] == -1)
    np.testing.assert_array_equal(segmented_argmin([3.0, 1.0, 1.0, np.nan], [0, 3, 4]), [1, -1])


def test_mcp_rows_matches_loop_with_ties(rng):
    sizes = rng.integers(0, 30, 200)
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    n = starts[-1]
    friends = rng.integers(0, 4, n)  # many ties
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    got = mcp_rows(friends, ids, starts)
    np.testing.assert_array_equal(got, _loop_mcp(friends, ids, starts))
    assert np.all(got[sizes == 0] == -1)
    # equal friends: the smallest id wins, not the first row
    np.testing.assert_array_equal(mcp_rows([2, 5, 5, 1], [9, 8, 3, 0], [0, 4]), [2])
    with pytest.raises(ParameterError):
        mcp_rows([1.5, 2.0], [0, 1], [0, 2])


# --------------------------------------------------------------------------- #
# DST Poisson solver and grid MBP
# --------------------------------------------------------------------------- #


def _laplacian_zero_boundary(phi, cell):
    p = np.pad(phi, 1)
    c = p[1:-1, 1:-1, 1:-1]
    lap = (p[2:, 1:-1, 1:-1] + p[:-2, 1:-1, 1:-1] + p[1:-1, 2:, 1:-1] + p[1:-1, :-2, 1:-1]
           + p[1:-1, 1:-1, 2:] + p[1:-1, 1:-1, :-2] - 6.0 * c)
    return lap / cell**2


def test_poisson_dirichlet_inverts_the_discrete_laplacian(rng):
    phi0 = rng.normal(size=(17, 20, 13))
    cell, G = 0.37, 1.7
    rho = _laplacian_zero_boundary(phi0, cell) / (4.0 * np.pi * G)
    phi = poisson_dirichlet(rho, cell, G=G)
    np.testing.assert_allclose(phi, phi0, rtol=0, atol=1e-10 * np.abs(phi0).max())


def test_poisson_dirichlet_point_mass_far_from_boundary():
    # Gaussian of mass M at the centre of a 95**3 grid: away from the core and
    # the boundary phi(r) - phi(r0) follows the open-space -G M erf(...) / r.
    N, cell, G, M, sig = 95, 1.0, 1.0, 3.0, 1.5
    k = np.arange(N) - (N - 1) / 2
    r2 = k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2
    rho = np.exp(-0.5 * r2 / sig**2)
    rho *= M / (rho.sum() * cell**3)
    phi = poisson_dirichlet(rho, cell, G=G)
    c = (N - 1) // 2
    from scipy.special import erf

    def exact(r):
        return -G * M * erf(r / (np.sqrt(2) * sig)) / r

    for d in ([1, 0, 0], [1, 1, 0], [1, 1, 1]):
        d = np.array(d)
        steps = np.arange(3, 12)
        r = steps * np.linalg.norm(d)
        vals = np.array([phi[tuple(c + s * d)] for s in steps])
        diff = vals - vals[0]
        ref = exact(r) - exact(r[0])
        np.testing.assert_allclose(diff[1:], ref[1:], rtol=0.03)


def test_grid_potential_geometry(rng):
    pos = plummer(rng, 500) + 3.0
    phi, origin, cell = grid_potential(pos, 1.0, n_grid=40)
    assert phi.shape == (40, 40, 40)
    t = (pos - origin) / cell  # node coordinates; the zero boundary is at -1 and 40
    assert t.min() >= 3.0 - 1e-9 and t.max() <= 36.0 + 1e-9
    assert np.isclose((t.max(axis=0) - t.min(axis=0)).max(), 33.0)
    node = np.unravel_index(np.argmin(phi), phi.shape)
    assert np.linalg.norm(origin + np.array(node) * cell - 3.0) < 3 * cell


def test_grid_mbp_matches_exact_mbp(rng):
    # ten random halos (Plummer / NFW, many with an offset clump), 1000-4000
    # particles, softening as in a simulation
    agree, worst = 0, 0.0
    for t in range(10):
        kind = "plummer" if t % 2 else "nfw"
        n = int(rng.integers(1000, 4000))
        pos = model_halo(rng, kind, n, clump=(t % 3 != 0))
        mass = rng.uniform(0.5, 1.5, n)
        eps = 0.01
        pot = brute_potentials(pos, mass, np.array([0, n]), eps=eps)
        true = int(np.argmin(pot))
        got = grid_mbp(pos, mass, softening=eps)
        if got == true:
            agree += 1
        else:
            worst = max(worst, (pot[got] - pot[true]) / abs(pot[true]))
    assert agree >= 9
    assert worst <= 1e-3


def test_grid_mbp_periodic_and_small(rng):
    box = 50.0
    pos = nfw(rng, 2000) * 0.7
    mass = rng.uniform(0.5, 1.5, 2000)
    want = grid_mbp(pos, mass, softening=0.01)
    shifted = np.mod(pos + np.array([49.5, 0.2, 25.0]), box)  # straddles two faces
    assert grid_mbp(shifted, mass, box_size=box, softening=0.01) == want
    pot = brute_potentials(pos, mass, np.array([0, 2000]), eps=0.01)
    assert want == int(np.argmin(pot))
    assert grid_mbp(pos[:1], mass[:1]) == 0
    two = np.array([[0.0, 0, 0], [1.0, 0, 0]])
    assert grid_mbp(two, [1.0, 2.0]) == 0  # the lighter one sits in the deeper well
    with pytest.raises(ParameterError):
        grid_mbp(pos, mass, n_grid=4)


# --------------------------------------------------------------------------- #
# GPU (run where CuPy and a GPU exist; compared with the float64 CPU reference)
# --------------------------------------------------------------------------- #


def test_gpu_module_imports_without_cupy():
    from cosmo_dask.halos import center_kernels_gpu

    assert callable(center_kernels_gpu.segment_potentials_gpu)


# the float64 GPU kernel against the CPU kernel: tests/halos/test_kernel_contracts.py


@pytest.mark.gpu
@pytest.mark.parametrize("periodic", [False, True])
def test_gpu_segment_potentials_float32(rng, periodic):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.halos.center_kernels_gpu import segment_potentials_gpu

    pos, mass, starts, box = _gpu_case(rng)
    box = box if periodic else None
    if periodic:
        pos = np.mod(pos, box)
    ref = segment_potentials(pos, mass, starts, box_size=box, softening=0.01)
    got = segment_potentials_gpu(cupy.asarray(pos), cupy.asarray(mass), starts, box_size=box,
                                 softening=0.01, precision="float32")
    np.testing.assert_allclose(cupy.asnumpy(got), ref, rtol=1e-5, atol=0)


@pytest.mark.gpu
def test_gpu_segment_potentials_edge_cases(rng):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.halos.center_kernels_gpu import segment_potentials_gpu

    pos = rng.normal(size=(10, 3))
    pos[4] = pos[3]
    mass = np.ones(10)
    starts = np.array([2, 6, 6, 9], dtype=np.int64)
    ref = segment_potentials(pos, mass, starts)
    got = cupy.asnumpy(segment_potentials_gpu(cupy.asarray(pos), 1.0, starts))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert got[0] == got[9] == 0.0
    empty = segment_potentials_gpu(cupy.asarray(pos), cupy.asarray(mass), np.array([0]))
    assert float(cupy.abs(empty).max()) == 0.0
    with pytest.raises(ParameterError):
        segment_potentials_gpu(cupy.asarray(pos), cupy.asarray(mass), np.array([0, 10]),
                               precision="float16")
