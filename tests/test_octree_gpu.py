"""GPU octree builder: layout invariants and multipoles vs NumPy float64 sums per node."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


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
    cupy = pytest.importorskip("cupy")
    return {k: (cupy.asnumpy(v) if isinstance(v, cupy.ndarray) else v)
            for k, v in vars(tree).items()}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layout_and_multipoles(dtype):
    cupy = pytest.importorskip("cupy")
    from cosmo_dask.spatial.octree_gpu import build_octree_gpu

    pos, mass = _plummer(3000)
    pos = pos.astype(dtype)
    tree = build_octree_gpu(cupy.asarray(pos), cupy.asarray(mass), max_leaf=16, max_group=40)
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
