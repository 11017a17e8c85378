"""Exact most bound particle from octree bounds (issue 30, item 3).

``segment_mbp`` bounds every member's potential with the octree (per group of members,
then per member) and evaluates exactly only the members that can win. These tests check
that the bounds hold against exact sums, that the answer (row and potential, bit for bit)
is the argmin of every exact potential, on large halos and on exact ties (the first row
wins), and a 1e5-member halo against a float64 numpy reference (slow).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_center_kernels import brute_potentials, model_halo, plummer

import cosmo_dask.halos.center_kernels as ck
from cosmo_dask.halos.center_kernels import segment_mbp, segment_potentials, segmented_argmin
from cosmo_dask.spatial.octree import build_octree, node_second_moment


def _reference(pos, mass, starts, **kw):
    pot = segment_potentials(pos, mass, starts, **kw)
    best = segmented_argmin(pot, starts)
    return best, np.where(best >= 0, pot[np.maximum(best, 0)], np.nan), pot


def _tree_bounds(pos, mass, eps, theta, per_group, approx=False):
    """(exact sums, upper, lower) of every member in the tree's sorted order."""
    n = len(pos)
    tree = build_octree(pos, mass, max_leaf=ck._TREE_LEAF, max_group=ck._TREE_GROUP)
    ps = np.ascontiguousarray(tree.pos)
    second = node_second_moment(tree)
    up, low = np.full(n, np.nan), np.full(n, np.nan)
    if per_group:
        leaves = np.flatnonzero(tree.first_child < 0)
        leaf_at = np.full(n, -1, np.int64)
        leaf_at[tree.start[leaves]] = leaves
        x, y, z = (np.ascontiguousarray(ps[:, a]) for a in range(3))
        ck._group_bounds(x, y, z, tree.pmass, tree.start, tree.count, tree.first_child,
                         tree.n_child, tree.com, tree.bmax, tree.mass, tree.quad, second,
                         np.sqrt(tree.mass * second), eps * eps, theta, approx, tree.groups,
                         np.zeros(len(tree.groups), np.int64), leaf_at, 8, up, low)
    else:
        ck._bound_sums(ps, tree.pmass, tree.start, tree.count, tree.first_child,
                       tree.n_child, tree.com, tree.bmax, tree.lo, tree.hi, tree.mass,
                       tree.quad, second, eps * eps, theta, np.arange(n), np.zeros(n, np.int64),
                       64, up, low)
    exact = brute_potentials(ps, tree.pmass, np.array([0, n]), eps=eps, G=-1.0)
    return exact, up, low


@pytest.mark.parametrize("per_group", [True, False])
@pytest.mark.parametrize("kind, eps", [("plummer", 0.0), ("nfw", 0.02), ("plummer", 3.0)])
def test_tree_bounds_enclose_the_exact_sums(kind, eps, per_group):
    # eps = 3 is larger than most groups: the expansion in four dimensions must hold there
    rng = np.random.default_rng(11)
    pos = model_halo(rng, kind, 2000, clump=True)
    pos[7] = pos[8]  # a duplicate pair (with eps = 0 it adds 0)
    mass = rng.uniform(0.0, 2.0, len(pos))
    mass[:50] = 0.0  # massless members
    width = []
    for theta in (0.7, 0.3):
        exact, up, low = _tree_bounds(pos, mass, eps, theta, per_group)
        tol = 1e-12 * np.abs(exact)
        assert np.all(low <= exact + tol) and np.all(exact <= up + tol)
        width.append(np.median((up - low) / exact))
    assert width[0] > width[1] and width[1] < 0.1  # and they bound something


@pytest.mark.parametrize("eps", [0.0, 0.01])
def test_large_halo_mbp_equals_direct_summation(eps):
    # 20,000 members: the group bounds, the per-member rounds and the exact candidates
    rng = np.random.default_rng(4)
    pos = np.concatenate([model_halo(rng, "plummer", 20000, clump=True) + 30.0,
                          model_halo(rng, "nfw", 12000, clump=True) + 3.0])
    mass = rng.uniform(0.5, 1.5, len(pos))
    starts = np.array([0, 20000, 32000], dtype=np.int64)
    rows, pot = segment_mbp(pos, mass, starts, softening=eps, G=2.0)
    want_rows, want_pot, every = _reference(pos, mass, starts, softening=eps, G=2.0)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(pot, want_pot)
    # the exact kernel against plain float64 numpy at the winners
    for s, r in enumerate(rows):
        a, b = starts[s], starts[s + 1]
        d = pos[a:b] - pos[r]
        s2 = (d * d).sum(1) + eps * eps
        s2[r - a] = np.inf
        np.testing.assert_allclose(pot[s], -2.0 * np.sum(mass[a:b] / np.sqrt(s2)),
                                   rtol=1e-12)
        assert np.all(every[a:b] >= pot[s])


def _tied_halo(rng, k_a, k_b, n_far):
    """Two clusters of coincident members 3 apart with softening 4 and masses 20: every
    pair term is an integer (20 / 4 = 5 within a cluster, 20 / 5 = 4 across), so each
    cluster's members tie exactly in any summation order; ``n_far`` massless members
    spread around (none within 1.5 of a cluster) add exactly 0 and are less bound. Rows
    shuffled."""
    a = np.zeros((k_a, 3))
    b = np.zeros((k_b, 3)) + np.array([3.0, 0.0, 0.0])
    far = plummer(rng, 2 * n_far, a=20.0, rmax=200.0) + np.array([1.5, 0.0, 0.0])
    far = far[np.abs(far - np.array([1.5, 0.0, 0.0])).max(axis=1) > 3.0][:n_far]
    pos = np.concatenate([a, b, far])
    mass = np.concatenate([np.full(k_a + k_b, 20.0), np.zeros(n_far)])
    perm = rng.permutation(len(pos))
    return pos[perm], mass[perm], perm


@pytest.mark.parametrize("k_a, k_b", [(1600, 1600), (1700, 1500)])
def test_exact_ties_go_to_the_first_row(rng, k_a, k_b):
    pos, mass, perm = _tied_halo(rng, k_a, k_b, 2000)
    n = len(pos)
    starts = np.array([0, n], dtype=np.int64)
    rows, pot = segment_mbp(pos, mass, starts, softening=4.0)
    want_rows, want_pot, every = _reference(pos, mass, starts, softening=4.0)
    in_a = perm < k_a
    in_b = (perm >= k_a) & (perm < k_a + k_b)
    # the ties are exact: every member of a cluster has the same potential
    assert np.unique(every[in_a]).size == 1 and np.unique(every[in_b]).size == 1
    winners = in_a | in_b if k_a == k_b else in_a
    assert every[in_a][0] == -(5.0 * (k_a - 1) + 4.0 * k_b)
    assert rows[0] == want_rows[0] == np.flatnonzero(winners)[0]
    assert pot[0] == want_pot[0]


def test_symmetric_lattice_matches_direct_summation():
    # a cube of 16**3 lattice points: the 8 central points are equivalent, equal
    # potentials up to the summation order; the tree must pick the reference's row
    g = np.arange(16, dtype=np.float64)
    pos = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
    starts = np.array([0, len(pos)], dtype=np.int64)
    for eps in (0.0, 0.5):
        rows, pot = segment_mbp(pos, 1.0, starts, softening=eps)
        want_rows, want_pot, every = _reference(pos, 1.0, starts, softening=eps)
        assert rows[0] == want_rows[0] and pot[0] == want_pot[0]
        assert np.all(np.abs(pos[rows[0]] - 7.5) == 0.5)  # one of the central points


@pytest.mark.slow
def test_mbp_of_a_1e5_halo_equals_direct_summation():
    # 1e10 pair terms for the reference: the exact numba kernel (about 10 s on 2 cores)
    rng = np.random.default_rng(8)
    n = 100_000
    pos = model_halo(rng, "plummer", n, clump=True)
    mass = rng.uniform(0.5, 1.5, n)
    starts = np.array([0, n], dtype=np.int64)
    rows, pot = segment_mbp(pos, mass, starts, softening=0.01)
    want_rows, want_pot, every = _reference(pos, mass, starts, softening=0.01)
    assert rows[0] == want_rows[0] and pot[0] == want_pot[0]
    d = pos - pos[rows[0]]
    s2 = (d * d).sum(1) + 1e-4
    s2[rows[0]] = np.inf
    np.testing.assert_allclose(pot[0], -np.sum(mass / np.sqrt(s2)), rtol=1e-12)


def test_catalog_mbp_of_a_large_halo_is_exact_by_default():
    # 21,000 members (above the old default grid_threshold of 20,000) and a close pair
    # in the outskirts: with no softening the pair is the most bound, which the exact
    # MBP finds and the grid approximation cannot (it searches the deepest wells)
    from cosmo_dask import Snapshot
    from cosmo_dask.halos import fof
    from cosmo_dask.halos.center_kernels import member_potentials

    rng = np.random.default_rng(21)
    halo = plummer(rng, 21000, a=1.0, rmax=2.5)
    k = int(np.argmin(np.abs(np.linalg.norm(halo, axis=1) - 1.0)))
    pos = np.concatenate([halo, halo[k:k + 1] + np.array([1e-6, 0.0, 0.0])]) + 50.0
    n = len(pos)
    snap = Snapshot.from_arrays(pos, box_size=100.0, ids=np.arange(n, dtype=np.int64))
    res = fof(snap, 0.5, absolute=True, centers=("mbp",), potential_softening=0.0)
    cat = res.catalog
    assert int(cat["n_members"][0]) > 20000
    assert int(cat["mbp_index"][0]) in (k, n - 1)
    members = np.flatnonzero(np.asarray(res.labels.compute()) == 0)
    row = int(np.flatnonzero(members == int(cat["mbp_index"][0]))[0])
    want = member_potentials(pos[members], 1.0, np.array([row]), box_size=100.0)[0]
    np.testing.assert_allclose(float(cat["mbp_potential"][0]), want, rtol=1e-12)
    # the grid approximation above 20,000 members (the default before) misses it
    grid = fof(snap, 0.5, absolute=True, centers=("mbp",), potential_softening=0.0,
               grid_threshold=20000).catalog
    assert int(grid["mbp_index"][0]) not in (k, n - 1)
