"""GPU friends-of-friends kernel against the CPU kernel: identical roots and friend counts.

Every test is marked ``gpu`` and skipped without a CUDA device (conftest.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cosmo_dask.errors import ParameterError
from cosmo_dask.halos.fof_kernels import fof_local

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def _gpu(pos, periods, ll, min_friends=1):
    import cupy

    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

    root, friends = fof_local_gpu(cupy.asarray(pos), periods, ll, min_friends)
    assert isinstance(root, cupy.ndarray) and isinstance(friends, cupy.ndarray)
    assert root.dtype == np.int64 and friends.dtype == np.int32
    return cupy.asnumpy(root), cupy.asnumpy(friends)


def _assert_same(pos, periods, ll, min_friends=1, cpu_pos=None):
    """GPU and CPU results equal element for element; returns them."""
    cpu_pos = np.asarray(pos, dtype=np.float64) if cpu_pos is None else cpu_pos
    root_c, friends_c = fof_local(cpu_pos, periods, ll, min_friends)
    root_g, friends_g = _gpu(pos, periods, ll, min_friends)
    np.testing.assert_array_equal(friends_g, friends_c)
    np.testing.assert_array_equal(root_g, root_c)
    return root_c, friends_c


def _blobs_on_faces_and_corners(rng, n_uniform, box, sigma, per_blob):
    """Uniform background plus Gaussian blobs on every corner, edge and face centre
    of the box, plus random ones; coordinates left unwrapped (some < 0 or >= box)."""
    fractions = (0.0, 0.5, 1.0)
    centres = [np.array(c) * box for c in itertools.product(fractions, repeat=3)]
    centres += list(rng.random((10, 3)) * box)
    blobs = [c + rng.normal(scale=sigma, size=(per_blob, 3)) for c in centres]
    return np.concatenate([rng.random((n_uniform, 3)) * box] + blobs)


def test_uniform_periodic(cupy, rng):
    box = 58.0
    pos = rng.random((200_000, 3)) * box
    root, friends = _assert_same(pos, (box, box, box), 0.2)
    assert friends.max() > 1 and np.unique(root).size < root.size


def test_clustered_periodic_blobs_on_faces_and_corners(cupy, rng):
    box = 20.0
    pos = _blobs_on_faces_and_corners(rng, 20_000, box, sigma=0.3, per_blob=400)
    root, friends = _assert_same(pos, (box, box, box), 0.15)
    # the corner blob is one group across all eight corners of the box
    corner = np.flatnonzero(np.all(np.minimum(np.mod(pos, box), box - np.mod(pos, box)) < 0.1,
                                   axis=1))
    assert corner.size > 8
    assert np.unique(root[corner]).size == 1
    assert friends.max() > 50


def test_clustered_dense_core(cupy, rng):
    """A few very dense blobs: many friends per particle, heavy union-find contention."""
    box = 10.0
    centres = rng.random((5, 3)) * box
    pos = np.concatenate([c + rng.normal(scale=0.05, size=(3000, 3)) for c in centres]
                         + [rng.random((5000, 3)) * box])
    root, friends = _assert_same(pos, (box, box, box), 0.05)
    assert friends.max() > 500


def test_open_axes(cupy, rng):
    pos = rng.normal(scale=3.0, size=(30_000, 3)) - 5.0
    _assert_same(pos, (0.0, 0.0, 0.0), 0.12)


def test_open_axes_huge_extent(cupy, rng):
    """Far-away outliers: the cells per open axis are capped and widened."""
    pos = np.concatenate([rng.random((5000, 3)) * 4.0,
                          np.array([[1e9, 0.0, -1e9], [1e9 + 0.01, 0.0, -1e9], [-3e8, 2e8, 0.0]])])
    root, _ = _assert_same(pos, (0.0, 0.0, 0.0), 0.1)
    assert root[5001] == 5000


def test_mixed_periods(cupy, rng):
    box = 12.0
    pos = _blobs_on_faces_and_corners(rng, 10_000, box, sigma=0.25, per_blob=200)
    pos[:, 1] *= 0.7  # open axis with its own extent
    _assert_same(pos, (box, 0.0, box), 0.2)
    _assert_same(pos, (0.0, box, 0.0), 0.2)


@pytest.mark.parametrize("min_friends", [2, 3, 8])
def test_min_friends(cupy, rng, min_friends):
    box = 15.0
    pos = _blobs_on_faces_and_corners(rng, 15_000, box, sigma=0.3, per_blob=150)
    root, friends = _assert_same(pos, (box, box, box), 0.2, min_friends=min_friends)
    low = friends < min_friends
    assert low.any() and (~low).any()
    np.testing.assert_array_equal(root[low], np.flatnonzero(low))


def test_min_friends_open(cupy, rng):
    pos = rng.normal(scale=2.0, size=(20_000, 3))
    _assert_same(pos, (0.0, 0.0, 0.0), 0.15, min_friends=3)


def test_duplicates(cupy, rng):
    box = 5.0
    base = rng.random((2000, 3)) * box
    pos = np.concatenate([base, base[:500], base[:100], np.zeros((50, 3)),
                          np.full((20, 3), box), np.full((20, 3), -box)])
    pos = pos[rng.permutation(len(pos))]
    root, friends = _assert_same(pos, (box, box, box), 0.05)
    assert friends.max() >= 89  # the 90 points at 0 == box == -box (mod box)
    _assert_same(pos, (box, box, box), 0.05, min_friends=3)
    _assert_same(pos, (0.0, 0.0, 0.0), 0.05)


@pytest.mark.parametrize("periods", [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (1.0, 0.0, 1.0)])
def test_tiny(cupy, periods):
    empty = np.empty((0, 3))
    root, friends = _gpu(empty, periods, 0.1)
    assert root.shape == (0,) and friends.shape == (0,)
    _assert_same(np.array([[0.5, 0.5, 0.5]]), periods, 0.1)
    _assert_same(np.array([[0.05, 0.5, 0.5], [0.95, 0.5, 0.5]]), periods, 0.1)  # wrap pair
    _assert_same(np.array([[0.2, 0.5, 0.5], [0.5, 0.5, 0.5]]), periods, 0.1)  # apart
    _assert_same(np.array([[0.2, 0.5, 0.5], [0.2, 0.5, 0.5]]), periods, 0.1)  # duplicate
    _assert_same(np.array([[0.2, 0.5, 0.5], [0.2, 0.5, 0.5]]), periods, 0.1, min_friends=2)


def test_exactly_at_linking_length(cupy):
    """Distances equal to ll in float64 are friends, one ulp more are not."""
    ll = 0.25
    x = np.array([1.0, 1.25, np.nextafter(1.5, 2.0), 2.0, 2.25])
    pos = np.stack([x, np.full(5, 2.0), np.full(5, 3.0)], axis=1)
    root, friends = _assert_same(pos, (0.0, 0.0, 0.0), ll)
    np.testing.assert_array_equal(root, [0, 0, 2, 3, 3])
    np.testing.assert_array_equal(friends, [1, 1, 0, 1, 1])
    _assert_same(pos, (4.0, 4.0, 4.0), ll)


@pytest.mark.parametrize("period", [0.05, 0.26, 0.29])
def test_period_below_three_linking_lengths(cupy, rng, period):
    """One or two cells along an axis (neighbour deduplication, double images)."""
    ll = 0.1
    pos = rng.random((4000, 3)) * [4.0, period, 4.0]
    pos[:, 1] += rng.integers(-2, 3, size=4000) * period  # unwrapped images
    _assert_same(pos, (4.0, period, 4.0), ll)
    _assert_same(pos, (0.0, period, 4.0), ll)
    _assert_same(pos, (4.0, period, period), ll)
    _assert_same(pos, (period, period, period), ll)


def test_float32_positions(cupy, rng):
    box = np.float32(20.0)
    pos32 = _blobs_on_faces_and_corners(rng, 20_000, float(box), sigma=0.3,
                                        per_blob=100).astype(np.float32)
    _assert_same(pos32, (20.0, 20.0, 20.0), 0.2, cpu_pos=pos32.astype(np.float64))
    _assert_same(pos32, (0.0, 20.0, 0.0), 0.2, cpu_pos=pos32.astype(np.float64),
                 min_friends=3)
    # inside the box: the kernels keep float32 sorted copies (nothing to wrap)
    inside = np.mod(pos32, box)
    inside[inside >= box] = 0
    _assert_same(inside, (20.0, 20.0, 20.0), 0.2, cpu_pos=inside)
    _assert_same(inside, (20.0, 20.0, 20.0), 0.2, cpu_pos=inside.astype(np.float64),
                 min_friends=4)


def test_numpy_input_and_non_contiguous(cupy, rng):
    from cosmo_dask.halos.fof_kernels_gpu import fof_local_gpu

    box = 6.0
    big = rng.random((4000, 6)) * box
    pos = big[:, ::2]
    root_c, friends_c = fof_local(pos, (box, box, box), 0.2)
    root_g, friends_g = fof_local_gpu(pos, np.array([box, box, box]), 0.2)
    assert isinstance(root_g, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(root_g), root_c)
    np.testing.assert_array_equal(cupy.asnumpy(friends_g), friends_c)
    root_g, friends_g = fof_local_gpu(cupy.asarray(big)[:, ::2], cupy.asarray([box] * 3), 0.2)
    np.testing.assert_array_equal(cupy.asnumpy(root_g), root_c)


def test_repeatable(cupy, rng):
    """Two runs on the same clustered input give identical output (no races)."""
    from cosmo_dask.halos.fof_kernels_gpu import _benchmark_positions, fof_local_gpu

    pos, box = _benchmark_positions(2_000_000, True, seed=3)
    gpos = cupy.asarray(pos)
    r1, f1 = fof_local_gpu(gpos, (box, box, box), 0.2)
    r2, f2 = fof_local_gpu(gpos, (box, box, box), 0.2)
    assert bool((r1 == r2).all()) and bool((f1 == f2).all())
    r3, f3 = fof_local_gpu(gpos, (box, box, box), 0.2, min_friends=4)
    r4, f4 = fof_local_gpu(gpos, (box, box, box), 0.2, min_friends=4)
    assert bool((r3 == r4).all()) and bool((f3 == f4).all())
    assert bool((f1 == f3).all())
    root_c, friends_c = fof_local(pos, (box, box, box), 0.2)
    np.testing.assert_array_equal(cupy.asnumpy(f1), friends_c)
    np.testing.assert_array_equal(cupy.asnumpy(r1), root_c)


def test_bad_arguments(cupy):
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
    with pytest.raises(ParameterError, match="non-finite"):
        fof_local_gpu(bad, (1.0, 1.0, 1.0), 0.1)


def test_benchmark_small(cupy):
    from cosmo_dask.halos.fof_kernels_gpu import benchmark_gpu

    out = benchmark_gpu(m=100_000, clustered=True, repeats=2)
    assert out["m"] == 100_000 and out["seconds"] > 0 and out["particles_per_s"] > 0
    assert set(out["stages_ms"]) >= {"cell_ids", "sort", "cells", "pairs", "finish"}
    assert out["n_groups_ge2"] > 0


@pytest.mark.parametrize("min_members", [1, 20])
def test_class_rows_gpu_equals_cpu(cupy, rng, min_members):
    from cosmo_dask.halos.fof_kernels import class_rows
    from cosmo_dask.halos.fof_kernels_gpu import class_rows_gpu

    m = 200_000
    cls = rng.integers(0, 20_000, m) * 3 - 7
    cls[:5000] = 42  # one big class
    ids = rng.permutation(m * 2)[:m].astype(np.int64)
    crossing = rng.random(m) < 0.002
    cpu = class_rows(cls, ids, crossing, min_members)
    gpu = class_rows_gpu(cupy.asarray(cls), cupy.asarray(ids), cupy.asarray(crossing),
                         min_members)
    np.testing.assert_array_equal(gpu, cpu)
