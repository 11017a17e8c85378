"""The dense-cell FOF path (``fof_local(..., count_friends=False)``) against independent
references: scipy cKDTree pairs or brute force, with scipy's connected components."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.halos.fof_kernels import fof_local
from tests.support.fof_reference import reference as _reference

# ---------------------------------------------------------------- references


def _check(pos, periods, ll, *, dtypes=(np.float64, np.float32)):
    """The dense path equals the reference; the counting path still gives exact counts."""
    for dt in dtypes:
        p = np.asarray(pos).astype(dt)
        ref, friends_ref = _reference(p.astype(np.float64), periods, ll)
        root, friends = fof_local(p, periods, ll, count_friends=False)
        assert friends is None
        np.testing.assert_array_equal(root, ref)
        root2, friends2 = fof_local(p, periods, ll)
        np.testing.assert_array_equal(root2, ref)
        np.testing.assert_array_equal(friends2, friends_ref)


# ---------------------------------------------------------------- data sets


def _plummer(rng, n, centre, a, box):
    u = rng.uniform(0.0, 0.98, n)
    r = a / np.sqrt(u ** (-2 / 3) - 1)
    v = rng.normal(size=(n, 3))
    pos = np.asarray(centre) + v * (r / np.linalg.norm(v, axis=1))[:, None]
    return np.mod(pos, box) if box else pos


@pytest.fixture
def rng():
    return np.random.default_rng(20260)


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("ll", [0.05, 0.12])
def test_uniform_periodic(rng, ll):
    L = 2.0
    _check(rng.random((6000, 3)) * L, [L, L, L], ll)


def test_plummer_spheres_straddling_faces(rng):
    """Dense spheres (fine cells with dozens of members) on a face, an edge, a corner
    and inside, plus a uniform background."""
    L = 4.0
    parts = [rng.random((3000, 3)) * L]
    for centre, n, a in (((0.0, 2.0, 2.0), 5000, 0.08), ((0.02, L - 0.01, 1.0), 4000, 0.05),
                         ((L - 0.01, 0.0, 0.01), 3000, 0.04), ((2.0, 2.5, 1.5), 6000, 0.15),
                         ((3.0, 1.0, 3.0), 500, 0.3)):
        parts.append(_plummer(rng, n, centre, a, L))
    pos = np.concatenate(parts)
    _check(pos, [L, L, L], 0.02)
    _check(pos, [L, L, L], 0.045, dtypes=(np.float32,))


def test_plummer_open_and_mixed(rng):
    L = 3.0
    parts = [rng.random((2000, 3)) * L]
    for centre, n, a in (((0.0, 0.0, 1.5), 2500, 0.06), ((1.5, 1.5, 1.5), 2000, 0.1)):
        parts.append(_plummer(rng, n, centre, a, L))
    pos = np.concatenate(parts)
    _check(pos, [0.0, 0.0, 0.0], 0.03)
    _check(pos, [L, 0.0, L], 0.03)
    _check(pos, [0.0, L, 0.0], 0.03)


@pytest.mark.parametrize("ll", [1.0, 1.0 + 1e-7, 1.0 - 1e-7, 1.5])
def test_perturbed_lattice(rng, ll):
    """Zel'dovich-like: a lattice of spacing 1 moved by tiny displacements, so that
    many distances lie within 1e-6 of the linking length."""
    n = 14
    q = (np.indices((n, n, n)).reshape(3, -1).T + 0.5).astype(np.float64)
    pos = q + rng.normal(scale=3e-7, size=q.shape)
    _check(pos, [float(n)] * 3, ll)


def test_lattice_exactly_at_linking_length():
    """Points exactly ll apart along axes (exact in binary): all friends, in one group."""
    ll = 0.25
    n = 12
    q = np.indices((n, n, 3)).reshape(3, -1).T * ll
    _check(q, [n * ll, n * ll, 0.0], ll)
    _check(q, [0.0, 0.0, 0.0], ll)
    # a chain along x with one gap just wider than ll
    x = np.r_[np.arange(10) * ll, 9 * ll + np.nextafter(ll, 1.0) + np.arange(5) * ll]
    chain = np.stack([x, np.full_like(x, 0.5), np.full_like(x, 0.5)], 1)
    _check(chain, [0.0, 0.0, 0.0], ll, dtypes=(np.float64,))


def test_duplicates(rng):
    L = 1.0
    base = rng.random((400, 3)) * L
    pos = np.concatenate([base, base, base[:100], np.repeat(base[:3], 50, axis=0)])
    pos = pos[rng.permutation(len(pos))]
    _check(pos, [L, L, L], 0.03)
    _check(pos, [0.0, 0.0, 0.0], 0.03)
    _check(np.zeros((300, 3)), [L, L, L], 0.01)


@pytest.mark.parametrize("cells", [1.2, 1.9, 2.5, 3.5, 4.7])
@pytest.mark.parametrize("periods_mask", [(1, 1, 1), (1, 0, 1), (0, 1, 1)])
def test_few_cells_per_axis(rng, cells, periods_mask):
    """Periods of only a few linking lengths: neighbour offsets wrap onto themselves."""
    ll = 0.1
    L = cells * ll
    per = [L * k for k in periods_mask]
    parts = [rng.random((600, 3)) * L, _plummer(rng, 600, (0.0, 0.0, 0.0), 0.01, L)]
    pos = np.concatenate(parts)
    _check(pos, per, ll)


def test_mixed_periods_of_different_sizes(rng):
    per = [1.0, 0.35, 0.0]
    pos = rng.random((3000, 3)) * np.array([1.0, 0.35, 0.6])
    pos = np.concatenate([pos, _plummer(rng, 1500, (0.99, 0.0, 0.3), 0.02, 0)])
    _check(pos, per, 0.04)


def test_coordinates_outside_the_period(rng):
    L = 2.0
    pos = rng.random((4000, 3)) * L
    pos = np.concatenate([pos, _plummer(rng, 2000, (0.0, 1.0, L), 0.05, 0)])  # unwrapped
    pos[:50] += 3 * L
    _check(pos, [L, L, L], 0.05)


@pytest.mark.parametrize("k", [2, 5])
def test_min_friends_keeps_exact_counts(rng, k):
    """min_friends > 1 takes the counting path whatever count_friends says."""
    L = 2.0
    pos = np.concatenate([rng.random((3000, 3)) * L, _plummer(rng, 2000, (1.0, 0.0, 1.9),
                                                              0.05, L)])
    ref, friends_ref = _reference(pos, [L, L, L], 0.06, min_friends=k)
    for count in (True, False):
        root, friends = fof_local(pos, [L, L, L], 0.06, min_friends=k, count_friends=count)
        np.testing.assert_array_equal(root, ref)
        np.testing.assert_array_equal(friends, friends_ref)


def test_empty_and_single():
    root, friends = fof_local(np.empty((0, 3)), [1.0, 1.0, 1.0], 0.1, count_friends=False)
    assert root.shape == (0,) and friends is None
    root, friends = fof_local(np.array([[0.5, 0.5, 0.5]]), [1.0, 0.0, 0.0], 0.1,
                              count_friends=False)
    np.testing.assert_array_equal(root, [0])
    assert friends is None


def test_fof_labels_without_counts_matches_finder(rng):
    """The plain-FOF graph (no counts) and the finder (counts for the MCP) agree."""
    from cosmo_dask import Snapshot
    from cosmo_dask.halos import fof
    from cosmo_dask.halos.fof_graph import fof_labels

    L = 8.0
    pos = np.concatenate([rng.random((3000, 3)) * L,
                          _plummer(rng, 1500, (0.0, 4.0, 4.0), 0.1, L),
                          _plummer(rng, 800, (7.9, 7.9, 0.1), 0.1, L)]).astype(np.float32)
    snap = Snapshot.from_arrays(pos, box_size=L)
    import dask

    with dask.config.set(scheduler="sync"):
        plain = fof_labels(snap, 0.2, min_members=5, n_domains=8)
        full = fof(snap, 0.2, min_members=5, n_domains=8, centers=("mcp",))
        np.testing.assert_array_equal(plain.labels.compute(), full.labels.compute())
    assert np.all(np.asarray(full.catalog["mcp_friends"]) >= 1)


def test_stacked_duplicates_at_and_just_beyond_linking_length():
    """Fine cells of identical points exactly ll apart (box test decides "all friends"),
    and stacks just beyond ll (box test decides "none")."""
    ll = 0.25
    q = np.indices((6, 6, 2)).reshape(3, -1).T * ll
    gap = np.array([6 * ll - ll + np.nextafter(ll, 1.0), 0.0, 0.0])
    pos = np.repeat(np.concatenate([q, q + gap]), 4, axis=0)
    _check(pos, [0.0, 0.0, 0.0], ll, dtypes=(np.float64,))
    _check(pos, [4.0, 0.0, 2.0], ll, dtypes=(np.float64,))


@pytest.mark.parametrize("sub", [1, 2])
def test_coarse_fine_cells_split_when_not_provably_linked(rng, monkeypatch, sub):
    """With fine cells too large to be linked internally (capped sub-division), such
    cells fall back to single particles and the result is unchanged."""
    from cosmo_dask.halos import fof_kernels

    monkeypatch.setattr(fof_kernels, "_MAX_SUB_PER_AXIS", sub)
    L = 2.0
    pos = np.concatenate([rng.random((3000, 3)) * L, _plummer(rng, 3000, (0.0, 1.0, 1.0),
                                                              0.05, L)])
    _check(pos, [L, L, L], 0.05)
    _check(pos, [0.0, L, 0.0], 0.05)
