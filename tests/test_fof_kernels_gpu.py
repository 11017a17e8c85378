"""The GPU friends-of-friends kernel against the CPU kernel and the scipy reference:
identical labels and friend counts, on both paths (dense-cell labels without counts,
pair tests with counts).

Every test runs on the GPU (``gpu`` mark, skipped without CUDA) and on the host: the
same CUDA source compiled as C++ (``tests/cuda_host.py``) and driven by the same
Python pipeline (``fof_pipeline`` with NumPy), by threads one after the other in
reverse and, for the dense and clustered sets (``RACES``), also by threads at once;
skipped without a C++ compiler.
"""

from __future__ import annotations

import itertools

import cuda_host
import numpy as np
import pytest
from fof_reference import reference as scipy_reference

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.halos import fof_kernels, fof_kernels_gpu
from cosmo_dask.halos.fof_kernels import class_rows, fof_local


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
        return fof_kernels_gpu.fof_local_with(np, self.kernels, pos, periods, ll, min_friends,
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
def rng():
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


def _blobs_on_faces_and_corners(rng, n_uniform, box, sigma, per_blob):
    """Uniform background plus Gaussian blobs on every corner, edge and face centre
    of the box, plus random ones; coordinates left unwrapped (some < 0 or >= box)."""
    fractions = (0.0, 0.5, 1.0)
    centres = [np.array(c) * box for c in itertools.product(fractions, repeat=3)]
    centres += list(rng.random((10, 3)) * box)
    blobs = [c + rng.normal(scale=sigma, size=(per_blob, 3)) for c in centres]
    return np.concatenate([rng.random((n_uniform, 3)) * box] + blobs)


def _plummer(rng, n, centre, a, box):
    """A Plummer sphere of ``n`` points and scale radius ``a`` (truncated at ~7 a),
    wrapped into ``[0, box)`` when ``box``."""
    u = rng.uniform(0.0, 0.98, n)
    r = a / np.sqrt(u ** (-2 / 3) - 1)
    v = rng.normal(size=(n, 3))
    pos = np.asarray(centre) + v * (r / np.linalg.norm(v, axis=1))[:, None]
    return np.mod(pos, box) if box else pos


def _plummer_set(rng, L, scale=1):
    """Dense spheres (fine cells with dozens of members) centred on a face, an edge, a
    corner and inside, plus a uniform background."""
    parts = [rng.random((3000 * scale, 3)) * L]
    for centre, n, a in (((0.0, 2.0, 2.0), 5000, 0.08), ((0.02, L - 0.01, 1.0), 4000, 0.05),
                         ((L - 0.01, 0.0, 0.01), 3000, 0.04), ((2.0, 2.5, 1.5), 6000, 0.15),
                         ((3.0, 1.0, 3.0), 500, 0.3)):
        parts.append(_plummer(rng, n * scale, centre, a, L))
    return np.concatenate(parts)


# ---------------------------------------------------------------- partitions and counts
def test_uniform_periodic(backend, rng):
    n, box = (200_000, 58.0) if backend.gpu else (40_000, 34.0)
    root, friends = _same(backend, rng.random((n, 3)) * box, (box, box, box), 0.2)
    assert friends.max() > 1 and np.unique(root).size < root.size


@pytest.mark.parametrize("backend", RACES, indirect=True)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_plummer_spheres_straddling_faces(backend, rng, dtype):
    """Dense cells on faces, an edge and a corner of the periodic box, against scipy."""
    L = 4.0
    pos = _plummer_set(rng, L).astype(dtype)
    pos[pos >= L] = 0.0
    root, friends = _same(backend, pos, (L, L, L), 0.02, reference=True)
    assert friends.max() > 100
    _same(backend, pos, (L, L, L), 0.045)
    _same(backend, pos, (L, 0.0, L), 0.03)
    _same(backend, pos, (L, L, L), 0.02, min_friends=5)


@pytest.mark.parametrize("backend", RACES, indirect=True)
def test_dense_cell_straddling_a_periodic_face(backend, rng):
    """A tight clump cut by the x = 0 face (and one cut by the y and z faces): its fine
    cells sit at both ends of the axis, one group through the minimum image."""
    L = 2.0
    clump = rng.normal(scale=0.003, size=(400, 3)) + [0.0, 1.0, 1.0]
    corner = rng.normal(scale=0.003, size=(300, 3)) + [1.0, 0.0, 0.0]
    pos = np.concatenate([rng.random((3000, 3)) * L, clump, corner])
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
def test_zeldovich_like_lattice(backend, rng, ll):
    """A lattice of spacing 1 moved by tiny displacements: many distances within 1e-6 of
    the linking length, periodic, against scipy."""
    n = 14
    q = np.indices((n, n, n)).reshape(3, -1).T + 0.5
    _same(backend, q + rng.normal(scale=3e-7, size=q.shape), [float(n)] * 3, ll,
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
def test_clustered_periodic_blobs_on_faces_and_corners(backend, rng):
    box = 20.0
    pos = _blobs_on_faces_and_corners(rng, 20_000, box, sigma=0.3, per_blob=400)
    root, friends = _same(backend, pos, (box, box, box), 0.15)
    # the corner blob is one group across all eight corners of the box
    corner = np.flatnonzero(np.all(np.minimum(np.mod(pos, box), box - np.mod(pos, box)) < 0.1,
                                   axis=1))
    assert corner.size > 8
    assert np.unique(root[corner]).size == 1
    assert friends.max() > 50


@pytest.mark.parametrize("backend", RACES, indirect=True)
def test_clustered_dense_core(backend, rng):
    """A few very dense blobs: many friends per particle, heavy union-find contention."""
    box = 10.0
    centres = rng.random((5, 3)) * box
    pos = np.concatenate([c + rng.normal(scale=0.05, size=(3000, 3)) for c in centres]
                         + [rng.random((5000, 3)) * box])
    root, friends = _same(backend, pos, (box, box, box), 0.05)
    assert friends.max() > 500


def test_open_axes(backend, rng):
    pos = rng.normal(scale=3.0, size=(30_000, 3)) - 5.0
    _same(backend, pos, (0.0, 0.0, 0.0), 0.12, reference=True)


def test_open_axes_huge_extent(backend, rng):
    """Far-away outliers: the cells per open axis are capped and widened."""
    pos = np.concatenate([rng.random((5000, 3)) * 4.0,
                          np.array([[1e9, 0.0, -1e9], [1e9 + 0.01, 0.0, -1e9], [-3e8, 2e8, 0.0]])])
    root, _ = _same(backend, pos, (0.0, 0.0, 0.0), 0.1)
    assert root[5001] == 5000


def test_mixed_periods(backend, rng):
    box = 12.0
    pos = _blobs_on_faces_and_corners(rng, 10_000, box, sigma=0.25, per_blob=200)
    pos[:, 1] *= 0.7  # open axis with its own extent
    _same(backend, pos, (box, 0.0, box), 0.2)
    _same(backend, pos, (0.0, box, 0.0), 0.2)


@pytest.mark.parametrize("backend", RACES, indirect=True)
@pytest.mark.parametrize("min_friends", [2, 3, 8])
def test_min_friends(backend, rng, min_friends):
    box = 15.0
    pos = _blobs_on_faces_and_corners(rng, 15_000, box, sigma=0.3, per_blob=150)
    root, friends = _same(backend, pos, (box, box, box), 0.2, min_friends=min_friends)
    low = friends < min_friends
    assert low.any() and (~low).any()
    np.testing.assert_array_equal(root[low], np.flatnonzero(low))


def test_min_friends_open(backend, rng):
    pos = rng.normal(scale=2.0, size=(20_000, 3))
    _same(backend, pos, (0.0, 0.0, 0.0), 0.15, min_friends=3, reference=True)


def test_duplicates(backend, rng):
    box = 5.0
    base = rng.random((2000, 3)) * box
    pos = np.concatenate([base, base[:500], base[:100], np.zeros((50, 3)),
                          np.full((20, 3), box), np.full((20, 3), -box)])
    pos = pos[rng.permutation(len(pos))]
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
def test_period_below_three_linking_lengths(backend, rng, period):
    """One or two cells along an axis (neighbour deduplication, double images)."""
    ll = 0.1
    pos = rng.random((4000, 3)) * [4.0, period, 4.0]
    pos[:, 1] += rng.integers(-2, 3, size=4000) * period  # unwrapped images
    _same(backend, pos, (4.0, period, 4.0), ll)
    _same(backend, pos, (0.0, period, 4.0), ll)
    _same(backend, pos, (4.0, period, period), ll)
    _same(backend, pos, (period, period, period), ll)


@pytest.mark.parametrize("cells", [1.2, 2.5, 3.5])
def test_few_cells_per_axis_with_a_dense_clump(backend, rng, cells):
    """Periods of a few linking lengths with a dense clump at the corner: neighbour
    offsets wrap onto themselves, fine cells hold many points."""
    ll = 0.1
    L = cells * ll
    pos = np.concatenate([rng.random((600, 3)) * L, _plummer(rng, 600, (0.0, 0.0, 0.0), 0.01,
                                                                 L)])
    _same(backend, pos, (L, L, L), ll, reference=True)
    _same(backend, pos, (L, 0.0, L), ll)


@pytest.mark.parametrize("sub", [1, 2])
def test_fine_cells_not_provably_linked(backend, rng, monkeypatch, sub):
    """Capped sub-division: fine cells too large to be linked internally fall back to
    single-particle units; the result is unchanged."""
    monkeypatch.setattr(fof_kernels, "_MAX_SUB_PER_AXIS", sub)
    L = 2.0
    pos = np.concatenate([rng.random((3000, 3)) * L, _plummer(rng, 3000, (0.0, 1.0, 1.0),
                                                              0.05, L)])
    _same(backend, pos, (L, L, L), 0.05, reference=True)
    _same(backend, pos, (0.0, L, 0.0), 0.05)


def test_float32_positions(backend, rng):
    box = np.float32(20.0)
    pos32 = _blobs_on_faces_and_corners(rng, 20_000, float(box), sigma=0.3,
                                        per_blob=100).astype(np.float32)
    _same(backend, pos32, (20.0, 20.0, 20.0), 0.2)  # wrapped in float64 by the kernels
    _same(backend, pos32, (0.0, 20.0, 0.0), 0.2, min_friends=3)
    # inside the box: the kernels keep float32 sorted copies (nothing to wrap)
    inside = np.mod(pos32, box)
    inside[inside >= box] = 0
    _same(backend, inside, (20.0, 20.0, 20.0), 0.2)
    _same(backend, inside, (20.0, 20.0, 20.0), 0.2, min_friends=4)


def test_int64_indices(backend, rng, monkeypatch):
    """The int64 index variant (used from 2^31 particles), forced on a small set."""
    monkeypatch.setattr(fof_kernels_gpu, "INT32_ROWS", 0)
    L = 4.0
    pos = _plummer_set(rng, L, scale=1)[::3]
    _same(backend, pos, (L, L, L), 0.03)
    _same(backend, pos.astype(np.float32), (L, L, L), 0.03, min_friends=3)


@pytest.mark.parametrize("backend", RACES, indirect=True)
@pytest.mark.parametrize("min_members", [1, 20])
def test_group_rows_equal_class_rows(backend, rng, min_members):
    """Per-group rows (no sort) reduce to the CPU's per-class rows."""
    L = 3.0
    pos = np.concatenate([rng.random((20_000, 3)) * L,
                          rng.normal(scale=0.05, size=(3000, 3)) + 1.5])
    root, _ = fof_local(pos, (L, L, L), 0.04, count_friends=False)
    index = rng.permutation(10**6)[:len(pos)].astype(np.int64)
    rep = index[root]
    ids = rng.permutation(10**7)[:len(pos)].astype(np.int64)
    # some groups cross a domain face; pairs of them merge into one class
    nodes = np.unique(rep[rng.random(rep.size) < 0.05])
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
def test_numpy_input_and_non_contiguous(rng):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

    box = 6.0
    big = rng.random((4000, 6)) * box
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
def test_repeatable_on_a_large_clustered_set(rng):
    """Runs on the same 2M clustered points give identical output (no races), equal to
    the CPU kernel, on both paths."""
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

    L = 40.0
    parts = [rng.random((1_000_000, 3)) * L]
    sizes = np.maximum(20, (rng.pareto(1.0, 3000) * 40).astype(int))
    sizes = sizes[np.cumsum(sizes) <= 1_000_000]
    for n in sizes:
        parts.append(_plummer(rng, int(n), rng.random(3) * L, 0.005 * n ** (1 / 3), L))
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
