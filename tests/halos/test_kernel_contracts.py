"""The halo kernel contracts (``cosmo_dask.halos.dispatch``), one test each, run on every
backend: the dispatch object is called with NumPy or CuPy chunks and its results are
checked against independent float64 references (scipy cKDTree FOF, numpy group sums,
numpy double sums of the potential)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.backend import host
from cosmo_dask.halos import dispatch
from tests.support.fof_reference import reference
from tests.support.halos import _gpu_case, brute_potentials, mbp_case


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def xp(request):
    """The array module of the chunks: numpy, or cupy on a GPU host."""
    if request.param == "gpu":
        return pytest.importorskip("cupy")
    return np


def _chunk_type(xp, *arrays):
    for a in arrays:
        assert isinstance(a, xp.ndarray), type(a)


# ---------------------------------------------------------------- fof_local
@pytest.mark.parametrize("periods", [(3.0, 3.0, 3.0), (3.0, 0.0, 3.0)])
@pytest.mark.parametrize("min_friends", [1, 3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fof_local(xp, rng, periods, min_friends, dtype):
    L = 3.0
    pos = np.concatenate([rng.random((12_000, 3)) * L,
                          rng.normal(scale=0.05, size=(3000, 3)) + 1.5,
                          rng.normal(scale=0.03, size=(1000, 3)) + [0.02, 1.0, 2.99]])
    pos = np.mod(pos, L).astype(dtype)  # the open axis keeps a few coordinates at 0
    ll = 0.04
    want_root, want_friends = reference(pos.astype(np.float64), periods, ll, min_friends)
    for counts in (True, False):
        root, friends = dispatch.fof_local(xp.asarray(pos), periods, ll, min_friends,
                                           count_friends=counts)
        _chunk_type(xp, root)
        assert root.dtype == np.int64
        np.testing.assert_array_equal(host(root), want_root)
        if counts or min_friends > 1:
            _chunk_type(xp, friends)
            assert friends.dtype == np.int32
            np.testing.assert_array_equal(host(friends), want_friends)
        else:
            assert friends is None
    assert np.bincount(want_root).max() > 500  # big groups, not just singles and pairs


# ---------------------------------------------------------------- group_rows
@pytest.mark.parametrize("min_members", [1, 20])
def test_group_rows(xp, rng, min_members):
    """Rows (class, count, smallest id) per local group, against numpy group sums."""
    L = 3.0
    pos = np.concatenate([rng.random((20_000, 3)) * L,
                          rng.normal(scale=0.05, size=(3000, 3)) + 1.5])
    root, _ = dispatch.fof_local(pos, (L, L, L), 0.04, count_friends=False)
    index = rng.permutation(10**6)[:len(pos)].astype(np.int64)
    rep = index[root]
    ids = rng.permutation(10**7)[:len(pos)].astype(np.int64)
    nodes = np.unique(rep[rng.random(rep.size) < 0.05])  # groups crossing a domain face
    merged = nodes.copy()
    merged[1::2] = nodes[0:nodes.size - 1:2][:merged[1::2].size]  # pairs of them merge
    at = np.minimum(np.searchsorted(nodes, rep), nodes.size - 1)
    crossing = nodes[at] == rep
    cls = np.where(crossing, merged[at], rep)

    got = dispatch.group_rows(xp.asarray(root), xp.asarray(cls), xp.asarray(ids),
                              xp.asarray(crossing), min_members)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64  # on the host

    groups, first, count = np.unique(root, return_index=True, return_counts=True)
    low = np.full(len(pos), np.iinfo(np.int64).max)
    np.minimum.at(low, root, ids)
    keep = (count >= min_members) | crossing[groups]
    want = np.stack([cls[first][keep], count[keep], low[groups][keep]], axis=1)
    assert want.shape[0] > 100 and np.any(want[:, 1] > 1)
    np.testing.assert_array_equal(got, want)  # root order on both backends


# ---------------------------------------------------------------- segment potentials
@pytest.mark.parametrize("periodic", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.03])
def test_segment_potentials(xp, rng, periodic, eps):
    pos, mass, starts, box = _gpu_case(rng)
    box = box if periodic else None
    if periodic:
        pos = np.mod(pos, box)
    got = dispatch.segment_potentials(xp.asarray(pos), xp.asarray(mass), xp.asarray(starts),
                                      box_size=box, softening=eps)
    _chunk_type(xp, got)
    assert got.dtype == np.float64
    want = brute_potentials(pos, mass, starts, eps=eps, box=box)
    np.testing.assert_allclose(host(got), want, rtol=1e-10, atol=0)
    if xp is not np:  # and the GPU kernel against the CPU kernel (tests/halos/test_center_kernels)
        ref = dispatch.segment_potentials(pos, mass, starts, box_size=box, softening=eps)
        np.testing.assert_allclose(host(got), ref, rtol=1e-10, atol=0)


# ---------------------------------------------------------------- segment MBP
@pytest.mark.parametrize("eps", [0.0, 0.01])
def test_segment_mbp(xp, rng, eps):
    """Each segment's most bound member and its potential: the argmin of the float64
    double sum (tests/halos/test_center_kernels.mbp_case: halos big enough for the CPU kernel's
    octree pruning, small ones, an empty one, some straddling the periodic faces)."""
    box, unwrapped, pos, mass, starts, sizes = mbp_case(rng)
    rows, pot = dispatch.segment_mbp(xp.asarray(pos), xp.asarray(mass), xp.asarray(starts),
                                     box_size=box, softening=eps, G=1.7)
    assert isinstance(rows, np.ndarray) and isinstance(pot, np.ndarray)  # on the host
    assert rows.dtype == np.int64 and pot.dtype == np.float64
    assert rows[5] == -1 and np.isnan(pot[5])
    ref = brute_potentials(unwrapped, mass, starts[:7], eps=eps, G=1.7)
    for s in (0, 1, 3, 4):
        a, b = starts[s], starts[s + 1]
        assert rows[s] == a + int(np.argmin(ref[a:b]))
        assert pot[s] == pytest.approx(ref[a:b].min(), rel=1e-11)
    assert rows[7] == starts[7] and pot[7] == 0.0  # a single member: nothing binds it
    ref_box = brute_potentials(pos[starts[6]:starts[7]], mass[starts[6]:starts[7]],
                               np.array([0, sizes[6]]), eps=eps, box=box, G=1.7)
    assert rows[6] == starts[6] + int(np.argmin(ref_box))
    assert pot[6] == pytest.approx(ref_box.min(), rel=1e-11)


# ---------------------------------------------------------------- segment max
def _segment_max_case(rng):
    """Non-negative float64 values in segments of 1 to 5,000 (one with equal values, one
    holding 0.0 and the largest float64), and the max of each by a Python loop."""
    sizes = np.array([1, 7, 5000, 3, 1, 260, 2, 900])
    starts = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    values = rng.random(starts[-1]) * rng.choice([1e-300, 1.0, 1e300], starts[-1])
    values[starts[3]:starts[4]] = 0.25
    values[starts[6]:starts[7]] = (0.0, np.finfo(np.float64).max)
    want = np.array([max(values[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)])
    return values, starts, want


def test_segment_max(xp, rng):
    """The largest value of each segment, bit for bit a Python loop's."""
    values, starts, want = _segment_max_case(rng)
    got = dispatch.segment_max(xp.asarray(values), xp.asarray(starts))
    _chunk_type(xp, got)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(host(got), want)
    assert host(dispatch.segment_max(xp.asarray(values[:0]), xp.asarray(starts[:1]))).size == 0


@pytest.mark.parametrize("order", ["reversed", "concurrent"])
def test_segment_max_cuda_text_on_host(rng, order):
    """``center.cu``'s ``seg_max_nonneg`` (its text alone: the file's other kernel uses
    shared memory) compiled for the host (tests/support/cuda_host.py, threads in another
    order and at once): the maxima bit for bit, whatever the order of the atomic maxima."""
    from tests.support import cuda_host

    if cuda_host.compiler() is None:
        pytest.skip("no host C++ compiler")
    from cosmo_dask import cuda

    text = cuda.source("center", {"REAL": "double", "SEG_POT": "seg_pot_f64", "BLOCK": 128})
    text = text[text.index('extern "C" __global__ void seg_max_nonneg'):]  # the kernel alone
    kern = cuda_host.HostKernels(text, order)["seg_max_nonneg"]
    values, starts, want = _segment_max_case(rng)
    seg = np.repeat(np.arange(starts.size - 1), np.diff(starts)).astype(np.int64)
    out = np.zeros(starts.size - 1, np.uint64)
    kern((3,), (5,), (values, seg, np.int64(values.size), out))
    np.testing.assert_array_equal(out.view(np.float64), want)
