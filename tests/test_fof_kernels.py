"""fof_local against independent references (scipy cKDTree pairs, brute force)."""

from __future__ import annotations

import numpy as np
import pytest
from fof_reference import brute_pairs as _brute_pairs
from fof_reference import kdtree_pairs as _kdtree_pairs
from fof_reference import wrap as _wrap
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos.fof_kernels import canonical_labels, fof_local

# ---------------------------------------------------------------- references


def _labels(m, pairs):
    """Canonical component labels of the graph with edges ``pairs``."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    g = coo_matrix((np.ones(len(pairs), dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(m, m))
    _, lab = connected_components(g, directed=False)
    return canonical_labels(lab)


def _reference(pos, periods, ll, min_friends=1, brute=False):
    pairs = (_brute_pairs if brute else _kdtree_pairs)(pos, periods, ll)
    m = len(pos)
    friends = np.bincount(pairs.ravel(), minlength=m)
    if min_friends > 1:
        core = friends >= min_friends
        pairs = pairs[core[pairs[:, 0]] & core[pairs[:, 1]]]
    return _labels(m, pairs), friends


def _check(pos, periods, ll, min_friends=1, brute=False):
    root, friends = fof_local(pos, periods, ll, min_friends=min_friends)
    ref_root, ref_friends = _reference(pos, periods, ll, min_friends, brute)
    assert root.dtype == np.int64 and friends.dtype == np.int32
    np.testing.assert_array_equal(friends, ref_friends)
    np.testing.assert_array_equal(root, ref_root)
    return root, friends


def _clustered(rng, m, box, centres, sigma):
    """Half uniform points, half Gaussian blobs around ``centres``."""
    nu = m // 2
    u = rng.random((nu, 3)) * box
    which = rng.integers(0, len(centres), m - nu)
    b = centres[which] + rng.standard_normal((m - nu, 3)) * sigma
    return np.concatenate([u, b])


# ---------------------------------------------------------------- partitions


@pytest.mark.parametrize("b", [0.2, 0.5, 0.8])
def test_uniform_periodic(rng, b):
    m, L = 60_000, 2.0
    pos = rng.random((m, 3)) * L
    ll = b * L / m ** (1 / 3)
    root, _ = _check(pos, [L, L, L], ll)
    if b == 0.8:  # near percolation: large groups that cross the boundary
        assert np.bincount(root).max() > 100


def test_uniform_open(rng):
    m = 60_000
    pos = rng.random((m, 3)) * np.array([8.0, 3.0, 5.0]) - np.array([3.0, 1.0, 0.5])
    ll = 0.7 * (120.0 / m) ** (1 / 3)
    _check(pos, [0.0, 0.0, 0.0], ll)


def test_clustered_periodic_boundary_blobs(rng):
    """Blobs centred on faces, edges and corners: groups straddle the boundary."""
    m, L = 80_000, 1.0
    spacing = L / m ** (1 / 3)
    corners = np.array([[x, y, z] for x in (0, 0.5) for y in (0, 0.5) for z in (0, 0.5)]) * L
    centres = np.concatenate([corners, rng.random((40, 3)) * L])
    pos = _clustered(rng, m, L, centres, 0.6 * spacing)
    pos = _wrap(pos, [L, L, L])
    ll = 0.2 * spacing
    root, _ = _check(pos, [L, L, L], ll)
    # the corner blob is one group spanning all eight octants around the origin
    near = np.all(np.minimum(pos, L - pos) < 0.5 * spacing, axis=1)
    labels = np.unique(root[near])
    big = labels[np.argmax([np.sum(root == g) for g in labels])]
    members = pos[root == big]
    octants = {tuple(r) for r in (members > 0.5 * L).astype(int)}
    assert len(octants) == 8


@pytest.mark.parametrize("periods", [(1.0, 0.0, 1.0), (1.5, 0.0, 0.0), (0.0, 0.0, 0.8)])
def test_mixed_periodicity(rng, periods):
    m = 40_000
    extent = np.array([p if p > 0 else 1.2 for p in periods])
    spacing = (np.prod(extent) / m) ** (1 / 3)
    centres = np.array([[0.0, 0.6, 0.0], [0.0, 0.0, 0.4], [0.5, 1.2, 0.8]]) * extent
    pos = _clustered(
        rng, m, extent, np.concatenate([centres, rng.random((20, 3)) * extent]), 2 * spacing
    )
    _check(pos, periods, 0.3 * spacing)


def test_mixed_periodicity_brute_force(rng):
    m = 3000
    periods = (1.0, 0.0, 1.0)
    pos = rng.random((m, 3)) * np.array([1.0, 0.7, 1.0]) + np.array([0.0, -0.2, 0.0])
    _check(pos, periods, 0.06, brute=True)


def test_duplicates(rng):
    L = 1.0
    base = rng.random((5_000, 3)) * L
    pos = np.concatenate([base, base[:2_000], base[:500], rng.random((10_000, 3)) * L])
    pos = pos[rng.permutation(len(pos))]
    root, friends = _check(pos, [L, L, L], 0.01)
    _check(pos, [0.0, 0.0, 0.0], 0.01)
    assert friends.max() >= 2


def test_coordinates_at_and_beyond_period(rng):
    m, L = 20_000, 1.0
    pos = rng.random((m, 3)) * L
    pos[:500, 0] = L
    pos[500:1000, 1] = -1e-13
    pos[1000:1200, 2] = -1e-17  # wraps to L in floating point, i.e. to 0
    pos[1200:1400] = L
    pos[1400:1600, 0] = L + 1e-12
    pos[1600:1700] = 0.0
    pos[1700:1800, 1] = rng.random(100) * 1e-3 - 5e-4  # both sides of the boundary
    root, _ = _check(pos, [L, L, L], 0.02)
    # the points at (L, L, L) and (0, 0, 0) are one group
    assert len(np.unique(np.concatenate([root[1200:1400], root[1600:1700]]))) == 1
    # a shifted copy of the box gives the same partition
    shifted = pos + np.array([3.0, -2.0, 7.0]) * L
    np.testing.assert_array_equal(fof_local(shifted, [L, L, L], 0.02)[0], root)


# ---------------------------------------------------------------- min_friends


@pytest.mark.parametrize("k", [3, 5])
def test_min_friends_periodic(rng, k):
    m, L = 60_000, 1.0
    spacing = L / m ** (1 / 3)
    centres = np.concatenate([np.zeros((1, 3)), rng.random((60, 3)) * L])
    pos = _wrap(_clustered(rng, m, L, centres, 1.0 * spacing), [L, L, L])
    root, friends = _check(pos, [L, L, L], 0.3 * spacing, min_friends=k)
    single = friends < k
    np.testing.assert_array_equal(root[single], np.flatnonzero(single))
    assert np.sum(~single) > 1000


@pytest.mark.parametrize("k", [3, 5])
def test_min_friends_mixed(rng, k):
    m = 20_000
    spacing = (1.0 / m) ** (1 / 3)
    pos = _clustered(rng, m, 1.0, rng.random((30, 3)), 1.2 * spacing)
    _check(pos, (1.0, 0.0, 0.0), 0.35 * spacing, min_friends=k)


# ---------------------------------------------------------------- edge cases


def test_empty_and_single():
    root, friends = fof_local(np.empty((0, 3)), [1.0, 1.0, 1.0], 0.1)
    assert root.shape == (0,) and root.dtype == np.int64
    assert friends.shape == (0,) and friends.dtype == np.int32
    root, friends = fof_local(np.array([[0.3, 2.0, -1.0]]), [1.0, 0.0, 0.0], 0.1)
    np.testing.assert_array_equal(root, [0])
    np.testing.assert_array_equal(friends, [0])


@pytest.mark.parametrize("periods", [(0.0, 0.0, 0.0), (1.0, 1.0, 1.0)])
def test_all_same_position(periods):
    m = 300
    pos = np.full((m, 3), 0.25)
    root, friends = fof_local(pos, periods, 0.01)
    np.testing.assert_array_equal(root, np.zeros(m))
    np.testing.assert_array_equal(friends, np.full(m, m - 1))
    np.testing.assert_array_equal(fof_local(pos, periods, 0.01, min_friends=m - 1)[0], 0)
    np.testing.assert_array_equal(fof_local(pos, periods, 0.01, min_friends=m)[0], np.arange(m))


def test_huge_coordinates_open(rng):
    # a large offset: spacing far above the float64 resolution there
    pos = rng.random((20_000, 3)) * 100.0 + 1e12
    _check(pos, [0.0, 0.0, 0.0], 1.5)
    # extreme extent: the cell count is capped, cells grow beyond ll
    blob = rng.standard_normal((2_000, 3)) * 0.05
    far = np.array([[1e300, -1e300, 0.0], [-1e300, 1e300, 1e300], [1.7e308, 0.0, -1.7e308]])
    pos = np.concatenate([blob, far, blob[:100] + 1e9])
    _check(pos, [0.0, 0.0, 0.0], 0.02, brute=True)


@pytest.mark.parametrize("ll", [0.37, 0.1, 0.0137, 0.3333333333])
def test_period_not_multiple_of_ll(rng, ll):
    L = 1.0
    m = 3000 if ll < 0.05 else 1500
    pos = rng.random((m, 3)) * L
    _check(pos, [L, L, L], ll, brute=True)
    _check(pos, [L, 0.0, L], ll, min_friends=3, brute=True)


@pytest.mark.parametrize(
    "periods, ll",
    [
        ((1.0, 0.25, 1.0), 0.1),  # two cells along y
        ((1.0, 0.15, 1.0), 0.1),  # one cell along y, L < 2 ll
        ((0.05, 0.0, 1.0), 0.1),  # period below the linking length
        ((0.25, 0.28, 0.2), 0.1),  # every periodic axis below 3 ll
    ],
)
def test_small_periods(rng, periods, ll):
    extent = np.array([p if p > 0 else 0.6 for p in periods])
    pos = rng.random((1500, 3)) * extent
    _check(pos, periods, ll, brute=True)
    _check(pos, periods, 0.3 * ll, brute=True)
    _check(pos, periods, ll, min_friends=4, brute=True)


def test_permutation_invariance_and_input_conversion(rng):
    m, L = 20_000, 1.0
    pos = rng.random((m, 3)) * L
    ll = 0.6 * L / m ** (1 / 3)
    root, friends = fof_local(pos, [L, L, L], ll)
    perm = rng.permutation(m)
    root_p, friends_p = fof_local(np.asfortranarray(pos[perm]), (L, L, L), ll)
    np.testing.assert_array_equal(root_p, canonical_labels(root[perm]))
    np.testing.assert_array_equal(friends_p, friends[perm])
    # float32 input is kept as float32 and measured in float64: the same partition
    # and friend counts as the float64 reference on the same (converted) values
    pos32 = pos.astype(np.float32)
    pos32[:300, 0] = np.float32(L)  # on the period, and just outside it
    pos32[300:600, 1] = np.float32(-1e-6)
    root32, friends32 = fof_local(pos32, [L, L, L], ll)
    ref_root, ref_friends = _reference(pos32.astype(np.float64), [L, L, L], ll, 1, False)
    np.testing.assert_array_equal(root32, ref_root)
    np.testing.assert_array_equal(friends32, ref_friends)


def test_invalid_parameters():
    pos = np.zeros((4, 3))
    with pytest.raises(ParameterError):
        fof_local(np.zeros((4, 2)), [1.0, 1.0, 1.0], 0.1)
    with pytest.raises(ParameterError):
        fof_local(pos, [1.0, 1.0], 0.1)
    with pytest.raises(ParameterError):
        fof_local(pos, [1.0, -1.0, 1.0], 0.1)
    with pytest.raises(ParameterError):
        fof_local(pos, [1.0, 1.0, 1.0], 0.0)
    with pytest.raises(ParameterError):
        fof_local(pos, [1.0, 1.0, 1.0], 0.1, min_friends=0)
    bad = pos.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ParameterError):
        fof_local(bad, [1.0, 1.0, 1.0], 0.1)


def test_canonical_labels(rng):
    labels = rng.integers(-5, 50, 1000) * 7
    out = canonical_labels(labels)
    expected = np.array([np.flatnonzero(labels == v)[0] for v in labels])
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == np.int64
    assert canonical_labels(np.array([], dtype=np.int64)).shape == (0,)
    np.testing.assert_array_equal(canonical_labels(["b", "a", "b"]), [0, 1, 0])


def _class_rows_reference(cls, ids, crossing, min_members):
    rows = []
    for c in np.unique(cls):
        sel = cls == c
        if sel.sum() >= min_members or crossing[sel].any():
            rows.append((c, sel.sum(), ids[sel].min()))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@pytest.mark.parametrize("min_members", [1, 3, 20])
def test_class_rows(rng, min_members):
    from cosmo_dask.halos.fof_kernels import class_rows

    m = 5000
    cls = rng.integers(0, 400, m) * 7 - 50  # negative and positive class keys
    ids = rng.permutation(m * 3)[:m].astype(np.int64)
    crossing = rng.random(m) < 0.01
    got = class_rows(cls, ids, crossing, min_members)
    np.testing.assert_array_equal(got, _class_rows_reference(cls, ids, crossing, min_members))


# ---------------------------------------------------------------- friend counts in dense cells
# The counting pass leaves the minimum-image step out of blocks of cells that are
# neighbours without wrapping (at least four cells per period): the counts must equal the
# independent references on dense sets straddling the box's faces and edges, with few
# and many cells per period.


def _dense_set(rng, box, m=6000):
    """Plummer-like cores (hundreds of points per linking-length cell) on a face, an
    edge and inside, plus a uniform background."""
    centres = np.array([[0.0, 0.5, 0.5], [0.98, 0.01, 0.5], [0.4, 0.6, 0.3]]) * box
    u = rng.uniform(0.0, 0.97, m)
    r = 0.02 * box / np.sqrt(u ** (-2 / 3) - 1)
    v = rng.normal(size=(m, 3))
    pos = centres[rng.integers(0, 3, m)] + v * (r / np.linalg.norm(v, axis=1))[:, None]
    return np.concatenate([pos, rng.random((m // 4, 3)) * box])


@pytest.mark.parametrize("periods", [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (1.0, 0.0, 1.0)])
@pytest.mark.parametrize("ll", [0.01, 0.26, 0.34])  # 100, 3 and 2 cells per period
def test_friend_counts_dense_equal_reference(rng, periods, ll):
    pos = _dense_set(rng, 1.0, 6000 if ll < 0.1 else 1500)
    pos = np.where(np.asarray(periods) > 0, np.mod(pos, 1.0), pos)
    for dt in (np.float64, np.float32):
        p = pos.astype(dt)
        root, friends = fof_local(p, periods, ll)
        ref_root, ref_friends = _reference(p.astype(np.float64), periods, ll)
        np.testing.assert_array_equal(friends, ref_friends)
        np.testing.assert_array_equal(root, ref_root)
        assert friends.max() > 100  # cells far fuller than a few particles


def test_friend_counts_ties_at_linking_length():
    """Lattices whose neighbours lie exactly at ll (and at sqrt(2) ll, sqrt(3) ll), also
    across the periodic faces: pairs at distance == ll are friends."""
    g = np.indices((12, 12, 12)).reshape(3, -1).T * 0.25
    g = np.repeat(g, 3, axis=0)  # stacks of identical points
    for ll, periods in ((0.25, (3.0, 3.0, 3.0)), (0.5, (3.0, 0.0, 3.0)),
                        (0.25 * np.sqrt(3.0), (0.0, 0.0, 0.0)), (0.75, (3.0, 3.0, 3.0))):
        root, friends = fof_local(g, periods, ll)
        np.testing.assert_array_equal(friends, _reference(g, periods, ll, brute=True)[1])


@pytest.mark.parametrize("k", [3, 40])
def test_friend_counts_min_friends_cores_dense(rng, k):
    pos = np.mod(_dense_set(rng, 1.0, 3000), 1.0)
    _check(pos, [1.0, 1.0, 1.0], 0.01, min_friends=k)
