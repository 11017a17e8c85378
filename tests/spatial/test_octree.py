"""CPU octree (numba): Morton keys, layout invariants, multipoles vs direct NumPy sums."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.models import plummer
from cosmo_dask.spatial.morton import key_cell, morton_keys, sort_by_key
from cosmo_dask.spatial.octree import build_octree, node_second_moment
from tests.support.devices import DEVICES, array_module, to_host


def _interleave(i: int, j: int, k: int) -> int:
    """Reference Morton key: bit b of x, y, z -> bits 3b+2, 3b+1, 3b."""
    key = 0
    for b in range(21):
        key |= ((i >> b) & 1) << (3 * b + 2)
        key |= ((j >> b) & 1) << (3 * b + 1)
        key |= ((k >> b) & 1) << (3 * b)
    return key


@pytest.fixture(scope="module")
def cloud():
    snap = plummer(3000, seed=3)
    pos = snap.pos.compute().astype(np.float64)
    rng = np.random.default_rng(1)
    mass = rng.uniform(0.5, 1.5, size=pos.shape[0])
    return pos, mass


def test_morton_keys_match_reference():
    rng = np.random.default_rng(0)
    cells = rng.integers(0, 2**21, size=(200, 3))
    lo = np.array([-1.0, 2.0, 0.5])
    size = 4.0
    pos = lo + (cells + 0.5) * (size / 2**21)
    keys = morton_keys(pos, lo, size)
    ref = np.array([_interleave(*map(int, c)) for c in cells], dtype=np.uint64)
    np.testing.assert_array_equal(keys, ref)
    np.testing.assert_array_equal(key_cell(keys, 21), cells)
    np.testing.assert_array_equal(key_cell(keys, 5), cells >> 16)


def test_morton_keys_periodic_images():
    rng = np.random.default_rng(2)
    box = 10.0
    pos = rng.uniform(0, box, size=(500, 3))
    shift = rng.integers(-3, 4, size=(500, 3)) * box
    k0 = morton_keys(pos, np.zeros(3), box, box_size=box)
    k1 = morton_keys(pos + shift, np.zeros(3), box, box_size=box)
    np.testing.assert_array_equal(k0, k1)
    cells = np.floor(pos / box * 2**21).astype(np.int64)
    ref = np.array([_interleave(*map(int, c)) for c in cells], dtype=np.uint64)
    np.testing.assert_array_equal(k0, ref)
    # x is the most significant bit of each triple: the top 3 bits are the octant
    top = (k0 >> np.uint64(60)).astype(np.int64)
    octant = ((pos >= box / 2).astype(np.int64) * np.array([4, 2, 1])).sum(axis=1)
    np.testing.assert_array_equal(top, octant)


def test_sort_is_stable():
    keys = np.array([5, 3, 5, 3, 1, 5], dtype=np.uint64)
    np.testing.assert_array_equal(sort_by_key(keys), [4, 1, 3, 0, 2, 5])


def _check_layout(tree, pos_in, mass_in):
    n = pos_in.shape[0]
    m = tree.n_nodes
    # order: permutation, keys sorted, sorted arrays consistent
    np.testing.assert_array_equal(np.sort(tree.order), np.arange(n))
    assert np.all(np.diff(tree.keys.astype(np.float64)) >= 0)
    np.testing.assert_array_equal(tree.pmass, mass_in[tree.order])
    assert tree.start[0] == 0 and tree.count[0] == n and tree.parent[0] == -1
    assert np.all(np.diff(tree.level) >= 0)  # breadth first
    size = tree.root_size
    for i in range(m):
        s, c, lev = tree.start[i], tree.count[i], int(tree.level[i])
        assert c >= 1
        # every particle of a node shares the node's cell at its level
        cells = key_cell(tree.keys[s:s + c], lev)
        assert np.all(cells == cells[0])
        side = size / 2**lev
        lo = tree.root_lo + cells[0] * side
        p = tree.pos[s:s + c]
        assert np.all(p >= lo - 1e-12 * size) and np.all(p <= lo + side + 1e-12 * size)
        if tree.first_child[i] < 0:
            assert tree.n_child[i] == 0
            assert c <= tree.max_leaf or lev == 21
            continue
        fc, nch = tree.first_child[i], int(tree.n_child[i])
        kids = np.arange(fc, fc + nch)
        assert c > tree.max_leaf
        np.testing.assert_array_equal(tree.parent[kids], i)
        np.testing.assert_array_equal(tree.level[kids], lev + 1)
        # children contiguous, in Morton order, tile the parent's range
        assert tree.start[kids[0]] == s
        np.testing.assert_array_equal(tree.start[kids[1:]], tree.start[kids[:-1]]
                                      + tree.count[kids[:-1]])
        assert tree.start[kids[-1]] + tree.count[kids[-1]] == s + c
    # every non-root node is somebody's child exactly once
    assert np.sum(tree.n_child) == m - 1


def _check_multipoles(tree):
    for i in range(tree.n_nodes):
        s, c = tree.start[i], tree.count[i]
        x = tree.pos[s:s + c].astype(np.float64)
        w = tree.pmass[s:s + c]
        mt = w.sum()
        com = (w[:, None] * x).sum(axis=0) / mt
        d = x - com
        d2 = (d * d).sum(axis=1)
        full = 3 * np.einsum("n,na,nb->ab", w, d, d) - np.eye(3) * (w * d2).sum()
        quad = full[[0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]
        scale = mt * max(np.sqrt(d2.max()), 1e-300) ** 2
        np.testing.assert_allclose(tree.mass[i], mt, rtol=1e-12)
        np.testing.assert_allclose(tree.com[i], com, rtol=1e-12, atol=1e-12 * tree.root_size)
        np.testing.assert_allclose(tree.quad[i], quad, rtol=0, atol=1e-10 * scale + 1e-300)
        np.testing.assert_allclose(tree.bmax[i], np.sqrt(d2.max()), rtol=1e-12, atol=1e-300)
        np.testing.assert_array_equal(tree.lo[i], x.min(axis=0))
        np.testing.assert_array_equal(tree.hi[i], x.max(axis=0))


def _check_groups(tree):
    g = tree.groups
    starts = tree.start[g]
    assert np.all(np.diff(starts) > 0)
    assert starts[0] == 0
    np.testing.assert_array_equal(starts[1:], starts[:-1] + tree.count[g[:-1]])
    assert starts[-1] + tree.count[g[-1]] == tree.n_particles
    leaf = tree.first_child < 0
    assert np.all((tree.count[g] <= tree.max_group) | leaf[g])
    par = tree.parent[g]
    assert np.all((par < 0) | (tree.count[np.maximum(par, 0)] > tree.max_group))


@pytest.mark.parametrize("max_leaf,max_group", [(16, 32), (8, 4)])
def test_layout_multipoles_groups(cloud, max_leaf, max_group):
    pos, mass = cloud
    tree = build_octree(pos, mass, max_leaf=max_leaf, max_group=max_group)
    _check_layout(tree, pos, mass)
    _check_multipoles(tree)
    _check_groups(tree)
    # default root: a cube holding every particle
    assert np.all(pos >= tree.root_lo) and np.all(pos < tree.root_lo + tree.root_size)
    s2 = node_second_moment(tree)
    for i in (0, 5, tree.n_nodes - 1):
        x = tree.pos[tree.start[i]:tree.start[i] + tree.count[i]]
        w = tree.pmass[tree.start[i]:tree.start[i] + tree.count[i]]
        np.testing.assert_allclose(s2[i], (w * ((x - tree.com[i]) ** 2).sum(axis=1)).sum(),
                                   rtol=1e-12)


def test_duplicates_reach_level_21_and_keep_order():
    pos = np.zeros((40, 3))
    pos[20:] = 1.0
    tree = build_octree(pos, 1.0, max_leaf=4, max_group=4)
    _check_layout(tree, pos, np.ones(40))
    _check_groups(tree)
    np.testing.assert_array_equal(tree.order, np.arange(40))  # stable ties
    assert tree.level.max() == 21


def test_periodic_tree_wraps(cloud):
    rng = np.random.default_rng(5)
    box = 2.0
    pos = rng.uniform(0, box, size=(2000, 3))
    mass = rng.uniform(1, 2, size=2000)
    t0 = build_octree(pos, mass, max_leaf=16, box_size=box)
    shifted = pos + rng.integers(-2, 3, size=pos.shape) * box
    t1 = build_octree(shifted, mass, max_leaf=16, box_size=box)
    np.testing.assert_array_equal(t0.order, t1.order)
    np.testing.assert_allclose(t1.pos, t0.pos, atol=1e-12)
    np.testing.assert_array_equal(t0.root_lo, 0.0)
    assert t0.root_size == box
    _check_layout(t1, shifted, mass)
    _check_multipoles(t1)


def test_bad_input():
    with pytest.raises(ParameterError, match="pos"):
        build_octree(np.zeros((5, 2)), 1.0)
    with pytest.raises(ParameterError, match="max_leaf"):
        build_octree(np.zeros((5, 3)), 1.0, max_leaf=0)
    with pytest.raises(ParameterError, match="mass"):
        build_octree(np.zeros((5, 3)), np.ones(4))
    with pytest.raises(ParameterError, match="root_size"):
        morton_keys(np.zeros((5, 3)), np.zeros(3), -1.0)


def test_cell_keys_are_the_morton_keys_of_cells():
    """spatial.morton.cell_keys (PSE's octree nodes) and morton_keys (particles) share one
    bit order: the keys of cell centres are the cells' keys, and key_cell inverts them."""
    from cosmo_dask.spatial.morton import MORTON_BITS, cell_keys, key_cell, morton_keys

    rng = np.random.default_rng(5)
    cells = rng.integers(0, 2**MORTON_BITS, size=(2000, 3))
    keys = cell_keys(cells)
    np.testing.assert_array_equal(key_cell(keys, MORTON_BITS), cells)
    np.testing.assert_array_equal(morton_keys((cells + 0.5) / 2**MORTON_BITS, np.zeros(3), 1.0),
                                  keys)
    # depth first: a parent's eight children follow each other in key order
    coarse = cells >> (MORTON_BITS - 3)
    order = np.argsort(keys)
    parent = (coarse[order] // 2) @ np.array([64, 8, 1])
    assert np.count_nonzero(np.diff(parent) != 0) == len(np.unique(parent)) - 1


# -------------------- on the GPU (formerly tests/test_octree_gpu.py)
# GPU octree builder: layout invariants and multipoles vs NumPy float64 sums per node.


def _plummer(n, seed=3):
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.0, 0.99, n)
    r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    v = rng.normal(size=(n, 3))
    return r[:, None] * v / np.linalg.norm(v, axis=1)[:, None], rng.uniform(0.5, 1.5, n) / n


def _spread(v):
    out = np.zeros_like(v, dtype=np.uint64)
    for b in range(21):
        out |= ((v >> np.uint64(b)) & np.uint64(1)) << np.uint64(3 * b)
    return out


def _host_tree(tree):
    return {k: (to_host(v) if type(v).__module__.startswith("cupy") else v)
            for k, v in vars(tree).items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layout_and_multipoles(dtype, device):
    """The builder of either device: layout invariants and multipoles against NumPy
    float64 sums per node."""
    xp = array_module(device)
    if device == "gpu":
        from cosmo_dask.spatial.octree_gpu import build_octree_gpu as build
    else:
        build = build_octree

    pos, mass = _plummer(3000)
    pos = pos.astype(dtype)
    tree = build(xp.asarray(pos), xp.asarray(mass), max_leaf=16, max_group=40)
    t = _host_tree(tree)
    n, m = len(pos), tree.n_nodes
    order = t["order"]
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(t["pos"], pos[order]) and t["pos"].dtype == dtype
    np.testing.assert_array_equal(t["pmass"], mass[order])
    # Morton keys from an independent NumPy computation
    cell = np.floor((pos[order].astype(np.float64) - t["root_lo"]) * (2.0**21 / t["root_size"]))
    cell = np.clip(cell, 0, 2**21 - 1).astype(np.uint64)
    keys = (_spread(cell[:, 0]) << np.uint64(2)) | (_spread(cell[:, 1]) << np.uint64(1)) \
        | _spread(cell[:, 2])
    np.testing.assert_array_equal(t["keys"], keys)
    assert np.all(np.diff(t["keys"].astype(np.float64)) >= 0)
    assert np.all(pos.min(0) >= t["root_lo"]) and np.all(pos.max(0) < t["root_lo"] + t["root_size"])
    # breadth first, children contiguous and covering the parent's range
    assert t["start"][0] == 0 and t["count"][0] == n and t["parent"][0] == -1
    assert np.all(np.diff(t["level"]) >= 0)
    for nd in range(m):
        f, k = t["first_child"][nd], t["n_child"][nd]
        if f < 0:
            assert k == 0 and (t["count"][nd] <= 16 or t["level"][nd] == 21)
            continue
        assert t["count"][nd] > 16
        ch = np.arange(f, f + k)
        assert np.all(t["parent"][ch] == nd) and np.all(t["level"][ch] == t["level"][nd] + 1)
        assert t["start"][ch[0]] == t["start"][nd]
        np.testing.assert_array_equal(t["start"][ch[1:]], (t["start"] + t["count"])[ch[:-1]])
        assert t["count"][ch].sum() == t["count"][nd]
        # children in Morton order: octant digit increases
        shift = np.uint64(3 * (21 - t["level"][nd] - 1))
        dig = (t["keys"][t["start"][ch]] >> shift) & np.uint64(7)
        assert np.all(np.diff(dig.astype(int)) > 0)
    # multipoles per node against float64 sums
    p64 = pos[order].astype(np.float64)
    pm = mass[order]
    scale = np.abs(p64).max()
    for nd in range(m):
        s, c = t["start"][nd], t["count"][nd]
        x, w = p64[s:s + c], pm[s:s + c]
        mt = w.sum()
        com = (w[:, None] * x).sum(0) / mt
        d = x - com
        d2 = (d * d).sum(1)
        q = np.array([(w * (3 * d[:, a] * d[:, b] - (a == b) * d2)).sum()
                      for a, b in [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]])
        assert t["mass"][nd] == pytest.approx(mt, rel=1e-12)
        np.testing.assert_allclose(t["com"][nd], com, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(t["quad"][nd], q, rtol=0, atol=1e-10 * mt * scale**2)
        assert t["bmax"][nd] == pytest.approx(np.sqrt(d2.max()), rel=1e-10, abs=1e-12 * scale)
        np.testing.assert_array_equal(t["lo"][nd], x.min(0))
        np.testing.assert_array_equal(t["hi"][nd], x.max(0))
    # groups tile the sorted particles, each <= max_group, parent > max_group
    g = t["groups"]
    assert t["start"][g[0]] == 0
    np.testing.assert_array_equal(t["start"][g[1:]], (t["start"] + t["count"])[g[:-1]])
    assert (t["start"] + t["count"])[g[-1]] == n
    assert np.all(t["count"][g] <= 40) and np.all(t["count"][t["parent"][g]] > 40)


@pytest.mark.gpu
def test_input_order_and_periodic_root():
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.core.errors import ParameterError
    from cosmo_dask.spatial.octree_gpu import build_octree_gpu

    rng = np.random.default_rng(7)
    pos = rng.uniform(0, 10.0, (5000, 3))
    perm = rng.permutation(len(pos))
    a = _host_tree(build_octree_gpu(cupy.asarray(pos), 2.0, box_size=10.0))
    b = _host_tree(build_octree_gpu(cupy.asarray(pos[perm]), 2.0, box_size=10.0))
    assert a["root_size"] == 10.0 and np.all(a["root_lo"] == 0)
    for k in ("pos", "keys", "start", "count", "first_child", "com", "quad", "bmax", "groups"):
        np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(perm[b["order"]], a["order"])
    assert a["mass"][0] == pytest.approx(2.0 * len(pos))
    with pytest.raises(ParameterError, match="box"):
        build_octree_gpu(cupy.asarray(pos), 1.0, box_size=5.0)
    with pytest.raises(ParameterError, match="max_leaf"):
        build_octree_gpu(cupy.asarray(pos), 1.0, max_leaf=0)
    with pytest.raises(ParameterError, match="shape"):
        build_octree_gpu(cupy.asarray(pos[:, :2]), 1.0)
