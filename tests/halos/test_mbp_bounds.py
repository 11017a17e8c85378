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

import cosmo_dask.halos.center_kernels as ck
from cosmo_dask.halos.center_kernels import segment_mbp, segment_potentials, segmented_argmin
from cosmo_dask.spatial.octree import build_octree, node_second_moment
from tests.support.halos import brute_potentials, model_halo, plummer


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
                         tree.n_child, tree.com, tree.bmax, tree.lo, tree.hi, tree.mass,
                         tree.quad, second, np.sqrt(tree.mass * second), eps * eps, theta,
                         approx, tree.groups,
                         np.zeros(len(tree.groups), np.int64), leaf_at,
                         np.ones(n, np.bool_), 8, up, low)
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


# --------------------------------------------------------------------------- #
# many halos at once: one forest for the tree halos, float32 prefilter for the others
# --------------------------------------------------------------------------- #


def _catalog(rng, sizes, box=None, straddle=()):
    """Halos of ``sizes`` (Plummer / NFW, some with clumps) one after another, each at a
    random place (or at a corner of the periodic box, split by its faces, for the
    indices in ``straddle``); returns ``(pos, starts)``."""
    parts = []
    for i, n in enumerate(sizes):
        h = model_halo(rng, "plummer" if i % 2 else "nfw", n)
        if box is None:
            h += rng.uniform(-50.0, 50.0, 3)
        else:
            centre = np.zeros(3) if i in straddle else rng.uniform(0.0, box, 3)
            h = np.mod(h + centre, box)
        parts.append(h)
    return np.concatenate(parts), np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def _assert_exact(pos, mass, starts, **kw):
    rows, pot = segment_mbp(pos, mass, starts, **kw)
    want_rows, want_pot, _ = _reference(pos, mass, starts, **kw)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(pot, want_pot)  # bit for bit (NaN for empty segments)
    return rows


@pytest.mark.parametrize("tree_min", [None, 150])
@pytest.mark.parametrize("periodic, eps", [(True, 0.0), (True, 0.03), (False, 0.0),
                                           (False, 0.5)])
def test_many_halos_of_mixed_sizes_equal_direct_summation(monkeypatch, tree_min, periodic,
                                                          eps):
    # 14 halos of 0 to 4000 members in one call (two empty, one of a single member):
    # with tree_min 150 ten of them share the forest, with the default (2000) two; the
    # rest go through the float32 prefilter (or, below 3 members, the exact sums)
    if tree_min is not None:
        monkeypatch.setattr(ck, "_TREE_MIN", tree_min)
    rng = np.random.default_rng(5 + int(periodic) + int(10 * eps))
    sizes = [300, 0, 4000, 1, 20, 2, 700, 160, 2500, 0, 90, 1200, 400, 3]
    box = 60.0 if periodic else None
    pos, starts = _catalog(rng, sizes, box, straddle=(0, 2, 6, 11))
    mass = rng.uniform(0.5, 1.5, len(pos))
    rows = _assert_exact(pos, mass, starts, box_size=box, softening=eps, G=1.3)
    assert np.all((rows >= 0) == (np.diff(starts) > 0))


def test_many_halos_with_duplicates_and_close_pairs_without_softening(monkeypatch):
    # softening 0: coincident members (a pair term of 0 in every sum), and in two halos
    # a pair 1e-22 apart near the origin (squared separation below float32's range: the
    # float32 sums must hand over to the exact ones) that is the most bound
    monkeypatch.setattr(ck, "_TREE_MIN", 300)
    rng = np.random.default_rng(9)
    sizes = [500, 120, 800, 60, 2100]
    pos, starts = _catalog(rng, sizes)
    for s in range(len(sizes)):
        a, b = starts[s], starts[s + 1]
        k = (b - a) // 4
        pos[a + 1:a + k:2] = pos[a:a + k - 1:2]  # a quarter of the members in pairs
    for s in (1, 2):
        a, b = starts[s], starts[s + 1]
        pos[a:b] -= pos[a + 7]
        pos[a + 7] = 0.0
        pos[a + 9] = [1e-22, 0.0, 0.0]
    mass = rng.uniform(0.5, 1.5, len(pos))
    rows = _assert_exact(pos, mass, starts)
    assert set(rows[1:3] - starts[1:3]) <= {7, 9}


@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_many_tied_halos_at_once_go_to_the_first_row(monkeypatch, eps):
    # symmetric lattices (8 equivalent central points) of 6**3 (prefilter) and 14**3
    # members (the forest, with tree_min 1000), shuffled, twice each, with two clusters
    # of exactly tied members in between: every halo's first tied row must win
    monkeypatch.setattr(ck, "_TREE_MIN", 1000)
    rng = np.random.default_rng(2)
    halos, masses = [], []
    for side in (6, 14, 6, 14):
        g = np.arange(side, dtype=np.float64)
        lat = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
        halos.append(lat[rng.permutation(len(lat))] + rng.uniform(-100, 100, 3))
        masses.append(np.ones(len(lat)))
    for k_a, k_b in ((300, 300), (1200, 1200)):
        p, m, _ = _tied_halo(rng, k_a, k_b, 400)
        halos.append(p)
        masses.append(m)
    pos, mass = np.concatenate(halos), np.concatenate(masses)
    starts = np.concatenate(([0], np.cumsum([len(h) for h in halos]))).astype(np.int64)
    soft = 4.0 if eps else 0.0  # the tied clusters need softening 4 to tie exactly
    rows = _assert_exact(pos, mass, starts, softening=soft)
    for s, side in enumerate((6, 14, 6, 14)):
        c = pos[rows[s]] - pos[starts[s]:starts[s + 1]].min(axis=0)
        assert np.all(np.abs(c - (side - 1) / 2) == 0.5)  # one of the central points


def test_prefilter_and_forest_keep_every_tie(monkeypatch):
    # the candidates themselves: in a lattice every central point ties in exact
    # arithmetic, and the float32 prefilter and the forest rounds must keep all 8
    monkeypatch.setattr(ck, "_TREE_MIN", 1000)
    halos = []
    for side in (8, 12):
        g = np.arange(side, dtype=np.float64)
        halos.append(np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3))
    pos = np.concatenate(halos)
    starts = np.array([0, 512, 512 + 1728], dtype=np.int64)
    mass = np.ones(len(pos))
    centre = [np.flatnonzero(np.all(np.abs(h - (len(np.unique(h[:, 0])) - 1) / 2) == 0.5,
                                    axis=1)) for h in halos]
    pre = ck._mbp_prefilter(pos[:512], mass[:512], 0.0, starts[:2], np.arange(512), True)
    assert set(centre[0]) <= set(pre)
    rows = ck._mbp_candidates(pos[512:], mass[512:], 0.0, np.array([0, 1728]),
                              np.arange(1728), True)
    assert set(centre[1]) <= set(rows)


@pytest.mark.parametrize("hand_over", [1, 2, 3, 4, None])
@pytest.mark.parametrize("periodic, eps", [(True, 0.02), (False, 0.0)])
def test_halos_handed_to_direct_sums_after_each_round_stay_exact(monkeypatch, hand_over,
                                                                 periodic, eps):
    # the forest's halos leave the bound rounds for the float32 direct sums before round
    # 1 .. 4 (every tree halo at once: _DIRECT_BELOW huge there, 0 before), or never
    # (None): Plummer / NFW halos with clumps, a shuffled 14**3 lattice (8 central points
    # tie up to the summation order) and exactly tied clusters (every row of a cluster
    # ties in any order), in one call; rows and potentials bit for bit as the argmin
    # of every exact potential
    monkeypatch.setattr(ck, "_TREE_MIN", 1000)
    big = 10**9
    below = () if hand_over is None else (0,) * (hand_over - 1) + (big,)
    monkeypatch.setattr(ck, "_DIRECT_BELOW", below)
    rng = np.random.default_rng(13 + int(periodic))
    box = 80.0 if periodic else None
    pos, starts = _catalog(rng, [6000, 1500, 300, 2500], box, straddle=(0,))
    g = np.arange(14, dtype=np.float64)
    lat = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
    tied, tmass, _ = _tied_halo(rng, 700, 700, 400)
    mass = np.concatenate([rng.uniform(0.5, 1.5, len(pos)), np.ones(len(lat)), tmass])
    pos = np.concatenate([pos, lat[rng.permutation(len(lat))] + 20.0, tied + 40.0])
    starts = np.concatenate([starts, starts[-1] + np.cumsum([len(lat), len(tied)])])
    if box is not None:
        pos = np.mod(pos, box)
    soft = eps if periodic else 4.0  # the tied clusters tie exactly with softening 4
    rows = _assert_exact(pos, mass, starts, box_size=box, softening=soft)
    c = pos[rows[4]] - pos[starts[4]:starts[5]].min(axis=0)
    assert np.all(np.abs(c - 6.5) == 0.5)  # one of the central points


def test_direct_sums_keep_every_tie_with_a_known_threshold(monkeypatch):
    # the candidates themselves: in a 12**3 lattice the 8 central points tie in exact
    # arithmetic; handed to the direct sums after the first round (with that round's
    # threshold), all 8 must stay candidates
    monkeypatch.setattr(ck, "_DIRECT_BELOW", (10**9,))
    g = np.arange(12, dtype=np.float64)
    pos = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
    centre = np.flatnonzero(np.all(np.abs(pos - 5.5) == 0.5, axis=1))
    rows = ck._mbp_candidates(pos, np.ones(len(pos)), 0.0, np.array([0, len(pos)]),
                              np.arange(len(pos)), True)
    assert set(centre) <= set(rows) and len(rows) < 100


@pytest.mark.slow
def test_mbp_of_a_1e5_halo_among_others_equals_direct_summation():
    # 1e10 pair terms for the reference (about 10 s on 2 cores): a 1e5-member halo in a
    # periodic box, straddling its corner, with 30 smaller halos in the same call
    rng = np.random.default_rng(8)
    sizes = [100_000] + list(rng.integers(20, 3000, 30))
    pos, starts = _catalog(rng, sizes, box=200.0, straddle=(0,))
    mass = rng.uniform(0.5, 1.5, len(pos))
    _assert_exact(pos, mass, starts, box_size=200.0, softening=0.01)


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_float32_sums_stay_within_their_error_bound(eps):
    # the float32 sums (self term included) against the exact float64 ones, at several
    # scales, with coincident members and pairs 1e-22 apart (squared separations below
    # float32's normal range: those rows must be summed exactly)
    rng = np.random.default_rng(3)
    pos = np.concatenate([model_halo(rng, "nfw", 400) * 1e-6, model_halo(rng, "plummer", 600),
                          model_halo(rng, "plummer", 300) * 1e9])
    pos[401] = pos[400]
    pos[405] = [0.0, 0.0, 0.0]
    pos[406] = [1e-22, 0.0, 0.0]
    mass = rng.uniform(0.0, 2.0, len(pos))
    starts = np.array([0, 400, 1000, 1300], dtype=np.int64)
    rows = np.arange(len(pos))
    approx = ck._potentials(pos, mass, starts, rows, 0.0, eps, -1.0, approx=True)
    exact = ck._potentials(pos, mass, starts, rows, 0.0, eps, -1.0)
    own = mass / eps if eps > 0 else 0.0
    assert np.all(np.abs(approx - own - exact) <= ck._APPROX_ERR / 2 * approx)


@pytest.mark.parametrize("eps", [2.0**-50, 2.0**-51])
def test_float32_sums_at_the_softening_threshold(eps):
    # eps**2 == _F32_TINY: every squared separation is at least eps**2, so the float32 loop
    # runs without its per-term tests; just below it, coincident members (s = eps**2) must
    # still send their rows to the exact sums. Both against the exact float64 sums.
    rng = np.random.default_rng(5)
    pos = model_halo(rng, "plummer", 500) * 1e-12
    pos[11] = pos[10]
    pos[12] = pos[10] + np.array([1e-40, 0.0, 0.0])
    mass = rng.uniform(0.0, 2.0, len(pos))
    starts = np.array([0, len(pos)], dtype=np.int64)
    rows = np.arange(len(pos))
    assert (eps * eps >= ck._F32_TINY) == (eps == 2.0**-50)
    approx = ck._potentials(pos, mass, starts, rows, 0.0, eps, -1.0, approx=True)
    exact = ck._potentials(pos, mass, starts, rows, 0.0, eps, -1.0)
    own = mass / eps
    assert np.all(np.abs(approx - own - exact) <= ck._APPROX_ERR / 2 * approx)
    rows_, pot = segment_mbp(pos, mass, starts, softening=eps)
    want_rows, want_pot, _ = _reference(pos, mass, starts, softening=eps)
    assert rows_[0] == want_rows[0] and pot[0] == want_pot[0]


def test_forest_holds_one_octree_per_segment():
    # build_forest: node s is the root of segment s (empty ones included), the rows stay
    # in their segment, every node's particles lie in one segment, the groups tile the
    # non-empty segments, and each node's mass, centre of mass and box are its particles'
    from cosmo_dask.spatial.octree import build_forest

    rng = np.random.default_rng(4)
    sizes = [40, 0, 700, 1, 300]
    pos = np.concatenate([model_halo(rng, "nfw", k) + 10.0 * i if k else np.zeros((0, 3))
                          for i, k in enumerate(sizes)])
    mass = rng.uniform(0.0, 2.0, len(pos))
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    tree = build_forest(pos, mass, starts, max_leaf=16, max_group=32)
    np.testing.assert_array_equal(tree.start[:5], starts[:-1])
    np.testing.assert_array_equal(tree.count[:5], sizes)
    assert np.all(tree.parent[:5] == -1) and np.all(tree.parent[5:] >= 0)
    seg = np.repeat(np.arange(5), sizes)
    np.testing.assert_array_equal(seg[tree.order], seg)
    np.testing.assert_array_equal(tree.pos, pos[tree.order])
    full = tree.count > 0
    first, last = tree.start[full], tree.start[full] + tree.count[full] - 1
    np.testing.assert_array_equal(seg[first], seg[last])
    g = tree.groups
    np.testing.assert_array_equal(np.concatenate([np.arange(tree.start[k], tree.start[k]
                                                            + tree.count[k]) for k in g]),
                                  np.arange(len(pos)))
    for k in np.flatnonzero(full)[::7]:
        sl = slice(tree.start[k], tree.start[k] + tree.count[k])
        np.testing.assert_allclose(tree.mass[k], tree.pmass[sl].sum(), rtol=1e-12)
        np.testing.assert_array_equal(tree.lo[k], tree.pos[sl].min(axis=0))
        np.testing.assert_array_equal(tree.hi[k], tree.pos[sl].max(axis=0))
        if tree.mass[k] > 0:
            com = (tree.pmass[sl, None] * tree.pos[sl]).sum(0) / tree.mass[k]
            np.testing.assert_allclose(tree.com[k], com, rtol=1e-12, atol=1e-12)
