"""fof_local against independent references (scipy cKDTree pairs, brute force)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos import fof_kernels, fof_kernels_gpu
from cosmo_dask.halos.fof_kernels import class_rows, fof_local
from tests.support import cuda_host
from tests.support.fof_reference import brute_pairs as _brute_pairs
from tests.support.fof_reference import canonical_labels
from tests.support.fof_reference import kdtree_pairs as _kdtree_pairs
from tests.support.fof_reference import reference as scipy_reference
from tests.support.fof_reference import wrap as _wrap

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


# ---------------------------------------------------------------- friend counts over units
# Counts are made over the dense-cell units (whole unit pairs added or skipped by exact
# box bounds, rows against a unit's box, the rest pair by pair); cell pairs with few
# particles per unit pair take the pair loop. ``_PAIRS_PER_UNIT_PAIR`` 0 sends every
# cell pair through the units, 10**9 none (the pair path): all three equal the
# independent reference, as do the labels.


def _plummer_core(rng, n, centre, a, box=0.0):
    u = rng.uniform(0.0, 0.98, n)
    r = a / np.sqrt(u ** (-2 / 3) - 1)
    v = rng.normal(size=(n, 3))
    pos = np.asarray(centre) + v * (r / np.linalg.norm(v, axis=1))[:, None]
    return np.mod(pos, box) if box else pos


def _count_set(rng, name):
    """``(pos, periods, ll)`` of the named test set."""
    if name == "uniform":
        return rng.random((20_000, 3)), (1.0, 1.0, 1.0), 0.02
    if name in ("clustered", "open"):  # very dense cores (thousands of friends), background
        per = (1.0, 1.0, 1.0) if name == "clustered" else (0.0, 0.0, 0.0)
        parts = [rng.random((3000, 3)), _plummer_core(rng, 6000, (0.3, 0.6, 0.5), 0.01),
                 _plummer_core(rng, 3000, (0.7, 0.2, 0.8), 0.03)]
        return np.concatenate(parts), per, 0.01
    if name == "across-edges":  # cores on a face, an edge and a corner of the box
        parts = [rng.random((2000, 3))]
        for centre in ((0.0, 0.5, 0.5), (0.999, 0.001, 0.4), (0.0, 0.0, 0.999)):
            parts.append(_plummer_core(rng, 3000, centre, 0.01, 1.0))
        return np.concatenate(parts), (1.0, 1.0, 1.0), 0.01
    if name.startswith("tiny"):  # fewer than four cells per period
        cells = float(name.split("-")[1])
        ll = 0.1
        L = cells * ll
        pos = np.concatenate([rng.random((1500, 3)) * L,
                              _plummer_core(rng, 2500, (0.0, 0.0, 0.0), 0.01, L)])
        return pos, (L, L, L), ll
    if name == "duplicates":  # stacks of coincident points, apart and together
        base = rng.random((500, 3))
        pos = np.concatenate([base, base, np.repeat(base[:20], 40, axis=0),
                              np.zeros((200, 3))])
        return pos[rng.permutation(len(pos))], (1.0, 1.0, 1.0), 0.03
    raise ValueError(name)


@pytest.mark.parametrize("min_pairs", [0, None, 10**9], ids=["units", "default", "pairs"])
@pytest.mark.parametrize("name", ["uniform", "clustered", "open", "across-edges", "tiny-1.5",
                                  "tiny-2.5", "tiny-3.5", "duplicates"])
def test_friend_counts_over_units_equal_reference(rng, monkeypatch, name, min_pairs):
    if min_pairs is not None:
        monkeypatch.setattr(fof_kernels, "_PAIRS_PER_UNIT_PAIR", min_pairs)
    pos, periods, ll = _count_set(rng, name)
    for dt in (np.float64, np.float32):
        p = pos.astype(dt)
        ref_root, ref_friends = scipy_reference(p.astype(np.float64), periods, ll)
        root, friends = fof_local(p, periods, ll)
        np.testing.assert_array_equal(friends, ref_friends)
        np.testing.assert_array_equal(root, ref_root)
        root3, friends3 = fof_local(p, periods, ll, min_friends=3)
        np.testing.assert_array_equal(friends3, ref_friends)
        np.testing.assert_array_equal(root3, scipy_reference(p.astype(np.float64), periods,
                                                             ll, min_friends=3)[0])
    if name in ("clustered", "open", "across-edges"):
        assert ref_friends.max() > 1000  # dense: fine cells of dozens of members


# -------------------- on the GPU (formerly tests/test_fof_kernels_gpu.py)
# The GPU friends-of-friends kernel against the CPU kernel and the scipy reference:
# identical labels and friend counts, on both paths (dense-cell labels without counts,
# pair tests with counts).
#
# Every test runs on the GPU (``gpu`` mark, skipped without CUDA) and on the host: the
# same CUDA source compiled as C++ (``tests/support/cuda_host.py``) and driven by the same
# Python pipeline (``fof_pipeline`` with NumPy), by threads one after the other in
# reverse and, for the dense and clustered sets (``RACES``), also by threads at once;
# skipped without a C++ compiler.


# ---------------------------------------------------------------- backends
class _Gpu:
    gpu = True

    def __init__(self):
        import cupy

        self.cupy = cupy

    def fof(self, pos, periods, ll, min_friends=1, count_friends=True):
        from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

        root, friends = fof_local_gpu(self.cupy.asarray(pos), periods, ll, min_friends,
                                      count_friends=count_friends)
        assert isinstance(root, self.cupy.ndarray)
        return root.get(), None if friends is None else friends.get()

    def group_rows(self, root, cls, ids, crossing, min_members):
        from cosmo_dask.halos.fof_kernels_gpu import group_rows_gpu

        c = self.cupy.asarray
        return group_rows_gpu(c(root), c(cls), c(ids), c(crossing), min_members)


class _Host:
    gpu = False

    def __init__(self, order):
        self.order = order

    def kernels(self, coord, sort, index):
        return cuda_host.host_kernels("fof", fof_kernels_gpu.cuda_defines(coord, sort, index),
                                      self.order)

    def fof(self, pos, periods, ll, min_friends=1, count_friends=True):
        return fof_kernels_gpu.fof_local(np, self.kernels, pos, periods, ll, min_friends,
                                         count_friends)

    def group_rows(self, root, cls, ids, crossing, min_members):
        return fof_kernels_gpu.group_rows(np, self.kernels, root, cls, ids, crossing,
                                          min_members)


_GPU = pytest.param("gpu", marks=pytest.mark.gpu)
#: the backends of the union-find-heavy tests: threads at once on the host too
RACES = [_GPU, "host-reversed", "host-concurrent"]


@pytest.fixture(params=[_GPU, "host-reversed"])
def backend(request):
    if request.param == "gpu":
        pytest.importorskip("cupy")
        return _Gpu()
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler to run the CUDA source on the host")
    return _Host(request.param.split("-")[1])


@pytest.fixture
def cuda_rng():
    return np.random.default_rng(2024)


# ---------------------------------------------------------------- references and data
def _same(backend, pos, periods, ll, min_friends=1, reference=False):
    """Both GPU paths equal the CPU kernel element for element (and, with ``reference``,
    scipy's partition and counts); returns the CPU ``(root, friends)``."""
    root_c, friends_c = fof_local(pos, periods, ll, min_friends)
    root, friends = backend.fof(pos, periods, ll, min_friends)
    assert root.dtype == np.int64 and friends.dtype == np.int32
    np.testing.assert_array_equal(friends, friends_c)
    np.testing.assert_array_equal(root, root_c)
    root_d, friends_d = backend.fof(pos, periods, ll, min_friends, count_friends=False)
    np.testing.assert_array_equal(root_d, root_c)
    if min_friends == 1:
        assert friends_d is None
    else:  # min_friends > 1 counts anyway, as on the CPU
        np.testing.assert_array_equal(friends_d, friends_c)
    if reference:
        ref, friends_ref = scipy_reference(np.asarray(pos, dtype=np.float64), periods, ll,
                                           min_friends)
        np.testing.assert_array_equal(root_c, ref)
        np.testing.assert_array_equal(friends_c, friends_ref)
    return root_c, friends_c


def _blobs_on_faces_and_corners(cuda_rng, n_uniform, box, sigma, per_blob):
    """Uniform background plus Gaussian blobs on every corner, edge and face centre
    of the box, plus random ones; coordinates left unwrapped (some < 0 or >= box)."""
    fractions = (0.0, 0.5, 1.0)
    centres = [np.array(c) * box for c in itertools.product(fractions, repeat=3)]
    centres += list(cuda_rng.random((10, 3)) * box)
    blobs = [c + cuda_rng.normal(scale=sigma, size=(per_blob, 3)) for c in centres]
    return np.concatenate([cuda_rng.random((n_uniform, 3)) * box] + blobs)


def _plummer(cuda_rng, n, centre, a, box):
    """A Plummer sphere of ``n`` points and scale radius ``a`` (truncated at ~7 a),
    wrapped into ``[0, box)`` when ``box``."""
    u = cuda_rng.uniform(0.0, 0.98, n)
    r = a / np.sqrt(u ** (-2 / 3) - 1)
    v = cuda_rng.normal(size=(n, 3))
    pos = np.asarray(centre) + v * (r / np.linalg.norm(v, axis=1))[:, None]
    return np.mod(pos, box) if box else pos


def _plummer_set(cuda_rng, L, scale=1):
    """Dense spheres (fine cells with dozens of members) centred on a face, an edge, a
    corner and inside, plus a uniform background."""
    parts = [cuda_rng.random((3000 * scale, 3)) * L]
    for centre, n, a in (((0.0, 2.0, 2.0), 5000, 0.08), ((0.02, L - 0.01, 1.0), 4000, 0.05),
                         ((L - 0.01, 0.0, 0.01), 3000, 0.04), ((2.0, 2.5, 1.5), 6000, 0.15),
                         ((3.0, 1.0, 3.0), 500, 0.3)):
        parts.append(_plummer(cuda_rng, n * scale, centre, a, L))
    return np.concatenate(parts)


# ---------------------------------------------------------------- partitions and counts
def test_cuda_uniform_periodic(backend, cuda_rng):
    n, box = (200_000, 58.0) if backend.gpu else (40_000, 34.0)
    root, friends = _same(backend, cuda_rng.random((n, 3)) * box, (box, box, box), 0.2)
    assert friends.max() > 1 and np.unique(root).size < root.size


@pytest.mark.parametrize("backend", RACES, indirect=True)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_plummer_spheres_straddling_faces(backend, cuda_rng, dtype):
    """Dense cells on faces, an edge and a corner of the periodic box, against scipy."""
    L = 4.0
    pos = _plummer_set(cuda_rng, L).astype(dtype)
    pos[pos >= L] = 0.0
    root, friends = _same(backend, pos, (L, L, L), 0.02, reference=True)
    assert friends.max() > 100
    _same(backend, pos, (L, L, L), 0.045)
    _same(backend, pos, (L, 0.0, L), 0.03)
    _same(backend, pos, (L, L, L), 0.02, min_friends=5)


@pytest.mark.parametrize("backend", RACES, indirect=True)
def test_dense_cell_straddling_a_periodic_face(backend, cuda_rng):
    """A tight clump cut by the x = 0 face (and one cut by the y and z faces): its fine
    cells sit at both ends of the axis, one group through the minimum image."""
    L = 2.0
    clump = cuda_rng.normal(scale=0.003, size=(400, 3)) + [0.0, 1.0, 1.0]
    corner = cuda_rng.normal(scale=0.003, size=(300, 3)) + [1.0, 0.0, 0.0]
    pos = np.concatenate([cuda_rng.random((3000, 3)) * L, clump, corner])
    for dtype in (np.float64, np.float32):
        p = pos.astype(dtype)
        root, friends = _same(backend, p, (L, L, L), 0.01, reference=True)
        for lo, hi, axes in ((3000, 3400, (0,)), (3400, 3700, (1, 2))):
            labels, counts = np.unique(root[lo:hi], return_counts=True)
            assert counts.max() > 0.95 * (hi - lo)  # one group holds (nearly) the clump
            main = p[lo:hi][root[lo:hi] == labels[counts.argmax()]]
            for a in axes:  # ... on both sides of the face
                assert (main[:, a] < 0).any() and (main[:, a] > 0).any()
        _same(backend, np.mod(p, dtype(L)) % dtype(L), (L, L, L), 0.01)


@pytest.mark.parametrize("ll", [1.0, 1.0 + 1e-7, 1.0 - 1e-7, 1.5])
def test_zeldovich_like_lattice(backend, cuda_rng, ll):
    """A lattice of spacing 1 moved by tiny displacements: many distances within 1e-6 of
    the linking length, periodic, against scipy."""
    n = 14
    q = np.indices((n, n, n)).reshape(3, -1).T + 0.5
    _same(backend, q + cuda_rng.normal(scale=3e-7, size=q.shape), [float(n)] * 3, ll,
          reference=True)


def test_stacked_duplicates_at_and_just_beyond_linking_length(backend):
    """Fine cells of identical points exactly ll apart (boxes decide "all friends") and
    stacks just beyond ll (boxes decide "none")."""
    ll = 0.25
    q = np.indices((6, 6, 2)).reshape(3, -1).T * ll
    gap = np.array([6 * ll - ll + np.nextafter(ll, 1.0), 0.0, 0.0])
    pos = np.repeat(np.concatenate([q, q + gap]), 4, axis=0)
    _same(backend, pos, (0.0, 0.0, 0.0), ll, reference=True)
    _same(backend, pos, (4.0, 0.0, 2.0), ll)
    # the second stack starts one ulp beyond ll from the first (fl(x - 1.25) > ll)
    far = np.repeat(np.concatenate([q, q + [np.nextafter(1.5, 2.0), 0.0, 0.0]]), 3, axis=0)
    root, _ = _same(backend, far, (0.0, 0.0, 0.0), ll, reference=True)
    assert np.unique(root).size == 2


@pytest.mark.parametrize("backend", RACES, indirect=True)
def test_clustered_periodic_blobs_on_faces_and_corners(backend, cuda_rng):
    box = 20.0
    pos = _blobs_on_faces_and_corners(cuda_rng, 20_000, box, sigma=0.3, per_blob=400)
    root, friends = _same(backend, pos, (box, box, box), 0.15)
    # the corner blob is one group across all eight corners of the box
    corner = np.flatnonzero(np.all(np.minimum(np.mod(pos, box), box - np.mod(pos, box)) < 0.1,
                                   axis=1))
    assert corner.size > 8
    assert np.unique(root[corner]).size == 1
    assert friends.max() > 50


@pytest.mark.parametrize("backend", RACES, indirect=True)
def test_clustered_dense_core(backend, cuda_rng):
    """A few very dense blobs: many friends per particle, heavy union-find contention."""
    box = 10.0
    centres = cuda_rng.random((5, 3)) * box
    pos = np.concatenate([c + cuda_rng.normal(scale=0.05, size=(3000, 3)) for c in centres]
                         + [cuda_rng.random((5000, 3)) * box])
    root, friends = _same(backend, pos, (box, box, box), 0.05)
    assert friends.max() > 500


def test_open_axes(backend, cuda_rng):
    pos = cuda_rng.normal(scale=3.0, size=(30_000, 3)) - 5.0
    _same(backend, pos, (0.0, 0.0, 0.0), 0.12, reference=True)


def test_open_axes_huge_extent(backend, cuda_rng):
    """Far-away outliers: the cells per open axis are capped and widened."""
    pos = np.concatenate([cuda_rng.random((5000, 3)) * 4.0,
                          np.array([[1e9, 0.0, -1e9], [1e9 + 0.01, 0.0, -1e9], [-3e8, 2e8, 0.0]])])
    root, _ = _same(backend, pos, (0.0, 0.0, 0.0), 0.1)
    assert root[5001] == 5000


def test_mixed_periods(backend, cuda_rng):
    box = 12.0
    pos = _blobs_on_faces_and_corners(cuda_rng, 10_000, box, sigma=0.25, per_blob=200)
    pos[:, 1] *= 0.7  # open axis with its own extent
    _same(backend, pos, (box, 0.0, box), 0.2)
    _same(backend, pos, (0.0, box, 0.0), 0.2)


@pytest.mark.parametrize("backend", RACES, indirect=True)
@pytest.mark.parametrize("min_friends", [2, 3, 8])
def test_min_friends(backend, cuda_rng, min_friends):
    box = 15.0
    pos = _blobs_on_faces_and_corners(cuda_rng, 15_000, box, sigma=0.3, per_blob=150)
    root, friends = _same(backend, pos, (box, box, box), 0.2, min_friends=min_friends)
    low = friends < min_friends
    assert low.any() and (~low).any()
    np.testing.assert_array_equal(root[low], np.flatnonzero(low))


def test_min_friends_open(backend, cuda_rng):
    pos = cuda_rng.normal(scale=2.0, size=(20_000, 3))
    _same(backend, pos, (0.0, 0.0, 0.0), 0.15, min_friends=3, reference=True)


def test_cuda_duplicates(backend, cuda_rng):
    box = 5.0
    base = cuda_rng.random((2000, 3)) * box
    pos = np.concatenate([base, base[:500], base[:100], np.zeros((50, 3)),
                          np.full((20, 3), box), np.full((20, 3), -box)])
    pos = pos[cuda_rng.permutation(len(pos))]
    root, friends = _same(backend, pos, (box, box, box), 0.05)
    assert friends.max() >= 89  # the 90 points at 0 == box == -box (mod box)
    _same(backend, pos, (box, box, box), 0.05, min_friends=3)
    _same(backend, pos, (0.0, 0.0, 0.0), 0.05)


@pytest.mark.parametrize("periods", [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (1.0, 0.0, 1.0)])
def test_tiny(backend, periods):
    root, friends = backend.fof(np.empty((0, 3)), periods, 0.1)
    assert root.shape == (0,) and friends.shape == (0,)
    root, friends = backend.fof(np.empty((0, 3)), periods, 0.1, count_friends=False)
    assert root.shape == (0,) and friends is None
    _same(backend, np.array([[0.5, 0.5, 0.5]]), periods, 0.1)
    _same(backend, np.array([[0.05, 0.5, 0.5], [0.95, 0.5, 0.5]]), periods, 0.1)  # wrap pair
    _same(backend, np.array([[0.2, 0.5, 0.5], [0.5, 0.5, 0.5]]), periods, 0.1)  # apart
    _same(backend, np.array([[0.2, 0.5, 0.5], [0.2, 0.5, 0.5]]), periods, 0.1)  # duplicate
    _same(backend, np.array([[0.2, 0.5, 0.5], [0.2, 0.5, 0.5]]), periods, 0.1, min_friends=2)


def test_exactly_at_linking_length(backend):
    """Distances equal to ll in float64 are friends, one ulp more are not."""
    ll = 0.25
    x = np.array([1.0, 1.25, np.nextafter(1.5, 2.0), 2.0, 2.25])
    pos = np.stack([x, np.full(5, 2.0), np.full(5, 3.0)], axis=1)
    root, friends = _same(backend, pos, (0.0, 0.0, 0.0), ll)
    np.testing.assert_array_equal(root, [0, 0, 2, 3, 3])
    np.testing.assert_array_equal(friends, [1, 1, 0, 1, 1])
    _same(backend, pos, (4.0, 4.0, 4.0), ll)


@pytest.mark.parametrize("period", [0.05, 0.26, 0.29])
def test_period_below_three_linking_lengths(backend, cuda_rng, period):
    """One or two cells along an axis (neighbour deduplication, double images)."""
    ll = 0.1
    pos = cuda_rng.random((4000, 3)) * [4.0, period, 4.0]
    pos[:, 1] += cuda_rng.integers(-2, 3, size=4000) * period  # unwrapped images
    _same(backend, pos, (4.0, period, 4.0), ll)
    _same(backend, pos, (0.0, period, 4.0), ll)
    _same(backend, pos, (4.0, period, period), ll)
    _same(backend, pos, (period, period, period), ll)


@pytest.mark.parametrize("cells", [1.2, 2.5, 3.5])
def test_few_cells_per_axis_with_a_dense_clump(backend, cuda_rng, cells):
    """Periods of a few linking lengths with a dense clump at the corner: neighbour
    offsets wrap onto themselves, fine cells hold many points."""
    ll = 0.1
    L = cells * ll
    pos = np.concatenate([cuda_rng.random((600, 3)) * L,
                          _plummer(cuda_rng, 600, (0.0, 0.0, 0.0), 0.01, L)])
    _same(backend, pos, (L, L, L), ll, reference=True)
    _same(backend, pos, (L, 0.0, L), ll)


@pytest.mark.parametrize("sub", [1, 2])
def test_fine_cells_not_provably_linked(backend, cuda_rng, monkeypatch, sub):
    """Capped sub-division: fine cells too large to be linked internally fall back to
    single-particle units; the result is unchanged."""
    monkeypatch.setattr(fof_kernels, "_MAX_SUB_PER_AXIS", sub)
    L = 2.0
    pos = np.concatenate([cuda_rng.random((3000, 3)) * L, _plummer(cuda_rng, 3000, (0.0, 1.0, 1.0),
                                                              0.05, L)])
    _same(backend, pos, (L, L, L), 0.05, reference=True)
    _same(backend, pos, (0.0, L, 0.0), 0.05)


def test_float32_positions(backend, cuda_rng):
    box = np.float32(20.0)
    pos32 = _blobs_on_faces_and_corners(cuda_rng, 20_000, float(box), sigma=0.3,
                                        per_blob=100).astype(np.float32)
    _same(backend, pos32, (20.0, 20.0, 20.0), 0.2)  # wrapped in float64 by the kernels
    _same(backend, pos32, (0.0, 20.0, 0.0), 0.2, min_friends=3)
    # inside the box: the kernels keep float32 sorted copies (nothing to wrap)
    inside = np.mod(pos32, box)
    inside[inside >= box] = 0
    _same(backend, inside, (20.0, 20.0, 20.0), 0.2)
    _same(backend, inside, (20.0, 20.0, 20.0), 0.2, min_friends=4)


def test_int64_indices(backend, cuda_rng, monkeypatch):
    """The int64 index variant (used from 2^31 particles), forced on a small set."""
    monkeypatch.setattr(fof_kernels_gpu, "INT32_ROWS", 0)
    L = 4.0
    pos = _plummer_set(cuda_rng, L, scale=1)[::3]
    _same(backend, pos, (L, L, L), 0.03)
    _same(backend, pos.astype(np.float32), (L, L, L), 0.03, min_friends=3)


@pytest.mark.parametrize("backend", RACES, indirect=True)
@pytest.mark.parametrize("min_members", [1, 20])
def test_group_rows_equal_class_rows(backend, cuda_rng, min_members):
    """Per-group rows (no sort) reduce to the CPU's per-class rows."""
    L = 3.0
    pos = np.concatenate([cuda_rng.random((20_000, 3)) * L,
                          cuda_rng.normal(scale=0.05, size=(3000, 3)) + 1.5])
    root, _ = fof_local(pos, (L, L, L), 0.04, count_friends=False)
    index = cuda_rng.permutation(10**6)[:len(pos)].astype(np.int64)
    rep = index[root]
    ids = cuda_rng.permutation(10**7)[:len(pos)].astype(np.int64)
    # some groups cross a domain face; pairs of them merge into one class
    nodes = np.unique(rep[cuda_rng.random(rep.size) < 0.05])
    merged = nodes.copy()
    merged[1::2] = nodes[0:nodes.size - 1:2][:merged[1::2].size]
    at = np.minimum(np.searchsorted(nodes, rep), nodes.size - 1)
    crossing = nodes[at] == rep
    cls = np.where(crossing, merged[at], rep)

    def reduced(rows):
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        s = np.flatnonzero(np.r_[True, rows[1:, 0] != rows[:-1, 0]])
        return np.stack([rows[s, 0], np.add.reduceat(rows[:, 1], s),
                         np.minimum.reduceat(rows[:, 2], s)], axis=1)

    got = backend.group_rows(root, cls, ids, crossing, min_members)
    want = class_rows(cls, ids, crossing, min_members)
    assert got.dtype == np.int64 and want.shape[0] > 100
    np.testing.assert_array_equal(reduced(got), want)


# ---------------------------------------------------------------- GPU only
@pytest.mark.gpu
def test_numpy_input_and_non_contiguous(cuda_rng):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

    box = 6.0
    big = cuda_rng.random((4000, 6)) * box
    pos = big[:, ::2]
    root_c, friends_c = fof_local(pos, (box, box, box), 0.2)
    root_g, friends_g = fof_local_gpu(pos, np.array([box, box, box]), 0.2)
    assert isinstance(root_g, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(root_g), root_c)
    np.testing.assert_array_equal(cupy.asnumpy(friends_g), friends_c)
    root_g, friends_g = fof_local_gpu(cupy.asarray(big)[:, ::2], cupy.asarray([box] * 3), 0.2,
                                      count_friends=False)
    assert friends_g is None
    np.testing.assert_array_equal(cupy.asnumpy(root_g), root_c)


@pytest.mark.gpu
def test_repeatable_on_a_large_clustered_set(cuda_rng):
    """Runs on the same 2M clustered points give identical output (no races), equal to
    the CPU kernel, on both paths."""
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

    L = 40.0
    parts = [cuda_rng.random((1_000_000, 3)) * L]
    sizes = np.maximum(20, (cuda_rng.pareto(1.0, 3000) * 40).astype(int))
    sizes = sizes[np.cumsum(sizes) <= 1_000_000]
    for n in sizes:
        parts.append(_plummer(cuda_rng, int(n), cuda_rng.random(3) * L, 0.005 * n ** (1 / 3), L))
    pos = np.concatenate(parts).astype(np.float32)
    pos[pos >= L] = 0.0
    gpos = cupy.asarray(pos)
    per = (L, L, L)
    r1, _ = fof_local_gpu(gpos, per, 0.05, count_friends=False)
    r2, _ = fof_local_gpu(gpos, per, 0.05, count_friends=False)
    r3, f3 = fof_local_gpu(gpos, per, 0.05)
    r4, f4 = fof_local_gpu(gpos, per, 0.05, min_friends=4)
    r5, f5 = fof_local_gpu(gpos, per, 0.05, min_friends=4)
    assert bool((r1 == r2).all()) and bool((r1 == r3).all())
    assert bool((r4 == r5).all()) and bool((f4 == f5).all()) and bool((f3 == f4).all())
    root_c, friends_c = fof_local(pos, per, 0.05)
    np.testing.assert_array_equal(cupy.asnumpy(f3), friends_c)
    np.testing.assert_array_equal(cupy.asnumpy(r1), root_c)
    assert friends_c.max() > 500  # dense cores
    root_k, _ = fof_local(pos, per, 0.05, min_friends=4)
    np.testing.assert_array_equal(cupy.asnumpy(r4), root_k)


@pytest.mark.gpu
def test_bad_arguments():
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

    pos = cupy.zeros((4, 3))
    with pytest.raises(ParameterError, match="shape"):
        fof_local_gpu(cupy.zeros((4, 2)), (1.0, 1.0, 1.0), 0.1)
    with pytest.raises(ParameterError, match="periods"):
        fof_local_gpu(pos, (1.0, 1.0), 0.1)
    with pytest.raises(ParameterError, match="periods"):
        fof_local_gpu(pos, (1.0, -1.0, 1.0), 0.1)
    with pytest.raises(ParameterError, match="linking_length"):
        fof_local_gpu(pos, (1.0, 1.0, 1.0), 0.0)
    with pytest.raises(ParameterError, match="min_friends"):
        fof_local_gpu(pos, (1.0, 1.0, 1.0), 0.1, min_friends=0)
    bad = pos.copy()
    bad[1, 2] = cupy.nan
    for counts in (True, False):
        with pytest.raises(ParameterError, match="non-finite"):
            fof_local_gpu(bad, (1.0, 1.0, 1.0), 0.1, count_friends=counts)
    bad[1, 2] = cupy.inf
    with pytest.raises(ParameterError, match="non-finite"):
        fof_local_gpu(bad.astype(cupy.float32), (0.0, 1.0, 1.0), 0.1)
